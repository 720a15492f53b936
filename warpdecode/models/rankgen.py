"""RankGen's encoder (Krishna et al. 2022): a prefix and a continuation mapped to vectors whose dot
product says how well the continuation follows the prefix.

This one is small enough to train on a CPU in minutes: the target's token embeddings (frozen, never
stored: rebuilt from the target at load, as a drafter's frozen head is) go through a learned input
projection, `layers` small pre-norm transformer layers (0: a bag of embeddings) shared by both sides
with a side embedding and learned positions (a prefix's counted back from its last token), a masked mean pool and one output projection per side
(the two towers). Vectors are L2-normalised; the score is their dot product over `temperature`.

A trained encoder is one safetensors file: its weights, and in the file's metadata the format, the
network's shape (`RankGenConfig`) and the target it was trained for (its fingerprint, checked at load).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from warpdecode.errors import CheckpointError, ConfigError
from warpdecode.models.backbone import Backbone

FORMAT = "warpdecode-rankgen"
VERSION = 1
Side = Literal["prefix", "continuation"]


@dataclass(frozen=True)
class RankGenConfig:
    width: int = 128
    """Width of the encoder's residual stream and of the output vectors."""
    layers: int = 1
    """Transformer layers shared by both sides (0: mean of the projected embeddings)."""
    heads: int = 4
    """Attention heads per layer."""
    max_prefix: int = 64
    """Prefix tokens read: the prefix's last ones."""
    max_continuation: int = 64
    """Continuation tokens read (the older tokens of a longer one extend the prefix: `RankGenNet.scores`)."""
    temperature: float = 0.05
    """Scores are cosine similarities over this."""

    def __post_init__(self) -> None:
        if self.width < 1 or self.layers < 0 or self.heads < 1 or self.width % self.heads:
            raise ConfigError(f"rankgen needs width >= 1 divisible by heads >= 1 and layers >= 0, got width "
                              f"{self.width}, heads {self.heads}, layers {self.layers}")
        if min(self.max_prefix, self.max_continuation) < 1 or not self.temperature > 0:
            raise ConfigError(f"rankgen needs max_prefix, max_continuation >= 1 and temperature > 0, got "
                              f"{self.max_prefix}, {self.max_continuation}, {self.temperature}")


class RankGenNet(nn.Module):
    def __init__(self, config: RankGenConfig, embed_dim: int) -> None:
        super().__init__()
        self.config, w = config, config.width
        self.project = nn.Linear(embed_dim, w)
        self.positions = nn.Embedding(max(config.max_prefix, config.max_continuation), w)
        self.sides = nn.Embedding(2, w)
        layer = nn.TransformerEncoderLayer(w, config.heads, 2 * w, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, config.layers, enable_nested_tensor=False) if config.layers else None
        self.heads = nn.ModuleDict({"prefix": nn.Linear(w, w), "continuation": nn.Linear(w, w)})
        self.embed: Tensor = torch.zeros(0, embed_dim)  # (V, C) the target's, frozen: set by `attach`

    def attach(self, target: Backbone) -> RankGenNet:
        """Read tokens through `target`'s input embeddings (a frozen copy, not a parameter)."""
        self.embed = target.embed.weight.detach().float().cpu().clone()
        return self

    def encode(self, tokens: Tensor, mask: Tensor, side: Side) -> Tensor:
        """Unit vectors of token rows, right-padded.

        Args:
            tokens: (B, T) int64 token ids of the target's vocabulary; mask: (B, T) bool, True on real tokens.
        Returns:
            (B, width) float32, L2-normalised.
        """
        if self.embed.numel() == 0:
            raise ValueError("RankGenNet.attach(target) first: the encoder reads the target's embeddings")
        if self.embed.device != tokens.device:
            self.embed = self.embed.to(tokens.device)
        T = tokens.shape[1]
        position = torch.arange(T, device=tokens.device).expand_as(tokens)  # (B, T)
        if side == "prefix":  # counted back from the last real token, which a prefix's reader needs most
            position = (mask.sum(1, keepdim=True) - 1 - position).clamp(min=0)
        x = self.project(self.embed[tokens]) + self.positions(position)  # (B, T, width)
        x = x + self.sides.weight[0 if side == "prefix" else 1]
        if self.encoder is not None:
            x = self.encoder(x, src_key_padding_mask=~mask)  # (B, T, width)
        weights = mask.float()[..., None]  # (B, T, 1)
        pooled = (x * weights).sum(1) / weights.sum(1).clamp(min=1.0)  # (B, width)
        return F.normalize(self.heads[side](pooled), dim=-1)

    def rows(self, sequences: list[list[int]], side: Side) -> tuple[Tensor, Tensor]:
        """(B, T) int64 tokens and (B, T) bool mask of token lists cut as `side` reads them (a prefix's
        last `max_prefix` tokens, a continuation's first `max_continuation`), right-padded."""
        limit = self.config.max_prefix if side == "prefix" else self.config.max_continuation
        cut = [s[-limit:] if side == "prefix" else s[:limit] for s in sequences]
        width = max(1, max(len(s) for s in cut))
        tokens = torch.tensor([s + [0] * (width - len(s)) for s in cut], dtype=torch.int64)
        mask = torch.tensor([[True] * len(s) + [False] * (width - len(s)) for s in cut])
        return tokens, mask

    @torch.inference_mode()
    def scores(self, prefix: list[int], continuations: list[list[int]]) -> list[float]:
        """How well each continuation follows `prefix`: cosine similarity over the temperature. A continuation
        longer than `max_continuation` is read as its last `max_continuation` tokens after the prefix
        extended by the rest (how well its newest text follows everything before it)."""
        limit = self.config.max_continuation
        prefixes = [prefix + c[:-limit] if len(c) > limit else prefix for c in continuations]
        queries = self.encode(*self.rows(prefixes, "prefix"), "prefix")  # (N, width)
        keys = self.encode(*self.rows([c[-limit:] for c in continuations], "continuation"), "continuation")  # (N, width)
        return ((keys * queries).sum(-1) / self.config.temperature).tolist()


def save_rankgen(net: RankGenNet, target: dict[str, Any], path: str | Path, training: dict[str, Any] | None = None) -> Path:
    """Write the encoder's weights (never the frozen embeddings) and its metadata to one file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"format": FORMAT, "version": str(VERSION), "config": json.dumps(asdict(net.config)),
            "target": json.dumps(target), "training": json.dumps(training or {})}
    weights = {k: v.detach().float().contiguous().cpu() for k, v in net.state_dict().items()}
    tmp = path.with_name(path.name + ".tmp")
    save_file(weights, str(tmp), metadata=meta)
    tmp.replace(path)
    return path


def read_rankgen(path: str | Path) -> tuple[RankGenConfig, dict[str, Any], dict[str, Tensor]]:
    """The network shape, the recorded target and the weights of an encoder file; one-line ConfigError for a
    missing, unreadable or foreign file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"rankgen scorer {str(path)!r} is not a file (train one: warpdecode fit --config "
                          "configs/search/rankgen.yaml)")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            weights = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
    except (SafetensorError, OSError) as e:
        raise ConfigError(f"rankgen scorer {str(path)!r} is corrupt: {str(e).splitlines()[0][:120]}") from None
    if meta.get("format") != FORMAT or meta.get("version") != str(VERSION):
        raise ConfigError(f"rankgen scorer {str(path)!r} is not a {FORMAT} version {VERSION} file")
    try:
        names = {f.name for f in fields(RankGenConfig)}
        config = RankGenConfig(**{k: v for k, v in json.loads(meta["config"]).items() if k in names})
        target = json.loads(meta["target"])
        if not isinstance(target, dict):
            raise TypeError("target is not an object")
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as e:
        raise ConfigError(f"rankgen scorer {str(path)!r} has bad metadata: {e}") from None
    return config, target, weights


def load_rankgen(path: str | Path, target: Backbone) -> RankGenNet:
    """A trained encoder for `target`, in eval mode: ConfigError for a missing or unreadable file (see
    `read_rankgen`), CheckpointError for one trained for another model."""
    config, recorded, weights = read_rankgen(path)
    if recorded.get("fingerprint") != target.fingerprint():
        raise CheckpointError(f"rankgen scorer {str(path)!r} was trained for {recorded.get('source')!r} (fingerprint "
                              f"{recorded.get('fingerprint')}), not this target ({target.fingerprint()})")
    net = RankGenNet(config, target.config.d_model)
    try:
        net.load_state_dict(weights)
    except RuntimeError as e:
        raise ConfigError(f"rankgen scorer {str(path)!r}: weights do not match its config: "
                          f"{str(e).splitlines()[0][:120]}") from None
    return net.attach(target).eval()

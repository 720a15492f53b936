"""Running the trained drafters' ONNX graphs (written by `export.drafter_graphs`, which lists their inputs and
outputs) in ONNX Runtime: on an ONNX Runtime target the drafters run these (`OnnxHeads`, `OnnxEagle`,
`OnnxDistilled`, `OnnxClover`) instead of their PyTorch networks, so drafting and verifying share one
runtime; the PyTorch network stays the reference they are tested against. Each finds the graphs its
network names (`graph_files`) in the drafter's directory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from warpdecode.errors import CheckpointError
from warpdecode.models.cache import KVCache
from warpdecode.models.clover import CloverNet
from warpdecode.models.distilled_draft import DistilledDraftNet
from warpdecode.models.eagle import EagleNet
from warpdecode.models.medusa import FutureHeads
from warpdecode.models.transformer import new_token_mask
from warpdecode.runtime.onnx_weights import external_data_locations
from warpdecode.runtime.onnxruntime import open_session, run_step_graph


def cpu_session(path: Path, threads: int | None) -> object:
    """An ONNX Runtime CPU session for a drafter graph."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or torch.get_num_threads()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return open_session(path, options, ["CPUExecutionProvider"])


def find_graphs(directory: Path, names: list[str]) -> list[Path] | None:
    """The graphs `names` of the drafter package `directory`, or None if any is missing. Each must lie
    inside the directory (symlinks resolved) and name no external data outside it (`CheckpointError`
    otherwise): a drafter directory used on its own gets the containment an inference package's
    verification gives its drafters."""
    paths = [directory / name for name in names]
    if not all(path.is_file() for path in paths):
        return None
    root = directory.resolve()
    for path in paths:
        if not path.resolve().is_relative_to(root):
            raise CheckpointError(f"{path} resolves to {path.resolve()}, outside its drafter package")
        for location in external_data_locations(path):
            if not location or not (path.parent / location).resolve().is_relative_to(root):
                raise CheckpointError(f"{path} names external data {location!r} outside its drafter package")
    return paths


def run_graph(session: object, **inputs: Tensor) -> Tensor:
    """The first output of `session` on fp32 inputs, as a torch tensor."""
    feeds = {name: np.ascontiguousarray(t.detach().float().cpu().numpy()) for name, t in inputs.items()}
    return torch.from_numpy(session.run(None, feeds)[0])  # type: ignore[attr-defined]


class OnnxEagle:
    """The EAGLE graphs in ONNX Runtime, called like the network: `eagle(features, tokens, embed,
    positions, cache, attention_mask)` → (predicted features, empty logits) and `eagle.head(features)`."""

    def __init__(self, layer: object, head: object) -> None:
        self.layer, self.head_session = layer, head
        self.names = [i.name for i in layer.get_inputs()]  # type: ignore[attr-defined]

    @classmethod
    def find(cls, directory: Path, net: EagleNet, threads: int | None = None) -> OnnxEagle | None:
        """The graphs of `net` in `directory`, or None if either is missing."""
        paths = find_graphs(directory, net.graph_files())
        return None if paths is None else cls(*(cpu_session(path, threads) for path in paths))

    def __call__(self, features: Tensor, tokens: Tensor, embed: nn.Embedding, positions: Tensor, cache: KVCache,
                 attention_mask: Tensor | None = None, logits_slice: slice | None = None) -> tuple[Tensor, Tensor]:
        """As `EagleNet.forward` with a cache; logits are left to `head` (drafting asks for none here)."""
        B, T, C = features.shape
        hidden = torch.empty(B, T, C, dtype=cache.k.dtype)
        leading = [features.to(cache.k.dtype).contiguous(), embed(tokens).to(cache.k.dtype).contiguous()]
        run_step_graph(self.layer, self.names, leading, positions.to(torch.int64), cache,
                       new_token_mask(attention_mask, B, T), True, [], {"hidden": hidden})
        if logits_slice is not None and not range(T)[logits_slice]:
            return hidden, torch.empty(B, 0, 0)
        return hidden, self.head(hidden[:, logits_slice or slice(None)])

    def head(self, features: Tensor) -> Tensor:
        """(..., C) → (..., N) draft-vocabulary logits."""
        flat = features.reshape(-1, features.shape[-1])
        return run_graph(self.head_session, features=flat).reshape(*features.shape[:-1], -1)


class OnnxDistilled:
    """The distilled draft model's step graph in ONNX Runtime, called like the network:
    `draft(tokens, embed, cache, logits_slice)` → (B, T', N) draft-vocabulary logits."""

    def __init__(self, session: object, draft_vocab_size: int) -> None:
        self.session, self.draft_vocab_size = session, draft_vocab_size
        self.names = [i.name for i in session.get_inputs()]  # type: ignore[attr-defined]

    @classmethod
    def find(cls, directory: Path, net: DistilledDraftNet, threads: int | None = None) -> OnnxDistilled | None:
        """The graph of `net` in `directory`, or None if it is missing."""
        paths = find_graphs(directory, net.graph_files())
        return None if paths is None else cls(cpu_session(paths[0], threads), net.config.vocab_size)

    def __call__(self, tokens: Tensor, embed: nn.Embedding, cache: KVCache | None = None,
                 logits_slice: slice | None = None) -> Tensor:
        assert cache is not None, "the graph runs against a KV cache"
        B, T = tokens.shape
        index = torch.arange(T)[logits_slice or slice(None)]
        positions = cache.lengths.to(torch.int64)[:, None] + torch.arange(T)[None]
        logits = torch.empty(B, index.numel(), self.draft_vocab_size, dtype=cache.k.dtype)
        run_step_graph(self.session, self.names, [embed(tokens).to(cache.k.dtype).contiguous()], positions, cache,
                       None, True, [index], {"logits": logits})
        return logits


class OnnxClover:
    """Clover's graphs in ONNX Runtime: `augmented(features, positions, cache)` → (states, context keys,
    context values) as `CloverNet.augmented` + `context_kv`, and `step(states, embeds, positions, keys,
    values)` → (next states, logits) as `CloverNet.step` + `logits` for one row."""

    def __init__(self, augment: object, step: object, draft_vocab_size: int) -> None:
        self.augment_session, self.step_session, self.draft_vocab_size = augment, step, draft_vocab_size
        self.names = [i.name for i in augment.get_inputs()]  # type: ignore[attr-defined]

    @classmethod
    def find(cls, directory: Path, net: CloverNet, threads: int | None = None) -> OnnxClover | None:
        """The graphs of `net` in `directory`, or None if either is missing."""
        paths = find_graphs(directory, net.graph_files())
        if paths is None:
            return None
        return cls(cpu_session(paths[0], threads), cpu_session(paths[1], threads), net.draft_vocab.numel())

    def augmented(self, features: Tensor, positions: Tensor, cache: KVCache) -> tuple[Tensor, Tensor, Tensor]:
        """(B, T, C) features at `positions` (B, T), appended to the block's `cache` → states (B, T, C)
        and the decoder's keys / values (B, Hkv, T, D)."""
        B, T, C = features.shape
        dtype = cache.k.dtype
        states = torch.empty(B, T, C, dtype=dtype)
        keys = torch.empty(B, cache.k.shape[2], T, cache.k.shape[4], dtype=dtype)
        values = torch.empty_like(keys)
        run_step_graph(self.augment_session, self.names, [features.to(dtype).contiguous()], positions, cache, None,
                       True, [], {"states": states, "context_keys": keys, "context_values": values})
        return states, keys, values

    def step(self, states: Tensor, embeds: Tensor, positions: Tensor, keys: Tensor,
             values: Tensor) -> tuple[Tensor, Tensor]:
        """(M, C) states, (M, C) embeddings, (M,) positions, (Hkv, S, D) context → (M, C), (M, N)."""
        feeds = {"states": states, "embeds": embeds, "keys": keys, "values": values}
        arrays = {name: np.ascontiguousarray(t.detach().float().cpu().numpy()) for name, t in feeds.items()}
        arrays["position_ids"] = np.ascontiguousarray(positions.cpu().numpy().astype(np.int64))
        next_states, logits = self.step_session.run(None, arrays)  # type: ignore[attr-defined]
        return torch.from_numpy(next_states), torch.from_numpy(logits)


class OnnxHeads:
    """The heads' graphs in ONNX Runtime, called like the PyTorch heads: `heads(features)` (Medusa),
    `heads.step(k, features, embeds)` (Hydra)."""

    def __init__(self, sessions: list[object]) -> None:
        self.sessions = sessions  # the network's `graph_files`: Medusa's one graph; Hydra's head 1..K

    @classmethod
    def find(cls, directory: Path, net: FutureHeads, threads: int | None = None) -> OnnxHeads | None:
        """The graphs of `net` (its kind and head count) in `directory`, or None if any is missing."""
        paths = find_graphs(directory, net.graph_files())
        return None if paths is None else cls([cpu_session(path, threads) for path in paths])

    def __call__(self, features: Tensor) -> Tensor:
        """(M, C) → (M, K, N), as `MedusaHeads.forward`."""
        return run_graph(self.sessions[0], features=features)

    def step(self, k: int, features: Tensor, embeds: Tensor) -> Tensor:
        """(M, C), (M, k, C) → (M, N), as `HydraHeads.step`."""
        return run_graph(self.sessions[k - 1], features=features, embeds=embeds)

"""The distilled draft model (FastDraft / S2D-style): a few of the target's blocks, trained to imitate it.

A small causal backbone reads tokens only (no target features): the target's token embedding
(shared, never stored), `n_layer` blocks initialised from the target's blocks `init_layers`, its
own final norm, and the frozen reduced-vocabulary head every learned drafter drafts through
(`draft_head.py`: the target's LM-head rows of the most frequent answer tokens). Distillation on
the target's own answers (`modules/distilled_draft.py`) heals the layers that were dropped.

At decode time it is an ordinary draft model with its own KV cache (`decoding/drafters/distilled.py`):
it prefills the prompt with its few blocks, drafts chains, top-k fans or dynamic trees, and rolls
back to the accepted prefix. A draft step costs about `n_layer / target n_layer` of a target step
plus the small head.
"""

from __future__ import annotations

import dataclasses
from typing import Self

import torch
from torch import Tensor, nn

from warpdecode.errors import ConfigError
from warpdecode.models.cache import KVCache
from warpdecode.models.config import ModelConfig
from warpdecode.models.draft_head import DraftVocabNet, draft_backbone_config
from warpdecode.models.net_config import NetConfig
from warpdecode.models.transformer import Transformer


def spread_layers(n_layer: int, count: int) -> list[int]:
    """`count` block indices spread evenly over 0..n_layer-1, first and last included.

    Example: spread_layers(30, 4) → [0, 10, 19, 29].
    """
    if not 1 <= count <= n_layer:
        raise ConfigError(f"a draft of {count} layers cannot be taken from a {n_layer}-layer target")
    if count == 1:
        return [0]
    return [round(i * (n_layer - 1) / (count - 1)) for i in range(count)]


def check_init_layers(layers: list[int], n_layer: int) -> None:
    """ConfigError unless `layers` is a strictly increasing list of block indices of a `n_layer`-block target."""
    if not layers or sorted(set(layers)) != list(layers) or layers[0] < 0 or layers[-1] >= n_layer:
        raise ConfigError(f"init_layers must be strictly increasing block indices in 0..{n_layer - 1}, got {layers}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistilledConfig(NetConfig):
    """A distilled draft package's network."""

    kind = "distilled draft model"
    draft_vocab_size: int
    num_layers: int
    init_layers: tuple[int, ...] | None = None
    """The target blocks its blocks started from (recorded only)."""


class DistilledDraftNet(DraftVocabNet):
    """`n_layer` blocks + norm + frozen reduced head over the target's token embedding (passed in)."""

    head_key = "model.lm_head.weight"
    config_class = DistilledConfig

    def __init__(self, target_config: ModelConfig, n_layer: int, draft_vocab_size: int) -> None:
        super().__init__(draft_vocab_size)
        self.config = draft_backbone_config(target_config, n_layer, draft_vocab_size)
        self.model = Transformer(self.config)
        del self.model.embed  # the target's embedding feeds `inputs_embeds`

    @classmethod
    def from_config(cls, target: ModelConfig, config: DistilledConfig) -> Self:
        return cls(target, config.num_layers, config.draft_vocab_size)

    def graph_files(self) -> list[str]:
        """The step graph: embeds, position_ids, attention_mask, logit_index, past_key_i / past_value_i
        → logits (B, K, N), new_keys / new_values."""
        return ["distilled_step.onnx"]

    def init_from_target(self, target: Transformer, init_layers: list[int], draft_vocab: Tensor) -> None:
        """Blocks copied from the target's `init_layers`, the target's final norm, and the head tied to
        the target's LM head rows of `draft_vocab` (frozen)."""
        check_init_layers(init_layers, target.config.n_layer)
        if len(init_layers) != self.config.n_layer:
            raise ConfigError(f"{len(init_layers)} init_layers for a draft of {self.config.n_layer} blocks")
        with torch.no_grad():
            for block, layer in zip(self.model.blocks, init_layers):
                block.load_state_dict(target.blocks[layer].state_dict())
            self.model.norm.load_state_dict(target.norm.state_dict())
            self.draft_vocab.copy_(draft_vocab)
        self.tie_head(target)

    def pack(self) -> None:
        self.model.pack_for_cpu_inference()

    def unpack(self) -> None:
        self.model.unpack()

    def forward(self, tokens: Tensor, embed: nn.Embedding, cache: KVCache | None = None,
                logits_slice: slice | None = None) -> Tensor:
        """Draft-vocabulary logits after each token.

        Args:
            tokens: (B, T) int64 target token ids, after the cached positions (or a whole sequence).
            embed: the target's token embedding.
            cache: the draft's own KV cache (appended to), or None for a teacher-forced pass (training).
            logits_slice: compute logits only for this slice of the T positions.
        Returns:
            (B, T', N) logits over the draft vocabulary; entry i scores the token after tokens[:, i].
        """
        x = embed(tokens).to(self.model.norm.weight.dtype)
        return self.model(tokens, cache=cache, inputs_embeds=x, logits_slice=logits_slice).logits

"""The frozen reduced-vocabulary LM head every learned drafter network drafts through (FR-Spec / EAGLE-3).

A drafter proposes only tokens of its *draft vocabulary*, the `draft_vocab` (N,) most frequent
target token ids of its training answers. Its head is the target's LM-head rows of those ids,
frozen and never stored: a drafter package holds `trainable_state()` and the head is rebuilt from
the target (`tie_head`) when the package is loaded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, Self, cast

import torch
from torch import Tensor, nn

from warpdecode.kernels.packed_linear import Linear
from warpdecode.models.backbone import Backbone
from warpdecode.models.config import ModelConfig
from warpdecode.models.net_config import NetConfig


def draft_backbone_config(target: ModelConfig, n_layer: int, draft_vocab_size: int, d_ff: int | None = None) -> ModelConfig:
    """The backbone of a drafter network that runs the target's kind of blocks (EAGLE's layer, Clover's
    augmenting block, the distilled draft model): the target's attention and MLP shapes (MLP width
    `d_ff` if given), `n_layer` blocks, the reduced vocabulary, an untied (frozen) head."""
    return dataclasses.replace(target, n_layer=n_layer, vocab_size=draft_vocab_size, tie_embeddings=False,
                               d_ff=d_ff or target.d_ff, eos_token_ids=[])


class DraftVocabNet(nn.Module):
    """Base of the drafter networks: the `draft_vocab` buffer and the frozen head found at `head_key`,
    built from a typed configuration (`config_class`, `from_config`) and naming the ONNX graphs it
    exports into an inference package (`graph_files`)."""

    draft_vocab: Tensor  # (N,) int64: target token id of each draft-vocabulary entry (a buffer)
    head_key: ClassVar[str]
    """State-dict key of the frozen head's weight (a bias-free `Linear` (N, C))."""
    config_class: ClassVar[type[NetConfig]]
    """The configuration a drafter package stores for this network (`drafter.json`'s `config`)."""
    stores_head: bool = False
    """The head's weights are the package's own (stored with the others, not rebuilt from the target)."""

    @classmethod
    def from_config(cls, target: ModelConfig, config: Any) -> Self:
        """An untrained network of `config` (an instance of `config_class`) for a target of `target`."""
        raise NotImplementedError

    @classmethod
    def from_package_config(cls, target: ModelConfig, config: Mapping[str, Any], where: str = "drafter.json") -> Self:
        """An untrained network of a package's `config` object (checked by `config_class.from_dict`)."""
        return cls.from_config(target, cls.config_class.from_dict(config, where))

    def graph_files(self) -> list[str]:
        """The ONNX graphs of this network in an inference package's drafter directory (written by
        `export.drafter_graphs`, run by `runtime.onnx_drafters`); none by default."""
        return []

    def __init__(self, draft_vocab_size: int) -> None:
        super().__init__()
        self.register_buffer("draft_vocab", torch.arange(draft_vocab_size), persistent=True)

    def frozen_head(self) -> Linear:
        return cast(Linear, self.get_submodule(self.head_key.removesuffix(".weight")))

    def tie_head(self, target: Backbone) -> None:
        """Set the (frozen) head to the target's LM head rows of `draft_vocab`."""
        head = self.frozen_head()
        embeddings = target.output_embeddings().detach()
        rows = embeddings[self.draft_vocab.to(embeddings.device)]
        head.weight = nn.Parameter(rows.to(head.weight.dtype).clone(), requires_grad=False)

    def pack(self) -> None:
        """Give the linear layers oneDNN-packed weight copies for CPU inference (`packed_linear`)."""
        raise NotImplementedError

    def trainable_state(self) -> dict[str, Tensor]:
        """The weights a drafter package stores: everything but the head (rebuilt from the target) unless
        `stores_head`."""
        return {k: v for k, v in self.state_dict().items() if k != self.head_key or self.stores_head}

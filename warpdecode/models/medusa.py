"""Medusa-1 and Hydra draft heads: K heads on the target's final feature, each guessing one token further ahead.

The target's final normed hidden state f_i (the *feature* its LM head reads) predicts x_{i+1}.
Head k (k = 1..K) predicts x_{i+1+k} from the same feature, through a small network and the
frozen reduced-vocabulary head (`draft_head.DraftVocabNet`):

* Medusa-1 (Cai et al. 2024): head k = `num_layers` residual blocks `x + SiLU(W x + b)` on f_i.
  The heads are independent of each other and of the tokens drafted before them.
* Hydra (Ankner et al. 2024): head k is *sequentially dependent*: it reads
  [f_i ; embed(x_{i+1}) ; ... ; embed(x_{i+k})], the feature and the embeddings of the k tokens
  between the feature and its prediction (x_{i+1} is the token the LM head chose; at inference the
  pending token, then the draft path). The embedding is the target's (passed in, never stored here).

    f_i ──► LM head ─► x_{i+1} ─► head 1 (Hydra reads x_{i+1}) ─► x_{i+2} ─► head 2 ... ─► x_{i+1+K}

A fresh head of either kind equals the LM head on f_i: W and b start at zero (the Medusa code zeroes
W only, which leaves a fresh head off the LM head by SiLU(b)), and Hydra's input projection starts as
the identity on the feature and zero on the embeddings.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Self, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from warpdecode.kernels.packed_linear import Linear
from warpdecode.models.config import ModelConfig
from warpdecode.models.draft_head import DraftVocabNet
from warpdecode.models.eagle import shift_left
from warpdecode.models.net_config import NetConfig
from warpdecode.models.transformer import Transformer


@dataclasses.dataclass(frozen=True, kw_only=True)
class HeadsConfig(NetConfig):
    """A Medusa or Hydra package's heads."""

    kind = "draft heads"
    draft_vocab_size: int
    num_heads: int
    num_layers: int
    """Residual blocks per head."""
    medusa2: dict[str, Any] | None = None
    """Medusa-2 heads: the LoRA adapters trained with them (`lora_rank`, `lora_targets`), recorded only."""


class ResBlock(nn.Module):
    """`P x + SiLU(W x + b)` with `P` the identity when the widths agree (Medusa's block), else a
    bias-free projection (Hydra's first block, which reads the feature and token embeddings)."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.linear = Linear(d_in, d_out, bias=True)
        self.skip = Linear(d_in, d_out, bias=False) if d_in != d_out else None

    def reset(self) -> None:
        """W = b = 0 and P = [I 0]: the block passes the first `d_out` inputs through."""
        with torch.no_grad():
            nn.init.zeros_(self.linear.weight)
            nn.init.zeros_(self.linear.bias)
            if self.skip is not None:
                nn.init.eye_(self.skip.weight)

    def forward(self, x: Tensor) -> Tensor:
        """x: (..., d_in) → (..., d_out)."""
        skip = x if self.skip is None else self.skip(x)
        return skip + F.silu(self.linear(x))

    def pack(self) -> None:
        self.linear.pack()
        if self.skip is not None:
            self.skip.pack()


class FutureHeads(DraftVocabNet):
    """K stacks of `ResBlock`s sharing one frozen reduced-vocabulary head; head k's first block reads
    `d_model * inputs(k)` values."""

    head_key = "head.weight"
    config_class = HeadsConfig

    def __init__(self, d_model: int, draft_vocab_size: int, num_heads: int, num_layers: int) -> None:
        super().__init__(draft_vocab_size)
        if num_heads < 1 or num_layers < 1:
            raise ValueError(f"need num_heads >= 1 and num_layers >= 1, got {num_heads}, {num_layers}")
        self.num_heads, self.num_layers = num_heads, num_layers
        self.heads = nn.ModuleList(
            nn.Sequential(ResBlock(d_model * self.inputs(k), d_model),
                          *(ResBlock(d_model, d_model) for _ in range(num_layers - 1)))
            for k in range(1, num_heads + 1)
        )
        self.head = Linear(d_model, draft_vocab_size, bias=False)

    @classmethod
    def from_config(cls, target: ModelConfig, config: HeadsConfig) -> Self:
        return cls(target.d_model, config.draft_vocab_size, config.num_heads, config.num_layers)

    def inputs(self, k: int) -> int:
        """How many d_model-wide vectors head k reads."""
        raise NotImplementedError

    def blocks(self) -> list[ResBlock]:
        return [cast(ResBlock, block) for stack in self.heads for block in cast(nn.Sequential, stack)]

    def init_from_target(self, target: Transformer, draft_vocab: Tensor) -> None:
        """Fresh heads (each equal to the LM head on the feature) for `draft_vocab` (N,) target token ids."""
        for block in self.blocks():
            block.reset()
        with torch.no_grad():
            self.draft_vocab.copy_(draft_vocab)
        self.tie_head(target)

    def pack(self) -> None:
        """oneDNN-packed weight copies for CPU inference (`packed_linear`)."""
        for block in self.blocks():
            block.pack()
        self.head.pack()

    def hidden(self, k: int, x: Tensor) -> Tensor:
        """Head k (1-based) before the frozen head: its inputs x (..., inputs(k) * C) → (..., C)."""
        return self.heads[k - 1](x)


class MedusaHeads(FutureHeads):
    """Medusa-1: every head reads the feature alone."""

    def inputs(self, k: int) -> int:
        return 1

    def graph_files(self) -> list[str]:
        """features (M, C) → logits (M, K, N), every head at once."""
        return ["heads.onnx"]

    def forward(self, features: Tensor) -> Tensor:
        """Args:
            features: (..., C) target features f_i.
        Returns:
            (..., K, N) draft-vocabulary logits; [..., k-1, :] scores x_{i+1+k}.
        """
        return self.head(torch.stack([self.hidden(k, features) for k in range(1, self.num_heads + 1)], dim=-2))


class HydraHeads(FutureHeads):
    """Hydra: head k reads the feature and the embeddings of the k tokens after it."""

    def inputs(self, k: int) -> int:
        return k + 1

    def graph_files(self) -> list[str]:
        """Head k = 1..K: features (M, C), embeds (M, k, C) → logits (M, N)."""
        return [f"head_{k}.onnx" for k in range(1, self.num_heads + 1)]

    def step(self, k: int, features: Tensor, embeds: Tensor) -> Tensor:
        """Head k at inference, on one row per draft-tree node.

        Args:
            features: (M, C) the feature f_i each row continues.
            embeds: (M, k, C) embeddings of x_{i+1} (the pending token) and the node's path to depth k-1.
        Returns:
            (M, N) draft-vocabulary logits of the token at depth k.
        """
        if embeds.shape[1:-1] != (k,):
            raise ValueError(f"head {k} reads {k} token embeddings per row, got embeds {tuple(embeds.shape)}")
        return self.head(self.hidden(k, torch.cat([features, embeds.flatten(1).to(features.dtype)], dim=-1)))

    def forward(self, features: Tensor, tokens: Tensor, embed: nn.Embedding) -> Tensor:
        """Every head at every position, teacher-forced: head k's inputs are the true tokens.

        Args:
            features: (B, T, C) target features f_0..f_{T-1}.
            tokens: (B, T) int64 tokens x_0..x_{T-1}.
        Returns:
            (B, T, K, N) draft-vocabulary logits; [:, i, k-1] scores x_{i+1+k} from f_i and
            x_{i+1}..x_{i+k}. Positions whose inputs run past the sequence read zero embeddings.
        """
        T = tokens.shape[1]
        embeds = embed(tokens).to(features.dtype)  # (B, T, C)
        shifted = [shift_left(embeds, j, T) for j in range(1, self.num_heads + 1)]  # x_{i+j}: (B, T, C) each
        hidden = [self.hidden(k, torch.cat([features] + shifted[:k], dim=-1)) for k in range(1, self.num_heads + 1)]
        return self.head(torch.stack(hidden, dim=-2))

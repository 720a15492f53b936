"""Learn2PD's filter: from the confidences of a block, which positions already hold their final token.

A small MLP reads, for the K positions of a diffusion LM's current block, the top-1 confidence of
each still-masked position (1 for positions already committed) and the mask pattern, and returns
one logit per position: whether the current prediction equals what one-token-per-step decoding
will finally write there. Trained post hoc with BCE on the model's own decoding trajectories
(`datamodules/trajectories.py`, `modules/parallel_filter.py`); run by the `learn2pd` commit policy.
"""

from __future__ import annotations

import dataclasses
from typing import Self

import torch
from torch import Tensor, nn

from warpdecode.errors import ConfigError
from warpdecode.models.net_config import NetConfig


def block_inputs(confidence: Tensor, masked: Tensor, block: Tensor) -> tuple[Tensor, Tensor]:
    """Gather each row's current block: (B, L) confidence / masked / block → (B, K) confidence, (B, K) masked.

    Every row's block must hold the same number K of positions (gen_length a multiple of block_length).
    """
    B = block.shape[0]
    sizes = block.sum(1)
    if not (sizes == sizes[0]).all():
        raise ConfigError("the learn2pd filter needs gen_length to be a multiple of block_length")
    return confidence[block].view(B, -1), masked[block].view(B, -1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParallelFilterConfig(NetConfig):
    """A `learn2pd` package's filter."""

    kind = "parallel-decoding filter"
    block_length: int
    hidden: int = 128


class ParallelFilter(nn.Module):
    @classmethod
    def from_config(cls, config: ParallelFilterConfig) -> Self:
        return cls(config.block_length, config.hidden)

    def __init__(self, block_length: int, hidden: int = 128) -> None:
        super().__init__()
        if block_length < 1 or hidden < 1:
            raise ConfigError(f"block_length and hidden must be positive, got {block_length}, {hidden}")
        self.block_length = block_length
        self.net = nn.Sequential(nn.Linear(2 * block_length, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                                 nn.Linear(hidden, block_length))

    def forward(self, confidence: Tensor, masked: Tensor) -> Tensor:
        """(N, K) fp32 confidence, (N, K) bool masked → (N, K) logits of "already final"."""
        if confidence.shape[-1] != self.block_length:
            raise ConfigError(f"this filter was trained for blocks of {self.block_length} positions, "
                              f"got {confidence.shape[-1]}")
        x = torch.cat([torch.where(masked, confidence, torch.ones_like(confidence)), masked.float()], dim=-1)
        return self.net(x)

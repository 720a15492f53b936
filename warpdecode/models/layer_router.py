"""FiRST's layer routers: which blocks of the target a request runs, decided once from its prompt.

One router per block reads the prompt's mean hidden state at that block's input (RMS-normalised, so
every layer's router sees the same scale) and returns the logit of "run this block". The decision is
made at prefill and fixed for the whole request, so the KV cache stays consistent: a skipped block
is skipped at every decoded position and its cache entries are never read. The first and the last
block always run. Trained with soft gates (`Transformer.forward(layer_gates=...)`) against the full
model (`modules/layer_router.py`); at decoding a block is skipped when its gate is below
`threshold`, at most `max_skip` of them, lowest gates first.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Self

import torch
from torch import Tensor, nn

from warpdecode.errors import ConfigError
from warpdecode.models.net_config import NetConfig


def prompt_means(hidden: Tensor, mask: Tensor | None = None) -> Tensor:
    """The RMS-normalised mean over the prompt of each block's input.

    Args:
        hidden: (B, L, T, C) block inputs (layer l: the input of block l).
        mask: (B, T) bool, True at prompt positions; None: every position.
    Returns:
        (B, L, C) float32.
    """
    hidden = hidden.float()
    if mask is None:
        mean = hidden.mean(dim=2)
    else:
        weights = mask[:, None, :, None].float()  # (B, 1, T, 1)
        mean = (hidden * weights).sum(dim=2) / weights.sum(dim=2).clamp_min(1.0)
    return mean * torch.rsqrt(mean.pow(2).mean(-1, keepdim=True) + 1e-6)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayerRouterConfig(NetConfig):
    """A `layer_router` package's routers and the decisions decoding takes by default."""

    kind = "layer router"
    writes_null: ClassVar[bool] = True
    n_layer: int
    d_model: int
    threshold: float = 0.5
    """A block whose gate is below this is skipped."""
    max_skip: int | None = None
    """Skip at most this many blocks (None: no limit)."""


class LayerRouter(nn.Module):
    @classmethod
    def from_config(cls, config: LayerRouterConfig) -> Self:
        return cls(config.n_layer, config.d_model)

    def __init__(self, n_layer: int, d_model: int, init_bias: float = 3.0) -> None:
        """Args:
        n_layer: L, the target's blocks.
        d_model: C, the target's hidden width.
        init_bias: every gate's initial logit (3.0: sigmoid 0.95, every block runs).
        """
        super().__init__()
        if n_layer < 3 or d_model < 1:
            raise ConfigError(f"a layer router needs n_layer >= 3 (the first and last always run) and d_model >= 1, "
                              f"got {n_layer}, {d_model}")
        self.n_layer, self.d_model = n_layer, d_model
        self.weight = nn.Parameter(torch.zeros(n_layer, d_model))
        self.bias = nn.Parameter(torch.full((n_layer,), init_bias))

    def forward(self, means: Tensor) -> Tensor:
        """(B, L, C) `prompt_means` → (B, L) gates in [0, 1]; the first and last block's are 1."""
        if means.shape[-2:] != (self.n_layer, self.d_model):
            raise ConfigError(f"this router reads ({self.n_layer}, {self.d_model}) prompt means, "
                              f"got {tuple(means.shape[-2:])}")
        gates = torch.sigmoid((means * self.weight).sum(-1) + self.bias)  # (B, L)
        fixed = torch.zeros(self.n_layer, dtype=torch.bool, device=gates.device)
        fixed[0] = fixed[-1] = True
        return torch.where(fixed, torch.ones_like(gates), gates)


def skipped_layers(gates: Tensor, threshold: float, max_skip: int | None = None) -> list[int]:
    """The blocks to skip for one request: gate below `threshold`, at most `max_skip` (lowest first).

    Example: gates [1, 0.2, 0.9, 0.4, 1], threshold 0.5 → [1, 3]; with max_skip 1 → [1].

    Args:
        gates: (L,) gates of one request.
    """
    order = sorted((float(g), i) for i, g in enumerate(gates.tolist()) if g < threshold)
    return sorted(i for _, i in order[:max_skip])

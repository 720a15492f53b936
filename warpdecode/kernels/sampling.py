"""Sampling with no host read and no generator state: counter-based uniforms and inverse-CDF draws.

A captured step cannot hold a per-request `torch.Generator` (its state lives outside the graph), and
`torch.multinomial` keeps state too. Here a draw is a pure function of (seed, counter): the uniform is
splitmix64 of those integers (int64 tensor ops, wrapping multiplication, logical shifts by masking),
and the token is the first whose cumulative probability exceeds `u x total`. The same seed gives the
same tokens on every device and in every form of the step (eager, static, captured).

Example: probs [0.5, 0, 0.5] and u = 0.7 → cumulative [0.5, 0.5, 1.0] → token 2; a token of
probability 0 is never drawn (its cumulative value equals its predecessor's).
"""

from __future__ import annotations

import torch
from torch import Tensor

from warpdecode.kernels.impl import Impl, resolve_impl

_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)  # splitmix64's constants as signed int64
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)


def _shift_right(z: Tensor, bits: int) -> Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def splitmix64(z: Tensor) -> Tensor:
    """splitmix64's finaliser of int64 `z` (any shape), elementwise, wrapping like uint64."""
    z = z + _GOLDEN
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    return z ^ _shift_right(z, 31)


def counter_uniforms(seed: Tensor, counters: Tensor, impl: Impl = "auto") -> Tensor:
    """Float64 uniforms in [0, 1), one per counter, a pure function of (seed, counter).

    Args:
        seed: (1,) or () int64, the request's seed.
        counters: (n,) int64, e.g. the positions the drawn tokens will take; distinct counters give
            independent draws, equal ones the same draw.
    Returns:
        (n,) float64.
    """
    resolve_impl(impl)
    z = splitmix64(splitmix64(seed.reshape(())) + counters)  # (n,)
    return _shift_right(z, 11).to(torch.float64) * (1.0 / (1 << 53))


def sample_rows(probs: Tensor, uniforms: Tensor, impl: Impl = "auto") -> Tensor:
    """One token per row by inverse CDF.

    Args:
        probs: (N, V) float, non-negative, each row with positive mass (need not sum to 1).
        uniforms: (N,) float64 in [0, 1).
    Returns:
        (N,) int64 tokens, row r drawn with probability probs[r] / probs[r].sum().
    """
    resolve_impl(impl)
    cdf = probs.to(torch.float64).cumsum(-1)  # (N, V)
    target = (uniforms * cdf[:, -1])[:, None]  # (N, 1)
    return torch.searchsorted(cdf, target, right=True)[:, 0].clamp(max=probs.shape[-1] - 1)

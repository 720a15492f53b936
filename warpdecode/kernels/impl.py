"""The implementation choice every kernel takes as an explicit argument (never a module global)."""

from __future__ import annotations

from typing import Literal, get_args

Impl = Literal["auto", "torch"]
"""`torch`: the pure-PyTorch reference; `auto`: the fastest available path for the tensors' device
(today the reference everywhere: a Triton path joins this choice when it is written and tested)."""


def resolve_impl(impl: str) -> Impl:
    """The implementation a call runs: `auto` resolves to the reference until a faster path exists."""
    if impl not in get_args(Impl):
        raise ValueError(f"impl must be one of {', '.join(get_args(Impl))}, got {impl!r}")
    return "torch"

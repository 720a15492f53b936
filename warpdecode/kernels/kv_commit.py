"""Commit the accepted path of a tree forward in a static KV cache, on the device.

A verify forward over W rows wrote row `r`'s keys and values at slot `start + slot_of_row[r]`. The
accepted path's rows (pending first) must end up at `start + 0, 1, ..., A`. For a chain they already
are (row d is at slot d): the commit is skipped, decided once from the tree's shape, not per step.

Example: start 10, path rows [0, 2, 4] written at slots 10, 12, 14 → copied to 10, 11, 12.
"""

from __future__ import annotations

import torch
from torch import Tensor

from warpdecode.kernels.impl import Impl, resolve_impl


def commit_tree_path(k: Tensor, v: Tensor, start: Tensor, src_slots: Tensor, *, in_place: bool,
                     impl: Impl = "auto") -> None:
    """Move the accepted path's keys and values into place (gather first: sources and destinations
    overlap). Entries past the accepted length copy something into slots past the new length, which
    nothing reads.

    Args:
        k, v: (L, B, Hkv, S, D) the cache's keys and values (every row of the batch shares `start`).
        start: (1,) int64, the cache length before the verify forward.
        src_slots: (A + 1,) int64, the slot (relative to `start`) of each kept row, pending first.
        in_place: the rows are already in place (a chain, forward rows written in order): no-op.
    """
    resolve_impl(impl)
    if in_place:
        return
    width = src_slots.shape[0]
    src = start + src_slots  # (A + 1,)
    dst = start + torch.arange(width, device=start.device)  # (A + 1,)
    k.index_copy_(3, dst, k.index_select(3, src))
    v.index_copy_(3, dst, v.index_select(3, src))

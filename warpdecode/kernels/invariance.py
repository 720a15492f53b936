"""Batch-invariant computation: a row's result that does not depend on the other rows of its batch.

A server decodes many requests in one forward, and a request's answer at temperature 0 must not
change with what else is in the batch (`docs/serve.md`). Two kernels break that on CPU, measured:

* a oneDNN matmul of ONE row takes a different path (a matrix-vector product) than a matmul of two
  or more rows, and rounds differently in the last bits (the default model's `down_proj`, 1536 inputs:
  up to 1.7e-4); from two rows up, each row's result is the same whatever the number of rows (checked
  for 2..200 rows);
* scaled-dot-product attention of a batch differs in the last bit from the same rows attended one
  by one (1e-7), and a row padded to a longer key length under a mask differs from the row over its
  own keys.

Inside `batch_invariant()`, the linear kernels run a single row as two (the row twice, one result
kept) and decoding attention runs each row over exactly its own keys (`models/transformer.py`), so
a row computes the same numbers at batch 1, 3 or 16. Rows named in `ragged` (those that verify
draft trees) run their attention, in decode and verify steps alike, as one `ragged_attention` for
all of them (`kernels/ragged_attention.py`: one call per layer, not one per verified position); the
others run one SDPA per row and query. The flags are per thread: a server's scheduler thread turns
them on for its forwards without changing anyone else's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor

_state = threading.local()


@contextmanager
def batch_invariant(on: bool = True, ragged: Sequence[int] = ()) -> Iterator[None]:
    """Run the forwards in this block (this thread only) batch-invariantly; `ragged`: the rows whose
    attention runs as `ragged_attention` (a row must use it at every step, or never)."""
    previous = getattr(_state, "on", False), getattr(_state, "ragged", ())
    _state.on, _state.ragged = on, tuple(ragged)
    try:
        yield
    finally:
        _state.on, _state.ragged = previous


@contextmanager
def padded_rows(lengths: Sequence[int]) -> Iterator[None]:
    """In the forwards of this block (this thread only) over `len(lengths)` rows, row b's new positions
    from `lengths[b]` on are padding (a batch's draft trees padded to one width): their hidden states and
    logits are unspecified, and a forward may skip them (the native decoder stack and the LM head do).
    Their cache slots may be left unwritten: they must never be kept."""
    previous = getattr(_state, "lengths", None)
    _state.lengths = tuple(lengths)
    try:
        yield
    finally:
        _state.lengths = previous


def padding_lengths() -> tuple[int, ...] | None:
    """The real positions per row of this thread's padded forwards (`padded_rows`), or None."""
    return getattr(_state, "lengths", None)


def is_batch_invariant() -> bool:
    return getattr(_state, "on", False)


def ragged_rows() -> tuple[int, ...]:
    """The rows of this thread's batch-invariant forwards that run `ragged_attention`."""
    return getattr(_state, "ragged", ()) if is_batch_invariant() else ()


def rows_invariant(matmul: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """`matmul(x)` for (..., in) activations; inside `batch_invariant()`, one row runs as two so that it
    takes the many-row kernel every batch size uses (`matmul` maps (M, in) or (..., in) to (..., out))."""
    if not is_batch_invariant() or x.numel() != x.shape[-1]:
        return matmul(x)
    flat = x.reshape(1, x.shape[-1])
    y = matmul(torch.cat([flat, flat]))[:1]  # (1, out)
    return y.reshape(*x.shape[:-1], y.shape[-1])

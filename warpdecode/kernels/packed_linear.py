"""Linear layers with a oneDNN-packed copy of their weight for CPU inference.

Decoding multiplies one to a few dozen rows by every weight matrix, which is memory-bound; oneDNN's
blocked weight layout streams the weight about twice as fast on CPU as the dense row-major layout
`F.linear` reads (measured on the default model: 49 ms → 26 ms for all of its matrices at one row,
60 ms → 30 ms at eight rows; `docs/benchmarks.md`).

The dense weight stays the parameter: training, `state_dict`, export and every non-CPU device use
it, and it is the reference the packed path is tested against. The packed copy is used only when
autograd is off, and only while the parameter is unchanged: an optimizer step, `load_state_dict` or
a move to another device changes the parameter's version or storage, and the stale copy is dropped.
It costs one extra copy of the weights in memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from warpdecode.kernels.invariance import rows_invariant

PACK_BATCH_HINT = 8
"""Rows oneDNN tunes the packed layout for; measured best for 1..64 rows on the default model."""


def _weight_key(weight: Tensor) -> tuple[int, int]:
    return weight._version, weight.data_ptr()


def can_pack(weight: Tensor) -> bool:
    return (weight.device.type == "cpu" and weight.dtype == torch.float32 and not weight.is_inference()
            and torch.backends.mkldnn.is_available())


@dataclass(frozen=True)
class PackedWeight:
    """A oneDNN-layout copy of one or more `(out_i, in)` weights stacked along `out`, and the
    versions of the weights it was made from."""

    packed: Tensor  # (sum out_i, in), mkldnn layout
    bias: Tensor | None  # (sum out_i,) or None
    keys: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, weights: Sequence[Tensor], biases: Sequence[Tensor | None] = ()) -> PackedWeight | None:
        """Pack `weights` (stacked), or None where packing is unavailable (non-CPU, non-fp32, no oneDNN)."""
        if not all(can_pack(w) for w in weights):
            return None
        with torch.no_grad():
            stacked = weights[0].detach() if len(weights) == 1 else torch.cat([w.detach() for w in weights])
            packed = torch.ops.mkldnn._reorder_linear_weight(stacked, PACK_BATCH_HINT)
            bias = None if not biases or biases[0] is None else torch.cat([b.detach() for b in biases if b is not None])
        return cls(packed, bias, tuple(_weight_key(w) for w in weights))

    def fresh_for(self, weights: Sequence[Tensor]) -> bool:
        return self.keys == tuple(_weight_key(w) for w in weights)

    def usable(self, x: Tensor, weights: Sequence[Tensor]) -> bool:
        return not torch.is_grad_enabled() and x.dtype == torch.float32 and self.fresh_for(weights)

    def __call__(self, x: Tensor) -> Tensor:
        return rows_invariant(self._matmul, x)

    def _matmul(self, x: Tensor) -> Tensor:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias, "none", [], "")


def linear(x: Tensor, weight: Tensor, packed: PackedWeight | None) -> Tensor:
    """`F.linear(x, weight)` (no bias), through `packed` when it is current and autograd is off.

    Args:
        x: (..., in) activations.
        weight: (out, in) dense weight, the reference.
    Returns:
        (..., out).
    """
    if packed is not None and packed.usable(x, (weight,)):
        return packed(x)
    return F.linear(x, weight)


class QuantizedMatmul(Protocol):
    def __call__(self, x: Tensor) -> Tensor: ...


class Linear(nn.Linear):
    """`nn.Linear` (same parameters and state-dict keys) that can hold a packed copy of its weight,
    or, in an inference-only quantised copy of a model (`models.quantized`), run its quantised weights instead."""

    packed: PackedWeight | None = None
    quantized: QuantizedMatmul | None = None

    def pack(self) -> bool:
        """Make or refresh the packed copy; False where packing is unavailable."""
        if self.packed is None or not self.packed.fresh_for((self.weight,)):
            self.packed = PackedWeight.of((self.weight,), (self.bias,))
        return self.packed is not None

    def unpack(self) -> None:
        self.packed = None

    def forward(self, x: Tensor) -> Tensor:
        if self.quantized is not None:
            return self.quantized(x)
        if self.packed is not None and self.packed.usable(x, (self.weight,)):
            return self.packed(x)
        return F.linear(x, self.weight, self.bias)


class FusedLinear:
    """Several `Linear`s reading the same input, run as one packed matmul when packed.

    Not a module: the layers stay registered where they are (their state-dict keys do not change);
    this only holds the stacked packed copy. Unpacked, it runs the layers one by one (the reference).
    """

    def __init__(self, layers: Sequence[Linear]) -> None:
        self.layers = tuple(layers)
        self.sizes = [layer.out_features for layer in self.layers]
        self.packed: PackedWeight | None = None
        self.quantized: QuantizedMatmul | None = None  # the stacked weight of a quantised copy (`models.quantized`)

    def _weights(self) -> tuple[Tensor, ...]:
        return tuple(layer.weight for layer in self.layers)

    def pack(self) -> bool:
        if self.packed is None or not self.packed.fresh_for(self._weights()):
            self.packed = PackedWeight.of(self._weights(), tuple(layer.bias for layer in self.layers))
        return self.packed is not None

    def unpack(self) -> None:
        self.packed = None

    def __call__(self, x: Tensor) -> tuple[Tensor, ...]:
        """(..., in) → one (..., out_i) tensor per layer."""
        if self.quantized is not None:
            return tuple(self.quantized(x).split(self.sizes, dim=-1))
        if self.packed is not None and self.packed.usable(x, self._weights()):
            return tuple(self.packed(x).split(self.sizes, dim=-1))
        return tuple(layer(x) for layer in self.layers)

"""Weight-only quantised weights and their CPU matmuls: the fast path of a quantised linear layer.

Two formats, both multiplied with bf16 activations by torch's CPU weight-only kernels:

* `Int8Weight`: per-output-channel symmetric int8 (`w ≈ q * scale`), `_weight_int8pack_mm`; a
  quarter of the fp32 bytes.
* `Int4Weight`: group-wise asymmetric 4-bit (`w ≈ q * scale + min` per group of 32 inputs),
  `_weight_int4pack_mm_for_cpu`; an eighth of the fp32 bytes. A checkpoint that was itself
  distributed as Q4_1 (the default model) is represented exactly up to bf16 scales: Q4_1's blocks
  of 32 attain 0 and 15, so min/max regrouping recovers them.

The tests compare each kernel with an independent dequantised reference (int8: `dequantized()`;
int4: the group-wise min/max rounding recomputed densely). `models/quantized.py` builds quantised
copies of a model from these weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

ACTIVATION_DTYPE = torch.bfloat16
"""Activations enter the quantised products in bf16 (the kernels' fast path); results return in x's dtype."""
INT8_K_MULTIPLE = 16
"""`_weight_int8pack_mm` reads the reduction dimension in blocks of 16 (other sizes return garbage
or crash), so weights are zero-padded to a multiple of it and activations padded per call."""
INT4_GROUP = 32
"""Inputs per int4 quantisation group (Q4_1's block size); the reduction dimension is padded to it."""
INT4_N_MULTIPLE = 16
"""`_convert_weight_to_int4pack_for_cpu` needs the output dimension in multiples of 16."""

Bits = Literal[4, 8]


def _pad_input(x: Tensor, width: int) -> Tensor:
    """(..., in) → (rows, width) bf16, zero-padded on the right."""
    flat = x.reshape(-1, x.shape[-1]).to(ACTIVATION_DTYPE)
    return flat if flat.shape[1] == width else F.pad(flat, (0, width - flat.shape[1]))


@dataclass(frozen=True)
class Int8Weight:
    """Per-output-channel int8 weight `(out, in)` with its `(out,)` scales."""

    qweight: Tensor  # (out, in padded to a multiple of 16) int8
    scales: Tensor  # (out,) bf16
    bias: Tensor | None  # (out,) bf16 or None, added to the bf16 product
    in_features: int

    @classmethod
    def of(cls, weight: Tensor, bias: Tensor | None = None) -> Int8Weight:
        """Quantise an `(out, in)` float weight."""
        w = weight.detach().float()
        scales = (w.abs().amax(dim=1) / 127).clamp_min(1e-12)  # (out,)
        # in place: one float temporary of the weight's size (an LM head's is 113 MB in the default model)
        q = (w / scales[:, None]).round_().clamp_(-127, 127).to(torch.int8)
        q = F.pad(q, (0, -q.shape[1] % INT8_K_MULTIPLE))  # (out, in rounded up to a multiple of 16)
        b = None if bias is None else bias.detach().to(ACTIVATION_DTYPE)
        return cls(q.contiguous(), scales.to(ACTIVATION_DTYPE), b, weight.shape[1])

    def dequantized(self) -> Tensor:
        """(out, in) float32, the reference the int8 kernel is tested against."""
        return self.qweight[:, : self.in_features].float() * self.scales.float()[:, None]

    def __call__(self, x: Tensor) -> Tensor:
        """(..., in) → (..., out) in x's dtype (the product itself runs with bf16 activations)."""
        y = torch.ops.aten._weight_int8pack_mm(_pad_input(x, self.qweight.shape[1]), self.qweight, self.scales)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], y.shape[-1]).to(x.dtype)


@dataclass(frozen=True)
class Int4Weight:
    """Group-wise asymmetric 4-bit weight `(out, in)`: per group of 32 inputs, `w ≈ q * scale + min`."""

    packed: Tensor  # torch's CPU int4 layout of (out padded to 16, in padded to 32)
    scales_and_zeros: Tensor  # (in padded / 32, out padded, 2) bf16: scale and `min + 8 * scale`
    bias: Tensor | None  # (out,) bf16 or None
    in_features: int
    out_features: int

    @classmethod
    def of(cls, weight: Tensor, bias: Tensor | None = None) -> Int4Weight:
        """Quantise an `(out, in)` float weight."""
        w = weight.detach().float()
        w = F.pad(w, (0, -w.shape[1] % INT4_GROUP))  # (out, K): K padded to a multiple of 32
        groups = w.view(w.shape[0], -1, INT4_GROUP)
        low, high = groups.amin(-1), groups.amax(-1)
        scale = ((high - low) / 15).clamp_min(1e-12)
        q = ((groups - low[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.int32)
        return cls.of_groups(q.view(w.shape), scale, low, bias, weight.shape[1])

    @classmethod
    def of_groups(cls, q: Tensor, scale: Tensor, low: Tensor, bias: Tensor | None, in_features: int) -> Int4Weight:
        """From quantised groups as Q4_1 stores them, `w = q * scale + low` per group of 32 inputs (no
        float weight is made).

        Args:
            q: (out, K) integers in [0, 15], K a multiple of 32 (the inputs zero-padded to it).
            scale, low: (out, K / 32) float.
            bias: (out,) or None.
            in_features: the inputs before padding.
        """
        out = q.shape[0]
        pad = -out % INT4_N_MULTIPLE
        q, scale, low = (F.pad(t, (0, 0, 0, pad)) for t in (q.to(torch.int32), scale.float(), low.float()))
        # The kernel dequantises as (q - 8) * scale + zero, so zero = min + 8 * scale.
        scales_and_zeros = torch.stack([scale, low + 8 * scale], -1).transpose(0, 1).contiguous().to(ACTIVATION_DTYPE)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.contiguous(), 1)
        b = None if bias is None else bias.detach().to(ACTIVATION_DTYPE)
        return cls(packed, scales_and_zeros, b, in_features, out)

    def __call__(self, x: Tensor) -> Tensor:
        """(..., in) → (..., out) in x's dtype (the product itself runs with bf16 activations)."""
        flat = _pad_input(x, self.scales_and_zeros.shape[0] * INT4_GROUP)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, INT4_GROUP, self.scales_and_zeros)
        y = y[:, : self.out_features]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], y.shape[-1]).to(x.dtype)


QUANTIZERS: dict[int, type[Int8Weight | Int4Weight]] = {8: Int8Weight, 4: Int4Weight}


def quantized_available(bits: int) -> bool:
    """Whether this torch build runs the CPU weight-only kernel for `bits` (4 or 8)."""
    try:
        QUANTIZERS[bits].of(torch.ones(16, 32))(torch.ones(1, 32))
    except (RuntimeError, NotImplementedError, AttributeError):
        return False
    return True

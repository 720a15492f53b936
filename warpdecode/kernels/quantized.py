"""Weight-only quantised weights and their CPU matmuls: the fast path of a quantised linear layer.

Two formats:

* `Int8Weight`: per-output-channel symmetric int8 (`w ≈ q * scale`); a quarter of the fp32 bytes.
* `Int4Weight`: group-wise asymmetric 4-bit (`w ≈ q * scale + min` per group of 32 inputs); an
  eighth of the fp32 bytes. A checkpoint that was itself distributed as Q4_1 (the default model) is
  represented exactly up to the scales' storage: Q4_1's blocks of 32 attain 0 and 15, so min/max
  regrouping recovers them.

Each has two kernels, chosen when the weight is made (`impl`, `auto` by default):

* `native` (`Block*Weight`): the block matmul on 8-bit activations (`kernels/block_matmul.py`, the
  scheme of llama.cpp's Q4_1 x Q8_1 dot products, AVX-512 VNNI or AVX2); fp16 int4 scales (Q4_1 exactly),
  float32 int8 scales. A row's outputs do not depend on the other rows of the call, and a verify of
  8 rows costs a fraction of 8 one-row steps.
* `torch` (`Torch*Weight`): torch's CPU weight-only kernels with bf16 activations
  (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`), bf16 scales; the fallback where the
  native kernel did not compile or the CPU has neither VNNI nor AVX2.

The two kernels are different quantised models (activation rounding, scale storage): a model runs
every step through the weights it was made with. The tests compare each kernel with an independent
dequantised reference. `models/quantized.py` builds quantised copies of a model from these weights.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from warpdecode.kernels.block_matmul import (
    BLOCK,
    INT8_BLOCK_BYTES,
    TILE,
    block_matmul,
    native_library,
    pack_int4,
    pack_int8,
    unpack_int4,
    unpack_int8,
)

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


QuantImpl = Literal["auto", "torch", "native"]
"""`torch`: torch's CPU weight-only kernels (bf16 activations); `native`: the block matmul on 8-bit
activations (`kernels/block_matmul.py`); `auto`: native where it compiled with its fast path, else torch."""


def resolve_quant_impl(impl: str) -> Literal["torch", "native"]:
    """The kernel a weight made with `impl` runs (ValueError on a bad name, or `native` unavailable)."""
    if impl not in ("auto", "torch", "native"):
        raise ValueError(f"impl must be one of auto, torch, native, got {impl!r}")
    if impl == "torch":
        return "torch"
    reason = native_library()
    if impl == "native" and isinstance(reason, str):
        raise ValueError(f"the native block matmul is unavailable: {reason}")
    return "torch" if isinstance(reason, str) else "native"


def _float_bias(bias: Tensor | None) -> Tensor | None:
    return None if bias is None else bias.detach().float().contiguous()


def _block_input(x: Tensor, width: int) -> Tensor:
    """(..., in) → (rows, width) float32, zero-padded on the right."""
    flat = x.reshape(-1, x.shape[-1]).float()
    return flat if flat.shape[1] == width else F.pad(flat, (0, width - flat.shape[1]))


def _finish(y: Tensor, bias: Tensor | None, x: Tensor) -> Tensor:
    """(rows, out) product → (..., out) in x's dtype, bias added."""
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], y.shape[-1]).to(x.dtype)


W8 = TypeVar("W8", bound="Int8Weight")


def _placed(first: W8, rest: Iterator[W8], rows: int, tile: int) -> Iterator[tuple[int, W8]]:
    """`first` and `rest` with the row each starts at, checked as they come: the same inputs and
    bias presence, a multiple of `tile` rows before every part, `rows` rows in all."""
    at = 0
    for part in itertools.chain([first], rest):
        if part.in_features != first.in_features or (part.bias is None) != (first.bias is None):
            raise ValueError("stacked int8 weights need the same inputs and bias")
        if at % tile:
            raise ValueError(f"only the last stacked int8 part may have rows that are not a multiple of {tile}")
        yield at, part
        at += part.out_features
    if at != rows:
        raise ValueError(f"stacked int8 parts hold {at} rows, not {rows}")


class Int8Weight(ABC):
    """Per-output-channel symmetric int8 weight `(out, in)`: `w ≈ q * scale`, q in [-127, 127]."""

    in_features: int
    out_features: int
    bias: Tensor | None

    @staticmethod
    def of(weight: Tensor, bias: Tensor | None = None, *, impl: QuantImpl = "auto") -> Int8Weight:
        """Quantise an `(out, in)` float weight for the kernel `impl` resolves to."""
        return Int8Weight.of_quantized(*int8_rows(weight), bias, impl=impl)

    @staticmethod
    def of_quantized(q: Tensor, scales: Tensor, bias: Tensor | None = None, *,
                     impl: QuantImpl = "auto") -> Int8Weight:
        """From `int8_rows`' q (out, in) int8 and scales (out,) float32."""
        if resolve_quant_impl(impl) == "native":
            return BlockInt8Weight.of_rows(q, scales, bias)
        return TorchInt8Weight.of_rows(q, scales, bias)

    @staticmethod
    def stacked(parts: Iterable[Int8Weight], rows: int) -> Int8Weight:
        """The weight of `parts`' rows one after another (each part quantised alone with the same kernel,
        `rows` in all), copied into place one part at a time: a caller that makes the parts lazily
        never holds more than one part beside the result. Every part but the last has a multiple of
        16 rows."""
        it = iter(parts)
        first = next(it)
        return type(first).stack(itertools.chain([first], it), rows)

    @classmethod
    @abstractmethod
    def stack(cls, parts: Iterator[Any], rows: int) -> Int8Weight:
        """`stacked` for parts of this kernel (`parts` non-empty)."""

    @abstractmethod
    def dequantized(self) -> Tensor:
        """(out, in) float32: the weight as the kernel sees it (the reference the kernel is tested against)."""

    @abstractmethod
    def first_rows(self, n: int) -> Int8Weight:
        """The weight of the first `n` output channels alone (its own copy; the same outputs for them)."""

    @property
    @abstractmethod
    def bias_float(self) -> Tensor | None:
        """(out,) float32 or None."""

    @abstractmethod
    def __call__(self, x: Tensor) -> Tensor:
        """(..., in) → (..., out) in x's dtype."""


@dataclass(frozen=True)
class TorchInt8Weight(Int8Weight):
    """`_weight_int8pack_mm` with bf16 activations."""

    qweight: Tensor  # (out, in padded to a multiple of 16) int8
    scales: Tensor  # (out,) bf16
    bias: Tensor | None  # (out,) bf16 or None, added to the bf16 product
    in_features: int

    @classmethod
    def of_rows(cls, q: Tensor, scales: Tensor, bias: Tensor | None) -> TorchInt8Weight:
        """q: (out, in) int8; scales: (out,) float."""
        padded = F.pad(q, (0, -q.shape[1] % INT8_K_MULTIPLE))  # (out, in rounded up to a multiple of 16)
        b = None if bias is None else bias.detach().to(ACTIVATION_DTYPE)
        return cls(padded.contiguous(), scales.to(ACTIVATION_DTYPE), b, q.shape[1])

    @classmethod
    def stack(cls, parts: Iterator[TorchInt8Weight], rows: int) -> TorchInt8Weight:
        first = next(parts)
        q = first.qweight.new_empty(rows, first.qweight.shape[1])
        scales = first.scales.new_empty(rows)
        bias = None if first.bias is None else first.bias.new_empty(rows)
        for at, part in _placed(first, parts, rows, 1):
            n = part.out_features
            q[at : at + n], scales[at : at + n] = part.qweight, part.scales
            if bias is not None and part.bias is not None:
                bias[at : at + n] = part.bias
        return cls(q, scales, bias, first.in_features)

    def dequantized(self) -> Tensor:
        return self.qweight[:, : self.in_features].float() * self.scales.float()[:, None]

    @property
    def out_features(self) -> int:  # type: ignore[override]
        return self.qweight.shape[0]

    def first_rows(self, n: int) -> TorchInt8Weight:
        bias = None if self.bias is None else self.bias[:n].clone()
        return TorchInt8Weight(self.qweight[:n].clone(), self.scales[:n].clone(), bias, self.in_features)

    @property
    def bias_float(self) -> Tensor | None:
        return None if self.bias is None else self.bias.float()

    def __call__(self, x: Tensor) -> Tensor:
        """(..., in) → (..., out) in x's dtype (the product itself runs with bf16 activations)."""
        y = torch.ops.aten._weight_int8pack_mm(_pad_input(x, self.qweight.shape[1]), self.qweight, self.scales)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], y.shape[-1]).to(x.dtype)


@dataclass(frozen=True)
class BlockInt8Weight(Int8Weight):
    """The native block matmul (`kernels/block_matmul.py`) with 8-bit activations."""

    blocks: Tensor  # pack_int8 of (out, in padded to a multiple of 32)
    scales: Tensor  # (out padded to a multiple of 16,) float32
    bias: Tensor | None  # (out,) float32 or None
    in_features: int
    out_features: int

    @classmethod
    def of_rows(cls, q: Tensor, scales: Tensor, bias: Tensor | None) -> BlockInt8Weight:
        """q: (out, in) int8; scales: (out,) float."""
        n = q.shape[0]
        blocks = pack_int8(F.pad(q, (0, -q.shape[1] % BLOCK)))
        return cls(blocks, F.pad(scales.float(), (0, -n % TILE)).contiguous(), _float_bias(bias), q.shape[1], n)

    @classmethod
    def stack(cls, parts: Iterator[BlockInt8Weight], rows: int) -> BlockInt8Weight:
        first = next(parts)
        tile_bytes = first.width // BLOCK * INT8_BLOCK_BYTES
        blocks = first.blocks.new_empty(-(-rows // TILE) * tile_bytes)
        scales = first.scales.new_zeros(rows + -rows % TILE)
        bias = None if first.bias is None else first.bias.new_empty(rows)
        for at, part in _placed(first, parts, rows, TILE):
            n = part.out_features
            blocks[at // TILE * tile_bytes : at // TILE * tile_bytes + part.blocks.numel()] = part.blocks
            scales[at : at + n] = part.scales[:n]
            if bias is not None and part.bias is not None:
                bias[at : at + n] = part.bias
        return cls(blocks, scales, bias, first.in_features, rows)

    @property
    def width(self) -> int:
        """The inputs padded to a multiple of 32."""
        return self.in_features + -self.in_features % BLOCK

    def dequantized(self) -> Tensor:
        q = unpack_int8(self.blocks, self.out_features, self.width)[:, : self.in_features]
        return q.float() * self.scales[: self.out_features, None]

    def first_rows(self, n: int) -> BlockInt8Weight:
        tiles = -(-n // TILE)
        part = self.blocks[: tiles * (self.width // BLOCK) * INT8_BLOCK_BYTES]
        bias = None if self.bias is None else self.bias[:n].clone()
        if n % TILE:  # the last tile holds channels past n: repack it without them
            q = unpack_int8(part, n, self.width)[:, : self.in_features]
            return BlockInt8Weight.of_rows(q, self.scales[:n], bias)
        return BlockInt8Weight(part.clone(), self.scales[:n].clone(), bias, self.in_features, n)

    @property
    def bias_float(self) -> Tensor | None:
        return self.bias

    def __call__(self, x: Tensor) -> Tensor:
        y = block_matmul(_block_input(x, self.width), self.blocks, 8, self.out_features, self.scales)
        return _finish(y, self.bias, x)


class Int4Weight(ABC):
    """Group-wise asymmetric 4-bit weight `(out, in)`: per group of 32 inputs, `w ≈ q * scale + min`."""

    in_features: int
    out_features: int

    @staticmethod
    def of(weight: Tensor, bias: Tensor | None = None, *, impl: QuantImpl = "auto") -> Int4Weight:
        """Quantise an `(out, in)` float weight."""
        return Int4Weight.of_groups(*int4_groups(weight), bias, weight.shape[1], impl=impl)

    @staticmethod
    def of_groups(q: Tensor, scale: Tensor, low: Tensor, bias: Tensor | None, in_features: int, *,
                  impl: QuantImpl = "auto") -> Int4Weight:
        """From quantised groups as Q4_1 stores them, `w = q * scale + low` per group of 32 inputs (no
        float weight is made).

        Args:
            q: (out, K) integers in [0, 15], K a multiple of 32 (the inputs zero-padded to it).
            scale, low: (out, K / 32) float (kept as bf16 by torch's kernel, fp16 by the native one).
            bias: (out,) or None.
            in_features: the inputs before padding.
        """
        if resolve_quant_impl(impl) == "native":
            return BlockInt4Weight(pack_int4(q, scale, low), _float_bias(bias), in_features, q.shape[0], q.shape[1])
        return TorchInt4Weight.from_groups(q, scale, low, bias, in_features)

    @abstractmethod
    def __call__(self, x: Tensor) -> Tensor:
        """(..., in) → (..., out) in x's dtype."""


@dataclass(frozen=True)
class TorchInt4Weight(Int4Weight):
    """`_weight_int4pack_mm_for_cpu` with bf16 activations."""

    packed: Tensor  # torch's CPU int4 layout of (out padded to 16, in padded to 32)
    scales_and_zeros: Tensor  # (in padded / 32, out padded, 2) bf16: scale and `min + 8 * scale`
    bias: Tensor | None  # (out,) bf16 or None
    in_features: int
    out_features: int

    @classmethod
    def from_groups(cls, q: Tensor, scale: Tensor, low: Tensor, bias: Tensor | None,
                    in_features: int) -> TorchInt4Weight:
        """`Int4Weight.of_groups` for torch's kernel."""
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


@dataclass(frozen=True)
class BlockInt4Weight(Int4Weight):
    """The native block matmul (`kernels/block_matmul.py`) with 8-bit activations."""

    blocks: Tensor  # pack_int4 of (out, width)
    bias: Tensor | None  # (out,) float32 or None
    in_features: int
    out_features: int
    width: int
    """The inputs padded to a multiple of 32."""

    def groups(self) -> tuple[Tensor, Tensor, Tensor]:
        """q (out, width) uint8, scale and min (out, width / 32) float32, as the kernel reads them."""
        return unpack_int4(self.blocks, self.out_features, self.width)

    def __call__(self, x: Tensor) -> Tensor:
        y = block_matmul(_block_input(x, self.width), self.blocks, 4, self.out_features)
        return _finish(y, self.bias, x)


ROWS_PER_CHUNK = 1024
"""Rows quantised at a time by `int4_groups` and `int8_rows`: their float temporaries are a chunk's, not the weight's
(a 1.5B model's gate/up matrix is 110 MB of float32; five whole temporaries made its load's peak)."""


def int8_rows(weight: Tensor) -> tuple[Tensor, Tensor]:
    """`Int8Weight.of`'s quantisation of an `(out, in)` float weight, per output channel: `scales =
    max|w| / 127` (at least 1e-12), `q = round(w / scale)`. Returns q (out, in) int8 and scales (out,)
    float32, made `ROWS_PER_CHUNK` rows at a time (each row alone: the same values)."""
    w = weight.detach()
    q = torch.empty(w.shape, dtype=torch.int8)
    scales = torch.empty(w.shape[0])
    for lo in range(0, w.shape[0], ROWS_PER_CHUNK):
        part = w[lo : lo + ROWS_PER_CHUNK].float()
        s = scales[lo : lo + part.shape[0]]
        s[:] = (part.abs().amax(dim=1) / 127).clamp_min(1e-12)
        q[lo : lo + part.shape[0]] = (part / s[:, None]).round_().clamp_(-127, 127)
    return q, scales


def int4_groups(weight: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """`Int4Weight.of`'s groups of an `(out, in)` float weight: per group of 32 inputs (the inputs
    zero-padded to a multiple of 32), `w ≈ q * scale + low` with `low`, `high` the group's extremes,
    `scale = (high - low) / 15` and `q = round((w - low) / scale)`.

    Returns:
        q (out, K) uint8 in [0, 15], scale and low (out, K / 32) float32; made `ROWS_PER_CHUNK`
        rows at a time (each row's groups alone: the same values as the whole at once).
    """
    w = weight.detach()
    out, K = w.shape[0], w.shape[1] + -w.shape[1] % INT4_GROUP
    q = torch.empty(out, K, dtype=torch.uint8)
    scale, low = torch.empty(out, K // INT4_GROUP), torch.empty(out, K // INT4_GROUP)
    for lo in range(0, out, ROWS_PER_CHUNK):
        hi = min(lo + ROWS_PER_CHUNK, out)
        groups = F.pad(w[lo:hi].float(), (0, K - w.shape[1])).view(hi - lo, -1, INT4_GROUP)
        low[lo:hi], high = groups.amin(-1), groups.amax(-1)
        scale[lo:hi] = ((high - low[lo:hi]) / 15).clamp_min(1e-12)
        q[lo:hi] = ((groups - low[lo:hi, :, None]) / scale[lo:hi, :, None]).round_().clamp_(0, 15).view(hi - lo, K)
    return q, scale, low


QUANTIZERS: dict[int, type[Int8Weight | Int4Weight]] = {8: Int8Weight, 4: Int4Weight}


def quantized_available(bits: int) -> bool:
    """Whether a CPU weight-only kernel runs `bits`-bit weights (4 or 8): the native one, or torch's."""
    try:
        QUANTIZERS[bits].of(torch.ones(16, 32))(torch.ones(1, 32))
    except (RuntimeError, NotImplementedError, AttributeError):
        return False
    return True

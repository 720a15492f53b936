"""Float32 matmuls of a few rows by a dense weight read in place (`csrc/dense_matmul.c`): the float32
decode steps' matmuls (inside `decoder_stack.py`) and their LM head.

A decode step multiplies one row (a verify a few) by every weight: memory-bound, where oneDNN's
matrix-vector path reads a packed copy of each weight (a second copy of the model) and an unpacked
`F.linear` reaches ~16 GB/s on this CPU; this kernel reads the `Linear`'s own (out, in) weight at
35–45 GB/s (measured, 2 threads). Each output is one dot product in a fixed order (16 lanes of fused
multiply-adds, reduced pairwise), so a row's bits do not depend on the other rows of the call or the
thread count. The reference is `F.linear`, equal up to float32 rounding.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from warpdecode.kernels.native import bound

DenseImpl = Literal["auto", "torch", "native"]


@functools.cache
def native_library() -> ctypes.CDLL | str:
    """The compiled kernel, or why there is none (one line)."""
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    return bound("dense_matmul_f32", [ptr, i64, i64, i64, ptr, i64, ptr, i64, ctypes.c_int], None)


def dense_matmul(x: Tensor, weight: Tensor, *, impl: DenseImpl = "auto") -> Tensor:
    """x times weight transposed.

    Args:
        x: (..., K) float32 activations.
        weight: (N, K) float32, contiguous, on the CPU.
        impl: `native`, the C kernel; `torch`, `F.linear` (the reference); `auto`: native where it compiled.

    Returns:
        (..., N) float32.
    """
    if impl not in ("auto", "torch", "native"):
        raise ValueError(f"impl must be one of auto, torch, native, got {impl!r}")
    lib = native_library()
    usable = (x.dtype == weight.dtype == torch.float32 and x.device.type == weight.device.type == "cpu"
              and weight.is_contiguous() and not isinstance(lib, str))
    if impl == "native" and not usable:
        raise ValueError(f"the native dense matmul runs contiguous float32 CPU weights with its library: {lib}")
    if impl == "torch" or not usable:
        return F.linear(x, weight)
    assert not isinstance(lib, str)
    K = weight.shape[1]
    if x.shape[-1] != K:
        raise ValueError(f"x has {x.shape[-1]} inputs, the weight {K}")
    flat = x.reshape(-1, K)
    if flat.stride(1) != 1:
        flat = flat.contiguous()
    y = torch.empty(flat.shape[0], weight.shape[0], dtype=torch.float32)
    lib.dense_matmul_f32(flat.data_ptr(), flat.shape[0], K, flat.stride(0), weight.data_ptr(), weight.shape[0],
                         y.data_ptr(), weight.shape[0], torch.get_num_threads())
    return y.reshape(*x.shape[:-1], weight.shape[0])

"""The native dense matmul (`csrc/dense_matmul.c`): its bits on every instruction set it builds for."""

from __future__ import annotations

import ctypes

import pytest
import torch
from isa_builds import build_for

from warpdecode.kernels.dense_matmul import dense_matmul, native_library

needs_native = pytest.mark.skipif(isinstance(native_library(), str), reason=f"no native kernel: {native_library()}")


@needs_native
@pytest.mark.parametrize("march", ["x86-64", "haswell"])
@pytest.mark.parametrize("K", [96, 40])  # 40: a tail shorter than 16 lanes
def test_every_instruction_set_computes_the_same_bits(tmp_path, march, K):
    """x86-64 (the 16-lane vector types lowered to SSE, passes of up to 6 rows) and haswell (the AVX2
    rows) give this machine's build's bits, a row alone or among others."""
    lib = build_for(march, ["dense_matmul.c"], tmp_path)
    g = torch.Generator().manual_seed(0)
    x, weight = torch.randn(7, K, generator=g), torch.randn(37, K, generator=g)  # 37: a last pass of 1 channel
    want = dense_matmul(x, weight, impl="native")
    torch.testing.assert_close(want, x @ weight.T, atol=1e-4, rtol=1e-4)
    for rows in (x, x[2:3]):
        got = torch.empty(rows.shape[0], 37)
        lib.dense_matmul_f32(ctypes.c_void_p(rows.data_ptr()), ctypes.c_int64(rows.shape[0]), ctypes.c_int64(K),
                             ctypes.c_int64(K), ctypes.c_void_p(weight.data_ptr()), ctypes.c_int64(37),
                             ctypes.c_void_p(got.data_ptr()), ctypes.c_int64(37), 2)
        assert torch.equal(got, want[2:3] if rows.shape[0] == 1 else want)

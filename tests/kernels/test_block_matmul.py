"""The native block matmul against its definition (`block_matmul_reference`), its layout round trips,
and its invariance: a row's bits do not depend on the other rows of the call or the thread count."""

from __future__ import annotations

import ctypes

import pytest
import torch
from isa_builds import build_for

from warpdecode.kernels import block_matmul as bm

NATIVE = bm.native_available()
needs_native = pytest.mark.skipif(not NATIVE, reason=f"native block matmul unavailable: {bm.native_library()}")


def int4_weight(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g)
    d = (torch.rand(n, k // 32, generator=g) * 0.05 + 1e-3).half().float()
    m = (-torch.rand(n, k // 32, generator=g) * 0.3).half().float()
    return q, d, m


def activations(rows: int, k: int, seed: int = 1) -> torch.Tensor:
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(seed))
    x[0, :32] = 0  # a block of zeros (its scale is 0)
    if rows > 2:
        x[2] *= 1e4  # a row far from the others' magnitude
    return x


def test_layouts_round_trip():
    q, d, m = int4_weight(37, 96)
    got_q, got_d, got_m = bm.unpack_int4(bm.pack_int4(q, d, m), 37, 96)
    assert torch.equal(got_q.long(), q) and torch.equal(got_d, d) and torch.equal(got_m, m)
    assert bm.pack_int4(q, d, m).numel() == 3 * 3 * bm.INT4_BLOCK_BYTES  # 3 tiles of 16 channels, 3 blocks
    q8 = torch.randint(-127, 128, (37, 96))
    assert torch.equal(bm.unpack_int8(bm.pack_int8(q8), 37, 96).long(), q8)


def test_the_reference_is_the_dense_product_up_to_8_bit_activations():
    q, d, m = int4_weight(20, 64)
    x = torch.randn(3, 64)
    dense = (q.float().view(20, 2, 32) * d[..., None] + m[..., None]).view(20, 64)
    got = bm.block_matmul_reference(x, q, 4, d, m)
    torch.testing.assert_close(got, x @ dense.T, atol=0.05, rtol=0.02)


@needs_native
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rows", [1, 3, 9])  # 9: more rows than one pass over a tile takes
def test_native_equals_the_reference(bits, rows):
    n, k = 37, 96
    x = activations(rows, k)
    if bits == 4:
        q, d, m = int4_weight(n, k)
        got = bm.block_matmul(x, bm.pack_int4(q, d, m), 4, n)
        want = bm.block_matmul_reference(x, q, 4, d, m)
    else:
        q = torch.randint(-127, 128, (n, k))
        scale = torch.rand(n) * 0.01
        got = bm.block_matmul(x, bm.pack_int8(q), 8, n, torch.nn.functional.pad(scale, (0, -n % 16)))
        want = bm.block_matmul_reference(x, q, 8, scale=scale)
    assert got.shape == (rows, n)
    # bit for bit but for float64's double rounding of the reference's fma (rare, one ulp)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6 * float(want.abs().max()))


@needs_native
@pytest.mark.parametrize("bits", [4, 8])
def test_a_row_is_the_same_bits_alone_in_any_batch_and_thread_count(bits):
    n, k = 53, 128
    if bits == 4:
        blocks, scale = bm.pack_int4(*int4_weight(n, k)), None
    else:
        blocks, scale = bm.pack_int8(torch.randint(-127, 128, (n, k))), torch.rand(64)
    x = activations(11, k)
    together = bm.block_matmul(x, blocks, bits, n, scale)
    threads = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            for i in range(11):
                assert torch.equal(bm.block_matmul(x[i : i + 1], blocks, bits, n, scale)[0], together[i])
            assert torch.equal(bm.block_matmul(x[3:8], blocks, bits, n, scale), together[3:8])
    finally:
        torch.set_num_threads(threads)
    strided = torch.zeros(11, 2 * k)[:, :k]
    strided.copy_(x)
    assert torch.equal(bm.block_matmul(strided, blocks, bits, n, scale), together)


@needs_native
@pytest.mark.parametrize(("march", "simd"), [("x86-64", 0), ("haswell", 1)])
def test_every_path_computes_the_same_bits(tmp_path, march, simd):
    """The C source built for another instruction set (x86-64: the portable loop of CPUs without
    SIMD paths; haswell: the AVX2 path) gives the bits of this machine's own build, also at the
    integer sums' bounds (int4 15 x 127 over a whole block, int8 -127 / 127 x -127 / 127)."""
    lib = build_for(march, ["block_matmul.c"], tmp_path)
    assert lib.block_matmul_simd() == simd
    n, k, rows = 37, 96, 6
    x = activations(rows, k)
    x[4] = x[4].abs() + 1  # every activation of a block quantises to 127 or nearly: the int16 sums' bound
    x[5, :32] = 1.0
    q, d, m = int4_weight(n, k)
    q[:5] = 15
    q8 = torch.randint(-127, 128, (n, k))
    q8[:3], q8[3:6] = 127, -127
    scale = torch.rand(48)
    for bits, blocks, s in ((4, bm.pack_int4(q, d, m), None), (8, bm.pack_int8(q8), scale)):
        y = torch.empty(rows, n)
        assert lib.block_matmul_f32(ctypes.c_void_p(x.data_ptr()), ctypes.c_int64(rows), ctypes.c_int64(k),
                                    ctypes.c_int64(k), ctypes.c_void_p(blocks.data_ptr()),
                                    None if s is None else ctypes.c_void_p(s.data_ptr()), bits, ctypes.c_int64(n),
                                    ctypes.c_void_p(y.data_ptr()), 2) == 0
        assert torch.equal(y, bm.block_matmul(x, blocks, bits, n, s))


@needs_native
def test_the_work_pool_serves_concurrent_callers_and_forked_children():
    """Python threads calling at once (one OpenMP team each) and a child forked after the parent ran
    the kernels (its OpenMP runtime has no threads: it runs every job alone) get the same bits."""
    import os
    import select
    import threading

    n, k = 300, 256
    blocks = bm.pack_int4(*int4_weight(n, k))
    x = activations(5, k)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        want = bm.block_matmul(x, blocks, 4, n)
        results: list[bool] = []

        def call() -> None:
            results.extend(torch.equal(bm.block_matmul(x, blocks, 4, n), want) for _ in range(50))

        workers = [threading.Thread(target=call) for _ in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=60)
        assert len(results) == 200 and all(results)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: no pytest here, report through the pipe and leave at once
            ok = all(torch.equal(bm.block_matmul(x, blocks, 4, n), want) for _ in range(5))
            os.write(write, b"1" if ok else b"0")
            os._exit(0)
        os.close(write)
        ready, _, _ = select.select([read], [], [], 120)
        if not ready:  # a hung child fails the test instead of hanging it
            os.kill(pid, 9)
        os.waitpid(pid, 0)
        assert ready and os.read(read, 1) == b"1"
    finally:
        torch.set_num_threads(threads)

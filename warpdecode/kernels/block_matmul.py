"""Block-quantised weight-only matmuls on 8-bit activations (`csrc/block_matmul.c`): the CPU fast
path of the int4 and int8 weights of `kernels/quantized.py`.

A decode or verify step multiplies a few activation rows by every weight; llama.cpp's answer, used
here too, is to quantise each activation row per block of 32 inputs to int8 and take the block's dot
products in integers, reading the weight bytes once per step, whatever the rows. With AVX-512 VNNI
(64 multiply-adds per instruction) a step of 8 rows costs little more than a step of 1; with AVX2
(`vpmaddubsw`, 32 per instruction, and the int16 sums' own adds) about 2.5x, 5 rows 2x.

Layout: output channels in tiles of 16, inputs in blocks of 32; a tile's blocks follow each other, so
a tile streams from memory in order. Within a block, group g (inputs 4g..4g+3) of channel j sits in
bytes 4j..4j+3 of the group's 64 bytes (one 32-bit lane per channel, the layout of `vpdpbusd`).

* int4 block (320 bytes): groups 0-3 in the low nibbles and 4-7 in the high nibbles of 256 bytes,
  then the 16 channels' fp16 scales `d` and fp16 minima `m` (`w = q * d + m`, q in [0, 15]: GGUF Q4_1's
  blocks exactly).
* int8 block (512 bytes): `u = q + 128` (q in [-127, 127]), with one float32 scale per channel
  (`w = q * s`).

Arithmetic (`block_matmul_reference` is the definition in PyTorch): per activation row and block,
`dx = max|x| / 127`, `xq = round(x * (127 / max|x|))` (half to even), an exact integer sum per
channel, then float accumulation block after block, `acc = fma(isum, d * dx, acc)`,
`acc = fma(m, dx * sum(xq), acc)` (int8: `acc = fma(isum - 128 * sum(xq), dx, acc)`, times `s` at the
end). A row's outputs therefore never depend on the other rows of the call or on the thread count
(tested bit for bit): a quantised target computes a verified token exactly as a one-token step.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from warpdecode.kernels.native import compiled

TILE = 16
BLOCK = 32
INT4_BLOCK_BYTES = TILE * BLOCK // 2 + 2 * TILE * 2
INT8_BLOCK_BYTES = TILE * BLOCK
Bits = Literal[4, 8]


@functools.cache
def native_library() -> ctypes.CDLL | str:
    """The compiled kernel, or why there is none (one line). Only a build with a SIMD path (AVX-512
    VNNI or AVX2) counts: the portable C path computes the same bits, but slower than torch's own
    kernels."""
    lib = compiled()
    if isinstance(lib, str):
        return lib
    lib.block_matmul_simd.restype = ctypes.c_int
    if not lib.block_matmul_simd():
        return "this CPU has neither AVX-512 VNNI nor AVX2 (the block matmul's fast paths)"
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.block_matmul_f32.argtypes = [ptr, i64, i64, i64, ptr, ptr, ctypes.c_int, i64, ptr, ctypes.c_int]
    lib.block_matmul_f32.restype = ctypes.c_int
    return lib


def native_available() -> bool:
    return not isinstance(native_library(), str)


def _tiles(t: Tensor, n: int) -> Tensor:
    """(N, ...) → (N padded to a multiple of 16, ...) with zero rows."""
    return F.pad(t, (0, 0) * (t.dim() - 1) + (0, -n % TILE))


def _grouped(q: Tensor) -> Tensor:
    """(Np, K) integers → (tiles, blocks, 8 groups, 16 channels, 4 inputs)."""
    n, k = q.shape
    return q.reshape(n // TILE, TILE, k // BLOCK, 8, 4).permute(0, 2, 3, 1, 4)


def _ungrouped(g: Tensor) -> Tensor:
    """The inverse of `_grouped`: (tiles, blocks, 8, 16, 4) → (Np, K)."""
    t, nb = g.shape[:2]
    return g.permute(0, 3, 1, 2, 4).reshape(t * TILE, nb * BLOCK)


def _per_tile(v: Tensor) -> Tensor:
    """(Np, blocks) per-channel values → (tiles, blocks, 16)."""
    n, nb = v.shape
    return v.reshape(n // TILE, TILE, nb).transpose(1, 2)


def pack_int4(q: Tensor, d: Tensor, m: Tensor) -> Tensor:
    """Int4 blocks of `w = q * d + m`.

    Args:
        q: (N, K) integers in [0, 15], K a multiple of 32.
        d, m: (N, K / 32) float (stored as fp16).

    Returns:
        (ceil(N / 16) * K / 32 * 320,) uint8.
    """
    n = q.shape[0]
    g = _grouped(_tiles(q.to(torch.uint8), n))  # (T, nb, 8, 16, 4)
    nibbles = (g[:, :, :4] | (g[:, :, 4:] << 4)).reshape(*g.shape[:2], -1)  # (T, nb, 256)
    halves = [_per_tile(_tiles(v.to(torch.float16), n)).contiguous().view(torch.uint8) for v in (d, m)]
    return torch.cat([nibbles, *halves], -1).reshape(-1).contiguous()


def unpack_int4(blocks: Tensor, n: int, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """`pack_int4`'s inputs back: q (N, K) uint8, d and m (N, K / 32) float32."""
    tiles, nb = -(-n // TILE), k // BLOCK
    b = blocks.view(tiles, nb, INT4_BLOCK_BYTES)
    nib = b[..., :256].reshape(tiles, nb, 4, TILE, 4)
    q = _ungrouped(torch.cat([nib & 0x0F, nib >> 4], 2))[:n]
    d, m = (b[..., lo : lo + 32].contiguous().view(torch.float16).float().transpose(1, 2).reshape(-1, nb)[:n]
            for lo in (256, 288))
    return q, d, m


def pack_int8(q: Tensor) -> Tensor:
    """Int8 blocks of q: (N, K) integers in [-127, 127], K a multiple of 32 → (ceil(N / 16) * K * 16 / 16,)
    uint8 (`q + 128`)."""
    g = _grouped(_tiles((q.to(torch.int16) + 128).to(torch.uint8), q.shape[0]))
    return g.reshape(-1).contiguous()


def unpack_int8(blocks: Tensor, n: int, k: int) -> Tensor:
    """`pack_int8`'s input back: (N, K) int8."""
    g = blocks.view(-(-n // TILE), k // BLOCK, 8, TILE, 4)
    return (_ungrouped(g).to(torch.int16) - 128).to(torch.int8)[:n]


def block_matmul(x: Tensor, blocks: Tensor, bits: Bits, out_features: int, scale: Tensor | None = None) -> Tensor:
    """x times the packed weight, with the native kernel (`native_available()` must hold).

    Args:
        x: (M, K) float32, K the weight's padded inputs (a multiple of 32), rows contiguous.
        blocks: `pack_int4` / `pack_int8` output for `out_features` channels of K inputs.
        scale: (N padded to 16,) float32 channel scales of an int8 weight.

    Returns:
        (M, out_features) float32.
    """
    lib = native_library()
    assert not isinstance(lib, str), lib
    M, K = x.shape
    if x.stride(1) != 1 or x.dtype != torch.float32:
        x = x.float().contiguous()
    y = torch.empty(M, out_features, dtype=torch.float32)
    failed = lib.block_matmul_f32(x.data_ptr(), M, K, x.stride(0), blocks.data_ptr(),
                                  None if scale is None else scale.data_ptr(), bits, out_features, y.data_ptr(),
                                  torch.get_num_threads())
    if failed:
        raise MemoryError("the block matmul could not allocate its scratch memory")
    return y


def _fma(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """float32 a * b + c, the product exact (float64), one rounding of the sum to float32 (up to float64's own)."""
    return (a.double() * b.double() + c.double()).float()


def block_matmul_reference(x: Tensor, q: Tensor, bits: Bits, d: Tensor | None = None, m: Tensor | None = None,
                           scale: Tensor | None = None) -> Tensor:
    """The definition of `block_matmul` in PyTorch (equal to it up to float64's rounding of an fma).

    Args:
        x: (M, K) float32.
        q: (N, K) weight integers: int4 in [0, 15] with d, m (N, K / 32) float32 (fp16 values);
            int8 in [-127, 127] with scale (N,) float32.

    Returns:
        (M, N) float32.
    """
    M, K = x.shape
    nb = K // BLOCK
    xb = x.float().reshape(M, nb, BLOCK)
    amax = xb.abs().amax(-1)  # (M, nb)
    dx = amax / 127
    inv = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
    xq = (xb * inv[..., None]).round().clamp(-127, 127)  # (M, nb, 32)
    sq = xq.sum(-1)  # (M, nb)
    qb = q.double().reshape(q.shape[0], nb, BLOCK)  # (N, nb, 32)
    isum = torch.einsum("mbi,nbi->mnb", xq.double(), qb)  # (M, N, nb), exact
    acc = torch.zeros(M, q.shape[0], dtype=torch.float32)
    for b in range(nb):
        if bits == 4:
            assert d is not None and m is not None
            acc = _fma(isum[..., b].float(), d[None, :, b] * dx[:, b : b + 1], acc)
            acc = _fma(m[None, :, b], (dx[:, b] * sq[:, b])[:, None], acc)
        else:
            acc = _fma(isum[..., b].float(), dx[:, b : b + 1], acc)
    if bits == 8:
        assert scale is not None
        acc = acc * scale[None, :]
    return acc

"""The decoder layers of a target in one native call per forward (`csrc/decoder_stack.c`): the CPU
decode and verify steps of `--dtype fp32|q8|q4|native`.

A decode step of a small model is mostly not matmul: the default model's 30 layers run ~15 PyTorch
operations each (norms, rotary, cache writes, residuals), and at a few microseconds apiece they cost
more than the block matmuls themselves (measured: 7.3 ms a step, of which 3.1 ms in the matmuls).
Here a run of layers is one C call: the same block matmuls (`block_matmul.py`) and exact attention
(`exact_attention.py`), with the norms, rotation, cache writes, residual adds and SwiGLU between them
in C. Float32 weights run through `csrc/dense_matmul.c`, reading each `Linear`'s own weight in place
(no packed copy; each output one dot product in a fixed order). Llama-family layers only (RMSNorm,
rotary positions, SwiGLU; q/k/v biases as Qwen2 has them).

The reference is the model's own PyTorch layers (`models/transformer.py`), which compute the same
function; the two differ in float rounding (a norm's sum order, SiLU's exp), so a target uses one or
the other for all its decode and verify steps (`Transformer.stack_impl`). The stack treats every row
alone in a fixed order: a row's bits do not depend on the other rows of the call, on the batch or on
the thread count (tested), which is what makes speculative decoding of a quantised target reproduce
its plain decoding token for token.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from warpdecode.kernels.block_matmul import native_library as block_library
from warpdecode.kernels.exact_attention import Visibility
from warpdecode.kernels.native import bound
from warpdecode.kernels.quantized import BlockInt4Weight, BlockInt8Weight

StackImpl = Literal["auto", "torch", "native"]


@dataclass(frozen=True)
class DenseWeight:
    """A float32 `Linear` weight as the stack reads it (in place)."""

    weight: Tensor  # (out, in) float32, contiguous
    bias: Tensor | None  # (out,) float32 or None

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    @property
    def width(self) -> int:
        return self.weight.shape[1]


StackWeight = BlockInt4Weight | BlockInt8Weight | DenseWeight


@dataclass(frozen=True)
class StackLayer:
    """One decoder layer's weights as the stack reads them. `qkv`: the q, k and v weights, or one
    stacked weight; `gate_up`: gate and up, or one stacked weight (outputs in that order)."""

    attn_norm: Tensor  # (C,) float32
    mlp_norm: Tensor  # (C,) float32
    qkv: tuple[StackWeight, ...]  # (H * D + 2 * Hkv * D, C) in all
    o: StackWeight  # (C, H * D)
    gate_up: tuple[StackWeight, ...]  # (2 * F, C) in all
    down: StackWeight  # (C, F)

    def matrices(self) -> list[StackWeight | None]:
        """The C layer's q, k, v, o, gate, up, down (None: absent, a stacked weight's other parts)."""
        qkv: list[StackWeight | None] = [*self.qkv, None, None][:3]
        gate_up: list[StackWeight | None] = [*self.gate_up, None][:2]
        return [*qkv, self.o, *gate_up, self.down]


@functools.cache
def native_library() -> ctypes.CDLL | str:
    """The compiled kernels with the stack's entry point, or why not (one line): the stack needs the
    block matmul's fast path (`block_matmul.native_library`)."""
    reason = block_library()
    if isinstance(reason, str):
        return reason
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    return bound("decoder_stack_f32", [ptr, i64, ptr, i64, i64, i64, i64, i64, i64, ctypes.c_float, ptr, ptr, ptr,
                                       ptr, i64, i64, i64, i64, ptr, ptr, ptr, ptr, ptr, i64, ctypes.c_int],
                 ctypes.c_int)


def _matrix(w: StackWeight | None) -> list[int]:
    """A weight's `matrix_t` fields (csrc/decoder_stack.c)."""
    if w is None:
        return [0] * 6
    bias = 0 if w.bias is None else w.bias.data_ptr()
    if isinstance(w, DenseWeight):
        return [w.weight.data_ptr(), 0, bias, 32, w.out_features, w.width]
    scale = w.scales.data_ptr() if isinstance(w, BlockInt8Weight) else 0
    return [w.blocks.data_ptr(), scale, bias, 8 if isinstance(w, BlockInt8Weight) else 4, w.out_features, w.width]


class DecoderStack:
    """The layers of one model as the native stack runs them; `of` says why when it cannot."""

    def __init__(self, layers: Sequence[StackLayer], heads: int, kv_heads: int, head_dim: int, eps: float) -> None:
        self.layers = tuple(layers)  # keeps every tensor the table points into alive
        self.heads, self.kv_heads, self.head_dim, self.eps = heads, kv_heads, head_dim, eps
        rows = [[lay.attn_norm.data_ptr(), lay.mlp_norm.data_ptr(), *(v for w in lay.matrices() for v in _matrix(w))]
                for lay in self.layers]
        self.table = torch.tensor(rows, dtype=torch.int64)  # (L, 44): the C layer_t array

    @classmethod
    def of(cls, layers: Sequence[StackLayer], heads: int, kv_heads: int, head_dim: int,
           eps: float) -> DecoderStack | str:
        """The stack of `layers`, or why it cannot run them (one line)."""
        lib = native_library()
        if isinstance(lib, str):
            return lib
        if not layers:
            return "no layers"
        C = layers[0].attn_norm.numel()
        first = layers[0]
        q, kv = heads * head_dim, kv_heads * head_dim

        def shapes(lay: StackLayer) -> list[tuple[int, int, int] | None]:
            return [None if w is None else (w.out_features, w.in_features, w.width) for w in lay.matrices()]

        for lay in layers:
            weights = [w for w in lay.matrices() if w is not None]
            if not all(isinstance(w, (BlockInt4Weight, BlockInt8Weight, DenseWeight)) for w in weights):
                return "the stack runs the native block weights and float32 weights"
            if any(isinstance(w, DenseWeight) and (w.weight.dtype != torch.float32 or not w.weight.is_contiguous()
                                                   or w.weight.device.type != "cpu") for w in weights):
                return "the stack runs contiguous float32 CPU weights"
            if any(t.dtype != torch.float32 or t.numel() != C or not t.is_contiguous()
                   for t in (lay.attn_norm, lay.mlp_norm)):
                return "the stack runs float32 norms"
            if any(w.bias is not None and (w.bias.dtype != torch.float32 or not w.bias.is_contiguous()) for w in weights):
                return "the stack runs float32 biases"
            if shapes(lay) != shapes(first):
                return "the stack runs layers of one shape"
        widths = {w.width for w in (*first.qkv, *first.gate_up)}
        if (sum(w.out_features for w in first.qkv) != q + 2 * kv or len(widths) != 1
                or any(w.in_features != C for w in (*first.qkv, *first.gate_up)) or first.o.out_features != C
                or first.o.in_features != q or sum(w.out_features for w in first.gate_up) % 2
                or first.down.out_features != C
                or first.down.in_features != sum(w.out_features for w in first.gate_up) // 2 or head_dim % 2):
            return "the weights do not have a Llama layer's shapes"
        return cls(layers, heads, kv_heads, head_dim, eps)

    def __call__(self, x: Tensor, first: int, stop: int, cos: Tensor, sin: Tensor, k: Tensor, v: Tensor,
                 start: Tensor, visible: Visibility, keep: Tensor | None = None) -> Tensor:
        """Layers `first .. stop - 1` over the new tokens.

        Args:
            x: (B, T, C) float32 layer inputs.
            cos, sin: (B, 1, T, D) float32 rotary tables of the new tokens' positions.
            k, v: (L, B, Hkv, S, D) float32 cache (`KVCache.k` / `.v`), written at slots
                `start[b] + t` of every layer run.
            start: (B,) int64, each row's cache length before the new tokens.
            visible: each query's visible slots (the new ones included).
            keep: (n,) int64 ascending rows `b * T + t` to compute (None: all): the others are padding (a
                batch's trees padded to one width), whose outputs are their inputs and whose cache slots are
                not written; `visible.only(keep)` gives them no slots, so their attention is skipped. A
                kept row's result is the same bits either way.

        Returns:
            (B, T, C) float32 outputs of layer `stop - 1`.
        """
        lib = native_library()
        assert not isinstance(lib, str), lib
        B, T, C = x.shape
        if not 0 <= first < stop <= len(self.layers):
            raise ValueError(f"layers {first}..{stop - 1} are not among the stack's {len(self.layers)}")
        if k.shape[1:] != (B, self.kv_heads, k.shape[3], self.head_dim) or v.shape != k.shape or k.stride() != v.stride():
            raise ValueError(f"cache {tuple(k.shape)} does not fit {B} rows of {self.kv_heads} x {self.head_dim}")
        if k.stride(-1) != 1 or k.dtype != torch.float32 or v.dtype != torch.float32:
            raise ValueError("the stack writes a float32 cache with contiguous rows")
        if visible.reach > k.shape[3] or int(start.max()) + T > k.shape[3]:
            raise ValueError(f"the new tokens reach past the cache's {k.shape[3]} slots")
        if keep is not None:
            keep = keep.to(torch.int64).contiguous()
            if keep.dim() != 1 or (keep.numel() and (int(keep[0]) < 0 or int(keep[-1]) >= B * T
                                                     or bool((keep[1:] <= keep[:-1]).any()))):
                raise ValueError(f"keep must list ascending rows of the {B * T} new tokens")
            if not keep.numel():
                return x.float().clone()
        out = x.float().reshape(B * T, C).clone()
        cos2, sin2 = (t.float().reshape(B * T, self.head_dim).contiguous() for t in (cos, sin))
        start = start.to(torch.int64).contiguous()
        table = self.table[first:stop]
        failed = lib.decoder_stack_f32(
            table.data_ptr(), stop - first, out.data_ptr(), B, T, C, self.heads, self.kv_heads, self.head_dim,
            self.eps, cos2.data_ptr(), sin2.data_ptr(), k[first].data_ptr(), v[first].data_ptr(), k.stride(0),
            k.stride(1), k.stride(2), k.stride(3), start.data_ptr(), visible.prefix.data_ptr(),
            visible.extra_offsets.data_ptr(), visible.extra.data_ptr(), None if keep is None else keep.data_ptr(),
            0 if keep is None else keep.numel(), torch.get_num_threads())
        if failed:
            raise MemoryError("the decoder stack could not allocate its scratch memory")
        return out.view(B, T, C)

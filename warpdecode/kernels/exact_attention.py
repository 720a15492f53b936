"""Exact attention for decode and verify steps: every query over exactly the keys it sees, as one call.

A speculative step verifies a chain or a tree of draft tokens in one forward, and a continuous batch
decodes many rows in one forward; either is lossless only if every query computes the same numbers a
one-token step at its position would compute alone. SDPA does not promise that: its result for a row
changes in the last bits with the number of queries, the key length and the masking of the call.
The project used to get there with one SDPA call per query over exactly its keys (`impl="torch"`,
the definition below), ~20 µs of overhead each: a verify of 8 tokens through 30 layers made 240 calls.

The definition (`impl="torch"`): each query of row `b` attends, with SDPA and no mask, over its
visible slots of the cache in slot order: the first `prefix` slots, then its `extra` slots (tree
ancestors beyond the prefix; `Visibility`).

The fast path (`impl="native"`, chosen by `auto` on CPU in float32 when it compiled) is a small C
kernel (`csrc/exact_attention.c`, the (row, query, query head) tasks on the kernels' work pool), compiled on first use
with the system C compiler into `$WARPDECODE_CACHE/kernels/` and called through ctypes. It computes the
same mathematics in its own fixed order, so it is not bit-identical to SDPA (~1e-7 relative, tested)
but it is bit-identical to itself for a query whatever else the call holds: one query or 128, one row
or 16, a prefix or the same keys reached through a tree (tested). A model must therefore run every
step of a decode through the same implementation (`resolve_exact_impl` answers once per process).
Without a C compiler, or with `WARPDECODE_NATIVE=0`, `auto` is the reference.

Example: a row of 10 cached slots verifies the tree pending → {a, b}: pending sees prefix 11, `a`
prefix 12, `b` prefix 11 plus extra slot 12; once `b` is accepted and moved to slot 11, a one-token
step after it sees prefix 12: the same keys in the same order, the same bits.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from warpdecode.kernels.native import bound

ExactImpl = Literal["auto", "torch", "native"]


@dataclass(frozen=True)
class Visibility:
    """Which cache slots each of a forward's B * T queries sees: its first `prefix` slots, then its
    `extra` slots (ascending). Built once per forward and shared by every layer."""

    prefix: Tensor  # (B * T,) int32
    extra_offsets: Tensor  # (B * T + 1,) int32, query i's extra slots are extra[offsets[i]:offsets[i+1]]
    extra: Tensor  # (E,) int32
    batch: int
    queries: int
    reach: int
    """One past the highest slot any query sees (the cache must hold that many)."""

    @classmethod
    def of_prefixes(cls, counts: Tensor) -> Visibility:
        """Every query sees a prefix of its row's slots. counts: (B, T) integers."""
        B, T = counts.shape
        prefix = counts.reshape(-1).to(torch.int32).cpu().contiguous()
        if B * T and int(prefix.min()) < 0:
            raise ValueError("a query cannot see a negative number of slots")
        return cls(prefix, torch.zeros(B * T + 1, dtype=torch.int32), torch.zeros(0, dtype=torch.int32), B, T,
                   int(prefix.max()) if B * T else 0)

    @classmethod
    def of_mask(cls, mask: Tensor) -> Visibility:
        """From a forward's (B, 1, T, S) bool mask over the used cache slots."""
        m = mask[:, 0].cpu()  # (B, T, S)
        B, T, S = m.shape
        lead = torch.where(m.all(-1), S, (~m).to(torch.int8).argmax(-1))  # (B, T) leading visible slots
        rest = m & (torch.arange(S)[None, None, :] >= lead[..., None])  # (B, T, S)
        counts = rest.sum(-1).reshape(-1)
        offsets = torch.zeros(B * T + 1, dtype=torch.int32)
        offsets[1:] = counts.cumsum(0)
        extra = rest.reshape(B * T, S).nonzero()[:, 1].to(torch.int32)
        reach = max(int(lead.max()) if B * T else 0, int(extra.max()) + 1 if extra.numel() else 0)
        return cls(lead.reshape(-1).to(torch.int32).contiguous(), offsets, extra.contiguous(), B, T, reach)

    def only(self, keep: Tensor) -> Visibility:
        """The same for the queries `keep` ((n,) flat indices b * T + t); every other query sees no slot."""
        kept = torch.zeros(self.batch * self.queries, dtype=torch.bool)
        kept[keep] = True
        extras = self.extra_offsets[1:] - self.extra_offsets[:-1]  # (B * T,) extra slots per query
        offsets = torch.zeros_like(self.extra_offsets)
        offsets[1:] = (extras * kept).cumsum(0)
        owner = torch.repeat_interleave(kept, extras)  # (E,) whether each extra slot's query is kept
        return Visibility((self.prefix * kept).to(torch.int32).contiguous(), offsets.to(torch.int32),
                          self.extra[owner].contiguous(), self.batch, self.queries, self.reach)

    def slots(self, b: int, t: int) -> int | Tensor:
        """Query (b, t)'s visible slots: a count when they are a prefix, else (n,) int64 indices."""
        i = b * self.queries + t
        n = int(self.prefix[i])
        lo, hi = int(self.extra_offsets[i]), int(self.extra_offsets[i + 1])
        if lo == hi:
            return n
        return torch.cat([torch.arange(n), self.extra[lo:hi].long()])


@functools.cache
def native_library() -> ctypes.CDLL | str:
    """The compiled kernel, or why there is none (a one-line reason; `kernels.native`)."""
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    return bound("exact_attention_f32", [ptr, i64, i64, i64, ptr, ptr, i64, i64, i64, ptr, i64, i64, i64, i64, i64,
                                         ptr, ptr, ptr, ctypes.c_float, ctypes.c_int], ctypes.c_int)


def resolve_exact_impl(impl: str, q: Tensor) -> Literal["torch", "native"]:
    """The implementation `exact_attention` runs for queries like `q` (raises ValueError on a bad
    name, or when `native` is asked for and cannot run)."""
    if impl not in ("auto", "torch", "native"):
        raise ValueError(f"impl must be one of auto, torch, native, got {impl!r}")
    if impl == "torch":
        return "torch"
    usable = q.device.type == "cpu" and q.dtype == torch.float32
    lib = native_library() if usable else None
    if impl == "native":
        if not usable:
            raise ValueError(f"the native exact attention runs float32 on the CPU, got {q.dtype} on {q.device}")
        if isinstance(lib, str):
            raise ValueError(f"the native exact attention is unavailable: {lib}")
    return "native" if usable and not isinstance(lib, str) else "torch"


def exact_attention(q: Tensor, k: Tensor, v: Tensor, visible: Visibility, *, impl: ExactImpl = "auto") -> Tensor:
    """Every query over exactly its visible slots.

    Args:
        q: (B, H, T, D) queries (any strides with a contiguous last dimension).
        k, v: (B, Hkv, S, D) a layer's cache (H a multiple of Hkv), the slots `visible` names written.
        visible: each query's slots.
        impl: `torch`, the definition (one SDPA per query); `native`, the C kernel; `auto`, native
            when it runs (CPU, float32, compiled), else torch.

    Returns:
        (B, H, T, D) in q's dtype.
    """
    B, H, T, D = q.shape
    if (visible.batch, visible.queries) != (B, T):
        raise ValueError(f"visibility is for {visible.batch} x {visible.queries} queries, q has {B} x {T}")
    if k.shape[0] != B or k.shape[1] == 0 or H % k.shape[1] or k.shape[-1] != D or v.shape != k.shape:
        raise ValueError(f"k, v {tuple(k.shape)} / {tuple(v.shape)} do not fit q {tuple(q.shape)}")
    if visible.reach > k.shape[2]:
        raise ValueError(f"a query sees slot {visible.reach - 1}, but the cache holds {k.shape[2]} slots")
    if resolve_exact_impl(impl, q) == "torch":
        gqa = k.shape[1] != H
        rows = []
        for b in range(B):
            cols = []
            for t in range(T):
                slots = visible.slots(b, t)
                kb, vb = ((k[b : b + 1, :, :slots], v[b : b + 1, :, :slots]) if isinstance(slots, int)
                          else (k[b : b + 1].index_select(2, slots), v[b : b + 1].index_select(2, slots)))
                cols.append(F.scaled_dot_product_attention(q[b : b + 1, :, t : t + 1], kb, vb, enable_gqa=gqa))
            rows.append(torch.cat(cols, dim=2))
        return torch.cat(rows)
    lib = native_library()
    assert not isinstance(lib, str)
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1 or v.stride() != k.stride():
        k, v = k.contiguous(), v.contiguous()
    out = torch.empty(B, H, T, D, dtype=q.dtype)
    failed = lib.exact_attention_f32(
        q.data_ptr(), q.stride(0), q.stride(1), q.stride(2), k.data_ptr(), v.data_ptr(), k.stride(0), k.stride(1),
        k.stride(2), out.data_ptr(), B, H, k.shape[1], T, D, visible.prefix.data_ptr(),
        visible.extra_offsets.data_ptr(), visible.extra.data_ptr(), D ** -0.5, torch.get_num_threads())
    if failed:
        raise MemoryError("exact attention could not allocate its scratch memory")
    return out

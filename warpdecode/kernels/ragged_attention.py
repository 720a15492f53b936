"""Batch-invariant attention for decode and verify steps: every query over exactly the keys it sees.

A continuous batch (`decoding/continuous.py`) runs, in one forward, rows that decode one token and
rows that verify a draft tree of many, each over its own cache length. A row's numbers must not
depend on the other rows, and a verified position must compute what a one-token step at that
position computes (speculation is then bit for bit plain decoding, whether a step drafted or not).

The definition (`impl="torch"`, one query at a time): a query's visible keys, in cache order, are
packed into slots `0 .. n-1` of a buffer of `ceil(n / KEY_BLOCK) * KEY_BLOCK` slots (the rest
masked); the scores are a matmul of at least `MIN_QUERY_ROWS` query rows (the query's heads, zero
rows added) over at least two matrices; each block of `KEY_BLOCK` slots gets its softmax numerator
summed over its own slots and its value product, and the blocks are accumulated in order (`baddbmm`
for the values, a sequential `cumsum` for the sums), then divided.

The fast path (`impl="auto"`) computes the same numbers for every query of the forward at once:
queries that see a prefix of their row's slots (every decode step and every chain) share one
matmul per layer over the batch's keys, padded to a multiple of `KEY_BLOCK`; queries of a tree that
skip slots (a sibling branch) gather their keys first. It equals the definition bit for bit because
this CPU's matmul and reductions (torch 2.13, oneDNN / MKL, 1 or 2 threads) were measured to give
each output the same bits (checked in `tests/kernels/test_ragged_attention.py`):

* whatever the number of query rows from 4 up (1 to 3 rows take a matrix-vector path that rounds
  differently) and of matrices from 2 up (one matrix gets both threads and rounds differently);
* whatever the number of key columns;
* with any number of trailing blocks whose probabilities are all zero (masked keys).

A plain `sum` over all the keys is not: its cascade order depends on the length, so trailing zeros
regroup the sum; neither is one matmul over a longer (padded) key axis. The keys and values of every
slot the call reads must be finite (masked slots are multiplied by exact zeros): the caller zeroes
unwritten slots (`ContinuousBatch`). Cost: ~30 torch calls per layer, so a one-token step costs more
than one SDPA call per row at one or a few rows (docs/notes/serving.md).

Example: a row of 10 cached slots verifies the chain pending → a → b: the pending token sees slots
0..10, `a` 0..11, `b` 0..12, each padded to 64 slots; a one-token step at `a`'s position later sees
the same 12 keys in the same slots and computes the same bits. In a tree pending → {a, b}, `b`
sees slots 0..10 and 12: its keys are gathered into slots 0..11 of its own buffer, which is what a
one-token step computes once `b` is accepted and moved to slot 11.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from warpdecode.kernels.impl import Impl, resolve_impl

KEY_BLOCK = 64
"""Key buffers are padded to a multiple of this many slots (masked), so that a query's sums do not
depend on how many keys other queries see."""
MIN_QUERY_ROWS = 4
"""Fewest query rows of a matmul (smaller ones take another kernel)."""


def padded_keys(n: int) -> int:
    """The key slots a query over `n` slots reads: `n` rounded up to a multiple of KEY_BLOCK."""
    return max(1, math.ceil(n / KEY_BLOCK)) * KEY_BLOCK


@dataclass(frozen=True)
class RaggedPlan:
    """Which keys each query of a forward sees, laid out for `ragged_attention` (built once per
    forward by `plan_ragged`, shared by every layer)."""

    keys: int
    """Key slots the shared matmul reads (the forward's longest row, padded to `KEY_BLOCK`)."""
    groups: int
    """Query heads per key head (G = H / Hkv)."""
    mask: Tensor  # (B, 1, M, keys) bool, query row g * T + t sees the slot (M >= MIN_QUERY_ROWS)
    tree_rows: Tensor | None  # (P,) int64, the row of each query that skips slots (None: none does)
    tree_queries: Tensor | None  # (P,) int64, its index among the row's T queries
    tree_slots: Tensor | None  # (P, Kg) int64, its visible slots in order, then slot 0 as padding
    tree_mask: Tensor | None  # (P, 1, Mg, Kg) bool, which of `tree_slots` it sees (every query row)
    bias: Tensor  # (B, 1, M, keys) float, `mask` as 0 (seen) and -inf
    tree_bias: Tensor | None  # (P, 1, Mg, Kg) float, `tree_mask` as 0 and -inf


def _bias(mask: Tensor, dtype: torch.dtype) -> Tensor:
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def plan_ragged(visible: Tensor, groups: int, dtype: torch.dtype = torch.float32) -> RaggedPlan:
    """Lay out `visible` for `ragged_attention`.

    Args:
        visible: (B, T, S) bool, which cache slots each of the T new queries of each row sees; every
            query sees at least one slot.
        groups: query heads per key head.
        dtype: the queries' dtype.
    """
    B, T, S = visible.shape
    keys = padded_keys(S)
    device = visible.device
    mask = F.pad(visible, (0, keys - S))  # (B, T, keys)
    counts = mask.sum(-1)  # (B, T)
    prefix = ((torch.arange(keys, device=device) < counts[..., None]) == mask).all(-1)  # (B, T)
    rows = max(groups * T, MIN_QUERY_ROWS)
    shared = torch.where(prefix[..., None], mask, torch.arange(keys, device=device) == 0)  # tree queries: a placeholder
    shared = shared.repeat(1, groups, 1)  # (B, G * T, keys), row g * T + t
    extra = torch.zeros(B, rows - groups * T, keys, dtype=torch.bool, device=device)
    extra[..., 0] = True  # padding query rows see slot 0, and are never read
    full = torch.cat([shared, extra], 1)[:, None]  # (B, 1, M, keys)
    if bool(prefix.all()):
        return RaggedPlan(keys, groups, full, None, None, None, None, _bias(full, dtype), None)
    tree_rows, tree_queries = (~prefix).nonzero(as_tuple=True)  # (P,) each
    picked = mask[tree_rows, tree_queries]  # (P, keys)
    n = picked.sum(-1)  # (P,)
    width = padded_keys(int(n.max()))
    order = torch.argsort((~picked).to(torch.int8), dim=-1, stable=True)[:, :width]  # visible slots first, in order
    used = torch.arange(width, device=device) < n[:, None]  # (P, Kg)
    slots = torch.where(used, order, 0)  # (P, Kg)
    tree_mask = used[:, None, None, :].expand(-1, 1, max(groups, MIN_QUERY_ROWS), -1)  # (P, 1, Mg, Kg)
    return RaggedPlan(keys, groups, full, tree_rows, tree_queries, slots, tree_mask, _bias(full, dtype),
                      _bias(tree_mask, dtype))


def _attend(q: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> Tensor:
    """Masked softmax attention summed block by block. q: (N, Hkv, M, D) scaled queries, M >=
    MIN_QUERY_ROWS; k, v: (N, Hkv, K, D) with finite values, K a multiple of KEY_BLOCK; bias: (N, 1, M,
    K) float, 0 where a query row sees the key and -inf elsewhere (at least one 0 per row). Returns
    (N, Hkv, M, D).

    Each block of KEY_BLOCK keys is summed on its own (a fixed-length sum and a fixed-depth matmul) and
    the blocks' sums are added one after the other: masked blocks add exact zeros, so the result does
    not depend on how many blocks follow a query's last key (a reduction over the blocks would group
    them differently for another count)."""
    if q.shape[0] * q.shape[1] < 2:  # one matrix would get every thread: run it twice
        return _attend(torch.cat([q, q]), torch.cat([k, k]), torch.cat([v, v]), torch.cat([bias, bias]))[:1]
    N, Hkv, M, D = q.shape
    blocks = k.shape[2] // KEY_BLOCK
    keys, values = k.reshape(N * Hkv, -1, D), v.reshape(N * Hkv, -1, D)  # (N Hkv, K, D), views of the cache's slots
    scores = torch.bmm(q.reshape(N * Hkv, M, D), keys.transpose(1, 2)).view(N, Hkv, M, -1).add_(bias)  # (N, Hkv, M, K)
    probs = scores.sub_(scores.amax(-1, keepdim=True)).exp_().view(N * Hkv, M, blocks, KEY_BLOCK)  # (N Hkv, M, nb, KB)
    total = probs.sum(-1).cumsum(-1)[..., -1:]  # (N Hkv, M, 1): in order, in float64 (a sequential scan)
    out = torch.bmm(probs[:, :, 0], values[:, :KEY_BLOCK])  # (N Hkv, M, D)
    for j in range(1, blocks):
        out = torch.baddbmm(out, probs[:, :, j], values[:, j * KEY_BLOCK : (j + 1) * KEY_BLOCK])
    return out.div_(total).view(N, Hkv, M, D)


def _rows(q: Tensor, rows: int) -> Tensor:
    """(N, Hkv, m, D) queries padded with zero rows to (N, Hkv, rows, D)."""
    return q if q.shape[2] == rows else F.pad(q, (0, 0, 0, rows - q.shape[2]))


def ragged_attention(q: Tensor, k: Tensor, v: Tensor, plan: RaggedPlan, *, impl: Impl = "auto") -> Tensor:
    """Every query over exactly the keys `plan` says it sees (module docstring), batch-invariantly.

    Args:
        q: (B, H, T, D) queries (rotated, unscaled).
        k, v: (B, Hkv, S, D) the cache's keys and values, new tokens written; S may be shorter or
            longer than `plan.keys` (slots past a row's keys are never read as numbers).
        plan: `plan_ragged(visible, H // Hkv)` of this forward's (B, T, S) visibility.
        impl: `torch` computes each query alone (the definition); `auto` all at once.
    Returns:
        (B, H, T, D) attention outputs.
    """
    B, H, T, D = q.shape
    Hkv = k.shape[1]
    G = plan.groups
    if G * Hkv != H:
        raise ValueError(f"plan was built for {G} query heads per key head, got {H} and {Hkv}")
    if k.shape[2] < plan.keys:
        k, v = F.pad(k, (0, 0, 0, plan.keys - k.shape[2])), F.pad(v, (0, 0, 0, plan.keys - v.shape[2]))
    k, v = k[:, :, : plan.keys], v[:, :, : plan.keys]  # (B, Hkv, keys, D)
    scale = 1.0 / math.sqrt(D)
    resolve_impl(impl)
    if impl == "torch":
        return _one_by_one(q * scale, k, v, plan)
    grouped = q.new_zeros(B, Hkv, plan.mask.shape[2], D)  # (B, Hkv, M, D), row g * T + t, then zero rows
    torch.mul(q.view(B, Hkv, G, T, D), scale, out=grouped[:, :, : G * T].view(B, Hkv, G, T, D))
    y = _attend(grouped, k, v, plan.bias)[:, :, : G * T].reshape(B, H, T, D)
    if plan.tree_rows is not None:
        assert plan.tree_queries is not None and plan.tree_slots is not None and plan.tree_bias is not None
        rows, queries, slots = plan.tree_rows, plan.tree_queries, plan.tree_slots
        kg = k[rows[:, None], :, slots].transpose(1, 2)  # (P, Hkv, Kg, D)
        vg = v[rows[:, None], :, slots].transpose(1, 2)  # (P, Hkv, Kg, D)
        qg = _rows(q[rows, :, queries].reshape(-1, Hkv, G, D) * scale, plan.tree_bias.shape[2])  # (P, Hkv, Mg, D)
        y[rows, :, queries] = _attend(qg, kg, vg, plan.tree_bias)[:, :, :G].reshape(-1, H, D)
    return y


def _one_by_one(q: Tensor, k: Tensor, v: Tensor, plan: RaggedPlan) -> Tensor:
    """The definition: each query alone over its visible keys packed into slots 0 .. n-1."""
    B, H, T, D = q.shape
    Hkv, G = k.shape[1], plan.groups
    visible = plan.mask[:, 0, :T].clone()  # (B, T, keys): query row t is head group 0 of query t
    if plan.tree_rows is not None:
        assert plan.tree_queries is not None and plan.tree_slots is not None and plan.tree_mask is not None
        for i, (b, t) in enumerate(zip(plan.tree_rows.tolist(), plan.tree_queries.tolist(), strict=True)):
            visible[b, t] = False
            visible[b, t, plan.tree_slots[i][plan.tree_mask[i, 0, 0]]] = True
    out = torch.empty_like(q)
    rows = max(G, MIN_QUERY_ROWS)
    for b in range(B):
        for t in range(T):
            slots = visible[b, t].nonzero().squeeze(1)  # (n,)
            width = padded_keys(slots.shape[0])
            kk = F.pad(k[b : b + 1, :, slots], (0, 0, 0, width - slots.shape[0]))  # (1, Hkv, width, D)
            vv = F.pad(v[b : b + 1, :, slots], (0, 0, 0, width - slots.shape[0]))
            mask = (torch.arange(width, device=q.device) < slots.shape[0]).expand(1, 1, rows, width)
            qq = _rows(q[b : b + 1, :, t].reshape(1, Hkv, G, D), rows)  # (1, Hkv, rows, D)
            out[b, :, t] = _attend(qq, kk, vv, _bias(mask, q.dtype))[0, :, :G].reshape(H, D)
    return out

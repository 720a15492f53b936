"""The native exact attention against its definition (one SDPA per query), and its invariance: a
query's bits do not depend on the rest of the call, the thread count, or how its keys are reached."""

from __future__ import annotations

import pytest
import torch
from isa_builds import build_for

from warpdecode.kernels import exact_attention as ea
from warpdecode.kernels import native
from warpdecode.kernels.exact_attention import Visibility, exact_attention, native_library, resolve_exact_impl

NATIVE = not isinstance(native_library(), str)
needs_native = pytest.mark.skipif(not NATIVE, reason=f"native kernel unavailable: {native_library()}")


def _qkv(B: int, H: int, Hkv: int, T: int, S: int, D: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, D, generator=g).transpose(1, 2)  # (B, H, T, D), strided like the model's
    k = torch.randn(B, Hkv, S, D, generator=g)
    v = torch.randn(B, Hkv, S, D, generator=g)
    return q, k, v


def test_visibility_of_a_tree_mask():
    # 10 cached slots, then the tree pending -> {a, b}, a -> c (the visible_keys example)
    S = 14
    mask = torch.zeros(1, 1, 4, S, dtype=torch.bool)
    mask[0, 0, :, :10] = True
    for query, new in enumerate([[0], [0, 1], [0, 2], [0, 1, 3]]):
        for j in new:
            mask[0, 0, query, 10 + j] = True
    vis = Visibility.of_mask(mask)
    assert [vis.slots(0, t) if isinstance(vis.slots(0, t), int) else vis.slots(0, t).tolist() for t in range(4)] == [
        11, 12, [*range(11), 12], [*range(12), 13]]
    assert vis.reach == 14


@needs_native
@pytest.mark.parametrize(("B", "H", "Hkv", "T", "D"), [(1, 9, 3, 1, 64), (1, 9, 3, 8, 64), (3, 4, 4, 5, 24),
                                                         (2, 6, 2, 3, 128), (1, 2, 1, 2, 7)])
def test_native_matches_the_definition(B, H, Hkv, T, D):
    S = 200
    q, k, v = _qkv(B, H, Hkv, T, S, D)
    g = torch.Generator().manual_seed(1)
    mask = torch.rand(B, 1, T, S, generator=g) < 0.6
    mask[..., :3] = True  # every query sees something
    mask[0, 0, 0] = torch.arange(S) < 150  # and one plain prefix
    vis = Visibility.of_mask(mask)
    want = exact_attention(q, k, v, vis, impl="torch")
    got = exact_attention(q, k, v, vis, impl="native")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6)


@needs_native
def test_a_query_computes_the_same_bits_whatever_else_the_call_holds():
    H, Hkv, D, S = 9, 3, 64, 300
    q, k, v = _qkv(4, H, Hkv, 6, S, D, seed=2)
    counts = torch.tensor([[40 + 7 * b + t for t in range(6)] for b in range(4)])
    together = exact_attention(q, k, v, Visibility.of_prefixes(counts), impl="native")
    for b in range(4):
        for t in range(6):
            alone = exact_attention(q[b : b + 1, :, t : t + 1], k[b : b + 1], v[b : b + 1],
                                    Visibility.of_prefixes(counts[b : b + 1, t : t + 1]), impl="native")
            assert torch.equal(alone, together[b : b + 1, :, t : t + 1])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(exact_attention(q, k, v, Visibility.of_prefixes(counts), impl="native"), together)
    finally:
        torch.set_num_threads(threads)


@needs_native
@pytest.mark.parametrize("D", [64, 8, 20])  # 8, 20: heads narrower than, or not a multiple of, 16 lanes
@pytest.mark.parametrize("seed", range(5))
def test_a_tree_query_equals_the_one_token_step_after_its_branch_is_accepted(D, seed):
    # verify: b sees the 11 cached slots and its own key at slot 12 (slot 11 holds its sibling a);
    # after acceptance b's key moves to slot 11 and the next step's query sees a prefix of 12
    H, Hkv, S = 4, 2, 16
    q, k, v = _qkv(1, H, Hkv, 1, S, D, seed=3 + seed)
    mask = torch.zeros(1, 1, 1, S, dtype=torch.bool)
    mask[0, 0, 0, :11] = True
    mask[0, 0, 0, 12] = True
    in_tree = exact_attention(q, k, v, Visibility.of_mask(mask), impl="native")
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 11], v2[:, :, 11] = k[:, :, 12], v[:, :, 12]
    after = exact_attention(q, k2, v2, Visibility.of_prefixes(torch.tensor([[12]])), impl="native")
    assert torch.equal(in_tree, after)


def test_bad_calls_are_refused():
    q, k, v = _qkv(1, 2, 1, 2, 8, 16)
    with pytest.raises(ValueError, match="sees slot 8"):
        exact_attention(q, k, v, Visibility.of_prefixes(torch.tensor([[3, 9]])))
    with pytest.raises(ValueError, match="visibility is for"):
        exact_attention(q, k, v, Visibility.of_prefixes(torch.tensor([[3]])))
    with pytest.raises(ValueError, match="impl must be"):
        exact_attention(q, k, v, Visibility.of_prefixes(torch.tensor([[3, 4]])), impl="triton")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="float32 on the CPU"):
        resolve_exact_impl("native", q.bfloat16())
    with pytest.raises(ValueError, match="negative"):
        Visibility.of_prefixes(torch.tensor([[-1]]))
    assert resolve_exact_impl("auto", q.bfloat16()) == "torch"


def _clear() -> None:
    native.compiled.cache_clear()
    ea.native_library.cache_clear()


def test_without_a_compiler_auto_is_the_definition(monkeypatch, tmp_path):
    monkeypatch.setenv("WARPDECODE_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "/bin/false")
    _clear()
    try:
        reason = native_library()
        assert isinstance(reason, str) and "failed" in reason
        q = _qkv(1, 2, 1, 2, 8, 16)[0]
        assert resolve_exact_impl("auto", q) == "torch"
        with pytest.raises(ValueError, match="unavailable"):
            resolve_exact_impl("native", q)
        monkeypatch.setenv("WARPDECODE_NATIVE", "0")
        _clear()
        assert native_library() == "WARPDECODE_NATIVE=0"
    finally:
        _clear()
        monkeypatch.undo()
    assert isinstance(native_library(), str) != NATIVE


@needs_native
@pytest.mark.parametrize("march", ["x86-64", "haswell"])
@pytest.mark.parametrize("D", [64, 20])  # 20: a tail shorter than 16 lanes
def test_every_instruction_set_computes_the_same_bits(tmp_path, march, D):
    """The kernel built for another instruction set (x86-64: 16-lane vector types lowered to SSE;
    haswell: the AVX2 loops) gives this machine's build's bits, on a tree of extra slots too."""
    import ctypes

    lib = build_for(march, ["exact_attention.c"], tmp_path)
    B, H, Hkv, T, S = 2, 6, 2, 5, 90
    q, k, v = _qkv(B, H, Hkv, T, S, D, seed=3)
    mask = torch.rand(B, 1, T, S, generator=torch.Generator().manual_seed(4)) < 0.5
    mask[..., :70] = True  # a prefix, then tree-like extra slots
    vis = Visibility.of_mask(mask)
    want = exact_attention(q, k, v, vis, impl="native")
    got = torch.empty(B, H, T, D)
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    args = [ptr(q.data_ptr()), *map(i64, q.stride()[:3]), ptr(k.data_ptr()), ptr(v.data_ptr()),
            *map(i64, k.stride()[:3]), ptr(got.data_ptr()), *map(i64, (B, H, Hkv, T, D)),
            ptr(vis.prefix.data_ptr()), ptr(vis.extra_offsets.data_ptr()), ptr(vis.extra.data_ptr()),
            ctypes.c_float(D ** -0.5), ctypes.c_int(2)]
    assert lib.exact_attention_f32(*args) == 0
    assert torch.equal(got, want)

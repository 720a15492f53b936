"""KVCache bookkeeping: write plans, rollback and tree-path compaction, checked slot by slot."""

from __future__ import annotations

import pytest
import torch

from warpdecode.errors import ConfigError
from warpdecode.models.cache import KVCache

L, HKV, S, D = 2, 2, 16, 3


def numbered_cache(lengths: list[int]) -> KVCache:
    """A cache whose every entry encodes where it lives: k = 1000*layer + 100*row + slot, v = -k."""
    cache = KVCache(L, len(lengths), HKV, S, D)
    layer = torch.arange(L)[:, None, None, None, None]
    row = torch.arange(len(lengths))[None, :, None, None, None]
    slot = torch.arange(S)[None, None, None, :, None]
    cache.k[:] = (1000 * layer + 100 * row + slot).float()
    cache.v[:] = -cache.k
    cache.lengths = torch.tensor(lengths)
    return cache


def slot_ids(cache: KVCache) -> torch.Tensor:
    """(B, S) slot that each position's keys came from (checked identical across layers, heads and D)."""
    k = cache.k - 1000 * torch.arange(L)[:, None, None, None, None]
    k = k - 100 * torch.arange(cache.batch)[None, :, None, None, None]
    assert bool((k == k[:1, :, :1, :, :1]).all())
    assert torch.equal(cache.v, -cache.k)
    return k[0, :, 0, :, 0].long()


def test_truncate_rolls_back_but_never_grows() -> None:
    cache = numbered_cache([5, 3, 7])
    with pytest.raises(ValueError, match=r"truncate to \[5, 4, 2\] but rows hold \[5, 3, 7\]"):
        cache.truncate([5, 4, 2])
    with pytest.raises(ValueError):
        cache.truncate([-1, 0, 0])
    assert cache.lengths.tolist() == [5, 3, 7]
    cache.truncate(2)  # a scalar applies to every row
    assert cache.lengths.tolist() == [2, 2, 2]
    cache.truncate(torch.tensor([2, 1, 0]))
    assert cache.lengths.tolist() == [2, 1, 0]
    with pytest.raises(ValueError, match=r"one length per row \(3\), got shape \(2,\)"):
        cache.truncate([0, 0])


def test_commit_with_overlapping_slots() -> None:
    """Path [0, 2, 4] of a tree at slots 10..14 moves 10, 12, 14 → 10, 11, 12 (sources overwrite sources)."""
    cache = numbered_cache([15])
    cache.commit(torch.tensor([10]), torch.tensor([[0, 2, 4]]), torch.tensor([3]))
    assert cache.lengths.tolist() == [13]
    expected = list(range(10)) + [10, 12, 14] + [13, 14, 15]
    assert slot_ids(cache)[0].tolist() == expected


@pytest.mark.parametrize("B", [1, 3])
def test_commit_ragged_acceptance(B: int) -> None:
    """Each row keeps its own path prefix, including a row that accepts nothing."""
    tree_start = [4, 2, 6][:B]
    path = [[0, 1, 3], [0, 2, 5], [0, 2, 3]][:B]
    num_accepted = [3, 0, 2][:B]
    cache = numbered_cache([start + 6 for start in tree_start])  # 6-node trees were written
    cache.commit(torch.tensor(tree_start), torch.tensor(path), torch.tensor(num_accepted))

    assert cache.lengths.tolist() == [s + n for s, n in zip(tree_start, num_accepted)]
    for b in range(B):
        expected = list(range(S))
        for i in range(num_accepted[b]):
            expected[tree_start[b] + i] = tree_start[b] + path[b][i]
        assert slot_ids(cache)[b].tolist() == expected


def test_commit_empty_path_only_sets_lengths() -> None:
    cache = numbered_cache([9, 7])
    cache.commit(torch.tensor([5, 7]), torch.zeros(2, 0, dtype=torch.int64), torch.tensor([0, 0]))
    assert cache.lengths.tolist() == [5, 7]
    assert slot_ids(cache).tolist() == [list(range(S))] * 2


def test_commit_of_nodes_already_in_place_moves_nothing(monkeypatch) -> None:
    """A chain's accepted prefix (and a plain step's pending token) is already where it belongs: only the
    lengths change, without touching the keys and values."""
    cache = numbered_cache([9, 8])
    k_before = cache.k.clone()
    monkeypatch.setattr(cache, "k", _Guarded(cache.k))
    cache.commit(torch.tensor([5, 4]), torch.tensor([[0, 1, 2, 7], [0, 1, 9, 9]]), torch.tensor([3, 2]))
    assert cache.lengths.tolist() == [8, 6]
    assert torch.equal(torch.Tensor(cache.k), k_before)
    with pytest.raises(AssertionError, match="gathered"):  # a node out of place does move
        cache.commit(torch.tensor([5, 4]), torch.tensor([[0, 2], [0, 1]]), torch.tensor([2, 2]))


class _Guarded(torch.Tensor):
    """A tensor that fails when indexed: `commit` must not gather or scatter."""

    def __getitem__(self, index):
        raise AssertionError("the cache was gathered from")

    def __setitem__(self, index, value):
        raise AssertionError("the cache was scattered into")


def test_plan_write_uniform() -> None:
    cache = numbered_cache([3, 3])
    plan = cache.plan_write(4)
    assert (plan.uniform_start, plan.used, plan.num_new) == (3, 7, 4)
    assert plan.rows is None and plan.slots is None
    assert cache.lengths.tolist() == [3, 3]  # planning does not advance

    new_k = torch.full((2, HKV, 4, D), 0.5)
    k, v = cache.write(1, new_k, -new_k, plan)
    assert k.shape == v.shape == (2, HKV, 7, D)
    assert bool((cache.k[1, :, :, 3:7] == 0.5).all()) and bool((cache.v[1, :, :, 3:7] == -0.5).all())
    assert torch.equal(cache.k[1, :, :, 7:], numbered_cache([3, 3]).k[1, :, :, 7:])  # nothing past the plan
    cache.advance(plan)
    assert cache.lengths.tolist() == [7, 7]


def test_plan_write_ragged() -> None:
    cache = numbered_cache([3, 1, 4])
    plan = cache.plan_write(2)
    assert plan.uniform_start is None
    assert plan.used == 6
    assert plan.start.tolist() == [3, 1, 4]
    assert plan.slots is not None and plan.slots.tolist() == [[3, 4], [1, 2], [4, 5]]
    assert plan.rows is not None and plan.rows.tolist() == [[0, 0], [1, 1], [2, 2]]

    # Row b's two new tokens carry values 10*b + t; they must land in its own slots only.
    new_k = (10 * torch.arange(3)[:, None, None, None] + torch.arange(2)[None, None, :, None]).float()
    new_k = new_k.expand(3, HKV, 2, D)  # (B, Hkv, T, D)
    before = cache.k.clone()
    k, _ = cache.write(0, new_k, -new_k, plan)
    assert k.shape == (3, HKV, 6, D)
    for b, start in enumerate([3, 1, 4]):
        for t in range(2):
            assert bool((cache.k[0, b, :, start + t] == 10 * b + t).all())
            assert bool((cache.v[0, b, :, start + t] == -(10 * b + t)).all())
    changed = (cache.k != before).any(dim=(2, 4))  # (L, B, S)
    assert changed.nonzero().tolist() == [[0, 0, 3], [0, 0, 4], [0, 1, 1], [0, 1, 2], [0, 2, 4], [0, 2, 5]]
    cache.advance(plan)
    assert cache.lengths.tolist() == [5, 3, 6]


def test_plan_write_refuses_overflow() -> None:
    cache = numbered_cache([3, 14])
    with pytest.raises(ConfigError, match="17 tokens does not fit the KV cache of 16"):
        cache.plan_write(3)
    assert cache.plan_write(2).used == 16


def test_constructor_rejects_empty_cache() -> None:
    with pytest.raises(ConfigError, match="batch > 0"):
        KVCache(L, 0, HKV, S, D)


def test_keep_rows_selects_and_reorders_rows() -> None:
    cache = KVCache(n_layer=2, batch=3, n_kv_head=1, max_len=4, head_dim=2)
    for row in range(3):
        cache.k[:, row] = float(row)
        cache.v[:, row] = float(-row)
    cache.lengths = torch.tensor([1, 2, 3])
    cache.keep_rows([2, 0])
    assert cache.batch == 2 and cache.lengths.tolist() == [3, 1]
    assert cache.k[:, 0].unique().tolist() == [2.0] and cache.v[:, 1].unique().tolist() == [0.0]
    with pytest.raises(ValueError, match="row indices"):
        cache.keep_rows([2])


def test_copy_from_takes_chosen_layers_and_positions() -> None:
    source = KVCache(n_layer=4, batch=1, n_kv_head=1, max_len=8, head_dim=2)
    source.k.copy_(torch.arange(source.k.numel(), dtype=torch.float32).view_as(source.k))
    source.v.copy_(-source.k)
    draft = KVCache(n_layer=2, batch=1, n_kv_head=1, max_len=8, head_dim=2)
    draft.copy_from(source, [0, 3], 2, 5)
    assert torch.equal(draft.k[:, :, :, 2:5], source.k[[0, 3], :, :, 2:5])
    assert torch.equal(draft.v[1, :, :, 2:5], source.v[3, :, :, 2:5])
    assert not draft.k[:, :, :, :2].any() and not draft.k[:, :, :, 5:].any()  # other positions untouched
    assert draft.lengths.tolist() == [5]
    with pytest.raises(ValueError, match="cannot copy"):
        draft.copy_from(source, [0, 1, 2], 0, 3)


def row_ids(cache: KVCache) -> torch.Tensor:
    """(B, S) row each position's keys came from (in `numbered_cache` numbering)."""
    k = cache.k[0, :, 0, :, 0]  # (B, S) layer 0: 100*row + slot
    assert bool((cache.v == -cache.k).all())
    return (k - torch.arange(S)).div(100, rounding_mode="floor").long()


def test_reorder_rows_copies_only_moved_rows_after_the_shared_prefix() -> None:
    cache = numbered_cache([6, 6, 6, 6])
    cache.reorder_rows([1, 0, 2, 1], begin=2)  # rows 0 and 1 swap, row 3 takes row 1, row 2 stays
    rows = row_ids(cache)
    assert rows[:, :2].tolist() == [[0, 0], [1, 1], [2, 2], [3, 3]]  # the prefix is not touched
    assert rows[:, 2:6].tolist() == [[1] * 4, [0] * 4, [2] * 4, [1] * 4]
    assert rows[:, 6:].tolist() == [[0] * 10, [1] * 10, [2] * 10, [3] * 10]  # past the length: untouched
    with pytest.raises(ValueError, match="rows of one length"):
        numbered_cache([3, 4]).reorder_rows([1, 0])
    with pytest.raises(ValueError, match="row indices"):
        cache.reorder_rows([0, 1, 2, 4])


def test_fill_from_row_gives_every_row_one_prefill() -> None:
    source = numbered_cache([5, 3])
    target = KVCache(L, 3, HKV, S, D)
    target.fill_from_row(source, row=1)
    assert target.lengths.tolist() == [3, 3, 3]
    assert bool((target.k[:, :, :, :3] == source.k[:, 1:2, :, :3]).all())
    assert bool((target.k[:, :, :, 3:] == 0).all())

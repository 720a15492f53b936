"""The device KV commit against KVCache.commit, and its no-op for chains."""

from __future__ import annotations

import torch

from warpdecode.kernels.kv_commit import commit_tree_path
from warpdecode.models.cache import KVCache


def filled_cache() -> KVCache:
    cache = KVCache(n_layer=2, batch=1, n_kv_head=2, max_len=20, head_dim=3)
    cache.k.copy_(torch.randn(cache.k.shape))
    cache.v.copy_(torch.randn(cache.v.shape))
    return cache


def test_matches_the_host_commit() -> None:
    """The docstring's example: tree forward at slots 10.., kept rows 0, 2, 4 (pending, nodes 1, 3)."""
    host, device = filled_cache(), filled_cache()
    device.k.copy_(host.k)
    device.v.copy_(host.v)
    host.commit(torch.tensor([11]), torch.tensor([[1, 3]]), torch.tensor([2]))  # nodes 1, 3 after the pending slot 10
    commit_tree_path(device.k, device.v, torch.tensor([10]), torch.tensor([0, 2, 4, 0]), in_place=False)
    assert torch.equal(device.k[:, :, :, :13], host.k[:, :, :, :13])
    assert torch.equal(device.v[:, :, :, :13], host.v[:, :, :, :13])


def test_chain_is_a_no_op() -> None:
    cache = filled_cache()
    k = cache.k.clone()
    commit_tree_path(cache.k, cache.v, torch.tensor([4]), torch.tensor([0, 3, 1]), in_place=True)
    assert torch.equal(cache.k, k)

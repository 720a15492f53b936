"""ragged_attention: the batched path against the one-query definition, bit for bit, and the invariances
a continuous batch relies on (a query's numbers do not depend on the other rows, on the other queries
of its row, or on how many keys they see)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from warpdecode.kernels.ragged_attention import KEY_BLOCK, padded_keys, plan_ragged, ragged_attention
from warpdecode.models.transformer import cache_attention_mask

H, HKV, D, S = 6, 2, 16, 300


def chain(T: int) -> torch.Tensor:
    return torch.ones(T, T, dtype=torch.bool).tril()


def tree() -> torch.Tensor:
    """pending → {a, b}, a → c, b → d: (5, 5) bool, each node sees its ancestors and itself."""
    parents = [-1, 0, 0, 1, 2]
    mask = torch.eye(5, dtype=torch.bool)
    for node, parent in enumerate(parents):
        while parent >= 0:
            mask[node, parent] = True
            parent = parents[parent]
    return mask


def attend(q, k, v, starts, new_mask, impl="auto"):
    """q: (B, H, T, D); new_mask: (B, T, T). Every row's T queries after its `starts` cached slots."""
    visible = cache_attention_mask(starts, new_mask, int(starts.max()) + new_mask.shape[-1])[:, 0]  # (B, T, S)
    return ragged_attention(q, k, v, plan_ragged(visible, q.shape[1] // k.shape[1]), impl=impl)


@pytest.fixture
def data(single_thread):
    torch.manual_seed(0)
    return torch.randn(5, HKV, S, D), torch.randn(5, HKV, S, D), torch.randn(5, 6, H, D).transpose(1, 2)


def test_batched_path_is_the_definition(data):
    k, v, q = data
    starts = torch.tensor([10, 100, 63, 200, 250])
    t5 = tree()
    mixed = torch.stack([chain(5), t5, chain(5), t5, torch.eye(5, dtype=torch.bool)])
    fast = attend(q[:, :, :5], k, v, starts, mixed)
    assert torch.equal(fast, attend(q[:, :, :5], k, v, starts, mixed, impl="torch"))
    reference = F.scaled_dot_product_attention(q[:, :, :5], k[:, :, :255], v[:, :, :255], enable_gqa=True,
                                               attn_mask=cache_attention_mask(starts, mixed, 255))
    assert torch.allclose(fast, reference, atol=1e-5)


def test_a_query_computes_what_a_one_token_step_at_its_position_computes(data):
    """A chain verified in one call, each position equal to a decode step there, alone or among rows."""
    k, v, q = data
    start = 120
    verified = attend(q[:1], k[:1], v[:1], torch.tensor([start]), chain(6)[None])  # (1, H, 6, D)
    for i in range(6):
        step = attend(q[:1, :, i : i + 1], k[:1], v[:1], torch.tensor([start + i]), chain(1)[None])
        assert torch.equal(step[0, :, 0], verified[0, :, i])
    others = q[:, :, :1].clone()
    others[0] = q[0, :, 3:4]
    crowded = attend(others, k, v, torch.tensor([start + 3, 5, 290, 64, 127]), chain(1).expand(5, 1, 1))
    assert torch.equal(crowded[0, :, 0], verified[0, :, 3])


def test_a_tree_node_computes_what_a_step_after_its_accepted_path_computes(data):
    """Node d (pending → b → d) sees slots 0..start, b's slot and its own; once b and d are accepted and
    moved to start+1, start+2, a one-token step at d's position sees them in order."""
    k, v, q = data
    start, t5 = 40, tree()
    verified = attend(q[:1, :, :5], k[:1], v[:1], torch.tensor([start]), t5[None])
    moved_k, moved_v = k[:1].clone(), v[:1].clone()
    for dst, src in ((start + 1, start + 2), (start + 2, start + 4)):  # b, then d
        moved_k[:, :, dst], moved_v[:, :, dst] = k[:1, :, src], v[:1, :, src]
    step = attend(q[:1, :, 4:5], moved_k, moved_v, torch.tensor([start + 2]), chain(1)[None])
    assert torch.equal(step[0, :, 0], verified[0, :, 4])


@pytest.mark.parametrize("length", [1, KEY_BLOCK - 1, KEY_BLOCK, KEY_BLOCK + 1, 3 * KEY_BLOCK + 5])
def test_a_row_is_the_same_whatever_the_other_rows_hold(data, length):
    k, v, q = data
    alone = attend(q[:1, :, :3], k[:1], v[:1], torch.tensor([length]), chain(3)[None])
    starts = torch.tensor([length, S - 3, 7, 2 * KEY_BLOCK, 1])
    together = attend(q[:, :, :3], k, v, starts, torch.stack([chain(3), tree()[:3, :3], chain(3), chain(3), chain(3)]))
    assert torch.equal(together[:1], alone)


def test_padded_keys():
    assert [padded_keys(n) for n in (0, 1, KEY_BLOCK, KEY_BLOCK + 1)] == [KEY_BLOCK, KEY_BLOCK, KEY_BLOCK, 2 * KEY_BLOCK]


def test_rejects_a_plan_for_other_heads(data):
    k, v, q = data
    visible = torch.ones(5, 6, 20, dtype=torch.bool)
    with pytest.raises(ValueError, match="query heads per key head"):
        ragged_attention(q, k, v, plan_ragged(visible, 2))
    with pytest.raises(ValueError, match="impl must be one of"):
        ragged_attention(q, k, v, plan_ragged(visible, H // HKV), impl="triton")  # type: ignore[arg-type]

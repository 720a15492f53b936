import pytest
import torch

from warpdecode.decoding.tree import DraftTree

# pending ─┬─ 0 ── 2
#          └─ 1 ── 3 ── 4
TREE = DraftTree(torch.tensor([10, 11, 12, 13, 14]), torch.tensor([-1, -1, 0, 1, 3]))


def test_depths_children_and_depth():
    assert TREE.depths().tolist() == [1, 1, 2, 2, 3]
    assert TREE.children() == {-1: [0, 1], 0: [2], 1: [3], 3: [4]}
    assert TREE.depth == 3 and DraftTree.empty().depth == 0


def test_path_tokens_run_from_depth_one_to_the_node():
    assert TREE.path_tokens() == [(10,), (11,), (10, 12), (11, 13), (11, 13, 14)]
    assert DraftTree.empty().path_tokens() == []


def test_verify_inputs_positions_and_ancestor_mask():
    tokens, positions, mask = TREE.verify_inputs(pending=7, start=20)
    assert tokens.tolist() == [[7, 10, 11, 12, 13, 14]]
    assert positions.tolist() == [[20, 21, 21, 22, 22, 23]]
    expected = [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0],
        [1, 0, 1, 0, 1, 0],
        [1, 0, 1, 0, 1, 1],
    ]
    assert mask.int().tolist() == [expected]


def test_chain():
    chain = DraftTree.chain([4, 5, 6])
    assert chain.parents.tolist() == [-1, 0, 1] and chain.depth == 3


def test_rejects_non_topological_order():
    with pytest.raises(ValueError, match="topological"):
        DraftTree(torch.tensor([1, 2]), torch.tensor([1, -1]))


def test_rejects_misshaped_draft_probs():
    with pytest.raises(ValueError, match="one row per node"):
        DraftTree.chain([1, 2], torch.zeros(3, 8))


def test_fuse_shares_common_prefixes_and_respects_the_budget():
    a, b = DraftTree.chain([1, 2, 3]), DraftTree.chain([1, 4])
    fused = DraftTree.fuse([a, b], budget=10)
    assert fused.tokens.tolist() == [1, 2, 3, 4] and fused.parents.tolist() == [-1, 0, 1, 0]
    assert DraftTree.fuse([a, b], budget=3).tokens.tolist() == [1, 2, 3]
    assert DraftTree.fuse([DraftTree.empty(), TREE], budget=10).path_tokens() == TREE.path_tokens()
    with pytest.raises(ValueError, match="deterministic"):
        DraftTree.fuse([DraftTree.chain([1], torch.ones(1, 4) / 4)], budget=4)


def test_auxiliary_nodes_are_cut_from_the_candidates_and_from_fusion():
    tree = DraftTree(torch.tensor([4, 5, 6, 7]), torch.tensor([-1, 0, -1, 2]), auxiliary=2)
    candidates = tree.verified()
    assert candidates.tokens.tolist() == [4, 5] and candidates.parents.tolist() == [-1, 0] and candidates.auxiliary == 0
    assert DraftTree.fuse([tree], budget=8).tokens.tolist() == [4, 5]
    with pytest.raises(ValueError, match="auxiliary"):
        DraftTree(torch.tensor([1]), torch.tensor([-1]), auxiliary=2)

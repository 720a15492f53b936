"""Hand-built cases: logits whose argmax spells the answer."""

import torch

from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.decoding.tree import DraftTree
from warpdecode.decoding.verifiers.greedy_match import greedy_accept
from warpdecode.decoding.verifiers.speculative_sampling import residual
from warpdecode.decoding.verifiers.typical_acceptance import TypicalAcceptance

V = 16


def argmax_logits(choices):
    """(len(choices), V) logits whose row i has its argmax at choices[i]."""
    logits = torch.zeros(len(choices), V)
    for i, c in enumerate(choices):
        logits[i, c] = 5.0
    return logits


def test_greedy_accepts_matching_branch_then_bonus():
    # pending ─┬─ 0:"3" ── 2:"4"
    #          └─ 1:"5" ── 3:"6"
    tree = DraftTree(torch.tensor([3, 5, 4, 6]), torch.tensor([-1, -1, 0, 1]))
    # target wants 5 after pending, 6 after node 1, then 9
    logits = argmax_logits([5, 0, 6, 0, 9])  # rows: after pending, node 0, node 1, node 2, node 3
    result = greedy_accept(tree, logits)
    assert result.path == [1, 3] and result.tokens == [5, 6, 9] and result.proposed == 2


def test_greedy_rejects_first_token():
    tree = DraftTree.chain([3, 4])
    result = greedy_accept(tree, argmax_logits([7, 4, 1]))
    assert result.path == [] and result.tokens == [7]


def test_residual_is_normalised_positive_part():
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.6, 0.2])
    torch.testing.assert_close(residual(p, q), torch.tensor([1.0, 0.0, 0.0]))
    torch.testing.assert_close(residual(p, p), p)  # nothing to correct: never rejects anyway


def test_typical_accepts_likely_tokens_and_stops_at_unlikely():
    tree = DraftTree.chain([2, 3])
    logits = torch.full((3, V), -10.0)
    logits[0, 2] = 5.0  # confident target agrees with the first draft token
    logits[1, 4] = 5.0  # confident target disagrees with the second (3 has ~0 probability)
    logits[2, 1] = 5.0
    result = TypicalAcceptance().accept(tree, logits, Sampler(SamplingConfig()))
    assert result.path == [0] and result.tokens == [2, 4]


def test_trust_accepts_the_whole_chain_and_counts_what_the_target_would_not_choose():
    from warpdecode.decoding.verifiers.trust import trust_accept

    tree = DraftTree.chain([3, 4, 5])
    sampler = Sampler(SamplingConfig())
    result = trust_accept(tree, argmax_logits([3, 9, 5, 11]), sampler)  # the target would write 9, not 4
    assert result.path == [0, 1, 2] and result.tokens == [3, 4, 5, 11] and result.divergent == 1
    empty = trust_accept(DraftTree.empty(), argmax_logits([7]), sampler)
    assert empty.tokens == [7] and empty.divergent == 0


def test_trust_refuses_trees():
    import pytest

    from warpdecode.decoding.verifiers.trust import trust_accept
    from warpdecode.errors import CapabilityError

    tree = DraftTree(torch.tensor([3, 5]), torch.tensor([-1, -1]))
    with pytest.raises(CapabilityError, match="chains only"):
        trust_accept(tree, argmax_logits([3, 0, 0]), Sampler(SamplingConfig()))


def test_typical_counts_accepted_tokens_off_the_target_argmax():
    tree = DraftTree.chain([3, 4])
    probs_rows = torch.full((3, V), 0.01)
    probs_rows[0, 3], probs_rows[0, 2] = 0.3, 0.55  # 3 is likely enough to pass, but 2 is the argmax
    probs_rows[1, 4] = 0.85
    logits = probs_rows.log()
    result = TypicalAcceptance(epsilon=0.09, delta=0.3).accept(tree, logits, Sampler(SamplingConfig()))
    assert result.path == [0, 1] and result.divergent == 1

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

"""Lookahead decoding: Jacobi n-gram collection, auxiliary rows never accepted, losslessness."""

import pytest
import torch
from tiny_models import greedy_target

from warpdecode.decoding.drafters.lookahead import LookaheadDrafter
from warpdecode.decoding.engine import Method, run
from warpdecode.decoding.generate import build_method, generate
from warpdecode.decoding.protocols import AcceptResult, DecodeState
from warpdecode.decoding.registry import build
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.decoding.tree import DraftTree
from warpdecode.errors import ConfigError


def one_hot_rows(tokens: list[int], vocab: int = 32) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(tokens), vocab).float()


def test_window_iterates_and_collects_diagonal_ngrams():
    """The docstring's example with ngram 2: window [a, b, c] → pool a → y, b → z; window [x, y, z]."""
    a, b, c, p, x, y, z = 1, 2, 3, 4, 5, 6, 7
    drafter = LookaheadDrafter(window=3, ngram=2)
    state = DecodeState(None, None, [9, 9, p], 2, Sampler(SamplingConfig()))
    drafter.start(state)
    drafter.window = [a, b, c]
    tree = drafter.propose(state, budget=10)
    assert tree.tokens.tolist() == [a, b, c] and tree.parents.tolist() == [-1, 0, 1] and tree.auxiliary == 3
    assert tree.verified().size == 0
    # Forward rows: after p, after a, after b, after c.
    state.forward_tree, state.forward_logits = tree, one_hot_rows([x, y, z, 0])
    drafter.observe(state, AcceptResult([], [x], proposed=0))
    assert drafter.pool == {a: [(y,)], b: [(z,)]}
    assert drafter.window == [x, y, z]
    state.tokens.append(b)  # b pending later: its pool n-gram is a candidate, the window rides behind
    tree = drafter.propose(state, budget=10)
    assert tree.tokens.tolist() == [z, x, y, z] and tree.parents.tolist() == [-1, -1, 1, 2] and tree.auxiliary == 3


def test_trigrams_need_two_windows_of_history():
    drafter = LookaheadDrafter(window=3, ngram=3)
    state = DecodeState(None, None, [9, 4], 1, Sampler(SamplingConfig()))
    drafter.start(state)
    drafter.window = [1, 2, 3]
    for predicted in ([5, 6, 7], [8, 10, 11]):
        tree = drafter.propose(state, budget=10)
        state.forward_tree, state.forward_logits = tree, one_hot_rows([predicted[0], *predicted[1:], 0])
        drafter.observe(state, AcceptResult([], [predicted[0]], proposed=0))
    # Diagonal over windows [1, 2, 3] → [5, 6, 7] → predictions [8, 10, 11]: (1, 6, 11).
    assert drafter.pool == {1: [(6, 11)]}


class AuxiliaryOnly:
    """Proposes the target's true greedy continuation, but only as auxiliary nodes."""

    needs_hidden_states = ()

    def __init__(self, continuation):
        self.continuation = continuation

    def prepare(self, target):
        pass

    def start(self, state):
        pass

    def propose(self, state, budget):
        done = len(state.tokens) - state.prompt_len
        tokens = self.continuation[done : done + min(budget, 3)]
        return DraftTree(torch.tensor(tokens, dtype=torch.int64), torch.arange(len(tokens)) - 1, auxiliary=len(tokens))

    def observe(self, state, result):
        pass


def test_auxiliary_nodes_are_never_accepted(single_thread):
    target = greedy_target()
    prompt = [3, 9, 27, 17]
    plain = generate(target, None, prompt, max_new_tokens=12, stop_at_eos=False)
    method = Method(AuxiliaryOnly(plain.token_ids), build("verifier", "greedy"), build("controller", "fixed"))
    tokens, _, stats = run(target, prompt, method, Sampler(SamplingConfig()), max_new_tokens=12, stop_ids=set())
    assert tokens == plain.token_ids
    assert sum(stats.accepted_per_step) == 0 and stats.target_forwards == 11


def test_lookahead_is_lossless_and_accepts_on_a_repetitive_prompt(single_thread):
    target = greedy_target()
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    plain = generate(target, None, prompt, max_new_tokens=60, stop_at_eos=False)
    out = generate(target, None, prompt, max_new_tokens=60, stop_at_eos=False,
                   method=build_method("lookahead", options={"window": 5, "ngram": 3}))
    assert out.token_ids == plain.token_ids
    assert out.stats.tau > 1.2  # the Jacobi pool finds the target's loop


@pytest.mark.parametrize("options", [{"window": 0}, {"ngram": 1}, {"window": 2, "ngram": 4}])
def test_invalid_options(options):
    with pytest.raises(ConfigError):
        LookaheadDrafter(**options)

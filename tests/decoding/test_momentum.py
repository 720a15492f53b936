"""Momentum decoding against a full-recompute transcription of the authors' `ResistanceDecodingNGram` /
`find_max_repetition_length` (gmftbyGMFTBY/MomentumDecoding: a graph of token nodes with the indexes
where each occurs, every n-gram ending at an occurrence of the candidate collected afresh each step),
greedy with the penalty off, and as a logits processor under speculative decoding."""

import math

import pytest
import torch
from tiny_models import greedy_target, naive_greedy

from warpdecode.decoding import registry
from warpdecode.decoding.generate import generate
from warpdecode.decoding.rules.momentum import MomentumLogits, NgramGraph
from warpdecode.errors import ConfigError

pytestmark = pytest.mark.usefixtures("single_thread")

PROMPT = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
TABLES = {"linear": lambda n: n, "log": lambda n: math.log(1 + n, 6) / 0.2, "exp": lambda n: 1.5**n / 2,
          "constant": lambda n: 2}


def repetition_length(token_list, candidate, max_length):
    """The authors' `find_max_repetition_length`, with the node indexes rebuilt from the token list."""
    indexes = [i for i, t in enumerate(token_list) if t == candidate]
    if not indexes:
        return 0
    index_path = {i: set() for i in range(1, max_length + 1)}
    for index in indexes:
        idx = index
        while idx >= 0:
            item = tuple(token_list[idx : index + 1])
            idx -= 1
            if len(item) <= max_length:
                index_path[len(item)].add(item)
            else:
                break
    for i in range(max_length, 1, -1):
        if tuple(token_list[-i + 1 :] + [candidate]) in index_path[i]:
            return i
    return 1


def reference(model, ids, n, alpha, k, max_length=5, table="linear"):
    seq = list(ids)
    with torch.inference_mode():
        for _ in range(n):
            probs = torch.softmax(model(torch.tensor([seq])).logits[0, -1].float(), -1)
            top_probs, top_ids = probs.topk(k)
            scores = []
            for p, v in zip(top_probs.tolist(), top_ids.tolist(), strict=True):
                rep = repetition_length(seq, v, max_length)
                scores.append(p - alpha * (TABLES[table](rep) if rep else 0.0))
            seq.append(top_ids.tolist()[max(range(k), key=lambda i: (scores[i], -i))])
    return seq[len(ids):]


def test_loop_length_by_hand():
    graph = NgramGraph(5, [5, 6, 7, 5, 6])
    assert [graph.loop_length(t) for t in (7, 5, 6, 9)] == [3, 1, 1, 0]
    assert NgramGraph(2, [5, 6, 7, 5, 6]).loop_length(7) == 2
    for seq in ([1, 2, 1, 2, 1], [3, 3, 3], [4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2]):
        graph = NgramGraph(5, seq)
        assert [graph.loop_length(t) for t in range(6)] == [repetition_length(seq, t, 5) for t in range(6)]


@pytest.mark.parametrize("alpha, k, max_ngram, resistance", [(0.2, 5, 5, "linear"), (0.05, 3, 3, "log"),
                                                            (0.1, 8, 4, "exp"), (0.3, 4, 5, "constant")])
def test_equals_the_reference(alpha, k, max_ngram, resistance):
    target = greedy_target()
    rule = registry.build("rule", "momentum", alpha=alpha, top_k=k, max_ngram=max_ngram, resistance=resistance)
    out = generate(target, None, PROMPT, max_new_tokens=24, stop_at_eos=False, rule=rule)
    assert out.token_ids == reference(target, PROMPT, 24, alpha, k, max_ngram, resistance)


def test_the_resistance_changes_the_output_and_is_greedy_when_off():
    target = greedy_target()
    greedy = naive_greedy(target, PROMPT, 24)
    off = generate(target, None, PROMPT, max_new_tokens=24, stop_at_eos=False,
                   rule=registry.build("rule", "momentum", alpha=0.0))
    on = generate(target, None, PROMPT, max_new_tokens=24, stop_at_eos=False, rule=registry.build("rule", "momentum"))
    assert off.token_ids == greedy
    assert on.token_ids != greedy


@pytest.mark.parametrize("method", ["prompt_lookup", "token_recycling"])
def test_as_a_logits_processor_speculative_decoding_gives_the_rule_s_tokens(method):
    target = greedy_target()
    rule = generate(target, None, PROMPT, max_new_tokens=24, stop_at_eos=False, rule=registry.build("rule", "momentum"))
    for m in ("none", method):
        hooked = generate(target, None, PROMPT, max_new_tokens=24, stop_at_eos=False, method=m,
                          logits_processor=[MomentumLogits()])
        assert hooked.token_ids == rule.token_ids


@pytest.mark.parametrize("options", [{"alpha": -0.1}, {"alpha": math.inf}, {"top_k": 0}, {"max_ngram": 0},
                                     {"resistance": "quadratic"}])
def test_refusals(options):
    with pytest.raises(ConfigError):
        registry.build("rule", "momentum", **options)


def test_refuses_sampling():
    with pytest.raises(ConfigError, match="greedily"):
        generate(greedy_target(), None, PROMPT, max_new_tokens=4, do_sample=True, rule=registry.build("rule", "momentum"))

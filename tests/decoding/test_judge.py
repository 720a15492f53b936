"""Judge decoding: the `judge` verifier accepts what greedy matching accepts plus the draft tokens its
judge approves, and counts those as divergent. Lossy; equal to greedy when the judge approves nothing."""

from __future__ import annotations

import pytest
import torch
from tiny_models import greedy_target, judge_package, naive_greedy, random_model

from warpdecode.bench.specs import parse_methods
from warpdecode.decoding.generate import build_method, generate
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.decoding.tree import DraftTree
from warpdecode.decoding.verifiers.greedy_match import greedy_accept
from warpdecode.decoding.verifiers.judge import judge_accept
from warpdecode.errors import CheckpointError, ConfigError

pytestmark = pytest.mark.usefixtures("single_thread")
PROMPT = [3, 7, 1, 9, 4, 4, 2]
GREEDY = Sampler(SamplingConfig())


def scores(values: list[float]):
    """The judge's scores as `judge_accept` asks for them, recording which nodes it asked about."""
    asked: list[int] = []

    def score(nodes: list[int]) -> list[float]:
        asked.extend(nodes)
        return [values[n] for n in nodes]

    score.asked = asked  # type: ignore[attr-defined]
    return score


def logits_choosing(choices: list[int], vocab: int = 8) -> torch.Tensor:
    """(len(choices), vocab) logits whose argmax at row i is choices[i]."""
    logits = torch.zeros(len(choices), vocab)
    logits[torch.arange(len(choices)), torch.tensor(choices)] = 5.0
    return logits


def test_a_judge_that_approves_nothing_is_greedy_matching():
    tree = DraftTree(torch.tensor([1, 2, 5, 3]), torch.tensor([-1, 0, 1, -1]))
    logits = logits_choosing([1, 2, 4, 6, 0])
    result = judge_accept(tree, logits, scores([0.0] * 4), 0.5, GREEDY)
    assert result == greedy_accept(tree, logits)
    assert result.path == [0, 1] and result.bonus == 4 and result.divergent == 0


def test_approved_tokens_are_accepted_and_counted_as_divergent():
    # chain 1 → 2 → 5; the target wants 1, 7, ...: node 1 (token 2) differs but the judge approves it
    chain = DraftTree(torch.tensor([1, 2, 5]), torch.tensor([-1, 0, 1]))
    logits = logits_choosing([1, 7, 5, 6])
    score = scores([0.0, 0.9, 0.0])
    result = judge_accept(chain, logits, score, 0.5, GREEDY)
    assert result.path == [0, 1, 2] and result.tokens == [1, 2, 5, 6] and result.divergent == 1
    assert score.asked == [1]  # the judge is asked only where the target disagrees
    # below the threshold it is rejected and the target's token follows
    result = judge_accept(chain, logits, scores([0.0, 0.4, 0.0]), 0.5, GREEDY)
    assert result.path == [0] and result.tokens == [1, 7] and result.divergent == 0


def test_in_a_tree_the_targets_choice_comes_first_then_the_best_approved_sibling():
    # root children: tokens 3 (score 0.6), 4 (score 0.9), 2 (the target's argmax, score 0)
    tree = DraftTree(torch.tensor([3, 4, 2]), torch.tensor([-1, -1, -1]))
    logits = logits_choosing([2, 0, 0, 0])
    assert judge_accept(tree, logits, scores([0.6, 0.9, 0.0]), 0.5, GREEDY).path == [2]
    logits = logits_choosing([6, 0, 0, 0])
    result = judge_accept(tree, logits, scores([0.6, 0.9, 0.0]), 0.5, GREEDY)
    assert result.path == [1] and result.divergent == 1


def judge_method(drafter: str, path: str, threshold: float, **options):
    return build_method(drafter, do_sample=False, options=options, verifier="judge",
                        verifier_options={"path": path, "threshold": threshold})


def test_decoding_with_a_silent_judge_is_greedy_identical(tmp_path):
    model = greedy_target()
    judge = judge_package(model, tmp_path / "judge", seed=3)
    out = generate(model, None, PROMPT, max_new_tokens=40, stop_at_eos=False,
                   method=judge_method("int4_self", judge, 1.0, num_tokens=5))
    assert out.token_ids == naive_greedy(model, PROMPT, 40)
    assert out.stats.divergent_tokens == 0


def test_a_judge_that_approves_everything_accepts_whole_chains(tmp_path):
    model = greedy_target()
    judge = judge_package(model, tmp_path / "judge", bias=10.0)
    kwargs = {"max_new_tokens": 40, "stop_at_eos": False}
    judged = generate(model, None, PROMPT, **kwargs, method=judge_method("draft_model", judge, 0.5, layers=1, num_tokens=4))
    trusted = generate(model, None, PROMPT, **kwargs, method=build_method(
        "draft_model", do_sample=False, options={"layers": 1, "num_tokens": 4}, verifier="trust"))
    assert judged.token_ids == trusted.token_ids
    assert judged.stats.divergent_tokens == trusted.stats.divergent_tokens > 0
    assert all(a == p for a, p in zip(judged.stats.accepted_per_step, judged.stats.proposed_per_step, strict=True))


def test_method_specs_route_verifier_options():
    spec = parse_methods("int4_self:verifier=judge:verifier.path=somewhere:verifier.threshold=0.7")[1]
    method = spec.build(do_sample=False)
    assert (method.verifier.path, method.verifier.threshold) == ("somewhere", 0.7)
    with pytest.raises(ConfigError, match="names no verifier"):
        parse_methods("int4_self:verifier.path=somewhere")
    with pytest.raises(ConfigError, match="has no option"):
        parse_methods("int4_self:verifier=greedy:verifier.path=somewhere")


def test_bad_options_and_another_targets_judge_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="needs a trained judge"):
        build_method("int4_self", do_sample=False, verifier="judge")
    with pytest.raises(ConfigError, match="threshold"):
        build_method("int4_self", do_sample=False, verifier="judge", verifier_options={"path": "x", "threshold": 1.5})
    other = judge_package(greedy_target(), tmp_path / "judge")
    model = random_model(seed=9, std=0.3, vocab_size=64, n_layer=3, n_head=4, n_kv_head=2, d_model=32, d_ff=64,
                         max_seq_len=256)
    with pytest.raises(CheckpointError, match="trained for"):
        generate(model, None, PROMPT, max_new_tokens=8, method=judge_method("int4_self", other, 0.5))

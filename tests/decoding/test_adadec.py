"""AdaDec against a straightforward uncached reference (every forward recomputes the whole sequence,
every rollout runs alone), and greedy decoding when it never pauses."""

import pytest
import torch
from tiny_models import greedy_target

from warpdecode.decoding import registry
from warpdecode.decoding.generate import generate
from warpdecode.decoding.rules.adadec import entropy, rollout_scores
from warpdecode.errors import ConfigError

pytestmark = pytest.mark.usefixtures("single_thread")


def reference(model, prompt, n, threshold, top_k, lookahead, stops):
    """AdaDec written out: (tokens, steps that paused)."""
    seq, paused = list(prompt), 0

    def logprobs(tokens):
        return torch.log_softmax(model(torch.tensor([tokens])).logits[0, -1].float(), dim=-1)

    with torch.inference_mode():
        for _ in range(n):
            lp = logprobs(seq)
            token = int(lp.argmax())
            if float(entropy(lp[None])[0]) > threshold:
                paused += 1
                best = float("-inf")
                for cand in lp.topk(top_k).indices.tolist():
                    values, context = [float(lp[cand])], seq + [cand]
                    while cand not in stops and len(values) <= lookahead:
                        nxt = logprobs(context)
                        cand = int(nxt.argmax())
                        values.append(float(nxt[cand]))
                        context.append(cand)
                    score = sum(values) / len(values)
                    if score > best:
                        best, token = score, context[len(seq)]
            seq.append(token)
            if token in stops:
                break
    return seq[len(prompt) :], paused


@pytest.mark.parametrize("prompt", [[3, 5, 7, 11], [40, 2]])
def test_never_pausing_is_greedy(prompt):
    model = greedy_target()
    rule = registry.build("rule", "adadec", threshold=float("inf"))
    out = generate(model, None, prompt, max_new_tokens=24, stop_at_eos=False, rule=rule)
    assert out.token_ids == generate(model, None, prompt, max_new_tokens=24, stop_at_eos=False).token_ids
    assert out.stats.target_forwards == 23


@pytest.mark.parametrize(("prompt", "stops"), [([3, 5, 7, 11], []), ([40, 2], [22, 46])])
def test_rerank_matches_the_uncached_reference(prompt, stops):
    model = greedy_target()
    rule = registry.build("rule", "adadec", threshold=2.9, top_k=3, lookahead=4)
    kwargs = {"eos_token_id": stops} if stops else {"stop_at_eos": False}
    out = generate(model, None, prompt, max_new_tokens=20, rule=rule, **kwargs)
    expected, paused = reference(model, prompt, 20, 2.9, 3, 4, set(stops))
    assert out.token_ids == expected
    assert 0 < paused < len(expected)  # some steps paused, some stayed greedy
    greedy = generate(model, None, prompt, max_new_tokens=20, **kwargs).token_ids
    assert out.token_ids != greedy


def test_rollouts_fit_the_end_of_the_context():
    """Near the context's end the rollouts shorten instead of writing past the cache."""
    model = greedy_target()  # 256 positions
    prompt = list(range(1, 60)) * 4  # 236 tokens: 20 left
    rule = registry.build("rule", "adadec", threshold=0.0, top_k=2, lookahead=8)
    out = generate(model, None, prompt, max_new_tokens=40, stop_at_eos=False, rule=rule)
    assert len(out.token_ids) == 20 and out.finish_reason == "context"


def test_rollout_scores_stop_at_a_stop_token():
    candidate = torch.tensor([-1.0, -2.0, -0.5])
    rollout = torch.tensor([[-1.0, -3.0], [-0.0, -0.0], [-9.0, -9.0]])
    stopped = torch.tensor([[False, True, False], [False, False, False], [True, False, False]])
    assert rollout_scores(candidate, rollout, stopped).tolist() == [-1.0, pytest.approx(-2 / 3), -0.5]


@pytest.mark.parametrize(("options", "message"), [
    ({}, "needs a learned threshold"),
    ({"threshold": -1.0}, "must be >= 0"),
    ({"threshold": float("nan")}, "must be >= 0"),
    ({"threshold": 1.0, "top_k": 1}, "top_k >= 2"),
    ({"threshold": 1.0, "lookahead": 0}, "lookahead >= 1"),
])
def test_bad_options_are_one_line_config_errors(options, message):
    with pytest.raises(ConfigError, match=message):
        registry.build("rule", "adadec", **options)

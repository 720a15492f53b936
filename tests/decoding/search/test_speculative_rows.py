"""The sampling searches with speculative decoding: each row drafts (prompt lookup) and verifies with
speculative sampling, so rows follow the target's distribution: greedy-limit rows equal plain
decoding, sampled rows' tokens match the exact marginals of plain sampling."""

import pytest
import torch
from tiny_models import greedy_target, naive_greedy, tiny_vocab_target, tv

from warpdecode.decoding.generate import build_method, generate
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.decoding.search.best_of_n import BestOfN
from warpdecode.decoding.search.first_finish import FirstFinish
from warpdecode.decoding.search.sample import MultiSample
from warpdecode.errors import CapabilityError

pytestmark = pytest.mark.usefixtures("single_thread")
PROMPT = [1, 5, 2, 6, 1, 5, 2, 6, 1, 5]  # repeats: prompt lookup drafts from it


def lookup():
    return build_method("prompt_lookup", do_sample=True)


def test_greedy_limit_rows_are_plain_decoding_and_draft():
    model = greedy_target()
    sampler = Sampler(SamplingConfig(do_sample=True, top_k=1, seed=0))
    out = MultiSample(n=3).search(model, None, PROMPT, sampler, max_new_tokens=12, stop_ids=set(), method=lookup)
    assert [c.token_ids for c in out.candidates] == [naive_greedy(model, PROMPT, 12)] * 3
    assert sum(out.stats.proposed_per_step) > 0 and out.stats.search_tokens == 36  # drafted (and rejected)


def test_sampled_rows_follow_the_targets_marginals():
    """Token 3 of each row (drafted and verified: the first token is picked at prefill) against its exact
    marginal Σ p(x1) p(x2|x1) p(x3|x1 x2) under the target."""
    model = tiny_vocab_target()
    prompt = [1, 5, 2, 6] + naive_greedy(model, [1, 5, 2, 6], 6) + [1, 5, 2, 6]  # lookup drafts the likely tokens
    with torch.inference_mode():
        def probs(seq):
            return torch.softmax(model(torch.tensor([seq])).logits[0, -1].double(), -1)
        exact = torch.zeros(8, dtype=torch.float64)
        p1 = probs(prompt)
        for a in range(8):
            p2 = probs(prompt + [a])
            for b in range(8):
                exact += p1[a] * p2[b] * probs(prompt + [a, b])
    thirds, accepted = [], 0
    for seed in range(40):
        sampler = Sampler(SamplingConfig(do_sample=True, seed=1000 * seed))
        out = MultiSample(n=16).search(model, None, prompt, sampler, max_new_tokens=4, stop_ids=set(), method=lookup)
        thirds += [c.token_ids[2] for c in out.candidates]
        accepted += sum(out.stats.accepted_per_step)
    assert accepted > 200  # speculation took part: ~430 accepted drafts
    # 640 samples of 8 outcomes: ~0.04 expected; accepting every draft would put far more mass on the lookup's
    assert tv(thirds, exact) < 0.065


def test_best_of_n_ranks_speculative_rows_by_their_target_logprob(tiny_model_dir):
    from warpdecode.models.checkpoint import load_pretrained

    model, tokenizer = load_pretrained(tiny_model_dir)
    out = generate(model, tokenizer, "print('a') print('a') print(", max_new_tokens=8, do_sample=True, seed=4,
                   chat=False, method="prompt_lookup", search=BestOfN(n=4))
    scores = [c.score for c in out.sequences]
    assert len(out.sequences) == 4 and scores == sorted(scores, reverse=True)
    for c in out.sequences:  # the score is the target's log-probability of the row, computed after the fact
        with torch.inference_mode():
            ids = tokenizer.encode("print('a') print('a') print(")
            logp = torch.log_softmax(model(torch.tensor([ids + c.token_ids])).logits[0].float(), -1)
        assert c.logprob == pytest.approx(sum(float(logp[len(ids) - 1 + i, t]) for i, t in enumerate(c.token_ids)),
                                          abs=1e-3)
    stopped = generate(model, tokenizer, "print('a') print('a') print(", max_new_tokens=8, do_sample=True, seed=4,
                       chat=False, method="prompt_lookup", num_return_sequences=3, stop=out.sequences[0].text[1:3])
    assert any(c.finish_reason == "stop" for c in stopped.sequences)


def test_refusals():
    model = greedy_target()
    with pytest.raises(CapabilityError, match="does not run with a drafter"):
        generate(model, None, PROMPT, max_new_tokens=4, do_sample=True, method="prompt_lookup", search=FirstFinish(n=2))
    with pytest.raises(CapabilityError, match="cannot draft for a row of a batch"):
        generate(model, None, PROMPT, max_new_tokens=4, do_sample=True, method="layer_skip", num_return_sequences=2)

"""n samples in one batch, best-of-N with scorers, and First Finish Search."""

import re

import pytest
import torch
from tiny_models import greedy_target, naive_greedy, tiny_vocab_target

from warpdecode.decoding import registry
from warpdecode.decoding.generate import generate
from warpdecode.decoding.outputs import Candidate
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.decoding.search.best_of_n import BestOfN
from warpdecode.decoding.search.first_finish import FirstFinish
from warpdecode.decoding.search.sample import MultiSample
from warpdecode.decoding.search.scorers import LogProbScorer, ProgramScorer, named_scorer
from warpdecode.errors import CapabilityError, ConfigError

pytestmark = pytest.mark.usefixtures("single_thread")
STOP = {3}
PROMPT = [1, 5, 2, 6]


def sampler(seed=0, **options):
    return Sampler(SamplingConfig(do_sample=True, seed=seed, **options))


def target_logprob(model, prompt, tokens):
    """Sum of the target's log-probabilities of `tokens` after `prompt`, in one cache-free forward."""
    with torch.inference_mode():
        logp = torch.log_softmax(model(torch.tensor([prompt + tokens])).logits[0].float(), -1)
    return sum(float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(tokens))


def test_samples_are_seeded_and_scored_under_the_target():
    model = tiny_vocab_target()
    first = MultiSample(n=6).search(model, None, PROMPT, sampler(), max_new_tokens=12, stop_ids=STOP)
    again = MultiSample(n=6).search(model, None, PROMPT, sampler(), max_new_tokens=12, stop_ids=STOP)
    assert [c.token_ids for c in first.candidates] == [c.token_ids for c in again.candidates]
    assert len({tuple(c.token_ids) for c in first.candidates}) > 1
    lengths = [len(c.token_ids) for c in first.candidates]
    assert first.stats.search_tokens == sum(lengths) and min(lengths) < 12  # rows leave the batch as they end
    for c in first.candidates:
        assert c.finish_reason == ("eos" if c.token_ids[-1] in STOP else "length")
        assert c.logprob == pytest.approx(target_logprob(model, PROMPT, c.token_ids), abs=1e-4)


def test_top_k_one_samples_are_greedy():
    model = greedy_target()
    out = MultiSample(n=3).search(model, None, PROMPT, sampler(top_k=1), max_new_tokens=8, stop_ids=set())
    assert [c.token_ids for c in out.candidates] == [naive_greedy(model, PROMPT, 8)] * 3


def test_best_of_n_ranks_by_its_scorer():
    model = tiny_vocab_target()
    samples = MultiSample(n=6).search(model, None, PROMPT, sampler(), max_new_tokens=12, stop_ids=STOP).candidates
    best = BestOfN(n=6).search(model, None, PROMPT, sampler(), max_new_tokens=12, stop_ids=STOP)
    assert sorted(c.token_ids for c in best.candidates) == sorted(c.token_ids for c in samples)
    assert best.candidates[0].logprob == max(c.logprob for c in samples)
    assert [c.score for c in best.candidates] == sorted((c.logprob for c in samples), reverse=True)
    shortest = BestOfN(n=6, scorer=ProgramScorer(lambda text: -len(text))).search(
        model, None, PROMPT, sampler(), max_new_tokens=12, stop_ids=STOP)  # no tokenizer: every text is ""
    assert [c.token_ids for c in shortest.candidates] == [c.token_ids for c in samples]  # ties keep row order


def test_program_scorers_read_the_text():
    candidates = [Candidate([1], "eos", text="x = 1"), Candidate([2, 3], "eos", logprob=-1.0, text="def f(): pass")]
    assert named_scorer("regex", r"def \w+\(").score([], candidates) == [0.0, 1.0]
    assert named_scorer("length").score([], candidates) == [-5.0, -13.0]
    assert LogProbScorer(mean=True).score([], candidates) == [0.0, -0.5]
    with pytest.raises(ConfigError, match="scorer=regex needs pattern"):
        named_scorer("regex")
    with pytest.raises(ConfigError, match="not a regular expression"):
        named_scorer("regex", "(")


def test_best_of_n_with_a_regex_on_text(tiny_model_dir):
    from warpdecode.models.checkpoint import load_pretrained

    model, tokenizer = load_pretrained(tiny_model_dir)
    search = registry.build("search", "best_of_n", n=8, scorer="regex", pattern="[aeiou]")
    out = generate(model, tokenizer, "print", max_new_tokens=6, do_sample=True, seed=0, search=search, chat=False)
    matching = [bool(re.search("[aeiou]", c.text)) for c in out.sequences]
    assert len(out.sequences) == 8 and matching == sorted(matching, reverse=True) and matching[0]
    assert out.text == out.sequences[0].text


def test_first_finish_stops_at_the_first_finished_row():
    model = tiny_vocab_target()
    n = 6
    every = MultiSample(n=n).search(model, None, PROMPT, sampler(), max_new_tokens=12, stop_ids=STOP).candidates
    ffs = FirstFinish(n=n).search(model, None, PROMPT, sampler(), max_new_tokens=12, stop_ids=STOP)
    first = min(len(c.token_ids) for c in every if c.finish_reason == "eos")
    winners = [c for c in every if c.finish_reason == "eos" and len(c.token_ids) == first]
    (winner,) = ffs.candidates
    # the same random stream until the first row ends: the winner is one of best-of-N's samples
    assert winner.finish_reason == "eos" and winner.token_ids == max(winners, key=lambda c: c.logprob).token_ids
    assert ffs.stats.search_tokens == n * first < sum(len(c.token_ids) for c in every)
    assert ffs.stats.target_forwards == first - 1


def test_sampling_strategies_need_sampling():
    model = greedy_target()
    for search in (MultiSample(n=2), BestOfN(n=2), FirstFinish(n=2)):
        with pytest.raises(CapabilityError, match="draws samples"):
            generate(model, None, PROMPT, max_new_tokens=4, search=search)
    out = generate(model, None, PROMPT, max_new_tokens=4, do_sample=True, seed=1, num_return_sequences=3)
    assert len(out.sequences) == 3 and out.token_ids == out.sequences[0].token_ids


def test_samples_end_at_stop_strings_and_the_batch_goes_on(tiny_model_dir):
    """Each row ends at the token completing a stop string, its text before it; every other row is the
    same as without stop strings up to its own end (one random stream: a row stopping early changes the
    draws of later rows, so only rows that finish before any stop are compared whole)."""
    from warpdecode.models.checkpoint import load_pretrained

    model, tokenizer = load_pretrained(tiny_model_dir)
    free = generate(model, tokenizer, "print", max_new_tokens=12, do_sample=True, seed=3, chat=False,
                    num_return_sequences=4, stop_at_eos=False)
    stop = free.sequences[0].text[3:5]
    assert stop
    out = generate(model, tokenizer, "print", max_new_tokens=12, do_sample=True, seed=3, chat=False,
                   num_return_sequences=4, stop=stop, stop_at_eos=False)
    first = out.sequences[0]
    cut = free.sequences[0].text.index(stop)
    assert first.finish_reason == "stop" and first.text == free.sequences[0].text[:cut]
    assert tokenizer.decode(first.token_ids).find(stop) >= 0 and stop not in tokenizer.decode(first.token_ids[:-1])
    for c in out.sequences:
        assert (c.finish_reason == "stop") == (stop in tokenizer.decode(c.token_ids)) and stop not in c.text
    ffs = generate(model, tokenizer, "print", max_new_tokens=12, do_sample=True, seed=3, chat=False, stop=stop,
                   stop_at_eos=False, search=FirstFinish(n=4))
    assert ffs.finish_reason == "stop" and ffs.stats.search_tokens == 4 * len(ffs.token_ids)
    with pytest.raises(CapabilityError, match="takes no stop strings"):
        generate(model, tokenizer, "print", max_new_tokens=4, num_beams=2, stop=stop, chat=False)

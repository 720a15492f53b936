"""RankGen beam search over sampled continuations, and the RankGen scorer's file."""

import itertools

import pytest
import torch
from tiny_models import greedy_target, random_model

from warpdecode.decoding import registry
from warpdecode.decoding.outputs import Candidate
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.decoding.search.rankgen import RankGenScorer
from warpdecode.errors import CheckpointError, ConfigError
from warpdecode.models.rankgen import RankGenConfig, RankGenNet, save_rankgen

pytestmark = pytest.mark.usefixtures("single_thread")
PROMPT = [1, 5, 2, 6]


def sampler(seed=0):
    return Sampler(SamplingConfig(do_sample=True, seed=seed))


class CountToken:
    """The number of times `token` occurs in the candidate."""

    def __init__(self, token):
        self.token, self.calls = token, []

    def score(self, prompt, candidates):
        self.calls.append([list(c.token_ids) for c in candidates])
        return [float(c.token_ids.count(self.token)) for c in candidates]


def run(strategy, model=None, *, max_new_tokens=10, stop_ids=frozenset(), seed=0):
    return strategy.search(model or greedy_target(), None, PROMPT, sampler(seed), max_new_tokens=max_new_tokens,
                           stop_ids=set(stop_ids))


def test_one_beam_over_whole_samples_is_best_of_n_with_the_same_scorer():
    rankgen = registry.build("search", "rankgen", scorer=CountToken(7), beams=1, samples=8, chunk=10)
    best_of_n = registry.build("search", "best_of_n", scorer=CountToken(7), n=8)
    ours, theirs = run(rankgen), run(best_of_n)
    assert ours.candidates[0].token_ids == theirs.candidates[0].token_ids
    assert ours.candidates[0].score == theirs.candidates[0].score == 1.0


@pytest.mark.parametrize("beams,samples,chunk", [(2, 3, 3), (3, 2, 4)])
def test_beams_continue_the_best_scored_chunks(beams, samples, chunk):
    scorer = CountToken(7)
    strategy = registry.build("search", "rankgen", scorer=scorer, beams=beams, samples=samples, chunk=chunk,
                              num_return_sequences=2)
    out = run(strategy, max_new_tokens=10)
    rounds = scorer.calls
    assert [len(r) for r in rounds] == [beams * samples] * len(rounds)
    for before, after in itertools.pairwise(rounds):
        kept = sorted(before, key=lambda c: -c.count(7))[:beams]  # stable, as the search ranks
        assert sorted({tuple(c[: len(kept[0])]) for c in after}) == sorted(tuple(k) for k in kept)
    assert all(len(c) == min(10, chunk * (i + 1)) for i, r in enumerate(rounds) for c in r)
    best = max(c.count(7) for c in rounds[-1])
    assert [c.score for c in out.candidates] == sorted((c.score for c in out.candidates), reverse=True)
    assert out.candidates[0].score == best and len(out.candidates) == 2
    assert out.stats.new_tokens == 10 and all(len(c.token_ids) == 10 for c in out.candidates)


def test_budget_eos_and_seed():
    model = greedy_target()
    strategy = registry.build("search", "rankgen", scorer=CountToken(7), beams=2, samples=3, chunk=4)
    out = run(strategy, model, max_new_tokens=7)
    assert len(out.candidates[0].token_ids) == 7 and out.candidates[0].finish_reason == "length"
    again = run(strategy, model, max_new_tokens=7)
    assert again.candidates[0].token_ids == out.candidates[0].token_ids
    other = [run(strategy, model, max_new_tokens=7, seed=s).candidates[0].token_ids for s in (1, 2, 3)]
    assert any(o != out.candidates[0].token_ids for o in other)
    stop = out.candidates[0].token_ids[1]  # a token the search draws early: rows stop at it
    ended = run(registry.build("search", "rankgen", scorer=CountToken(stop), beams=2, samples=3, chunk=4), model,
                max_new_tokens=12, stop_ids={stop})
    best = ended.candidates[0]
    assert best.finish_reason == "eos" and best.token_ids[-1] == stop and stop not in best.token_ids[:-1]


def test_options_are_checked():
    for options, message in [({}, "needs path"), ({"scorer": CountToken(1), "path": "x"}, "needs path"),
                             ({"scorer": CountToken(1), "beams": 0}, "beams >= 1"),
                             ({"scorer": CountToken(1), "samples": 0}, "samples >= 1"),
                             ({"scorer": CountToken(1), "beams": 20, "samples": 20}, "<= 256"),
                             ({"scorer": CountToken(1), "chunk": 0}, "chunk >= 1"),
                             ({"scorer": CountToken(1), "num_return_sequences": 3}, "num_return_sequences")]:
        with pytest.raises(ConfigError, match=message):
            registry.build("search", "rankgen", **options)


def test_scorer_file_round_trip_and_refusals(tmp_path):
    model = greedy_target()
    torch.manual_seed(0)
    net = RankGenNet(RankGenConfig(width=16, layers=1, heads=2, max_prefix=8, max_continuation=6), model.config.d_model)
    net.attach(model).eval()
    path = save_rankgen(net, {"source": "tiny", "fingerprint": model.fingerprint()}, tmp_path / "rg.safetensors")
    assert path.stat().st_size < 50_000  # the target's embeddings are not stored
    scorer = RankGenScorer.load(str(path), model)
    candidates = [Candidate([3, 4, 5], "length"), Candidate([9], "eos"), Candidate(list(range(10, 20)), "length")]
    assert scorer.score(PROMPT * 5, candidates) == pytest.approx(net.scores(PROMPT * 5, [c.token_ids for c in candidates]))
    long = list(range(10, 20))  # 10 tokens, max_continuation 6: its first 4 are read as prefix
    assert net.scores(PROMPT, [long]) == pytest.approx(net.scores(PROMPT + long[:4], [long[4:]]))
    out = run(registry.build("search", "rankgen", path=str(path), beams=2, samples=2, chunk=3), model, max_new_tokens=6)
    assert out.candidates[0].score == pytest.approx(scorer.score(PROMPT, out.candidates)[0], abs=1e-4)
    with pytest.raises(CheckpointError, match="trained for 'tiny'"):  # another model
        RankGenScorer.load(str(path), random_model(seed=5, std=0.3, vocab_size=64, n_layer=1, n_head=4, d_model=32,
                                                   d_ff=64, max_seq_len=64))
    (tmp_path / "bad.safetensors").write_bytes(b"not a safetensors file")
    for bad, message in [(tmp_path / "none.safetensors", "is not a file"), (tmp_path / "bad.safetensors", "corrupt")]:
        with pytest.raises(ConfigError, match=message):
            registry.build("search", "rankgen", path=str(bad))

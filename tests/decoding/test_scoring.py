"""TokenScorer: the target's log-probabilities of new tokens, the same however they are handed in."""

from __future__ import annotations

import pytest
import torch
from tiny_models import greedy_target, naive_greedy

from warpdecode.decoding import scoring
from warpdecode.decoding.continuous import ContinuousBatch
from warpdecode.decoding.generate import build_method
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.decoding.scoring import TokenScorer
from warpdecode.errors import ConfigError

pytestmark = pytest.mark.usefixtures("single_thread")
PROMPTS = [[5, 6, 7, 8, 5, 6], [1, 2, 3], [9] * 11]


def _reference(model, prompt: list[int], new: list[int]) -> torch.Tensor:
    """log_softmax of a cache-free forward over prompt + new: row t scores new[t]. Returns (T, V)."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + new])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), dim=-1)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_scores_equal_log_softmax_of_the_targets_logits_and_do_not_depend_on_chunking(prompt, monkeypatch):
    model = greedy_target()
    new = naive_greedy(model, prompt, 12)
    whole = TokenScorer(model, prompt, max_new_tokens=12, top=4).score(new)
    chunked_scorer = TokenScorer(model, prompt, max_new_tokens=12, top=4)
    chunked = [s for lo, hi in ((0, 1), (1, 5), (5, 6), (6, 12)) for s in chunked_scorer.score(new[lo:hi])]
    assert chunked == whole  # bit for bit: every position computes what a one-token step computes
    monkeypatch.setattr(scoring, "SCORE_CHUNK", 5)  # one long batch, read in pieces
    assert TokenScorer(model, prompt, max_new_tokens=12, top=4).score(new) == whole
    reference = _reference(model, prompt, new)
    assert [s.token for s in whole] == new
    torch.testing.assert_close(torch.tensor([s.logprob for s in whole]), reference[torch.arange(12), new],
                               atol=1e-5, rtol=0)
    for s, row in zip(whole, reference, strict=True):
        assert [t for t, _ in s.top] == row.topk(4).indices.tolist()
        values = [lp for _, lp in s.top]
        assert values == sorted(values, reverse=True)
        assert s.top[0] == (s.token, s.logprob)  # greedy tokens are the most likely ones


def test_top_zero_gives_only_the_tokens_own_logprob_and_the_room_is_checked():
    model = greedy_target()
    scorer = TokenScorer(model, [1, 2], max_new_tokens=3)
    scored = scorer.score([4, 5])
    assert [s.top for s in scored] == [(), ()] and all(s.logprob < 0 for s in scored)
    with pytest.raises(ConfigError, match="exceed"):
        scorer.score([6, 7])
    with pytest.raises(ConfigError):
        TokenScorer(model, [], max_new_tokens=3)


class _Recording(Sampler):
    """Keeps every logits row it picks a token from."""

    def __init__(self) -> None:
        super().__init__(SamplingConfig())
        self.seen: list[torch.Tensor] = []

    def select(self, logits: torch.Tensor) -> torch.Tensor:
        self.seen.append(logits.clone())
        return super().select(logits)


@pytest.mark.parametrize("prefill_chunk", [None, 4])
def test_a_batch_rows_kept_logits_are_what_the_scorer_computes(prefill_chunk):
    """Bit for bit: the logits rows of a batch pick their tokens from (plain and speculative rows, the
    first token from the prompt's prefill, in chunks or not) are the scorer's, so the server may take
    either."""
    model = greedy_target()
    batch = ContinuousBatch(model, max_rows=3, max_len=64, stop_ids=set(), prefill_chunk=prefill_chunk)
    methods = [None, "prompt_lookup", "token_recycling"]
    rows = [batch.add(p, max_new_tokens=12, sampler=_Recording(), keep_logits=True,
                      method=None if m is None else build_method(m, do_sample=False))
            for p, m in zip(PROMPTS, methods, strict=True)]
    kept: dict[int, list[torch.Tensor]] = {id(row): [] for row in rows}
    for row in rows:
        if row.last:
            kept[id(row)].append(row.last_logits)
    while batch.rows or batch.filling:
        for row in batch.step():
            assert row.last_logits is not None and len(row.last_logits) == len(row.last)
            kept[id(row)].append(row.last_logits)
        for row in [r for r in batch.rows if r.finish is not None]:
            batch.remove(row)
    assert max(len(r.last) for r in rows) > 1 or any(len(ls) > 1 for ls in kept.values())
    assert any(max(r.stats.accepted_per_step, default=0) > 0 for r in rows)  # some step kept drafts
    for prompt, row, method in zip(PROMPTS, rows, methods, strict=True):
        scored = TokenScorer(model, prompt, max_new_tokens=12, top=3, prefill_chunk=prefill_chunk).score(row.new)
        carried = scoring.scores(torch.cat(kept[id(row)]), torch.tensor(row.new), 3)
        if method != "token_recycling":  # plain rows and chains: every query over a prefix of its row
            assert carried == scored
        else:  # a tree: the native exact attention rounds a query over prefix + extra slots apart (~1e-7)
            torch.testing.assert_close(torch.tensor([s.logprob for s in carried]),
                                       torch.tensor([s.logprob for s in scored]), atol=1e-5, rtol=0)
    plain = rows[0]  # its sampler saw exactly these logits
    assert torch.equal(torch.cat(plain.sampler.seen), torch.cat(kept[id(plain)]))

"""TokenScorer: the target's log-probabilities of new tokens, the same however they are handed in."""

from __future__ import annotations

import pytest
import torch
from tiny_models import greedy_target, naive_greedy

from warpdecode.decoding import scoring
from warpdecode.decoding.continuous import ContinuousBatch
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


def test_plain_rows_of_a_batch_are_scored_with_the_logits_they_were_decoded_from():
    model = greedy_target()
    batch = ContinuousBatch(model, max_rows=3, max_len=64, stop_ids=set())
    rows = [batch.add(p, max_new_tokens=10, sampler=_Recording()) for p in PROMPTS]
    while batch.rows:
        batch.step()
        for row in [r for r in batch.rows if r.finish is not None]:
            batch.remove(row)
    for prompt, row in zip(PROMPTS, rows, strict=True):
        scored = TokenScorer(model, prompt, max_new_tokens=10).score(row.new)
        decoded = torch.log_softmax(torch.cat(row.sampler.seen).float(), dim=-1)  # (10, V)
        assert [s.logprob for s in scored] == decoded[torch.arange(10), row.new].tolist()  # bit for bit

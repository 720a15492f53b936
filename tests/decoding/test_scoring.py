"""TokenScorer: the target's log-probabilities of new tokens, the same however they are handed in."""

from __future__ import annotations

import pytest
import torch
from tiny_models import greedy_target, naive_greedy, random_model

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
def test_a_batch_rows_kept_logits_are_what_the_scorer_computes(prefill_chunk, monkeypatch):
    """Bit for bit: the logits rows of a batch pick their tokens from (a plain row, a chain's and a tree's
    accepted paths, the first token from the prompt's prefill, in chunks or not) are the scorer's, so the
    server may take either."""
    # heads 16 wide: the native exact attention rounds a tree node's query over prefix + extra slots as the
    # same keys read as a prefix only where the head width is a multiple of 16 (its vector width)
    model = random_model(seed=1, std=0.3, vocab_size=64, n_layer=3, n_head=2, n_kv_head=1, d_model=32, d_ff=64,
                         max_seq_len=256)
    prompts = [[5, 6, 7, 8, 5, 6], [1, 2, 3], [47, 53, 0, 3, 59, 3, 39, 9, 19, 21, 50]]
    methods = [None, "prompt_lookup", "token_recycling"]
    batch = ContinuousBatch(model, max_rows=3, max_len=64, stop_ids=set(), prefill_chunk=prefill_chunk)
    paths: list[list[int]] = []
    accept = batch._accept
    monkeypatch.setattr(batch, "_accept", lambda *args: paths.append(accept(*args)) or paths[-1])
    rows = [batch.add(p, max_new_tokens=24, sampler=_Recording(), keep_logits=True,
                      method=None if m is None else build_method(m, do_sample=False))
            for p, m in zip(prompts, methods, strict=True)]
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
    assert any(path != list(range(len(path))) for path in paths)  # a tree's path off its first branch
    for prompt, row in zip(prompts, rows, strict=True):
        scored = TokenScorer(model, prompt, max_new_tokens=24, top=3, prefill_chunk=prefill_chunk).score(row.new)
        assert scoring.scores(torch.cat(kept[id(row)]), torch.tensor(row.new), 3) == scored
    plain = rows[0]  # its sampler saw exactly these logits
    assert torch.equal(torch.cat(plain.sampler.seen), torch.cat(kept[id(plain)]))


def test_top_alternatives_break_ties_by_token_id():
    logits = torch.tensor([[1.0, 3.0, 0.0, 3.0, 3.0, 2.0], [5.0, 4.0, 4.0, 1.0, 0.0, 0.0]])  # (T, V)
    first, second = scoring.scores(logits, torch.tensor([5, 2]), 2)
    assert [t for t, _ in first.top] == [1, 3] and [t for t, _ in second.top] == [0, 1]  # a tie across the cut
    assert first.top[0][1] == first.top[1][1] and first.logprob == pytest.approx(float(torch.log_softmax(logits[0], 0)[5]))
    assert [t for t, _ in scoring.scores(logits, torch.tensor([5, 2]), 6)[0].top] == [1, 3, 4, 5, 0, 2]


@pytest.mark.slow
def test_real_model_batch_rows_keep_the_scorers_numbers(smollm2):
    """The default model (64-wide heads): a plain row's and a token-recycling row's kept logits are the
    scorer's, bit for bit."""
    tok = smollm2.tokenizer
    prompts = [tok.encode("def add(a, b):\n    return a + b\n\ndef sub(a, b):"), tok.encode("1, 2, 3, 4, 5, 6,")]
    methods = [None, "token_recycling"]
    batch = ContinuousBatch(smollm2.model, max_rows=2, max_len=128, stop_ids=set())
    rows = [batch.add(p, max_new_tokens=12, sampler=Sampler(SamplingConfig()), keep_logits=True,
                      method=None if m is None else build_method(m, do_sample=False))
            for p, m in zip(prompts, methods, strict=True)]
    kept = {id(row): [row.last_logits] for row in rows}
    while batch.rows:
        for row in batch.step():
            kept[id(row)].append(row.last_logits)
        for row in [r for r in batch.rows if r.finish is not None]:
            batch.remove(row)
    assert max(len(r.stats.accepted_per_step) and max(r.stats.accepted_per_step) for r in rows) > 0
    for prompt, row in zip(prompts, rows, strict=True):
        scored = TokenScorer(smollm2.model, prompt, max_new_tokens=12, top=5).score(row.new)
        assert scoring.scores(torch.cat(kept[id(row)]), torch.tensor(row.new), 5) == scored

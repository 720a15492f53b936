"""n samples of one prompt as one batch: Hugging Face's `num_return_sequences` with `do_sample`.

The prompt is run once and its keys and values are given to n cache rows; each step samples one token
per open row through the `Sampler` (its penalties per row, then its filters), and a row that ends (a
stop token or the budget) leaves the batch. Each sample records its log-probability under the target.
One random generator serves the batch, so samples differ from n one-by-one runs with the same seed.
`stop_at_first` ends the whole batch when the first row ends with a stop token (First Finish Search).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from warpdecode.decoding.engine import Method
from warpdecode.decoding.outputs import Candidate, DecodeStats, FinishReason
from warpdecode.decoding.processors import TokenHistory
from warpdecode.decoding.registry import register
from warpdecode.decoding.sampler import Sampler
from warpdecode.decoding.search.protocols import SearchResult, SearchStrategy
from warpdecode.decoding.search.rows import MAX_ROWS, next_row_logits, prefill_rows, with_text
from warpdecode.decoding.search.speculative_rows import sample_rows_speculative
from warpdecode.decoding.stop_strings import StopStrings
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.cache import KVCache
from warpdecode.models.tokenizer import Tokenizer


@dataclass
class _Row:
    tokens: list[int] = field(default_factory=list)
    logprob: float = 0.0
    finish: FinishReason | None = None


@torch.inference_mode()
def sample_rows(model: Backbone, tokenizer: Tokenizer | None, prompt: list[int], sampler: Sampler, n: int, *,
                max_new_tokens: int, stop_ids: set[int], stop_at_first: bool = False,
                stop_strings: tuple[str, ...] = (), method: Callable[[], Method] | None = None) -> SearchResult:
    """Sample `n` continuations of `prompt` in one batch; candidates in row order (unranked, no score).
    `method` builds a speculative method per row: then `sample_rows_speculative` runs them.
    A row ends at a stop token ("eos"), at the token that completes one of `stop_strings` in its text
    ("stop"; its text then ends before the stop string) or at the budget ("length"). With
    `stop_at_first`, the rows still open when the first row stops are cut there ("length")."""
    if method is not None:
        return sample_rows_speculative(model, tokenizer, prompt, sampler, n, method, max_new_tokens=max_new_tokens,
                                       stop_ids=stop_ids, stop_at_first=stop_at_first, stop_strings=stop_strings)
    if stop_strings and tokenizer is None:
        raise ConfigError("stop strings need a tokenizer")
    start = time.perf_counter()
    stats = DecodeStats(prompt_tokens=len(prompt))
    cache, first = prefill_rows(model, prompt, n, len(prompt) + max_new_tokens)
    return decode_rows(model, tokenizer, prompt, sampler, cache, first[None].expand(n, -1), stats, start,
                       max_new_tokens=max_new_tokens, stop_ids=stop_ids, stop_at_first=stop_at_first,
                       stop_strings=stop_strings)


def decode_rows(model: Backbone, tokenizer: Tokenizer | None, prompt: list[int], sampler: Sampler, cache: KVCache,
                logits: Tensor, stats: DecodeStats, start: float, *, max_new_tokens: int, stop_ids: set[int],
                stop_at_first: bool = False, stop_strings: tuple[str, ...] = (),
                bias: Tensor | None = None) -> SearchResult:
    """Continue the n rows of `cache` (already prefilled: one prompt, or one per row) one token per step, as
    `sample_rows` does; the penalties read `prompt` as every row's context.

    Args:
        logits: (n, V) float32 each row's next-token logits after its prompt.
        bias: (n, V) float32 or None, added to a row's processed logits before its token is chosen (not to
            the recorded log-probabilities); a row's entry for a token is cleared once the row emits it, so
            a bonus for a token is paid once (plan-guided decoding, `edu_plans.py`).
    """
    n = logits.shape[0]
    bias = None if bias is None else bias.to(logits.device, torch.float32).clone()
    rows = [_Row() for _ in range(n)]
    checks = [StopStrings(tokenizer, stop_strings) for _ in range(n)] if stop_strings and tokenizer else None
    active = list(range(n))
    while True:
        raw = torch.log_softmax(logits.float(), dim=-1)  # (B_active, V) the target's distribution
        if sampler.penalties:
            history = TokenHistory(torch.tensor(prompt), len(prompt), tuple(tuple(rows[i].tokens) for i in active))
            logits = sampler.penalize(logits, history)
        if bias is not None:
            logits = logits.float() + bias[active]
        chosen = sampler.select(logits)  # (B_active,)
        picked = raw.gather(1, chosen[:, None])[:, 0].tolist()
        if bias is not None:
            bias[active, chosen.to(bias.device)] = 0.0
        if not stats.time_to_first_token:
            stats.time_to_first_token = time.perf_counter() - start
        for i, token, logprob in zip(active, chosen.tolist(), picked, strict=True):
            row = rows[i]
            row.tokens.append(token)
            row.logprob += logprob
            if checks is not None and checks[i].check([token]) is not None:
                row.finish = "stop"
            elif token in stop_ids:
                row.finish = "eos"
            elif len(row.tokens) >= max_new_tokens:
                row.finish = "length"
        stats.search_tokens += len(active)
        if stop_at_first and any(rows[i].finish in ("eos", "stop") for i in active):
            for i in active:
                rows[i].finish = rows[i].finish or "length"
        still = [j for j, i in enumerate(active) if rows[i].finish is None]
        if not still:
            break
        active, logits = next_row_logits(model, cache, [r.tokens for r in rows], active, still)  # (B_active, V)
        stats.target_forwards += 1
    stats.seconds = time.perf_counter() - start
    stats.target_seconds = stats.seconds - stats.time_to_first_token
    candidates = [Candidate(r.tokens, r.finish or "length", logprob=r.logprob) for r in rows]
    return SearchResult(with_text(candidates, tokenizer, stop_strings), stats)


@register("search", "sample")
class MultiSample(SearchStrategy):
    needs_sampling = True
    takes_stop_strings = True
    composes_with_speculation = True  # each row drafts and verifies on its own (speculative_rows.py)

    def __init__(self, n: int = 4) -> None:
        if not 1 <= n <= MAX_ROWS:
            raise ConfigError(f"n (--num-return-sequences) must be in [1, {MAX_ROWS}], got {n}")
        self.n = self.num_return_sequences = n

    def search(self, model: Backbone, tokenizer: Tokenizer | None, prompt: list[int], sampler: Sampler, *,
               max_new_tokens: int, stop_ids: set[int], stop_strings: tuple[str, ...] = (),
               method: Callable[[], Method] | None = None) -> SearchResult:
        result = sample_rows(model, tokenizer, prompt, sampler, self.n, max_new_tokens=max_new_tokens,
                             stop_ids=stop_ids, stop_strings=stop_strings, method=method)
        result.stats.new_tokens = len(result.candidates[0].token_ids)
        return result

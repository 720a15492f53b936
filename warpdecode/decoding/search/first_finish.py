"""First Finish Search (Agarwal et al. 2025): sample n continuations in one batch and stop the whole
batch as soon as the first one ends with a stop token or a stop string; that one is the answer.

The bet: among samples of one reasoning prompt, the shortest finished trace is as likely to be right as
a longer one, so waiting for all n (best-of-N) spends tokens for nothing. Tokens spent
(`stats.search_tokens`) are n times the winner's length at most. When several rows stop at the same
step the one the target finds most likely wins; when none stops within the budget, the most likely of
the cut rows does.
"""

from __future__ import annotations

from warpdecode.decoding.registry import register
from warpdecode.decoding.sampler import Sampler
from warpdecode.decoding.search.protocols import SearchResult, SearchStrategy
from warpdecode.decoding.search.rows import MAX_ROWS
from warpdecode.decoding.search.sample import sample_rows
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.tokenizer import Tokenizer


@register("search", "first_finish")
class FirstFinish(SearchStrategy):
    needs_sampling = True
    takes_stop_strings = True
    composes_with_speculation = False  # a drafting row finishes in fewer steps: the first to finish would change
    num_return_sequences = 1

    def __init__(self, n: int = 4) -> None:
        if not 1 <= n <= MAX_ROWS:
            raise ConfigError(f"first_finish needs n in [1, {MAX_ROWS}], got {n}")
        self.n = n

    def search(self, model: Backbone, tokenizer: Tokenizer | None, prompt: list[int], sampler: Sampler, *,
               max_new_tokens: int, stop_ids: set[int], stop_strings: tuple[str, ...] = ()) -> SearchResult:
        result = sample_rows(model, tokenizer, prompt, sampler, self.n, max_new_tokens=max_new_tokens,
                             stop_ids=stop_ids, stop_at_first=True, stop_strings=stop_strings)
        finished = [c for c in result.candidates if c.finish_reason in ("eos", "stop")] or result.candidates
        winner = max(finished, key=lambda c: c.logprob)  # first of equals: the lowest row
        winner.score = winner.logprob
        result.candidates = [winner]
        result.stats.new_tokens = len(winner.token_ids)
        return result

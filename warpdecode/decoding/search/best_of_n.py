"""Best-of-N: sample n continuations in one batch, score each finished one, return them best first.

The scorer (`scorers.py`) is the target's log-probability by default; a program (regex, length, any
callable of the text) or, later, a reward model ranks instead. Cost: every sample runs to its end, so
tokens spent (`stats.search_tokens`) are the sum of the n lengths; First Finish Search stops earlier.
"""

from __future__ import annotations

from collections.abc import Callable

from warpdecode.decoding.engine import Method
from warpdecode.decoding.registry import register
from warpdecode.decoding.sampler import Sampler
from warpdecode.decoding.search.protocols import SearchResult, SearchStrategy
from warpdecode.decoding.search.rows import MAX_ROWS
from warpdecode.decoding.search.sample import sample_rows
from warpdecode.decoding.search.scorers import Scorer, ScorerName, named_scorer
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.tokenizer import Tokenizer


@register("search", "best_of_n")
class BestOfN(SearchStrategy):
    needs_sampling = True
    takes_stop_strings = True
    composes_with_speculation = True  # each row drafts and verifies on its own (speculative_rows.py)

    def __init__(self, n: int = 4, scorer: ScorerName | Scorer = "logprob", pattern: str | None = None) -> None:
        if not 1 <= n <= MAX_ROWS:
            raise ConfigError(f"best_of_n needs n in [1, {MAX_ROWS}], got {n}")
        self.n = self.num_return_sequences = n
        self.scorer = scorer if isinstance(scorer, Scorer) else named_scorer(scorer, pattern)

    def search(self, model: Backbone, tokenizer: Tokenizer | None, prompt: list[int], sampler: Sampler, *,
               max_new_tokens: int, stop_ids: set[int], stop_strings: tuple[str, ...] = (),
               method: Callable[[], Method] | None = None) -> SearchResult:
        result = sample_rows(model, tokenizer, prompt, sampler, self.n, max_new_tokens=max_new_tokens,
                             stop_ids=stop_ids, stop_strings=stop_strings, method=method)
        scores = self.scorer.score(prompt, result.candidates)
        for candidate, score in zip(result.candidates, scores, strict=True):
            candidate.score = score
        result.candidates.sort(key=lambda c: -(c.score or 0.0))  # stable: ties keep row order
        result.stats.new_tokens = len(result.candidates[0].token_ids)
        return result

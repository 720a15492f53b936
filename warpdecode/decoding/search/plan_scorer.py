"""The reranker of plan-guided summaries (`edu_plans.py`), behind the `Scorer` protocol.

Adams et al. 2023 rerank with BRIO, a trained summary scorer; none exists offline, so the score is a
weighted sum of three signals read without a forward:

* `coverage`: the share of a candidate's plan content words (`edu.content_words`) its text contains
  (candidate i follows plan i; 0 without plans);
* `support`: ROUGE-2 precision against the source, the share of the candidate's word bigrams the source
  holds (a faithfulness proxy: a paraphrase scores low, a copied sentence high);
* `logprob`: the target's mean token log-probability of the candidate (length-normalised).

Without plans it ranks any summaries of one source (best-of-N with `PlanScorer(source)`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from warpdecode.decoding.outputs import Candidate
from warpdecode.decoding.search.edu import content_words, words
from warpdecode.errors import ConfigError


def bigram_precision(text: str, source: str) -> float:
    """Share of the text's word bigrams that occur in the source (0.0 for a text under 2 words)."""
    tokens, known = words(text), set(pairwise(words(source)))
    grams = list(pairwise(tokens))
    return sum(g in known for g in grams) / len(grams) if grams else 0.0


@dataclass(frozen=True)
class PlanScorer:
    source: str
    plans: tuple[str, ...] = ()
    """Each candidate's plan text, in candidate order (empty: no coverage term)."""
    coverage_weight: float = 1.0
    support_weight: float = 1.0
    logprob_weight: float = 1.0

    def __post_init__(self) -> None:
        weights = (self.coverage_weight, self.support_weight, self.logprob_weight)
        if not all(0 <= w < float("inf") for w in weights):
            raise ConfigError(f"the plan reranker needs finite weights >= 0, got coverage_weight={weights[0]}, "
                              f"support_weight={weights[1]}, logprob_weight={weights[2]}")

    def coverage(self, plan: str, text: str) -> float:
        wanted, have = content_words(plan), set(words(text))
        return len(wanted & have) / len(wanted) if wanted else 0.0

    def score(self, prompt: list[int], candidates: Sequence[Candidate]) -> list[float]:
        if self.plans and len(self.plans) != len(candidates):
            raise ValueError(f"{len(candidates)} candidates for {len(self.plans)} plans")
        out = []
        for i, c in enumerate(candidates):
            value = self.support_weight * bigram_precision(c.text, self.source)
            value += self.logprob_weight * c.logprob / max(1, len(c.token_ids))
            if self.plans:
                value += self.coverage_weight * self.coverage(self.plans[i], c.text)
            out.append(value)
        return out

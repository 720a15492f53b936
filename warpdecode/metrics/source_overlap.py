"""A faithfulness proxy for text generated from a source (a summary of a document, an answer from
retrieved passages): the fraction of the generated word n-grams that occur in the source.

High values mean the text stays with what the source says (or copies it); low values mean words the
source does not hold, which is where unsupported claims live. It measures grounding in words, not
truth: a correct paraphrase scores low, and a copied sentence used wrongly scores high.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

from warpdecode.metrics.open_ended import ngrams


def words(text: str) -> list[str]:
    """Lower-cased word tokens (letters, digits, underscore), punctuation dropped: "Lake Quen." → ["lake", "quen"]."""
    return re.findall(r"\w+", text.lower())


class SourceOverlap(Metric):
    """Over every (generated, source) pair given: generated n-grams found in their source / generated
    n-grams (NaN before any n-gram). Inputs are word lists (`words`)."""

    full_state_update = False
    found: Tensor
    total: Tensor

    def __init__(self, n: int = 2, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.n = n
        self.add_state("found", torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("total", torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, generated: Sequence[Sequence[str]], sources: Sequence[Sequence[str]]) -> None:
        vocabulary: dict[str, int] = {}
        for text, source in zip(generated, sources, strict=True):
            ids = [vocabulary.setdefault(w, len(vocabulary)) for w in text]
            known = set(ngrams([vocabulary.setdefault(w, len(vocabulary)) for w in source], self.n))
            grams = ngrams(ids, self.n)
            self.found += sum(g in known for g in grams)
            self.total += len(grams)

    def compute(self) -> Tensor:
        return self.found / self.total if self.total > 0 else torch.tensor(float("nan"))

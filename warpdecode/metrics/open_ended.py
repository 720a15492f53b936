"""Open-ended generation quality: diversity and repetition of a set of generated sequences.

Each metric is updated with generated sequences of *units* (int64 ids: tokens, or words mapped to
ids so that models with different tokenizers compare) and computes over everything seen:

* `DistinctN(n)`: distinct n-grams / all n-grams, pooled over the sequences (Li et al. 2016).
* `RepetitionRate(n)`: rep-n, the mean over sequences of 1 − distinct n-grams / n-grams within the
  sequence (Welleck et al. 2019's seq-rep-n); 0 = no n-gram repeats, → 1 = one n-gram looping.
* `TypeTokenRatio()`: the mean over sequences of distinct units / units.
* `SelfBLEU(n)`: the mean over sequences of the BLEU-n of each sequence against all the others as
  references (Zhu et al. 2018); high = the generations resemble each other.

Sequences shorter than the n-gram order count nowhere (there is nothing to measure). The states are a
flat unit tensor and per-sequence lengths, both concatenated across processes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import pairwise

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.functional.text import bleu_score


def ngrams(units: Sequence[int], n: int) -> list[tuple[int, ...]]:
    return [tuple(units[i : i + n]) for i in range(len(units) - n + 1)]


class SequenceSetMetric(Metric):
    """Keeps every sequence it is updated with; subclasses compute over `sequences()`."""

    full_state_update = False
    higher_is_better: bool | None = None
    units: Tensor
    """(Σ T,) int64, every sequence's units back to back."""
    lengths: Tensor
    """(N,) int64, each sequence's length."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.add_state("units", default=torch.zeros(0, dtype=torch.int64), dist_reduce_fx="cat")
        self.add_state("lengths", default=torch.zeros(0, dtype=torch.int64), dist_reduce_fx="cat")

    def update(self, sequences: Iterable[Sequence[int] | Tensor]) -> None:
        """Args:
        sequences: generated sequences, each a list of unit ids or a (T,) int64 tensor.
        """
        rows = [torch.as_tensor(s, dtype=torch.int64).reshape(-1) for s in sequences]
        if not rows:
            return
        self.units = torch.cat([self.units, *(r.to(self.units.device) for r in rows)])
        self.lengths = torch.cat([self.lengths, torch.tensor([len(r) for r in rows], device=self.lengths.device)])

    def sequences(self) -> list[list[int]]:
        units: list[int] = self.units.tolist()
        bounds = torch.tensor([0, *self.lengths.tolist()]).cumsum(0).tolist()
        return [units[a:b] for a, b in pairwise(bounds)]


def _ratio(numerator: float, denominator: float) -> Tensor:
    return torch.tensor(numerator / denominator if denominator else float("nan"))


class DistinctN(SequenceSetMetric):
    higher_is_better = True

    def __init__(self, n: int = 2, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.n = n

    def compute(self) -> Tensor:
        grams = [g for s in self.sequences() for g in ngrams(s, self.n)]
        return _ratio(len(set(grams)), len(grams))


class RepetitionRate(SequenceSetMetric):
    higher_is_better = False

    def __init__(self, n: int = 4, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.n = n

    def compute(self) -> Tensor:
        rates = [1 - len(set(g)) / len(g) for s in self.sequences() if (g := ngrams(s, self.n))]
        return _ratio(sum(rates), len(rates))


class TypeTokenRatio(SequenceSetMetric):
    higher_is_better = True

    def compute(self) -> Tensor:
        ratios = [len(set(s)) / len(s) for s in self.sequences() if s]
        return _ratio(sum(ratios), len(ratios))


class SelfBLEU(SequenceSetMetric):
    higher_is_better = False

    def __init__(self, n: int = 4, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.n = n

    def compute(self) -> Tensor:
        texts = [" ".join(map(str, s)) for s in self.sequences() if len(s) >= self.n]
        if len(texts) < 2:
            return torch.tensor(float("nan"))
        scores = [float(bleu_score([text], [texts[:i] + texts[i + 1 :]], n_gram=self.n, smooth=True))
                  for i, text in enumerate(texts)]
        return torch.tensor(sum(scores) / len(scores))


class WordIds:
    """Maps words (whitespace-separated) to stable ids, so that text from any tokenizer is measured in
    the same units."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}

    def __call__(self, text: str) -> list[int]:
        return [self.index.setdefault(word, len(self.index)) for word in text.split()]

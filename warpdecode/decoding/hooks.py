"""The caller's logits hooks, with Hugging Face `generate()`'s names and semantics: `logits_processor`
(callables `(input_ids, scores) -> scores`), `sequence_bias` and `bad_words_ids`.

They run where the penalties run (`Sampler.penalize`), so every row of a tree verification is
processed with its own context (the committed tokens plus the row's root-to-node path) and
speculative decoding with a hook stays token-identical to plain decoding with the same hook. Order,
as Hugging Face's: sequence bias, the penalties, bad words, then the caller's processors; the
sampling warpers come after all of them.

A caller's processor must be a function of its inputs: speculative decoding calls it once per tree
row, for rows that are then thrown away, in no promised order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from warpdecode.decoding.processors import Penalty, TokenHistory
from warpdecode.errors import ConfigError

LogitsProcessorFn = Callable[[Tensor, Tensor], Tensor]
"""Hugging Face's `LogitsProcessor` call: `(input_ids (1, T) int64, scores (1, V) float32) -> (1, V)`."""


def _token_sequences(value: object, flag: str, *, allow_empty: bool = False) -> list[tuple[int, ...]]:
    """`value` as non-empty tuples of token ids >= 0; ConfigError naming `flag` otherwise."""
    if not isinstance(value, (list, tuple)) or not (value or allow_empty):
        raise ConfigError(f"{flag} must be a non-empty list of token-id sequences, got {value!r}")
    out = []
    for seq in value:
        if (not isinstance(seq, (list, tuple)) or not seq
                or any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in seq)):
            raise ConfigError(f"{flag}: each sequence must be a non-empty list of token ids >= 0, got {seq!r}")
        out.append(tuple(seq))
    return out


class SequenceBias:
    """Add a bias to the logit of a sequence's last token wherever the row's context ends with the
    sequence's other tokens; a one-token sequence is biased everywhere (Hugging Face's
    `SequenceBiasLogitsProcessor`). Biases of several multi-token sequences ending in one token add up.
    A bias of `-inf` forbids the sequence (`BadWords`).
    """

    def __init__(self, biases: Mapping[tuple[int, ...], float], flag: str = "sequence_bias") -> None:
        if not isinstance(biases, Mapping) or not (biases or flag == "bad_words_ids"):
            raise ConfigError(f"{flag} must be a non-empty dict of token-id tuples to floats, got {biases!r}")
        keys = _token_sequences(list(biases), flag, allow_empty=True)
        values = list(biases.values())
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
            raise ConfigError(f"{flag}: every bias must be a number, got {values!r}")
        self.flag = flag
        self.single = {seq[0]: float(v) for seq, v in zip(keys, values, strict=True) if len(seq) == 1}
        self.multi = [(seq[:-1], seq[-1], float(v)) for seq, v in zip(keys, values, strict=True) if len(seq) > 1]
        self.largest = max((t for seq in keys for t in seq), default=-1)
        self.longest = max((len(prefix) for prefix, _, _ in self.multi), default=0)

    def __call__(self, logits: Tensor, history: TokenHistory) -> Tensor:
        """(N, V) logits → (N, V) biased logits, row r by the context `history` gives it."""
        if self.largest >= logits.shape[-1]:
            raise ConfigError(f"{self.flag} names token {self.largest}, but the vocabulary has {logits.shape[-1]} tokens")
        bias = torch.zeros_like(logits)  # (N, V): one sum per logit, added once, as Hugging Face adds it
        for token, value in self.single.items():
            bias[:, token] = value
        for row in range(logits.shape[0]):
            tail = history.tail(row, self.longest)
            for prefix, token, value in self.multi:
                if len(prefix) <= len(tail) and tuple(tail[len(tail) - len(prefix) :]) == prefix:
                    bias[row, token] += value
        return logits + bias


class BadWords(SequenceBias):
    """Forbid token sequences (Hugging Face's `NoBadWordsLogitsProcessor`): a sequence's last token gets
    logit `-inf` wherever the context ends with its other tokens. A one-token sequence that is a stop
    token is dropped, as Hugging Face drops it, so the model can still end."""

    def __init__(self, bad_words_ids: Sequence[Sequence[int]], stop_ids: Sequence[int] = ()) -> None:
        sequences = _token_sequences(bad_words_ids, "bad_words_ids")
        kept = [seq for seq in sequences if not (len(seq) == 1 and seq[0] in stop_ids)]
        super().__init__({seq: float("-inf") for seq in kept}, "bad_words_ids")


@dataclass(frozen=True)
class CallerProcessors:
    """The caller's processors, each called on every row with that row's own `input_ids`."""

    processors: tuple[LogitsProcessorFn, ...]

    def __call__(self, logits: Tensor, history: TokenHistory) -> Tensor:
        rows = []
        for row in range(logits.shape[0]):
            input_ids = history.context(row).to(logits.device)[None]  # (1, T)
            scores = logits[row : row + 1].clone()  # (1, V): a processor may write in place
            for processor in self.processors:
                scores = processor(input_ids, scores)
            if scores.shape != (1, logits.shape[1]):
                raise ConfigError(f"a logits_processor returned scores of shape {tuple(scores.shape)}, "
                                  f"expected {(1, logits.shape[1])}")
            rows.append(scores)
        return torch.cat(rows).float()


@dataclass(frozen=True)
class LogitsHooks:
    """The hooks of one request, each optional."""

    logits_processor: tuple[LogitsProcessorFn, ...] = ()
    sequence_bias: Mapping[tuple[int, ...], float] | None = None
    bad_words_ids: Sequence[Sequence[int]] | None = None
    stop_ids: tuple[int, ...] = ()
    """The request's stop tokens: a one-token bad word among them is dropped."""
    _built: tuple[list[Penalty], list[Penalty]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if any(not callable(p) for p in self.logits_processor):
            raise ConfigError("logits_processor must be a list of callables (input_ids, scores) -> scores")
        before: list[Penalty] = [SequenceBias(self.sequence_bias)] if self.sequence_bias is not None else []
        after: list[Penalty] = [BadWords(self.bad_words_ids, self.stop_ids)] if self.bad_words_ids is not None else []
        if self.logits_processor:
            after.append(CallerProcessors(tuple(self.logits_processor)))
        object.__setattr__(self, "_built", (before, after))

    def around(self, penalties: list[Penalty]) -> list[Penalty]:
        """The penalties with the hooks in Hugging Face's order: sequence bias first; bad words and
        the caller's processors last."""
        before, after = self._built
        return [*before, *penalties, *after]

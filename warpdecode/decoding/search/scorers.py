"""Scorers: how a search ranks finished candidates (best-of-N, and later reward-guided searches).

A `Scorer` maps a prompt and its candidates to one number each, higher is better. Two families:

* the target's own belief: `LogProbScorer`, the sequence log-probability recorded while sampling
  (summed, or per token with `mean`), at no extra forward;
* a program: `ProgramScorer` over the candidate's text: any callable, a regular expression
  (`regex_scorer`: 1 when it matches), or the length (`length_scorer`: shorter is better).

* a model: `ModelScorer`, a second model's (or the target's) mean log-probability of the candidate's
  tokens after the prompt: the stand-in for a process reward model that A*-decoding ships, since no
  trained one exists offline. It scores partial solutions as well as finished ones.

A search over partial solutions (A*) passes each open one as a `Candidate` whose `finish_reason` is
"length"; a trained reward head fits the same protocol (score the token ids).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import torch

from warpdecode.decoding.outputs import Candidate
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.cache import KVCache


@runtime_checkable
class Scorer(Protocol):
    def score(self, prompt: list[int], candidates: Sequence[Candidate]) -> list[float]:
        """One score per candidate (higher is better); `prompt` is the token ids they continue."""
        ...


@dataclass(frozen=True)
class LogProbScorer:
    """The candidate's log-probability under the target; `mean` divides by its length (per-token)."""

    mean: bool = False

    def score(self, prompt: list[int], candidates: Sequence[Candidate]) -> list[float]:
        return [c.logprob / max(1, len(c.token_ids)) if self.mean else c.logprob for c in candidates]


@dataclass(frozen=True)
class ProgramScorer:
    """A function of the candidate's text (the candidates need text: run with a tokenizer)."""

    function: Callable[[str], float]

    def score(self, prompt: list[int], candidates: Sequence[Candidate]) -> list[float]:
        return [float(self.function(c.text)) for c in candidates]


class ModelScorer:
    """A model's log-probability of the candidate's tokens after the prompt, per token (`mean`) or summed.

    A process-reward stand-in, not a trained PRM: it says how plausible the model finds the partial
    solution, not whether it is right. `model` must share the target's tokenizer (Qwen2.5-Coder 0.5B and
    1.5B do). The prompt runs once per prompt (its keys and values are kept); each candidate then costs
    one forward over its own tokens.
    """

    def __init__(self, model: Backbone, mean: bool = True) -> None:
        self.model, self.mean = model, mean
        self._prompt: tuple[int, ...] = ()
        self._cache: KVCache | None = None
        self._first = torch.zeros(0)  # (V,) float32 log-probabilities after the prompt

    @torch.inference_mode()
    def score(self, prompt: list[int], candidates: Sequence[Candidate]) -> list[float]:
        model, device = self.model, self.model.embed.weight.device
        if self._cache is None or self._prompt != tuple(prompt):
            self._cache = model.new_cache(1, len(prompt))
            out = model(torch.tensor([prompt], device=device), cache=self._cache, logits_slice=slice(-1, None))
            self._prompt, self._first = tuple(prompt), torch.log_softmax(out.logits[0, -1].float(), -1)
        scores = []
        for c in candidates:
            tokens = c.token_ids
            if not tokens:
                scores.append(0.0)
                continue
            if max(tokens) >= self._first.shape[0]:
                raise ConfigError(f"scorer model has {self._first.shape[0]} tokens; the candidate has id {max(tokens)}: "
                                  "it needs the target's tokenizer")
            total = float(self._first[tokens[0]])
            if len(tokens) > 1:
                cache = model.new_cache(1, len(prompt) + len(tokens))
                cache.fill_from_row(self._cache)
                logits = model(torch.tensor([tokens[:-1]], device=device), cache=cache).logits[0]  # (T - 1, V)
                logp = torch.log_softmax(logits.float(), -1)
                total += float(logp.gather(1, torch.tensor(tokens[1:], device=device)[:, None]).sum())
            scores.append(total / len(tokens) if self.mean else total)
        return scores


def regex_scorer(pattern: str) -> ProgramScorer:
    """1.0 for a candidate whose text matches `pattern` anywhere (`re.search`), else 0.0."""
    try:
        compiled = re.compile(pattern)
    except re.error as error:
        raise ConfigError(f"scorer pattern {pattern!r} is not a regular expression: {error}") from None
    return ProgramScorer(lambda text: float(compiled.search(text) is not None))


def length_scorer() -> ProgramScorer:
    """Shorter is better: minus the number of characters."""
    return ProgramScorer(lambda text: -float(len(text)))


ScorerName = Literal["logprob", "mean_logprob", "regex", "length"]


def named_scorer(name: ScorerName, pattern: str | None = None) -> Scorer:
    """The built-in scorer a method spec names (`best_of_n:scorer=regex:pattern=...`)."""
    if (name == "regex") != (pattern is not None):
        raise ConfigError("scorer=regex needs pattern=REGEX, and pattern is read by scorer=regex only")
    if name == "regex":
        assert pattern is not None
        return regex_scorer(pattern)
    scorers: dict[str, Callable[[], Scorer]] = {"logprob": LogProbScorer, "mean_logprob": lambda: LogProbScorer(mean=True),
                                                "length": length_scorer}
    if name not in scorers:
        raise ConfigError(f"unknown scorer {name!r}; choose one of: logprob, mean_logprob, regex, length")
    return scorers[name]()

"""Scorers: how a search ranks finished candidates (best-of-N, and later reward-guided searches).

A `Scorer` maps a prompt and its candidates to one number each, higher is better. Two families:

* the target's own belief: `LogProbScorer`, the sequence log-probability recorded while sampling
  (summed, or per token with `mean`), at no extra forward;
* a program: `ProgramScorer` over the candidate's text: any callable, a regular expression
  (`regex_scorer`: 1 when it matches), or the length (`length_scorer`: shorter is better).

A search over partial solutions (A*) passes each open one as a `Candidate` whose `finish_reason` is
"length"; a model's mean log-probability of it (`rewards.ModelScorer`) is the process-reward stand-in
A*-decoding ships, since no trained process reward model exists offline.

Reward-guided searches (DeAL, Transfer Q*) add programmatic rewards here (`keyword_scorer`,
`LengthTargetScorer`) and learned ones in `rewards.py` (a reward head, a second model).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from warpdecode.decoding.outputs import Candidate
from warpdecode.errors import ConfigError


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


def keyword_scorer(keywords: Sequence[str]) -> ProgramScorer:
    """The fraction of `keywords` the text contains (case-insensitive): a DeAL-style programmatic constraint,
    partial credit for a partial continuation."""
    wanted = [k.strip().lower() for k in keywords if k.strip()]
    if not wanted:
        raise ConfigError("the keyword reward needs at least one keyword (keywords=a,b,c)")
    return ProgramScorer(lambda text: sum(k in text.lower() for k in wanted) / len(wanted))


@dataclass(frozen=True)
class LengthTargetScorer:
    """Closeness to `target` new tokens: `-|length - target| / target` for a finished candidate (it ended
    with a stop token), `-max(0, length - target) / target` for an open one (it can still reach the target)."""

    target: int

    def __post_init__(self) -> None:
        if self.target < 1:
            raise ConfigError(f"the length reward needs target_length >= 1, got {self.target}")

    def score(self, prompt: list[int], candidates: Sequence[Candidate]) -> list[float]:
        out = []
        for c in candidates:
            over = len(c.token_ids) - self.target
            out.append(-(abs(over) if c.finish_reason == "eos" else max(0, over)) / self.target)
        return out

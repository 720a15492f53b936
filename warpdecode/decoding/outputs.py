"""Typed results of a generation; metric definitions are in docs/metrics.md."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

FinishReason = Literal["eos", "stop", "length", "context"]
"""eos: a stop token; stop: a stop string (`generate(stop=...)`); length: `max_new_tokens` (a constrained
output closed by `close_at_budget` too: `DecodeStats.closing_tokens` > 0); context: the model's context
is full."""


def compute_tau(accepted: int, forwards: int, *, bonus: bool = True) -> float:
    """τ over `forwards` verify forwards that accepted `accepted` draft tokens in all: the mean tokens
    emitted per forward, `(accepted + forwards) / forwards` with the bonus token, `accepted / forwards`
    without it (docs/metrics.md); 0.0 without a forward. 6 accepted over 4 forwards → 2.5 (1.5 without)."""
    if not forwards:
        return 0.0
    return (accepted + forwards) / forwards if bonus else accepted / forwards


@dataclass
class DecodeStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    target_forwards: int = 0
    """Target forwards after the prefill (the prefill itself is not counted)."""
    seconds: float = 0.0
    """Wall time from the start of the prefill to the last token."""
    time_to_first_token: float = 0.0
    draft_seconds: float = 0.0
    """Time spent in the drafter and controller (proposals and observations); the streaming callback
    (`on_tokens`) is in neither this nor `target_seconds`."""
    target_seconds: float = 0.0
    """Time spent in target verify forwards and acceptance."""
    accepted_per_step: list[int] = field(default_factory=list)
    """Draft tokens accepted at each verify forward (the bonus token not included)."""
    proposed_per_step: list[int] = field(default_factory=list)
    """Draft tokens that could have been accepted at each verify forward (the draft tree's depth)."""
    divergent_tokens: int = 0
    """Emitted draft tokens the target's argmax disagreed with (lossy verifiers: `trust`, `typical`)."""
    closing_tokens: int = 0
    """Tokens at the end of a constrained output written by budget-aware closing instead of the model
    (`generate(close_at_budget=True)`, stop token included; finish reason `length`); 0 otherwise."""
    search_tokens: int = 0
    """Tokens generated over every row of a search (beams, samples), kept or discarded: its cost in
    tokens; 0 for single-sequence decoding, where it is `new_tokens`."""

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def tau(self) -> float:
        """Mean tokens emitted per target forward, bonus token included."""
        return compute_tau(sum(self.accepted_per_step), len(self.accepted_per_step))

    @property
    def tau_without_bonus(self) -> float:
        return compute_tau(sum(self.accepted_per_step), len(self.accepted_per_step), bonus=False)

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens / draft tokens that could have been accepted."""
        proposed = sum(self.proposed_per_step)
        return sum(self.accepted_per_step) / proposed if proposed else 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {
            "tokens_per_second": self.tokens_per_second,
            "tau": self.tau,
            "tau_without_bonus": self.tau_without_bonus,
            "acceptance_rate": self.acceptance_rate,
        }


@dataclass
class Candidate:
    """One sequence of a multi-candidate search (beam search, n samples, best-of-N)."""

    token_ids: list[int]
    """New tokens only, the stop token included when the sequence ended with one."""
    finish_reason: FinishReason
    score: float | None = None
    """The strategy's ranking score: for beam search Hugging Face's `sequences_scores` (the sum of the
    processed token log-probabilities divided by the length penalty), for best-of-N the scorer's."""
    logprob: float = 0.0
    """Sum of the target's log-probabilities of the tokens (the raw model distribution; beam search sums
    the processed log-probabilities it ranks, which differ from the raw ones only under penalties)."""
    text: str = ""


@dataclass
class GenerateOutput:
    token_ids: list[int]
    """New tokens only (the prompt is not repeated)."""
    text: str
    finish_reason: FinishReason
    stats: DecodeStats = field(default_factory=DecodeStats)
    sequences: list[Candidate] = field(default_factory=list)
    """Every returned sequence, best first, when a search returns several (`num_beams`,
    `num_return_sequences`, a search method); `token_ids` / `text` are then the first one's. Empty for
    single-sequence decoding."""


def until_stop(tokens: list[int], stop_ids: set[int]) -> list[int]:
    """`tokens` up to and including the first stop token (all of them when none is one): a step that
    emits several tokens stops right after a stop token, even mid-path."""
    for i, token in enumerate(tokens):
        if token in stop_ids:
            return tokens[: i + 1]
    return tokens

"""When a self-drafted chain stops: rules that read only the drafter's own state.

A rule sees each drafted position before its token joins the chain: the draft's (1, V) logits there
and its (1, C) final normed hidden state. It answers whether the token joins the chain, and whether
drafting goes on after it. None reads the target, so under a lossless verifier every rule keeps the
output exactly the target's; with the lossy `trust` verifier (no verification) the rule becomes a
router that decides which model writes each token.

* `acceptance` (SpecDec++): the acceptance head's p_i = P(target accepts token i | earlier ones
  accepted); stop after the token once 1 − Π p_i exceeds the threshold (the token is still proposed).
* `router`: the same head as a learned router: a token joins only while its own predicted p_i is at
  least the threshold; below it, the large model writes the token (Entropy Adaptive Decoding's
  learned variant: "predict when the small model suffices").
* `entropy` (Entropy Adaptive Decoding): a token joins only while the rolling mean entropy (nats)
  of the draft's distributions over the last `window` drafted positions, this one included, stays at
  or below the threshold. The window spans steps and resets per request.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass
from typing import Literal

from torch import Tensor

from warpdecode.errors import ConfigError
from warpdecode.models.acceptance_head import AcceptanceHead, draft_signals

StopRuleName = Literal["acceptance", "router", "entropy"]
DEFAULT_THRESHOLDS: dict[str, float] = {"acceptance": 0.5, "router": 0.5, "entropy": 1.0}


@dataclass(frozen=True)
class Decision:
    keep: bool
    """The token joins the chain."""
    go_on: bool
    """Drafting continues after it (only read when `keep`)."""


class StopRule(ABC):
    """Base of the rules: the reset hooks do nothing unless a rule keeps state across positions."""

    def start_request(self) -> None:
        """Reset per-request state (a rule whose state spans steps)."""

    def start_chain(self) -> None:
        """Reset per-chain state (called at each proposal)."""

    @abstractmethod
    def decide(self, logits: Tensor, hidden: Tensor) -> Decision:
        """Args:
        logits: (1, V) draft logits at the position.
        hidden: (1, C) draft final normed hidden state there.
        """
        ...


class AcceptanceStop(StopRule):
    def __init__(self, head: AcceptanceHead, threshold: float) -> None:
        self.head, self.threshold = head, threshold
        self.all_accepted = 1.0
        """Π p_i over the chain so far."""

    def start_chain(self) -> None:
        self.all_accepted = 1.0

    def decide(self, logits: Tensor, hidden: Tensor) -> Decision:
        self.all_accepted *= float(self.head(hidden, draft_signals(logits)).sigmoid())
        return Decision(keep=True, go_on=1 - self.all_accepted <= self.threshold)


class RouterStop(StopRule):
    def __init__(self, head: AcceptanceHead, threshold: float) -> None:
        self.head, self.threshold = head, threshold

    def decide(self, logits: Tensor, hidden: Tensor) -> Decision:
        keep = float(self.head(hidden, draft_signals(logits)).sigmoid()) >= self.threshold
        return Decision(keep=keep, go_on=keep)


class EntropyStop(StopRule):
    def __init__(self, threshold: float, window: int) -> None:
        self.threshold = threshold
        self.recent: deque[float] = deque(maxlen=window)

    def start_request(self) -> None:
        self.recent.clear()

    def decide(self, logits: Tensor, hidden: Tensor) -> Decision:
        self.recent.append(float(draft_signals(logits)[0, 1]))
        keep = sum(self.recent) / len(self.recent) <= self.threshold
        return Decision(keep=keep, go_on=keep)


def check_stop_options(name: str, threshold: float | None, window: int, has_head: bool, owner: str) -> float:
    """The threshold of rule `name` (its default when None); `ConfigError` for bad options."""
    if name not in DEFAULT_THRESHOLDS:
        raise ConfigError(f"{owner} stop must be one of {', '.join(DEFAULT_THRESHOLDS)}, got {name!r}")
    value = DEFAULT_THRESHOLDS[name] if threshold is None else threshold
    if name == "entropy":
        if value <= 0 or window < 1:
            raise ConfigError(f"{owner} stop=entropy needs stop_threshold > 0 (nats) and entropy_window >= 1, "
                              f"got {value}, {window}")
        return value
    if not 0 < value < 1:
        raise ConfigError(f"{owner} stop_threshold must be in (0, 1) for stop={name}, got {value}")
    if not has_head:
        raise ConfigError(f"{owner} stop={name} needs acceptance_head= (a head trained with "
                          "configs/controls/specdec-pp.yaml)")
    return value


def build_stop_rule(name: str, threshold: float, window: int, head: AcceptanceHead | None) -> StopRule:
    """The rule of options already checked by `check_stop_options`."""
    if name == "entropy":
        return EntropyStop(threshold, window)
    assert head is not None
    return AcceptanceStop(head, threshold) if name == "acceptance" else RouterStop(head, threshold)

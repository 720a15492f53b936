"""Acceptance-driven draft length: grow after a fully accepted draft, shrink after a rejection.

The schedule of Hugging Face's assisted generation (`num_assistant_tokens_schedule="heuristic"`):
`K ← K + grow` when every proposed token was accepted, `K ← max(min_nodes, K - shrink)` otherwise;
steps without a proposal leave K unchanged. Drafting long only while drafts keep being accepted
keeps verify forwards short where the drafter is often wrong.
"""

from __future__ import annotations

from warpdecode.decoding.protocols import AcceptResult, Controller, DecodeState
from warpdecode.decoding.registry import register
from warpdecode.errors import ConfigError


@register("controller", "adaptive")
class AdaptiveLength(Controller):
    def __init__(self, initial: int = 4, grow: int = 2, shrink: int = 1, min_nodes: int = 1, max_nodes: int = 32) -> None:
        """Args:
        initial: draft budget of the first step of every request.
        grow: added after a step whose whole draft was accepted.
        shrink: subtracted after a step with a rejected draft token.
        min_nodes: smallest budget.
        max_nodes: largest budget.
        """
        if not 1 <= min_nodes <= initial <= max_nodes or grow < 0 or shrink < 0:
            raise ConfigError(f"adaptive controller needs 1 <= min_nodes <= initial <= max_nodes and grow, shrink >= 0; "
                              f"got min_nodes={min_nodes}, initial={initial}, max_nodes={max_nodes}, "
                              f"grow={grow}, shrink={shrink}")
        self.initial, self.grow, self.shrink = initial, grow, shrink
        self.min_nodes, self.max_nodes = min_nodes, max_nodes
        self.current = initial

    def start(self, state: DecodeState) -> None:
        self.current = self.initial

    def budget(self, state: DecodeState) -> int:
        return self.current

    def observe(self, result: AcceptResult) -> None:
        if result.proposed == 0:
            return
        if len(result.path) == result.proposed:
            self.current = min(self.max_nodes, self.current + self.grow)
        else:
            self.current = max(self.min_nodes, self.current - self.shrink)

"""Fixed budget: every step may propose up to the same number of draft nodes."""

from __future__ import annotations

from warpdecode.decoding.protocols import AcceptResult, Controller, DecodeState
from warpdecode.decoding.registry import register
from warpdecode.errors import ConfigError


@register("controller", "fixed")
class FixedBudget(Controller):
    def __init__(self, max_nodes: int = 64) -> None:
        """Args:
        max_nodes: largest draft tree (nodes) per verify forward; the drafter's own limits also apply.
        """
        if max_nodes < 0:
            raise ConfigError(f"max_nodes must be >= 0, got {max_nodes}")
        self.max_nodes = max_nodes

    def start(self, state: DecodeState) -> None:
        pass

    def budget(self, state: DecodeState) -> int:
        return self.max_nodes

    def observe(self, result: AcceptResult) -> None:
        pass

"""Cost-aware draft depth: verify a draft only as deep as its measured acceptance pays for its measured cost.

The single-request form of the server's `DraftBudget.keep` (`decoding/draft_cost.py`): the controller
times every verify forward against its positions (a least-squares line: the seconds of a one-token
step and of each further position) and counts, per proposed tree size, how often a tree was accepted
to each depth. Each step's proposal is then cut to the depth past which one more level would lower
the step's tokens per second. Where verified positions are cheap against a step (a big model, a GPU),
nothing is cut; where they are dear (the default model's quantised target on a CPU, a position ~22 %
of a step), a weak proposal (prompt lookup after a one-token match) is verified one level deep or not
at all, so speculation does not lose to plain decoding. The cut only changes what is verified, never
what is emitted: lossless methods stay lossless; the measurements are timings, so τ and speed (never
the tokens) vary between runs.
"""

from __future__ import annotations

import time

from warpdecode.decoding.draft_cost import LevelAcceptance, LevelCost, keep_depth
from warpdecode.decoding.protocols import AcceptResult, Controller, DecodeState
from warpdecode.decoding.registry import register
from warpdecode.decoding.tree import DraftTree
from warpdecode.errors import ConfigError


@register("controller", "cost")
class CostAware(Controller):
    def __init__(self, max_nodes: int = 64, memory: int = 200, explore_every: int = 16) -> None:
        """Args:
        max_nodes: largest draft tree (nodes) a step may propose, before the cut.
        memory: steps over which the timings and acceptance counts decay (by 1/e).
        explore_every: of the proposals cut to nothing, every this many is verified one level deep, so
            that an acceptance measured low is measured again (a drafter warming up, another text).
        """
        if max_nodes < 0 or memory < 1 or explore_every < 1:
            raise ConfigError(f"the cost controller needs max_nodes >= 0, memory >= 1 and explore_every >= 1, "
                              f"got {max_nodes}, {memory}, {explore_every}")
        self.max_nodes, self.explore_every = max_nodes, explore_every
        self._dropped = 0  # proposals cut to nothing so far
        self.costs, self.acceptance = LevelCost(memory), LevelAcceptance(memory)
        self._step: tuple[int, int, int, float] | None = None
        """The step being verified: (proposed nodes, verified depth, positions, its start on the clock)."""

    def start(self, state: DecodeState) -> None:
        self._step = None  # the measurements describe the machine and the drafter: they carry over requests

    def budget(self, state: DecodeState) -> int:
        return self.max_nodes

    def trim(self, state: DecodeState, tree: DraftTree) -> DraftTree:
        proposed, cost = tree.size, self.costs.cost()
        if proposed and cost is not None and not tree.auxiliary:
            depth = keep_depth(tree, cost, lambda d: self.acceptance.accepted("", proposed, d))
            if depth == 0:
                self._dropped += 1
                depth = int(self._dropped % self.explore_every == 0)
            tree = tree.cut(depth)
        self._step = (proposed, tree.depth, tree.size + 1, time.perf_counter())
        return tree

    def observe(self, result: AcceptResult) -> None:
        if self._step is None:
            return
        proposed, depth, positions, started = self._step
        self._step = None
        self.costs.observe(positions, time.perf_counter() - started)
        self.acceptance.learn("", proposed, depth, len(result.path))

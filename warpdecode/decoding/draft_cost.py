"""What a draft level costs and what it gives, measured as decoding runs: how deep a draft tree is worth
verifying.

A verify forward of `w` positions per row costs about `a + b * w` seconds (a least-squares line over
the recent steps, `LevelCost`), and a drafter's trees of a given proposed size are accepted to depth
`d` a measured share of the time (`LevelAcceptance`). One more level of `n` nodes is worth verifying
while the tokens it is expected to add, per second it adds, beat the step's tokens per second so far
(`keep_depth`). Both the server's batches (`continuous.DraftBudget`) and the single-request `cost`
controller (`controllers/cost.py`) cut their trees with this: where a verified position is cheap
against a step (a GPU, a big model at batch 1) every level pays and nothing is cut; where it is dear
(the default model's quantised target on a CPU: a position costs ~22 % of a step), only the levels
whose acceptance pays for them are verified, so speculation does not lose to plain decoding.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from warpdecode.decoding.tree import DraftTree


class LevelCost:
    """Seconds of a step against its positions per row: a least-squares line over decayed sums."""

    def __init__(self, memory: int = 200) -> None:
        """memory: steps after which an observation's weight has decayed by 1/e."""
        self.decay = 1 - 1 / memory
        self.sums = [0.0] * 5  # decayed sums of 1, width, seconds, width², width·seconds

    def observe(self, width: int, seconds: float) -> None:
        for i, value in enumerate((1.0, width, seconds, width * width, width * seconds)):
            self.sums[i] = self.decay * self.sums[i] + value

    def cost(self) -> tuple[float, float] | None:
        """(seconds of a one-position step, seconds per further position), None until steps of two widths
        were seen."""
        n, x, y, xx, xy = self.sums
        spread = n * xx - x * x
        if n == 0 or spread <= 1e-6 * n * n:
            return None
        slope = (n * xy - x * y) / spread
        return max(0.0, (y - slope * x) / n + slope), max(0.0, slope)


class LevelAcceptance:
    """Per (drafter, proposed nodes): of the trees verified to depth d or deeper, the share accepted to d."""

    def __init__(self, memory: int = 200) -> None:
        self.decay = 1 - 1 / memory
        self._levels: dict[tuple[str, int], list[list[float]]] = {}
        """(drafter, proposed) → per depth d (index d - 1): [trees verified to d or deeper, of them accepted
        to d or deeper], decayed."""

    def accepted(self, drafter: str, proposed: int, depth: int) -> float:
        """The measured share (a level never measured counts as accepted half the time: it is tried)."""
        levels = self._levels.get((drafter, proposed), [])
        verified, hits = levels[depth - 1] if depth <= len(levels) else (0.0, 0.0)
        return (hits + 1) / (verified + 2)

    def learn(self, drafter: str, proposed: int, verified_depth: int, accepted: int) -> None:
        """A tree of `proposed` nodes was verified to `verified_depth` and accepted to `accepted` tokens."""
        if not proposed or not verified_depth:
            return
        levels = self._levels.setdefault((drafter, proposed), [])
        levels.extend([0.0, 0.0] for _ in range(verified_depth - len(levels)))
        for d, level in enumerate(levels[:verified_depth], start=1):
            level[0] = self.decay * level[0] + 1
            level[1] = self.decay * level[1] + (accepted >= d)


def keep_depth(tree: DraftTree, cost: tuple[float, float], accepted: Callable[[int], float], rows: int = 1) -> int:
    """How deep to verify `tree` in a step of `rows` rows (each giving at least one token).

    Args:
        cost: `LevelCost.cost()`, (seconds of a one-position step, seconds per further position per row).
        accepted: depth → the measured share of such trees accepted to that depth.
    """
    first, per_level = cost
    widths = torch.bincount(tree.depths())[1:].tolist()  # nodes per level
    tokens, seconds, share = float(rows), first, 1.0
    for depth, nodes in enumerate(widths, start=1):
        share = min(share, accepted(depth))  # accepted to d needs d - 1 first
        extra = per_level * nodes
        if share * seconds <= extra * tokens:  # (tokens + share) / (seconds + extra) <= tokens / seconds
            return depth - 1
        tokens, seconds = tokens + share, seconds + extra
    return len(widths)

"""Greedy verification: walk the tree while the drafted token equals the target's argmax.

Lossless at temperature 0: the emitted tokens are exactly those plain greedy decoding would emit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from torch import Tensor

from warpdecode.decoding.protocols import NO_HIDDEN_STATES, AcceptResult, Verifier
from warpdecode.decoding.registry import register
from warpdecode.decoding.sampler import Sampler
from warpdecode.decoding.tree import DraftTree


def greedy_accept(tree: DraftTree, target_logits: Tensor) -> AcceptResult:
    """Args:
    tree: N-node proposal.
    target_logits: (N+1, V); row 0 follows the pending token, row i+1 follows node i.
    """
    best = target_logits.argmax(dim=-1).tolist()  # (N+1,) the target's choice after each position
    tokens = tree.tokens.tolist()
    children = tree.children()
    path: list[int] = []
    node = -1
    while True:
        choice = best[node + 1]
        child = next((c for c in children.get(node, []) if tokens[c] == choice), None)
        if child is None:
            return AcceptResult.from_path(tree, path, choice)
        path.append(child)
        node = child


@register("verifier", "greedy")
class GreedyMatch(Verifier):
    lossless: ClassVar[bool] = True
    needs_sampling: ClassVar[bool] = False

    def accept(self, tree: DraftTree, target_logits: Tensor, sampler: Sampler,
               hidden_states: Mapping[int, Tensor] = NO_HIDDEN_STATES) -> AcceptResult:
        return greedy_accept(tree, target_logits)

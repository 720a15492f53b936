"""The oracle verifier: accepts a controlled number of draft tokens, for timing at a chosen τ.

Not a decoding method: it emits whatever the drafter proposed, so its text is meaningless. What it
gives is the cost of speculation at a known acceptance on any target, including one with random
weights at a public checkpoint's shape (`--model random:NAME`), where no drafter could be accepted:
a step's time does not depend on the weights' values, only on the shapes the step runs (the verify
forward's rows, the accepted path's length for the cache commit).

Each step walks the tree's first root-to-leaf path (first child at each level) and accepts each
next node with probability `accept`, stopping at the first rejection; the bonus token is the target's
argmax after the last accepted node (a real read of the logits). The draws come from the verifier's
own seeded generator, so two runs of the same method accept the same lengths. `tau=` sets `accept`
from a target mean tokens per step for a chain of `depth` nodes instead: τ = (1 − p^(d+1)) / (1 − p).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch
from torch import Tensor

from warpdecode.decoding.protocols import NO_HIDDEN_STATES, AcceptResult, Verifier
from warpdecode.decoding.registry import register
from warpdecode.decoding.sampler import Sampler
from warpdecode.decoding.tree import DraftTree
from warpdecode.errors import ConfigError


def chain_tau(accept: float, depth: int) -> float:
    """Mean tokens per step (bonus included) of a `depth`-node chain whose nodes are each accepted
    with probability `accept` until the first rejection: 1 + p + p² + ... + p^depth."""
    return sum(accept**i for i in range(depth + 1))


def accept_for_tau(tau: float, depth: int) -> float:
    """The per-node acceptance probability that gives a `depth`-node chain a mean of `tau` tokens per
    step (bisection on `chain_tau`, increasing in p). Example: tau 2.4 at depth 4 → p ≈ 0.67."""
    if not 1.0 <= tau <= depth + 1:
        raise ConfigError(f"oracle tau must be in [1, {depth + 1}] for a {depth}-node chain, got {tau}")
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if chain_tau(mid, depth) < tau else (low, mid)
    return (low + high) / 2


@register("verifier", "oracle")
class OracleAcceptance(Verifier):
    lossless: ClassVar[bool] = False
    needs_sampling: ClassVar[bool] = False

    def __init__(self, accept: float = 0.6, tau: float | None = None, depth: int = 4, seed: int = 0) -> None:
        """Args:
        accept: probability of accepting each next node of the first path.
        tau: instead of `accept`, the mean tokens per step wanted for a chain of `depth` nodes.
        depth: the chain length `tau` refers to (the drafter's `num_tokens`).
        seed: seed of the acceptance draws.
        """
        if not 0.0 <= accept <= 1.0:
            raise ConfigError(f"oracle accept must be in [0, 1], got {accept}")
        if depth < 1:
            raise ConfigError(f"oracle depth must be >= 1, got {depth}")
        self.accept_probability = accept if tau is None else accept_for_tau(tau, depth)
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)

    def accept(self, tree: DraftTree, target_logits: Tensor, sampler: Sampler,
               hidden_states: Mapping[int, Tensor] = NO_HIDDEN_STATES) -> AcceptResult:
        """tree: N-node proposal; target_logits: (N+1, V), row i+1 after node i."""
        children = tree.children()
        path: list[int] = []
        node = -1
        while children.get(node) and float(torch.rand((), generator=self.generator)) < self.accept_probability:
            node = children[node][0]
            path.append(node)
        bonus = int(target_logits[node + 1].argmax())
        return AcceptResult.from_path(tree, path, bonus)

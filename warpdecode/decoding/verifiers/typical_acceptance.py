"""Medusa's typical acceptance (Cai et al. 2024). Lossy: output does not follow the target exactly.

A draft token x is accepted when the target gives it probability above
min(epsilon, delta * exp(-H(p))), H the entropy of the target distribution p: confident targets accept
only their likely tokens, uncertain ones accept more. Among siblings that pass, the most likely one
is followed. The bonus token comes from the sampler (argmax when not sampling).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

import torch
from torch import Tensor

from warpdecode.decoding.protocols import NO_HIDDEN_STATES, AcceptResult, Verifier
from warpdecode.decoding.registry import register
from warpdecode.decoding.sampler import Sampler
from warpdecode.decoding.tree import DraftTree
from warpdecode.errors import ConfigError


def typical_accept(tree: DraftTree, target_probs: Tensor, epsilon: float, delta: float) -> tuple[list[int], int]:
    """Accepted path and the index of the row the bonus token is drawn from.

    Args:
        target_probs: (N+1, V) target distributions (row 0 follows the pending token).
    """
    entropy = -(target_probs * target_probs.clamp_min(1e-20).log()).sum(-1)  # (N+1,)
    threshold = torch.minimum(torch.full_like(entropy, epsilon), delta * torch.exp(-entropy)).tolist()
    tokens = tree.tokens.tolist()
    children = tree.children()
    path: list[int] = []
    node = -1
    while True:
        row = target_probs[node + 1]
        passing = [c for c in children.get(node, []) if float(row[tokens[c]]) > threshold[node + 1]]
        if not passing:
            return path, node + 1
        node = max(passing, key=lambda c: float(row[tokens[c]]))
        path.append(node)


@register("verifier", "typical")
class TypicalAcceptance(Verifier):
    lossless: ClassVar[bool] = False
    needs_sampling: ClassVar[bool] = False

    def __init__(self, epsilon: float = 0.09, delta: float = 0.3) -> None:
        """Args:
        epsilon: hard probability threshold (Medusa's posterior_threshold).
        delta: entropy-scaled threshold factor (Medusa's posterior_alpha, usually sqrt(epsilon)).
        """
        if not 0 < epsilon < 1 or delta <= 0 or math.isnan(delta):
            raise ConfigError(f"typical acceptance needs 0 < epsilon < 1 and delta > 0, got {epsilon}, {delta}")
        self.epsilon = epsilon
        self.delta = delta

    def accept(self, tree: DraftTree, target_logits: Tensor, sampler: Sampler,
               hidden_states: Mapping[int, Tensor] = NO_HIDDEN_STATES) -> AcceptResult:
        probs = torch.softmax(target_logits.float(), dim=-1)
        path, row = typical_accept(tree, probs, self.epsilon, self.delta)
        bonus = int(sampler.select(target_logits[row : row + 1])[0])
        rows = [0] + [node + 1 for node in path[:-1]]  # the row each accepted node was judged on
        chosen = target_logits[rows].argmax(dim=-1).tolist() if path else []
        divergent = sum(int(tree.tokens[node]) != c for node, c in zip(path, chosen))
        return AcceptResult.from_path(tree, path, bonus, divergent=divergent)

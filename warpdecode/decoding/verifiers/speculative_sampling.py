"""Lossless speculative sampling for chains and trees.

For a chain this is the rejection rule of Leviathan et al. (2023) and Chen et al. (2023): a draft
token x drawn from the draft distribution q is *accepted* with probability min(1, p(x) / q(x)), where
p is the target distribution; after a rejection the *recovered* token is drawn from the residual
norm(max(p - q, 0)). When every draft token is accepted the *bonus* token is drawn from p.

For a tree, siblings are tried in order with the same rule, each rejection replacing p by its
residual before the next sibling (SpecInfer's multi-step speculative sampling, Miao et al. 2024).
Siblings must be independent draws from their `draft_probs` rows, or deterministic proposals
(`draft_probs is None`: a point mass, for which the rule accepts x with probability p(x)). Either
way the emitted tokens follow p exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import ClassVar

import torch
from torch import Tensor

from warpdecode.decoding.protocols import NO_HIDDEN_STATES, AcceptResult, Verifier
from warpdecode.decoding.registry import register
from warpdecode.decoding.sampler import Sampler
from warpdecode.decoding.tree import DraftTree


def residual(target_probs: Tensor, draft_probs: Tensor) -> Tensor:
    """norm(max(p - q, 0)) over (V,); falls back to p where p <= q everywhere (then q == p: never rejects)."""
    r = (target_probs - draft_probs).clamp_min(0)
    total = r.sum()
    return r / total if total > 0 else target_probs


def reject_siblings(p: Tensor, siblings: list[int], tree: DraftTree, tokens: list[int], uniforms: Tensor) -> tuple[int | None, Tensor]:
    """SpecInfer's recursive rejection over one node's children, tried in order.

    Args:
        p: (V,) target distribution after the node.
        siblings: the node's children; `tokens` are the tree's tokens as a list.
        uniforms: (N,) acceptance draws, indexed by node.
    Returns:
        The accepted child (None if all were rejected) and the distribution left: p itself after an
        acceptance, the residual after the last rejection otherwise.
    """
    for child in siblings:
        x = tokens[child]
        q = tree.draft_probs[child] if tree.draft_probs is not None else None
        qx = float(q[x]) if q is not None else 1.0
        if float(uniforms[child]) * qx < float(p[x]):  # u < p(x) / q(x), without dividing by zero
            return child, p
        if q is None:
            q = torch.zeros_like(p)
            q[x] = 1.0
        p = residual(p, q)
    return None, p


SelectChild = Callable[[Tensor, list[int]], tuple[int | None, Tensor]]
"""(target distribution after a node (V,), the node's children) → the accepted child (None if all
were rejected) and the distribution left to draw from."""


def walk_tree(tree: DraftTree, target_probs: Tensor, select: SelectChild, generator: torch.Generator | None) -> AcceptResult:
    """Descend from the pending token through accepted children; where `select` accepts none, draw
    the recovered (or, after a fully accepted path, bonus) token from the distribution it left."""
    children = tree.children()
    path: list[int] = []
    node = -1
    while True:
        accepted, p = select(target_probs[node + 1], children.get(node, []))
        if accepted is None:
            return AcceptResult.from_path(tree, path, int(torch.multinomial(p, 1, generator=generator)))
        path.append(accepted)
        node = accepted


def speculative_accept(
    tree: DraftTree, target_probs: Tensor, uniforms: Tensor, generator: torch.Generator | None
) -> AcceptResult:
    """The pure acceptance rule, randomness explicit.

    Args:
        tree: N-node proposal; `tree.draft_probs` (N, V) or None for point masses.
        target_probs: (N+1, V) filtered target distributions; row 0 follows the pending token.
        uniforms: (N,) float32 in [0, 1), one acceptance draw per node.
        generator: draws the recovered / bonus token.
    """
    tokens = tree.tokens.tolist()
    return walk_tree(tree, target_probs, lambda p, kids: reject_siblings(p, kids, tree, tokens, uniforms), generator)


@register("verifier", "speculative_sampling")
class SpeculativeSampling(Verifier):
    lossless: ClassVar[bool] = True
    needs_sampling: ClassVar[bool] = True

    def accept(self, tree: DraftTree, target_logits: Tensor, sampler: Sampler,
               hidden_states: Mapping[int, Tensor] = NO_HIDDEN_STATES) -> AcceptResult:
        target_probs = sampler.probs(target_logits)  # (N+1, V)
        if tree.draft_probs is not None and tree.draft_probs.device != target_probs.device:  # once, for every rule
            tree = replace(tree, draft_probs=tree.draft_probs.to(target_probs.device))
        uniforms = torch.rand(tree.size, generator=sampler.generator, device=target_probs.device)
        return self.rule(tree, target_probs, uniforms, sampler.generator)

    def rule(self, tree: DraftTree, target_probs: Tensor, uniforms: Tensor,
             generator: torch.Generator | None) -> AcceptResult:
        """The acceptance rule `accept` applies (subclasses verify with another rule, same draws)."""
        return speculative_accept(tree, target_probs, uniforms, generator)

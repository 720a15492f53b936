"""SpecTr's k-sequential selection (Sun et al. 2023): lossless multi-draft verification.

At a node whose k children are i.i.d. draws from the same draft distribution q, child x is tried
in turn and accepted with probability min(1, p(x) / (ρ q(x))). With β(ρ) = Σ_x min(q(x), p(x)/ρ),
one draw is accepted with probability β, so a token is accepted with probability 1 - (1 - β)^k
and x comes out through acceptance with probability min(q(x), p(x)/ρ) (1 - (1-β)^k) / β. If every
child is rejected the token is drawn from the residual

    p_res(x) = [p(x) - min(q(x), p(x)/ρ) (1 - (1-β)^k) / β] / (1 - β)^k,

so the output follows p exactly. p_res is a distribution when ρ >= (1 - (1-β)^k) / β; ρ = 1 is
plain speculative sampling (k = 1), and the smallest valid ρ in [1, k] (found by bisection) gives
the highest acceptance. After an accepted child the walk continues at that child, as in the other
verifiers. Nodes whose children are not i.i.d. draws (deterministic or different rows) fall back
to SpecInfer's recursive rejection, which is lossless for any proposals.
"""

from __future__ import annotations

import torch
from torch import Tensor

from warpdecode.decoding.protocols import AcceptResult
from warpdecode.decoding.registry import register
from warpdecode.decoding.tree import DraftTree
from warpdecode.decoding.verifiers.speculative_sampling import (
    SpeculativeSampling,
    reject_siblings,
    walk_tree,
)

BISECTION_STEPS = 40


def accepted_mass(p: Tensor, q: Tensor, rho: float, k: int) -> tuple[Tensor, float]:
    """(min(q, p/ρ) (V,), the factor (1 - (1-β)^k) / β) for one ρ."""
    kept = torch.minimum(q, p / rho)
    beta = float(kept.sum())
    factor = (1 - (1 - beta) ** k) / beta if beta > 0 else float(k)
    return kept, factor


def smallest_valid_rho(p: Tensor, q: Tensor, k: int) -> float:
    """The smallest ρ in [1, k] with ρ >= (1 - (1-β(ρ))^k) / β(ρ) (the residual is then non-negative)."""
    low, high = 1.0, float(k)
    if accepted_mass(p, q, low, k)[1] <= low:
        return low
    for _ in range(BISECTION_STEPS):
        mid = (low + high) / 2
        if accepted_mass(p, q, mid, k)[1] <= mid:
            high = mid
        else:
            low = mid
    return high


def kseq_residual(p: Tensor, q: Tensor, rho: float, k: int) -> Tensor:
    """p_res (V,) after k rejected i.i.d. draws (module docstring); p itself if nothing is left."""
    kept, factor = accepted_mass(p, q, rho, k)
    r = (p - kept * factor).clamp_min(0)
    total = r.sum()
    return r / total if total > 0 else p


def spectr_accept(tree: DraftTree, target_probs: Tensor, uniforms: Tensor, generator: torch.Generator | None) -> AcceptResult:
    """The pure acceptance rule, randomness explicit.

    Args:
        tree: N-node proposal with `draft_probs` (N, V), or None (every node deterministic).
        target_probs: (N+1, V) filtered target distributions; row 0 follows the pending token.
        uniforms: (N,) float32 in [0, 1), one acceptance draw per node.
        generator: draws the recovered / bonus token.
    """
    tokens = tree.tokens.tolist()

    def select(p: Tensor, kids: list[int]) -> tuple[int | None, Tensor]:
        rows = tree.draft_probs[kids] if tree.draft_probs is not None and kids else None
        if rows is None or not bool((rows == rows[:1]).all()):  # not i.i.d.: SpecInfer's recursive rejection
            return reject_siblings(p, kids, tree, tokens, uniforms)
        q, k = rows[0], len(kids)  # i.i.d. children: k-sequential selection
        rho = smallest_valid_rho(p, q, k)
        for child in kids:
            x = tokens[child]
            if float(uniforms[child]) * rho * float(q[x]) < float(p[x]):  # u < p(x) / (ρ q(x))
                return child, p
        return None, kseq_residual(p, q, rho, k)

    return walk_tree(tree, target_probs, select, generator)


@register("verifier", "spectr")
class SpecTr(SpeculativeSampling):
    def rule(self, tree: DraftTree, target_probs: Tensor, uniforms: Tensor,
             generator: torch.Generator | None) -> AcceptResult:
        return spectr_accept(tree, target_probs, uniforms, generator)

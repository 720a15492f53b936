"""No verification: accept the drafter's whole chain, then the target writes one token. Lossy.

The verify forward still runs: it brings the target's KV cache up to date with the drafted tokens
(one batched forward, however long the chain) and gives the target's token after them. This is how
the small model of Entropy Adaptive Decoding hands over to the large one: the drafter decides which
positions it writes (`int4_self:stop=entropy` or `stop=router`), the target writes the others. The
result counts the accepted tokens the target would not have chosen (`divergent`: its argmax differs),
the output divergence the method trades for speed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from torch import Tensor

from warpdecode.decoding.protocols import NO_HIDDEN_STATES, AcceptResult, Verifier
from warpdecode.decoding.registry import register
from warpdecode.decoding.sampler import Sampler
from warpdecode.decoding.tree import DraftTree
from warpdecode.errors import CapabilityError


def trust_accept(tree: DraftTree, target_logits: Tensor, sampler: Sampler) -> AcceptResult:
    """Args:
    tree: an N-node chain.
    target_logits: (N+1, V); row i follows the i-th token of `[pending] + chain`.
    """
    if tree.depth != tree.size:
        raise CapabilityError("the trust verifier accepts chains only; this drafter proposed a tree")
    chosen = target_logits[: tree.size].argmax(dim=-1)  # (N,) the target's choice at each drafted position
    divergent = int((chosen != tree.tokens.to(chosen.device)).sum())
    bonus = int(sampler.select(target_logits[tree.size : tree.size + 1])[0])
    return AcceptResult.from_path(tree, list(range(tree.size)), bonus, divergent=divergent)


@register("verifier", "trust")
class Trust(Verifier):
    lossless: ClassVar[bool] = False
    needs_sampling: ClassVar[bool] = False

    def accept(self, tree: DraftTree, target_logits: Tensor, sampler: Sampler,
               hidden_states: Mapping[int, Tensor] = NO_HIDDEN_STATES) -> AcceptResult:
        return trust_accept(tree, target_logits, sampler)

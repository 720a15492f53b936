"""`AdaptiveRejection`: the grammar hook that picks a verify step's token by checking candidates with the
matcher instead of computing the full allowed-token mask (adaptive rejection sampling, the exact part
of AWRS, Lipkin et al. 2025, "Fast Controlled Generation from Language Models with Adaptive Weighted
Rejection Sampling").

On a step whose tree is empty (plain decoding, or a drafter with nothing to propose, and no forced
token to jump over), the row after the pending token is not masked. Instead:

* sampling: draw x from the unconstrained distribution p (the penalised logits at the sampling
  temperature); if the grammar allows x, emit it; otherwise set p(x) = 0, renormalise and draw again.
  The draws use the Gumbel-max trick: one noise vector per step, keys log p + Gumbel, and the draws
  without replacement are the keys in descending order, so a rejection costs one argmax, not a new
  pass of `torch.multinomial` over the row.
* greedy: the same with the logits as keys: the most likely token, then the next most likely once it
  is rejected, and so on.

Why it is exact: after rejecting a set R of forbidden tokens, the next draw is p restricted to V \\ R,
and the allowed set A lies inside V \\ R, so the first accepted token has probability p(x) / p(A): the
masked, renormalised distribution. For the same reason a step that has rejected `max_checks` tokens
may switch to the full mask and take the keys' argmax over A (a Gumbel-max draw from p restricted to
A) without changing the distribution. Greedy ties break toward the lowest id, as the argmax of masked
logits does.

A candidate is checked with `Constraint.allows`, which agrees with the mask bit by contract. On
llguidance that is `validate_tokens`, except where the grammar forces bytes: its mask then keeps only
their canonical tokens (after a forced `{"name":"`, the token `{"` but not `{`), so such a state reads
its full mask once (jump-forward drafts most of those steps anyway).

The row is then handed to the verifier as logits with only the chosen token finite, so every verifier
emits it. Steps with draft nodes are masked in full (`ConstrainedDecoding`): verifying a draft needs
the whole constrained row. Sampling filters other than the temperature (top-k, top-p, min-p,
typical-p) are applied after the mask and need the whole row too: they are refused.

AWRS's weight (an unbiased estimate of p(A), for sequential Monte Carlo over grammatical strings) is
not needed for sampling one sequence and is not computed.
"""

from __future__ import annotations

import torch
from torch import Tensor

from warpdecode.decoding.constraints.closing import BudgetClosing
from warpdecode.decoding.constraints.protocol import Constraint
from warpdecode.decoding.constraints.tree_mask import NEG_INF, ConstrainedDecoding
from warpdecode.decoding.processors import Temperature
from warpdecode.decoding.sampler import Sampler
from warpdecode.decoding.tree import DraftTree
from warpdecode.errors import CapabilityError


class AdaptiveRejection(ConstrainedDecoding):
    """`ConstrainedDecoding` that selects undrafted steps' tokens by adaptive rejection.

    `checks` counts matcher checks and `selections` the tokens selected this way (checks per token =
    checks / selections); `fallbacks` counts steps that computed the full mask after `max_checks`.
    """

    def __init__(self, state: Constraint, sampler: Sampler, *, jump_forward: bool = True, max_checks: int = 64,
                 closing: BudgetClosing | None = None) -> None:
        if any(not isinstance(warp, Temperature) for warp in sampler.warpers):
            raise CapabilityError("constrained_sampling='awrs' takes the temperature only: top_k, top_p, min_p and "
                                  "typical_p filter the masked distribution and need the full mask")
        super().__init__(state, jump_forward=jump_forward, closing=closing)
        self.sampler = sampler
        self.max_checks = max_checks
        self.lazy = False  # the tree `shape` last returned is empty and its row is selected by rejection
        self.checks = self.selections = self.fallbacks = 0

    def mask_next(self, logits: Tensor) -> Tensor:
        return self._select(logits)

    def shape(self, tree: DraftTree, budget: int) -> DraftTree:
        self.lazy = tree.size == 0 and not (self.jump_forward and budget > 0 and self.state.forced_tokens())
        if self.lazy:
            self.rows = None
            return tree
        return super().shape(tree, budget)

    def mask(self, logits: Tensor) -> Tensor:
        return self._select(logits) if self.lazy else super().mask(logits)

    def _select(self, logits: Tensor) -> Tensor:
        """(1, V) penalised logits → (1, V) with only the selected allowed token finite (0)."""
        keys = logits[0].float()
        if self.sampler.config.do_sample:  # Gumbel-max: argmax of log p + Gumbel noise is a draw from p
            uniform = torch.rand(keys.shape, generator=self.sampler.generator, device=keys.device)
            keys = self.sampler.probs(keys[None])[0].log() - torch.log(-torch.log(uniform))
        else:
            keys = keys.clone()
        token = None
        for _ in range(self.max_checks):
            candidate = int(keys.argmax())
            if keys[candidate] == NEG_INF:
                break
            self.checks += 1
            if self.state.allows(candidate):
                token = candidate
                break
            keys[candidate] = NEG_INF
        if token is None:  # the same keys' argmax over the allowed set: still exact
            self.fallbacks += 1
            token = int(super().mask_next(keys[None])[0].argmax())
        self.selections += 1
        out = torch.full_like(logits, NEG_INF)
        out[0, token] = 0.0
        return out

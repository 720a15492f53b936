"""ASAp: grammar-aligned sampling by adaptive sampling with approximate expected futures (Park et al.
2024, "Grammar-Aligned Decoding").

Masking (`ConstrainedDecoding`) samples each token from the model's next-token distribution restricted
to the tokens the grammar allows: the product of those per-step renormalisations is *not* the model
conditioned on producing a grammatical string, P(s | s in L) = P(s) / P(L). Each step should weigh a
token t after prefix w by its expected future grammaticality EFG(w t) = P(a completion of w t is in L):

    Q(t | w) = P(t | w) EFG(w t) / sum over t' of P(t' | w) EFG(w t')

ASAp starts from the masking estimate (EFG = 1 for every allowed token, 0 otherwise) and, after each
sampled string, corrects the estimates along its path from the leaf up, using the probabilities it
saw there: EFG(w) = sum over allowed t of P(t | w) EFG(w t), with EFG = 1 after the stop token. The
estimates only fall towards the true EFG, so the sampling distribution converges to the exact
conditional as samples accumulate (each sample still comes from the current, approximate one).

`ASAp` samples whole strings for one prompt: it is the multi-sample loop of the paper (it keeps a
trie of every prefix it has visited), for studies on small grammars rather than the serving path;
`exact_conditional` enumerates a finite language for the comparison (docs/notes/structured-output.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import torch
from torch import Tensor

from warpdecode.decoding.constraints.protocol import Constraint, mask_words, unpack_mask

NextProbs = Callable[[tuple[int, ...]], Tensor]
"""The model's next-token distribution after a prefix of output tokens: (V,) float probabilities."""


class ASAp:
    """Grammar-aligned sampling for one prompt: `sample()` draws a string, then corrects the estimates.

    `state` is the grammar at the start (forked for every sample), `next_probs` the model (memoised per
    prefix), `max_tokens` the longest string: a path that reaches it without the stop token counts as
    ungrammatical (EFG 0), like a generation cut by its budget.
    """

    def __init__(self, state: Constraint, next_probs: NextProbs, *, max_tokens: int = 64) -> None:
        self.start = state
        self.next_probs = next_probs
        self.max_tokens = max_tokens
        self.children: dict[tuple[int, ...], dict[int, float]] = {}  # w → {t: EFG(w t)}, corrected ones only (else 1)
        self.grammatical = 1.0  # the root's estimate: P(L), the model's probability of the language
        self._rows: dict[tuple[int, ...], tuple[Tensor, Tensor]] = {}  # prefix → (P(· | w), allowed) (V,)

    def _row(self, prefix: tuple[int, ...], state: Constraint) -> tuple[Tensor, Tensor]:
        if prefix not in self._rows:
            bits = torch.zeros(1, mask_words(state.vocab_size), dtype=torch.int32)
            state.fill_mask(bits[0])
            self._rows[prefix] = (self.next_probs(prefix).double(), unpack_mask(bits, state.vocab_size)[0])
        return self._rows[prefix]

    def _weights(self, prefix: tuple[int, ...], state: Constraint) -> Tensor:
        """(V,) float64: P(t | w) EFG(w t), zero where the grammar forbids t."""
        probs, allowed = self._row(prefix, state)
        efg = allowed.double()
        for token, value in self.children.get(prefix, {}).items():
            efg[token] = value
        return probs * efg

    def distribution(self, prefix: tuple[int, ...], state: Constraint) -> Tensor:
        """(V,) float64: the current sampling distribution Q(· | prefix) (`state` is the grammar after it)."""
        weights = self._weights(prefix, state)
        return weights / weights.sum()

    def sample(self, generator: torch.Generator | None = None) -> list[int]:
        """Draw one string (token ids, ending with a stop token unless cut at `max_tokens`), then
        correct the estimates along its path."""
        state, path = self.start.fork(), cast(tuple[int, ...], ())
        while not state.is_terminated() and len(path) < self.max_tokens:
            token = int(torch.multinomial(self.distribution(path, state), 1, generator=generator))
            assert state.advance([token]) == 1
            path += (token,)
        value = 1.0 if state.is_terminated() else 0.0  # EFG of the whole path
        for cut in range(len(path) - 1, -1, -1):  # the leaf's parent up to the root
            state.rollback(1)
            self.children.setdefault(path[:cut], {})[path[cut]] = value
            value = float(self._weights(path[:cut], state).sum())
        self.grammatical = value
        return list(path)


def exact_conditional(state: Constraint, next_probs: NextProbs, *, max_tokens: int = 64,
                      policy: Callable[[tuple[int, ...], Constraint], Tensor] | None = None) -> dict[tuple[int, ...], float]:
    """Every string of a finite language (ending with its stop token) → its probability.

    Without `policy`: the model conditioned on the language, P(s) / P(L). With `policy` (prefix, state
    → (V,) next-token distribution): the probability that policy samples s (e.g. `ASAp.distribution`,
    or the masked, renormalised model). Strings longer than `max_tokens` are dropped (a ValueError
    if any has probability: the language is not finite enough)."""
    out: dict[tuple[int, ...], float] = {}

    def walk(prefix: tuple[int, ...], prob: float) -> None:
        if state.is_terminated():
            out[prefix] = prob
            return
        if len(prefix) >= max_tokens:
            raise ValueError(f"a string longer than {max_tokens} tokens: {prefix}")
        bits = torch.zeros(1, mask_words(state.vocab_size), dtype=torch.int32)
        state.fill_mask(bits[0])
        allowed = unpack_mask(bits, state.vocab_size)[0]
        probs = next_probs(prefix).double() if policy is None else policy(prefix, state)
        for token in allowed.nonzero().flatten().tolist():
            if probs[token] > 0:
                assert state.advance([token]) == 1
                walk(prefix + (token,), prob * float(probs[token]))
                state.rollback(1)

    walk((), 1.0)
    if policy is None:
        total = sum(out.values())
        out = {s: p / total for s, p in out.items()}
    return out


def masked_policy(next_probs: NextProbs) -> Callable[[tuple[int, ...], Constraint], Tensor]:
    """Masking's next-token distribution (the model restricted to the allowed tokens), for `exact_conditional`."""

    def policy(prefix: tuple[int, ...], state: Constraint) -> Tensor:
        bits = torch.zeros(1, mask_words(state.vocab_size), dtype=torch.int32)
        state.fill_mask(bits[0])
        probs = next_probs(prefix).double() * unpack_mask(bits, state.vocab_size)[0]
        return probs / probs.sum()

    return policy


def kl(p: dict[tuple[int, ...], float], q: dict[tuple[int, ...], float]) -> float:
    """KL(p || q) in nats over strings; q must cover p's support."""
    return sum(pv * math.log(pv / q[s]) for s, pv in p.items() if pv > 0)

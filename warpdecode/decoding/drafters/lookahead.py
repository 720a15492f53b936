"""Lookahead decoding (Fu et al. 2024): Jacobi iteration generates n-grams, verified in the same forward.

Every verify forward carries, besides the candidates, a *Jacobi window*: `window` guessed tokens
for the positions after the pending token, run as a causal chain (auxiliary tree nodes: never
accepted). The target's greedy prediction at each window position is the next guess for the
position after it, which is one Jacobi iteration. Each iteration also yields n-grams along the
diagonal of the last `ngram - 1` windows (a token from each, one position further each time, the
last from the new predictions), and these go into a pool keyed by their first token. The
candidates of the next step are the pool's n-grams that start with the pending token (their other
`ngram - 1` tokens, most recent first, merged into one tree).

Example (ngram 2): window [a, b, c] after pending p; the target predicts x after p, y after a, z
after b → pool gains a → y and b → z (old guess, then what the target predicts after it); the
window becomes [x, y, z]. When a later pending token is b, the chain [z] is a candidate.

The window is not shifted when several tokens are accepted (as in the reference implementation):
it keeps iterating; n-grams remain valid wherever their first token reappears.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from warpdecode.decoding.protocols import AcceptResult, DecodeState, Drafter
from warpdecode.decoding.registry import register
from warpdecode.decoding.tree import DraftTree
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone


@register("drafter", "lookahead")
class LookaheadDrafter(Drafter):
    supports_batch: ClassVar[bool] = True

    def __init__(self, window: int = 4, ngram: int = 3, max_candidates: int = 3, pool_size: int = 8) -> None:
        """Args:
        window: Jacobi window length (auxiliary rows per verify forward).
        ngram: n-gram length the pool collects (candidates are chains of `ngram - 1` tokens).
        max_candidates: pool n-grams verified per step.
        pool_size: n-grams kept per first token (the most recent).
        """
        if window < 1 or ngram < 2 or max_candidates < 1 or pool_size < 1:
            raise ConfigError(f"lookahead needs window >= 1, ngram >= 2, max_candidates >= 1 and pool_size >= 1, "
                              f"got {window}, {ngram}, {max_candidates}, {pool_size}")
        if window < ngram - 1:
            raise ConfigError(f"lookahead window {window} is too short to collect {ngram}-grams (needs >= {ngram - 1})")
        self.window_size, self.ngram, self.max_candidates, self.pool_size = window, ngram, max_candidates, pool_size
        self.window: list[int] = []
        self.levels: list[list[int]] = []
        """Earlier windows, oldest first (at most `ngram - 2`), for the diagonal n-grams."""
        self.pool: dict[int, list[tuple[int, ...]]] = {}
        self.sent: list[int] = []
        """The window run in the last forward (it may be shorter than `window` under a small budget)."""

    def prepare(self, target: Backbone) -> None:
        pass

    def start(self, state: DecodeState) -> None:
        prompt = state.tokens[: state.prompt_len]
        # Initial guesses: the prompt's last tokens, cycled (any guess works; Jacobi corrects it).
        self.window = [prompt[-1 - (i % len(prompt))] for i in range(self.window_size)]
        self.levels, self.pool, self.sent = [], {}, []

    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        if budget < 1:
            self.sent = []
            return DraftTree.empty()
        window = self.window[: min(self.window_size, budget)]
        chains = [DraftTree.chain(list(g)) for g in self.pool.get(state.pending, [])[: self.max_candidates]]
        candidates = DraftTree.fuse(chains, budget - len(window)) if chains else DraftTree.empty()
        n = candidates.size
        self.sent = window
        parents = candidates.parents.tolist() + [-1] + list(range(n, n + len(window) - 1))
        return DraftTree(torch.cat([candidates.tokens, torch.tensor(window, dtype=torch.int64)]),
                         torch.tensor(parents, dtype=torch.int64), auxiliary=len(window))

    def observe(self, state: DecodeState, result: AcceptResult) -> None:
        tree, logits = state.forward_tree, state.forward_logits
        if not self.sent or tree is None or logits is None or tree.auxiliary != len(self.sent):
            return  # the window did not run (e.g. inside a fused tree)
        first_aux = 1 + tree.size - tree.auxiliary  # forward row of the first window token
        rows = torch.cat([logits[:1], logits[first_aux : first_aux + len(self.sent) - 1]])
        predicted = rows.argmax(dim=-1).tolist()  # the next guess for each window position
        trajectory = self.levels + [self.sent]
        depth = len(trajectory)
        if depth >= self.ngram - 1:
            diagonal = trajectory[depth - self.ngram + 1 :]  # the last ngram - 1 windows, oldest first
            for j in range(len(predicted) - self.ngram + 1):
                if all(j + i < len(level) for i, level in enumerate(diagonal)):
                    self.remember(tuple(level[j + i] for i, level in enumerate(diagonal)) + (predicted[j + self.ngram - 1],))
        self.levels = trajectory[-(self.ngram - 2) :] if self.ngram > 2 else []
        self.window = predicted + self.window[len(predicted) :]

    def remember(self, gram: tuple[int, ...]) -> None:
        """Add an n-gram to the pool under its first token (most recent first, at most `pool_size`)."""
        bucket = self.pool.setdefault(gram[0], [])
        rest = gram[1:]
        if rest in bucket:
            bucket.remove(rest)
        bucket.insert(0, rest)
        del bucket[self.pool_size :]

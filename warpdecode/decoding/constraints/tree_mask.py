"""`ConstrainedDecoding`: the engine's hook that keeps every step of the draft→verify loop inside a grammar.

Per verify step, on the tree the drafter proposed:

* `shape`: draft tokens the grammar forbids are cut, with their subtrees, before the verify forward
  (deterministic trees without auxiliary rows; a stochastic node keeps its place and the verifier
  rejects it, since its target probability is 0). With `jump_forward`, the tokens the grammar
  forces are drafted for free: after the pending token, as a chain fused in front of the drafter's
  tree, and after every leaf of the tree.
* `mask`: each verified logits row gets the mask of its own context, the grammar state after the
  node's root-to-node path (advance along the path, roll back after the subtree), so the verifier
  decides against the constrained distribution and stays exact.
* `commit`: the state advances by the emitted tokens, cut after a stop token. With `closing`
  (`closing.py`), the output is closed instead once the budget left would no longer cover a
  completion of the grammar (`closed`).

Rows no accepted path can reach (under a forbidden stochastic node, or after a stop token) are left
unmasked: the verifier never emits from them, and an all-`-inf` row would turn softmaxes into NaNs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from warpdecode.decoding.constraints.protocol import Constraint, mask_words, unpack_mask
from warpdecode.decoding.tree import DraftTree
from warpdecode.errors import ConfigError

if TYPE_CHECKING:
    from warpdecode.decoding.constraints.closing import BudgetClosing

NEG_INF = float("-inf")


class ConstrainedDecoding:
    def __init__(self, state: Constraint, *, jump_forward: bool = True, closing: BudgetClosing | None = None) -> None:
        self.state = state
        self.jump_forward = jump_forward
        self.closing = closing
        self.words = mask_words(state.vocab_size)
        self.rows: Tensor | None = None  # (N+1, W) int32 masks of the tree `shape` last returned

    @property
    def done(self) -> bool:
        """The output is complete: a stop token was emitted."""
        return self.state.is_terminated()

    @property
    def closing_tokens(self) -> int:
        """Tokens of the output written by budget-aware closing (0: the model's own output)."""
        return 0 if self.closing is None else self.closing.closing_tokens

    def mask_next(self, logits: Tensor) -> Tensor:
        """(1, V) logits after the committed tokens → the same with forbidden tokens at `-inf`."""
        bits = torch.zeros(1, self.words, dtype=torch.int32)
        self.state.fill_mask(bits[0])
        self._check_live(bits[0])
        return _apply(logits, bits)

    def _check_live(self, bits: Tensor) -> None:
        """ConfigError where the committed tokens reach a dead end: the grammar goes on only with text no
        token writes (llguidance then allows a stop token where the grammar does not accept)."""
        if self.state.is_accepting():
            return
        allowed = unpack_mask(bits[None], self.state.vocab_size)[0]
        allowed[sorted(self.state.stop_ids)] = False
        if not allowed.any():
            raise ConfigError("the response format needs characters this model's vocabulary cannot write")

    def commit(self, tokens: list[int]) -> list[int]:
        """Advance by emitted `tokens`; returns them up to the first stop token (inclusive), or with
        `closing`, up to the closing point and then the closing (ending with a stop token).

        They come from masked rows, so the grammar accepts each one (checked: a mismatch is a bug)."""
        out = tokens[: self.state.advance(tokens)] if self.closing is None else self.closing.take(self.state, tokens)
        if len(out) < len(tokens) and not self.state.is_terminated():
            raise RuntimeError(f"emitted token {tokens[len(out)]} is outside the grammar")
        return out

    def shape(self, tree: DraftTree, budget: int) -> DraftTree:
        """The tree to verify instead of `tree` (proposed for the pending token), at most `budget` nodes;
        computes every verified row's mask for `mask`."""
        if tree.draft_probs is not None or tree.auxiliary:
            self.rows = self._masks_in_place(tree.verified())
            return tree
        if self.jump_forward and budget > 0:
            forced = self.state.forced_tokens()[:budget]
            if forced:
                tree = DraftTree.fuse([DraftTree.chain(forced), tree], budget)
        return self._rebuild(tree, budget)

    def _rebuild(self, tree: DraftTree, budget: int) -> DraftTree:
        """A deterministic tree walked depth first: forbidden nodes cut with their subtrees, and with
        jump-forward every leaf extended by the tokens the grammar forces after it. Nodes come out in
        depth-first order (siblings keep their order), the rows' masks with them."""
        children, tokens = tree.children(), tree.tokens.tolist()
        out_tokens: list[int] = []
        out_parents: list[int] = []
        rows: list[Tensor] = []

        def walk(out: int, proposed: list[int]) -> None:  # the state is after output node `out`'s path
            row = torch.full((self.words,), -1, dtype=torch.int32)  # -1: every bit set (unmasked)
            rows.append(row)
            if self.state.is_terminated():
                return  # nothing follows a stop token: the row stays unmasked (unreachable)
            self.state.fill_mask(row)
            if out == -1:
                self._check_live(row)
            extended = False
            for child in proposed:
                extended |= self._enter(row, tokens[child], out, children.get(child, []), walk,
                                        out_tokens, out_parents, budget)
            if not extended and self.jump_forward and len(out_tokens) < budget:
                forced = self.state.forced_tokens()[:1]  # the leaf's next forced token; its walk finds the rest
                if forced:
                    self._enter(row, forced[0], out, [], walk, out_tokens, out_parents, budget)

        walk(-1, children.get(-1, []))
        self.rows = torch.stack(rows)
        return DraftTree(torch.tensor(out_tokens, dtype=torch.int64), torch.tensor(out_parents, dtype=torch.int64))

    def _enter(self, row: Tensor, token: int, parent: int, proposed: list[int], walk: Callable[[int, list[int]], None],
               out_tokens: list[int], out_parents: list[int], budget: int) -> bool:
        """Add `token` under output node `parent` and walk below it, if the grammar allows it (its mask is
        `row`) and the budget has room; the state is restored after."""
        if len(out_tokens) >= budget or not (int(row[token // 32]) >> (token % 32)) & 1 or self.state.advance([token]) != 1:
            return False
        out_tokens.append(token)
        out_parents.append(parent)
        walk(len(out_tokens) - 1, proposed)
        self.state.rollback(1)
        return True

    def _masks_in_place(self, tree: DraftTree) -> Tensor:
        """(N+1, W) masks of a tree verified as proposed (stochastic nodes, auxiliary rows): a forbidden
        node stays for the verifier to reject (target probability 0); rows under it stay unmasked."""
        bits = torch.full((tree.size + 1, self.words), -1, dtype=torch.int32)
        children, tokens = tree.children(), tree.tokens.tolist()

        def walk(node: int) -> None:
            if self.state.is_terminated():
                return
            self.state.fill_mask(bits[node + 1])
            if node == -1:
                self._check_live(bits[0])
            for child in children.get(node, []):
                if (int(bits[node + 1, tokens[child] // 32]) >> (tokens[child] % 32)) & 1 and self.state.advance([tokens[child]]):
                    walk(child)
                    self.state.rollback(1)

        walk(-1)
        return bits

    def mask(self, logits: Tensor) -> Tensor:
        """(N+1, V) logits over `[pending] + tree` (the tree `shape` returned) → forbidden tokens at `-inf`."""
        assert self.rows is not None and self.rows.shape[0] == logits.shape[0], "mask() follows shape()"
        return _apply(logits, self.rows)


def _apply(logits: Tensor, bits: Tensor) -> Tensor:
    """(R, V) logits with `-inf` where the (R, W) packed masks forbid a token."""
    allowed = unpack_mask(bits, logits.shape[-1]).to(logits.device)
    return logits.masked_fill(~allowed, NEG_INF)

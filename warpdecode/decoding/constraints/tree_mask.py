"""`ConstrainedDecoding`: the engine's hook that keeps every step of the draft→verify loop inside a grammar.

Per verify step, on the tree the drafter proposed:

* `shape`: draft tokens the grammar forbids are cut, with their subtrees, before the verify forward
  (deterministic trees without auxiliary rows; a stochastic node keeps its place and the verifier
  rejects it, since its target probability is 0). With `jump_forward`, the tokens the grammar
  forces after the pending token are drafted first, as a chain fused with the drafter's tree.
* `mask`: each verified logits row gets the mask of its own context, the grammar state after the
  node's root-to-node path (advance along the path, roll back after the subtree), so the verifier
  decides against the constrained distribution and stays exact.
* `commit`: the state advances by the emitted tokens, cut after a stop token.

Rows no accepted path can reach (under a forbidden stochastic node, or after a stop token) are left
unmasked: the verifier never emits from them, and an all-`-inf` row would turn softmaxes into NaNs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from warpdecode.decoding.constraints.protocol import Constraint, mask_words, unpack_mask
from warpdecode.decoding.tree import DraftTree

NEG_INF = float("-inf")


class ConstrainedDecoding:
    def __init__(self, state: Constraint, *, jump_forward: bool = True) -> None:
        self.state = state
        self.jump_forward = jump_forward
        self.words = mask_words(state.vocab_size)
        self.rows: Tensor | None = None  # (N+1, W) int32 masks of the tree `shape` last returned
        self.forced = 0
        """Draft tokens jump-forward proposed (summed over the request)."""

    @property
    def done(self) -> bool:
        """The output is complete: a stop token was emitted."""
        return self.state.is_terminated()

    def mask_next(self, logits: Tensor) -> Tensor:
        """(1, V) logits after the committed tokens → the same with forbidden tokens at `-inf`."""
        bits = torch.zeros(1, self.words, dtype=torch.int32)
        self.state.fill_mask(bits[0])
        return _apply(logits, bits)

    def commit(self, tokens: list[int]) -> list[int]:
        """Advance by emitted `tokens`; returns them up to the first stop token (inclusive).

        They come from masked rows, so the grammar accepts each one (checked: a mismatch is a bug)."""
        done = self.state.advance(tokens)
        if done < len(tokens) and not self.state.is_terminated():
            raise RuntimeError(f"emitted token {tokens[done]} is outside the grammar")
        return tokens[:done]

    def shape(self, tree: DraftTree, budget: int) -> DraftTree:
        """The tree to verify: `tree` (proposed for the pending token) without the forbidden nodes, after
        the jump-forward chain; at most `budget` nodes. Computes every row's mask for `mask`."""
        prunable = tree.draft_probs is None and not tree.auxiliary
        if prunable and self.jump_forward and budget > 0:
            forced = self.state.forced_tokens()[:budget]
            if forced:
                fused = DraftTree.fuse([DraftTree.chain(forced), tree], budget)
                self.forced += len(forced)
                tree = fused
        verified = tree.verified()
        n = verified.size
        bits = torch.full((n + 1, self.words), -1, dtype=torch.int32)  # -1: every bit set (unmasked)
        keep = [False] * n
        children = verified.children()
        tokens = verified.tokens.tolist()

        def walk(node: int, row: int) -> None:  # the state is after `node`'s path; its row is `row`
            if self.state.is_terminated():
                return  # nothing follows a stop token: the row stays unmasked, the children are cut
            self.state.fill_mask(bits[row])
            for child in children.get(node, []):
                allowed = (int(bits[row, tokens[child] // 32]) >> (tokens[child] % 32)) & 1
                if allowed and self.state.advance([tokens[child]]) == 1:
                    keep[child] = True
                    walk(child, child + 1)
                    self.state.rollback(1)
                elif not prunable:
                    keep[child] = True  # rejected by the verifier; its subtree's rows stay unmasked
                    _keep_subtree(child, children, keep)

        walk(-1, 0)
        if all(keep):
            self.rows = bits
            return tree
        kept = [i for i in range(n) if keep[i]]
        index = {old: new for new, old in enumerate(kept)}
        parents = verified.parents.tolist()
        self.rows = bits[[0] + [i + 1 for i in kept]]
        return DraftTree(verified.tokens[kept], torch.tensor([index[parents[i]] if parents[i] >= 0 else -1 for i in kept],
                                                              dtype=torch.int64))

    def mask(self, logits: Tensor) -> Tensor:
        """(N+1, V) logits over `[pending] + tree` (the tree `shape` returned) → forbidden tokens at `-inf`."""
        assert self.rows is not None and self.rows.shape[0] == logits.shape[0], "mask() follows shape()"
        return _apply(logits, self.rows)


def _keep_subtree(node: int, children: dict[int, list[int]], keep: list[bool]) -> None:
    for child in children.get(node, []):
        keep[child] = True
        _keep_subtree(child, children, keep)


def _apply(logits: Tensor, bits: Tensor) -> Tensor:
    """(R, V) logits with `-inf` where the (R, W) packed masks forbid a token."""
    allowed = unpack_mask(bits, logits.shape[-1]).to(logits.device)
    return logits.masked_fill(~allowed, NEG_INF)

"""The device buffers of one request, and what a device drafter does with them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from warpdecode.decoding.device_step.tree import AuxiliaryRows, StaticTree
from warpdecode.models.transformer import Transformer


@dataclass
class DeviceState:
    """Everything a step reads and advances, on the target's device (H = history capacity).

    `history` is the prompt, then every new token, the pending token (emitted, not yet in the cache)
    at index `length`: it is the output buffer the host reads, `history[prompt_len : prompt_len + new]`.
    """

    history: Tensor  # (H,) int64, tokens; slots past `length` are stale
    length: Tensor  # (1,) int64, cache length: tokens before the pending one
    new: Tensor  # () int64, tokens emitted so far, the first (from the prefill) included
    done: Tensor  # () bool, a stop token was emitted or `max_new_tokens` reached
    steps: Tensor  # () int64, verify forwards run
    limit: Tensor  # () int64, `max_new_tokens` on the device (a captured step reads it there)
    accepted: Tensor  # (M,) int64, draft tokens accepted at each forward (M >= max_new_tokens)
    proposed: Tensor  # (M,) int64, depth of the drafted (valid) nodes at each forward
    prompt_len: int = 0
    max_new_tokens: int = 0

    @classmethod
    def allocate(cls, capacity: int, device: torch.device | str) -> DeviceState:
        """Buffers for any request with prompt + max_new_tokens + tree width <= `capacity`; `reset`
        fills them. The same buffers serve request after request, so a graph captured on them replays."""
        def zeros(*shape: int, dtype: torch.dtype = torch.int64) -> Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        return cls(zeros(capacity), zeros(1), zeros(), zeros(dtype=torch.bool), zeros(), zeros(), zeros(capacity),
                   zeros(capacity))

    def reset(self, prompt_ids: list[int], pending: Tensor, *, max_new_tokens: int, stop_ids: Tensor) -> None:
        """The state after the prefill chose `pending` ((1,) int64 on the device); `stop_ids` (S,) int64
        (-1 pads)."""
        n = len(prompt_ids)
        if n + max_new_tokens > self.history.shape[0] or max_new_tokens > self.accepted.shape[0]:
            raise ValueError(f"{n} prompt + {max_new_tokens} new tokens exceed the state's capacity "
                             f"{self.history.shape[0]}")
        self.history[:n] = torch.tensor(prompt_ids, dtype=torch.int64)
        self.history[n : n + 1] = pending
        self.length.fill_(n)
        self.new.fill_(1)
        self.done.copy_(torch.isin(pending, stop_ids)[0] | (max_new_tokens <= 1))
        self.steps.zero_()
        self.limit.fill_(max_new_tokens)
        self.accepted.zero_()
        self.proposed.zero_()
        self.prompt_len, self.max_new_tokens = n, max_new_tokens

    @classmethod
    def start(cls, prompt_ids: list[int], pending: Tensor, *, max_new_tokens: int, width: int,
              stop_ids: Tensor) -> DeviceState:
        """Buffers of one request's size, filled (`allocate` then `reset`)."""
        state = cls.allocate(len(prompt_ids) + max_new_tokens + width, pending.device)
        state.reset(prompt_ids, pending, max_new_tokens=max_new_tokens, stop_ids=stop_ids)
        return state

    def pending(self) -> Tensor:
        """(1,) int64, the pending token."""
        return self.history.index_select(0, self.length)


class DeviceDrafter(Protocol):
    """A drafter made of tensor ops only: it drafts into its static tree and learns from each forward."""

    tree: StaticTree
    """Set by `prepare`, on the target's device."""
    feature_layers: tuple[int, ...]
    """The target hidden states the drafter reads (`start`, `observe`); () for none. Learned drafters
    read the features of the accepted positions (Medusa the last one, EAGLE every one)."""
    auxiliary: AuxiliaryRows | None
    """Rows the verify forward runs after the tree's for the drafter (PPD's prompt rows, read by
    `read_auxiliary`); None for none. Set by `prepare`."""

    def prepare(self, target: Transformer) -> None:
        """Build the tree and buffers on the target's device (once; later calls keep what they hold)."""

    def draft(self, state: DeviceState, room: Tensor) -> tuple[Tensor, Tensor]:
        """Draft tokens for the tree's nodes after `state.pending()`.

        Args:
            room: () int64, most nodes that may be valid (the first ones in node order are kept).
        Returns:
            tokens: (N,) int64; valid: (N,) bool, the nodes that carry a drafted token (a node's
            parent is valid when it is).
        """
        ...

    def update(self, tokens: Tensor, logits: Tensor, keep: Tensor) -> None:
        """Learn from a target forward: `tokens` (T,) int64 inputs, `logits` (T, V) after each,
        `keep` (T,) bool the rows that were really drafted (the others carry nothing)."""

    def start(self, hidden: dict[int, Tensor], tokens: Tensor, capacity: int) -> None:
        """A new request after its prefill: `hidden` {layer in `feature_layers`: (n, C)} at the n
        prompt positions, `tokens` (n,) int64 the token after each (the prompt's next tokens, then the
        pending one); `capacity`, the target cache's positions (buffers the drafter sizes by it)."""

    def observe(self, hidden: dict[int, Tensor], tokens: Tensor, count: Tensor, keep: Tensor) -> None:
        """After a verify forward: `hidden` {layer: (P, C)} at the kept path's rows (the old pending
        token first; rows past `count` are stale), `tokens` (P,) int64 the token after each (the
        accepted tokens, then the bonus one), `count` () int64 the rows that count (accepted + 1);
        `keep` () bool, False when the step changed nothing (after the end)."""

    def read_auxiliary(self, logits: Tensor, rows: Tensor, end: Tensor, keep: Tensor) -> None:
        """After a verify forward with `auxiliary` rows: `logits` (a, V) after the auxiliary rows that
        ran, `rows` (a,) int64 their indices among the A (increasing; every row `auxiliary.sent`
        marks among them), `end` (1,) int64 the node the kept path ends on (-1: the pending token),
        `keep` () bool as in `observe`."""


def forward_rows(drafter: DeviceDrafter) -> int:
    """Rows of the drafter's static verify forward: the tree's W, then its auxiliary rows."""
    return drafter.tree.width + (drafter.auxiliary.size if drafter.auxiliary is not None else 0)


class ReadsNoFeatures:
    """Base of the device drafters that read no target hidden state and learn only through `update`
    (or not at all): `feature_layers` is empty, no auxiliary rows, `start` and `observe` do nothing."""

    feature_layers: tuple[int, ...] = ()
    auxiliary: AuxiliaryRows | None = None

    def start(self, hidden: dict[int, Tensor], tokens: Tensor, capacity: int) -> None:
        """Nothing to read: no feature layers."""

    def observe(self, hidden: dict[int, Tensor], tokens: Tensor, count: Tensor, keep: Tensor) -> None:
        """Nothing to read: no feature layers."""

    def update(self, tokens: Tensor, logits: Tensor, keep: Tensor) -> None:
        """Nothing to learn from the target's logits (overridden by drafters that do)."""

    def read_auxiliary(self, logits: Tensor, rows: Tensor, end: Tensor, keep: Tensor) -> None:
        """No auxiliary rows."""

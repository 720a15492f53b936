"""The device buffers of one request, and what a device drafter does with them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from warpdecode.decoding.device_step.tree import StaticTree


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
    accepted: Tensor  # (max_new_tokens,) int64, draft tokens accepted at each forward
    proposed: Tensor  # (max_new_tokens,) int64, depth of the drafted (valid) nodes at each forward
    prompt_len: int
    max_new_tokens: int

    @classmethod
    def start(cls, prompt_ids: list[int], pending: Tensor, *, max_new_tokens: int, width: int,
              stop_ids: Tensor) -> DeviceState:
        """The state after the prefill chose `pending` ((1,) int64 on the device)."""
        device = pending.device
        n = len(prompt_ids)
        history = torch.zeros(n + max_new_tokens + width, dtype=torch.int64, device=device)
        history[:n] = torch.tensor(prompt_ids, dtype=torch.int64)
        history[n : n + 1] = pending
        done = torch.isin(pending, stop_ids)[0] | (max_new_tokens <= 1)
        return cls(history, torch.tensor([n], dtype=torch.int64, device=device),
                   torch.ones((), dtype=torch.int64, device=device), done,
                   torch.zeros((), dtype=torch.int64, device=device),
                   torch.zeros(max_new_tokens, dtype=torch.int64, device=device),
                   torch.zeros(max_new_tokens, dtype=torch.int64, device=device), n, max_new_tokens)

    def pending(self) -> Tensor:
        """(1,) int64, the pending token."""
        return self.history.index_select(0, self.length)


class DeviceDrafter(Protocol):
    """A drafter made of tensor ops only: it drafts into its static tree and learns from each forward."""

    tree: StaticTree
    """Set by `prepare`, on the target's device."""

    def prepare(self, vocab_size: int, device: torch.device) -> None:
        """Build the tree and buffers on `device` (once; later calls keep what they hold)."""

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

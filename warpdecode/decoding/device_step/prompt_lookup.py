"""Prompt lookup with tensor ops: `drafters/prompt_lookup.py` over the device history.

The draft is a fixed chain of `num_tokens` nodes; the nodes the host drafter would not propose (no
match, a shorter chain after a shorter match, past the copied text or the budget) are invalid and
never accepted, so acceptance and output equal the host drafter's.

The match: with G = max_ngram, `windows[e]` holds the G tokens ending at position e; `run[e]` counts
how many of them, from the right, equal the suffix's (the G tokens ending at the pending token). An
n-gram occurs ending at e when run[e] >= n; the most recent occurrence before the suffix itself is
the largest such e below the pending token's position.

Example: history [a, b, c, d, a, b] (b pending, G = 2): run = [0, 2, 0, 0, 0, 2]; n = 2 occurs last
ending at 1, so the chain copies from position 2: [c, d, a, b].
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from warpdecode.decoding.device_step.state import DeviceState, ReadsNoFeatures
from warpdecode.decoding.device_step.tree import StaticTree
from warpdecode.models.transformer import Transformer

if TYPE_CHECKING:
    from warpdecode.decoding.drafters.prompt_lookup import PromptLookupDrafter


class DevicePromptLookup(ReadsNoFeatures):
    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, num_tokens: int = 10, scale: bool = True) -> None:
        """The options of `PromptLookupDrafter`, which checks them."""
        self.max_ngram, self.min_ngram, self.num_tokens, self.scale = max_ngram, min_ngram, num_tokens, scale
        self.tree = StaticTree.chain(num_tokens)

    @classmethod
    def of(cls, drafter: PromptLookupDrafter) -> DevicePromptLookup:
        return cls(drafter.max_ngram, drafter.min_ngram, drafter.num_tokens, drafter.scale)

    def prepare(self, target: Transformer) -> None:
        device = target.embed.weight.device
        if self.tree.tables.depths.device != device:
            self.tree = StaticTree.chain(self.num_tokens, device)

    def draft(self, state: DeviceState, room: Tensor) -> tuple[Tensor, Tensor]:
        history, length = state.history, state.length  # pending at `length`
        H, G, device = history.shape[0], self.max_ngram, history.device
        padded = torch.cat([torch.full((G - 1,), -1, dtype=torch.int64, device=device), history])
        windows = padded.unfold(0, G, 1)  # (H, G): windows[e] = history[e-G+1 .. e]
        same = windows == windows.index_select(0, length)  # (H, G) against the suffix
        run = same.flip(1).to(torch.int64).cumprod(1).sum(1)  # (H,) trailing tokens equal to the suffix's
        ends = torch.arange(H, device=device)
        ns = torch.arange(self.min_ngram, G + 1, device=device)  # (Gn,) n-gram lengths
        hits = (run[None, :] >= ns[:, None]) & (ends < length)[None, :]  # (Gn, H) occurs ending at e, before the suffix
        last = torch.where(hits, ends, -1).amax(1)  # (Gn,) most recent end per n, -1 if none
        n = torch.where(last >= 0, ns, 0).amax()  # () longest n that occurs, 0 if none
        start = last.index_select(0, (n - self.min_ngram).clamp(min=0).view(1)) + 1  # (1,) first copied position
        chain = (self.num_tokens * n + G - 1) // G if self.scale else torch.full_like(n, self.num_tokens)
        i = torch.arange(self.num_tokens, device=device)
        source = start + i  # (K,)
        valid = (n > 0) & (i < chain) & (i < room) & (source <= length)
        return history.index_select(0, source.clamp(max=H - 1)), valid


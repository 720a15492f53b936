"""Lookahead for reward-guided searches (DeAL, Transfer Q*): branch candidate tokens off the rows of a
search's cache and extend each by a few greedy target tokens in one batch, so that a reward reads a
longer continuation than the one token the search is choosing."""

from __future__ import annotations

import torch

from warpdecode.models.backbone import Backbone
from warpdecode.models.cache import KVCache


class Lookahead:
    """A cache of `rows` branch rows that shares the search cache's prompt, filled once; each call copies
    only the generated positions of the parent rows."""

    def __init__(self, model: Backbone, search_cache: KVCache, rows: int, prompt_len: int) -> None:
        self.model, self.prompt_len = model, prompt_len
        self.cache = model.new_cache(rows, search_cache.max_len)
        self.cache.fill_from_row(search_cache)

    @torch.inference_mode()
    def rollouts(self, search_cache: KVCache, parents: list[int], tokens: list[int], depth: int,
                 stop_ids: set[int]) -> list[list[int]]:
        """Greedy continuations of `depth` tokens (fewer after a stop token) of each candidate: branch i
        is row `parents[i]` of `search_cache` (every row of one length) followed by `tokens[i]`. Costs
        `depth` forwards of `len(tokens)` rows. The candidate tokens themselves are not returned."""
        R, P = len(tokens), self.prompt_len
        if R > self.cache.batch:
            raise ValueError(f"{R} branches do not fit a lookahead of {self.cache.batch} rows")
        cache = self.cache if R == self.cache.batch else self.cache.rows(0, R)
        end = int(search_cache.lengths.max())
        index = torch.tensor(parents, device=cache.k.device)
        cache.k[:, :, :, P:end] = search_cache.k[:, index, :, P:end]
        cache.v[:, :, :, P:end] = search_cache.v[:, index, :, P:end]
        cache.lengths = torch.full((R,), end, dtype=torch.int64)
        device = self.model.embed.weight.device
        pending = torch.tensor(tokens, device=device)[:, None]  # (R, 1)
        out: list[list[int]] = [[] for _ in range(R)]
        open_rows = [t not in stop_ids for t in tokens]
        for _ in range(depth):
            if not any(open_rows):
                break
            pending = self.model(pending, cache=cache).logits[:, -1].argmax(-1, keepdim=True)  # (R, 1)
            for i, token in enumerate(pending[:, 0].tolist()):
                if open_rows[i]:
                    out[i].append(token)
                    open_rows[i] = token not in stop_ids
        return out

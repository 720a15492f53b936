"""Approximate KV reuse across the denoising steps of a block (Fast-dLLM's prefix and dual caches).

A masked diffusion LM attends bidirectionally, so every key and value depends on every token and
changes whenever a position is committed: an exact cache does not exist. Fast-dLLM observes that the
keys and values of positions outside the current block barely change while the block is decoded,
and reuses them:

* `prefix`: at the first step of a block the whole sequence runs once and the keys/values of the
  prompt and the finished blocks are kept; the following steps of the block run only the current
  block and every later answer position, attending to the kept prefix.
* `dual`: the keys/values of the later (still masked) answer positions are kept as well; the
  following steps run only the current block.

The first step of every block is an ordinary full forward (its logits are exact); the others read
stale keys/values for the positions they do not run, which is the accuracy the cache costs
(`warpdecode bench` reports it next to the step and wall-clock numbers). Positions outside the run
keep the logits of their last computation.

Mechanics: each row's positions are reordered kept-first (the order of keys does not matter to
attention once RoPE has encoded their positions), so the kept keys/values are a prefix of a
`KVCache` row and the recomputed positions are written after it and dropped again after the step.
"""

from __future__ import annotations

import torch
from torch import Tensor

from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.cache import KVCache

KV_REUSE_MODES = ("none", "prefix", "dual")


def check_kv_reuse(mode: str) -> str:
    if mode not in KV_REUSE_MODES:
        raise ConfigError(f"kv_cache must be one of {', '.join(KV_REUSE_MODES)}, got {mode!r}")
    return mode


def recomputed_positions(mode: str, answer: Tensor, block: Tensor, current: Tensor) -> Tensor:
    """(B, L) bool: the positions a cached step runs.

    Args:
        answer: (B, L) bool answer region. block: (B, L) int64 block index of answer positions.
        current: (B, 1) int64 each row's current block (past the last block for a finished row).
    """
    if mode == "prefix":
        return answer & (block >= current)
    return answer & (block == current)


def permute_rows(x: Tensor, order: Tensor) -> Tensor:
    """x (B, L, ...) → x[b, order[b]] for every row (order: (B, L) int64)."""
    index = order.view(*order.shape, *([1] * (x.dim() - 2))).expand(-1, -1, *x.shape[2:])
    return x.gather(1, index)


class BlockKVReuse:
    """Logits of one denoising step, reusing keys/values within a block (see the module docstring)."""

    def __init__(self, model: Backbone, mode: str, answer: Tensor, attention: Tensor) -> None:
        """
        Args:
            mode: `prefix` or `dual`.
            answer: (B, L) bool answer region of every row.
            attention: (B, L, L) bool the decode's attention (padding hidden from real positions).
        """
        if check_kv_reuse(mode) == "none":
            raise ValueError("BlockKVReuse needs mode prefix or dual")
        self.model, self.mode, self.answer, self.attention = model, mode, answer, attention
        B, L = answer.shape
        self.real = attention[:, 0, :]  # (B, L): position 0 (a prompt token) sees every real position
        extra = int(answer.sum(1).max())  # room for the recomputed positions after the kept ones
        config = model.config
        self.cache = KVCache(config.n_layer, B, config.kv_head_count, L + extra, config.head_width,
                             dtype=model.embed.weight.dtype, device=model.embed.weight.device)
        self.current: Tensor | None = None  # (B, 1) the blocks the cache was built for
        self.logits: Tensor | None = None  # (B, L, V) fp32, the latest logits of every position
        # Set by each refresh: kept positions per row (B,), and the positions a cached step runs
        # (B, T) with their validity (B, T) and attention among them (B, T, T).
        self.kept_lengths = torch.zeros(B, dtype=torch.int64)
        self.run_index = torch.zeros(B, 1, dtype=torch.int64)
        self.valid = torch.zeros(B, 1, dtype=torch.bool)
        self.run_mask = torch.ones(B, 1, 1, dtype=torch.bool)
        self.refreshes = 0

    def __call__(self, tokens: Tensor, block: Tensor, current: Tensor) -> Tensor:
        """(B, L) tokens, (B, L) block index, (B, 1) current block → (B, L, V) fp32 logits."""
        if self.current is None or not torch.equal(current, self.current):
            return self._refresh(tokens, block, current)
        return self._cached_step(tokens)

    def _refresh(self, tokens: Tensor, block: Tensor, current: Tensor) -> Tensor:
        """A full forward in kept-first order; keeps the kept positions' keys/values."""
        L = tokens.shape[1]
        recompute = recomputed_positions(self.mode, self.answer, block, current)  # (B, L)
        kept = self.real & ~recompute
        rank = torch.where(kept, 0, torch.where(recompute, 1, 2))  # kept, recomputed, padding
        order = torch.sort(rank * L + torch.arange(L, device=tokens.device), dim=1).indices  # (B, L)
        attention = permute_rows(permute_rows(self.attention, order).transpose(1, 2), order).transpose(1, 2)
        self.cache.truncate(0)
        out = self.model(tokens.gather(1, order), positions=order, cache=self.cache, attention_mask=attention)
        logits = torch.empty_like(out.logits, dtype=torch.float32)
        logits.scatter_(1, order[:, :, None].expand_as(out.logits), out.logits.float())
        self.kept_lengths = kept.sum(1).cpu()  # (B,)
        counts = recompute.sum(1)  # (B,)
        width = max(int(counts.max()), 1)
        starts = self.kept_lengths.to(tokens.device)[:, None]
        slots = (starts + torch.arange(width, device=tokens.device)).clamp(max=L - 1)  # (B, T)
        self.valid = torch.arange(width, device=tokens.device)[None, :] < counts[:, None]  # (B, T)
        self.run_index = torch.where(self.valid, order.gather(1, slots), 0)  # (B, T) positions a cached step runs
        eye = torch.eye(width, dtype=torch.bool, device=tokens.device)
        self.run_mask = (self.valid[:, :, None] & self.valid[:, None, :]) | eye  # (B, T, T)
        self.cache.truncate(self.kept_lengths)
        self.current, self.logits = current.clone(), logits
        self.refreshes += 1
        return logits

    def _cached_step(self, tokens: Tensor) -> Tensor:
        """Run only the recomputed positions against the kept keys/values."""
        assert self.logits is not None
        out = self.model(tokens.gather(1, self.run_index), positions=self.run_index, cache=self.cache,
                         attention_mask=self.run_mask).logits.float()  # (B, T, V)
        self.cache.truncate(self.kept_lengths)
        rows, cols = self.valid.nonzero(as_tuple=True)
        self.logits[rows, self.run_index[rows, cols]] = out[rows, cols]
        return self.logits

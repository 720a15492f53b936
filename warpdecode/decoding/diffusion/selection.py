"""Pure selection rules shared by the commit policies (no state, no model)."""

from __future__ import annotations

import torch
from torch import Tensor


def top_k_active(scores: Tensor, active: Tensor, k: Tensor | int) -> Tensor:
    """(B, L) bool: the `k` highest-scoring active positions of each row (fewer when fewer are active).

    Args:
        scores: (B, L) float, higher is committed first.
        active: (B, L) bool.
        k: an int, or (B,) int64 per row.
    """
    B, L = scores.shape
    k = torch.as_tensor(k, device=scores.device).expand(B)  # (B,)
    ranked = scores.masked_fill(~active, float("-inf")).argsort(dim=1, descending=True, stable=True)  # (B, L)
    take = torch.arange(L, device=scores.device)[None, :] < torch.minimum(k, active.sum(1))[:, None]  # (B, L)
    chosen = torch.zeros_like(active)
    chosen.scatter_(1, ranked, take)
    return chosen


def ensure_progress(chosen: Tensor, scores: Tensor, active: Tensor) -> Tensor:
    """`chosen`, plus the best active position of every row that has active positions but chose none."""
    stalled = active.any(1) & ~(chosen & active).any(1)  # (B,)
    return chosen | (top_k_active(scores, active, 1) & stalled[:, None])


def top2_gap(logits: Tensor) -> Tensor:
    """(B, L, V) logits → (B, L) difference between the two largest log-probabilities."""
    top = logits.log_softmax(-1).topk(2, dim=-1).values  # (B, L, 2)
    return top[..., 0] - top[..., 1]

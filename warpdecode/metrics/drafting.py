"""What a drafter will get, measured during training: per-depth accuracy and simulated acceptance length.

A drafter trained with teacher forcing can be scored exactly as the verifier would score it.
For each start position of a validation sequence (a moment where the target has just emitted a
token) and each draft depth d, the *rank* of the target's true next token among the drafter's
candidates at that depth, with every earlier draft token correct, says which tree nodes would be
accepted: a rank path (r_1, ..., r_d) of a static draft tree (`tree_shapes`) is accepted iff the
ranks at depths 1..d are exactly r_1..r_d. So one matrix of ranks gives

* top-1 / top-k accuracy per depth,
* the acceptance length τ (bonus token included) any tree shape would reach, and
* the tree of `num_nodes` nodes with the highest expected τ on that data (`tree_from_ranks`):
  each node adds the frequency of its rank prefix to E[τ], and a prefix is at least as frequent as
  any longer path through it, so the most frequent prefixes always form a valid tree.

For heads that do not see earlier draft tokens (Medusa) the rank at depth d does not depend on
the earlier ones being right, and the same formulas hold.

A rank equal to `max_rank` means "not among the candidates" (or past the end of the sequence).
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import Tensor
from torchmetrics import Metric

from warpdecode.decoding.tree_shapes import RankPath, chain


def label_ranks(logits: Tensor, labels: Tensor, max_rank: int) -> Tensor:
    """Rank of each label among its row of logits, capped at `max_rank`.

    Args:
        logits: (M, N) draft scores.
        labels: (M,) int64 column of the true token, or -1 when it has none (outside the draft
            vocabulary, past the end).
    Returns:
        (M,) int64: how many candidates score strictly higher than the label; `max_rank` for
        missing labels and ranks beyond it.
    """
    present = labels >= 0
    picked = logits.gather(1, labels.clamp_min(0)[:, None])  # (M, 1)
    rank = (logits > picked).sum(dim=1)
    return torch.where(present, rank, max_rank).clamp_max(max_rank)


def accepted_depths(ranks: Tensor, rank_paths: list[RankPath]) -> Tensor:
    """(M,) int64 number of draft tokens a tree of `rank_paths` would accept at each start.

    Args:
        ranks: (M, D) int64 rank of the true token at depths 1..D.
    """
    accepted = torch.zeros(ranks.shape[0], dtype=torch.int64, device=ranks.device)
    for path in rank_paths:
        if len(path) > ranks.shape[1]:
            continue
        match = (ranks[:, : len(path)] == torch.tensor(path, device=ranks.device)).all(dim=1)
        accepted = torch.where(match, torch.clamp_min(accepted, len(path)), accepted)
    return accepted


def simulated_tau(ranks: Tensor, rank_paths: list[RankPath]) -> float:
    """Mean acceptance length, bonus token included, of a tree of `rank_paths` over starts `ranks` (M, D)."""
    if ranks.shape[0] == 0:
        return float("nan")
    return 1.0 + accepted_depths(ranks, rank_paths).double().mean().item()


def tree_from_ranks(ranks: Tensor, num_nodes: int, max_rank: int) -> list[RankPath]:
    """The `num_nodes` rank paths of highest empirical frequency in `ranks` (M, D): the static
    tree with the highest mean acceptance length on this data. Parents come first; ties go to the
    shorter, then the lexicographically smaller path (so the result is deterministic)."""
    counts: Counter[RankPath] = Counter()
    for row in ranks.tolist():
        prefix: RankPath = ()
        for rank in row:
            if rank >= max_rank:
                break
            prefix = prefix + (rank,)
            counts[prefix] += 1
    ordered = sorted(counts, key=lambda p: (-counts[p], len(p), p))
    return ordered[:num_nodes]


class DraftRanks(Metric):
    """Collects the (M, D) rank matrix of a validation pass; `compute` reports accuracy and τ.

    `update(ranks)` takes (M, D) ranks of M start positions (use `label_ranks` per depth).
    """

    full_state_update = False
    higher_is_better = True

    def __init__(self, max_rank: int, topk: int = 5, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.max_rank, self.topk = max_rank, topk
        self.add_state("ranks", default=[], dist_reduce_fx="cat")

    def update(self, ranks: Tensor) -> None:
        parts: list[Tensor] = self.ranks  # type: ignore[assignment]
        parts.append(ranks.detach().to(torch.int64))

    def matrix(self) -> Tensor:
        """(M, D) all ranks collected so far."""
        parts: Tensor | list[Tensor] = self.ranks  # type: ignore[assignment]
        if isinstance(parts, Tensor):  # after a distributed sync the state is one tensor
            return parts
        return torch.cat(parts) if parts else torch.zeros(0, 0, dtype=torch.int64)

    def compute(self) -> dict[str, Tensor]:
        """`top1/d{k}` and `top{topk}/d{k}` per depth k (1-based) and `tau/chain` (a chain as deep as the data)."""
        ranks = self.matrix()
        out: dict[str, Tensor] = {}
        for depth in range(ranks.shape[1]):
            column = ranks[:, depth].double()
            out[f"top1/d{depth + 1}"] = (column == 0).double().mean()
            out[f"top{self.topk}/d{depth + 1}"] = (column < self.topk).double().mean()
        out["tau/chain"] = torch.tensor(simulated_tau(ranks, chain(ranks.shape[1])), dtype=torch.float64)
        return out

"""A trained drafter's validation acceptance as a picture (`acceptance.png` beside the package).

Left: the simulated τ of the best static tree of n nodes for every n up to the stored size (the
curve a node budget is chosen from; `num_nodes=auto` weighs it against the verify latency), with
the chain's τ for reference. Right: top-1 and top-k accuracy per draft depth, teacher-forced (every
earlier draft token correct), from the same rank matrix.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from torch import Tensor


def pyplot() -> ModuleType:
    """matplotlib.pyplot on the file-only Agg backend (no display needed), imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def depth_accuracy(ranks: Tensor, k: int) -> list[float]:
    """Fraction of start positions whose true token ranks below `k` at each depth of `ranks` (M, D)."""
    return (ranks < k).double().mean(dim=0).tolist()


def plot_acceptance(path: Path, ranks: Tensor, tau_by_nodes: list[float], tau_chain: float, title: str,
                    topk: int = 5) -> Path:
    """Write the two panels described in the module doc to `path` (PNG).

    Args:
        ranks: (M, D) int64 validation ranks (`DraftRanks.matrix`).
        tau_by_nodes: τ of the best tree of 1..n nodes.
        tau_chain: τ of the depth-D chain of top-1 tokens.
    """
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10.0, 4.0))
    nodes = list(range(1, len(tau_by_nodes) + 1))
    left.plot(nodes, tau_by_nodes, marker=".", label="best static tree")
    left.axhline(tau_chain, color="grey", linestyle="--", label=f"chain of {ranks.shape[1]} (τ {tau_chain:.2f})")
    left.annotate(f"{tau_by_nodes[-1]:.2f}", (nodes[-1], tau_by_nodes[-1]), textcoords="offset points",
                  xytext=(-10, 6), ha="right")
    left.set_xlabel("tree nodes")
    left.set_ylabel("simulated τ (bonus token included)")
    left.set_ylim(bottom=1.0)
    left.legend(loc="lower right")
    left.grid(alpha=0.3)
    depths = list(range(1, ranks.shape[1] + 1))
    for k in (1, topk):
        right.plot(depths, depth_accuracy(ranks, k), marker="o", label=f"top-{k}")
    right.set_xticks(depths)
    right.set_xlabel("draft depth (earlier tokens correct)")
    right.set_ylabel("accuracy")
    right.set_ylim(0.0, 1.0)
    right.legend()
    right.grid(alpha=0.3)
    fig.suptitle(f"{title}: {ranks.shape[0]:,} validation start positions")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

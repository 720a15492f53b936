import torch

from warpdecode.decoding.tree_shapes import chain
from warpdecode.metrics.drafting import simulated_tau, tree_from_ranks
from warpdecode.metrics.plots import depth_accuracy, plot_acceptance


def test_depth_accuracy_counts_ranks_below_k_per_depth():
    ranks = torch.tensor([[0, 0, 3], [0, 2, 5], [1, 0, 0], [5, 5, 5]])  # max_rank 5: missing
    assert depth_accuracy(ranks, 1) == [0.5, 0.5, 0.25]
    assert depth_accuracy(ranks, 3) == [0.75, 0.75, 0.25]


def test_plot_acceptance_writes_a_png(tmp_path):
    generator = torch.Generator().manual_seed(0)
    ranks = torch.randint(0, 4, (200, 3), generator=generator)
    paths = tree_from_ranks(ranks, 8, max_rank=10)
    curve = [simulated_tau(ranks, paths[:n]) for n in range(1, 9)]
    path = plot_acceptance(tmp_path / "acceptance.png", ranks, curve, simulated_tau(ranks, chain(3)), "test")
    assert path.read_bytes().startswith(b"\x89PNG") and path.stat().st_size > 10_000

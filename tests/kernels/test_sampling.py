"""Counter-based uniforms and inverse-CDF draws (`kernels/sampling.py`): a pure function of (seed,
counter, row), uniform, and drawing each token with its probability."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tv

from warpdecode.kernels.sampling import counter_uniforms, sample_rows, splitmix64


def test_splitmix64_matches_the_uint64_reference() -> None:
    """The int64 tensor version equals splitmix64 computed on Python's unbounded integers."""
    mask = (1 << 64) - 1

    def reference(x: int) -> int:
        z = (x + 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    inputs = [0, 1, 2, 12345, (1 << 62) + 17, -1 & ((1 << 63) - 1)]
    got = splitmix64(torch.tensor(inputs, dtype=torch.int64)).tolist()
    assert [g & mask for g in got] == [reference(x) for x in inputs]


def test_uniforms_are_a_function_of_seed_and_counter() -> None:
    seed, counters = torch.tensor([7]), torch.arange(100, 116)
    u = counter_uniforms(seed, counters)
    assert u.dtype == torch.float64 and u.shape == (16,)
    assert ((u >= 0) & (u < 1)).all()
    assert torch.equal(u, counter_uniforms(seed, counters))
    assert torch.equal(u[3:5], counter_uniforms(seed, counters[3:5]))  # a draw depends on its counter only
    assert counter_uniforms(seed, torch.tensor([104, 104])).unique().numel() == 1
    assert not torch.equal(u, counter_uniforms(torch.tensor([8]), counters))
    assert len(set(u.tolist())) == 16


def test_uniforms_are_uniform() -> None:
    u = counter_uniforms(torch.tensor([1]), torch.arange(20_000))
    counts = torch.histc(u.float(), bins=10, min=0, max=1)
    assert (counts - 2000).abs().max() < 200  # ~4.5 standard deviations
    assert abs(u.mean().item() - 0.5) < 0.01
    pairs = (u[:-1] < 0.5) & (u[1:] < 0.5)  # neighbouring counters are independent
    assert abs(pairs.double().mean().item() - 0.25) < 0.015


@pytest.mark.parametrize("probs", [[0.5, 0.0, 0.3, 0.2], [0.0, 0.0, 1.0, 0.0], [0.1] * 10])
def test_draws_follow_the_distribution(probs: list[float]) -> None:
    p = torch.tensor(probs)
    rows = p[None].expand(50, -1)
    draws = torch.cat([sample_rows(rows, counter_uniforms(torch.tensor([5]), torch.arange(c * 50, c * 50 + 50)))
                       for c in range(100)]).tolist()  # 5,000
    assert all(probs[t] > 0 for t in draws)  # never a token of probability 0
    assert tv(draws, p / p.sum()) < 0.03


def test_unnormalised_rows_and_edge_uniforms() -> None:
    probs = torch.tensor([[2.0, 0.0, 2.0], [0.0, 0.0, 3.0], [1.0, 0.0, 0.0]])
    assert sample_rows(probs, torch.tensor([0.0, 0.0, 0.0], dtype=torch.float64)).tolist() == [0, 2, 0]
    almost_one = torch.tensor([1 - 2**-53] * 3, dtype=torch.float64)
    assert sample_rows(probs, almost_one).tolist() == [2, 2, 0]
    assert sample_rows(probs, torch.tensor([0.5, 0.5, 0.5], dtype=torch.float64)).tolist() == [2, 2, 0]

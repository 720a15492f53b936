"""τ is defined once (`compute_tau`): the decode stats and the bench aggregates read it."""

import pytest

from warpdecode.decoding.outputs import DecodeStats, compute_tau


@pytest.mark.parametrize(("accepted", "forwards", "tau", "without_bonus"),
                         [(6, 4, 2.5, 1.5), (0, 3, 1.0, 0.0), (0, 0, 0.0, 0.0)])
def test_compute_tau(accepted, forwards, tau, without_bonus):
    assert compute_tau(accepted, forwards) == tau
    assert compute_tau(accepted, forwards, bonus=False) == without_bonus


def test_decode_stats_tau_counts_each_verify_forward():
    stats = DecodeStats(accepted_per_step=[3, 0, 2, 1], proposed_per_step=[4, 4, 4, 4])
    assert (stats.tau, stats.tau_without_bonus, stats.acceptance_rate) == (2.5, 1.5, 0.375)
    assert DecodeStats().tau == DecodeStats().tau_without_bonus == 0.0

"""The verify-latency curve and the tree size it makes best (`num_nodes=auto` of the packaged drafters)."""

from __future__ import annotations

import pytest
from tiny_models import greedy_target, heads_package, naive_greedy

from warpdecode.decoding.drafters import learned
from warpdecode.decoding.generate import build_method, generate
from warpdecode.decoding.latency import choose_nodes, non_decreasing, verify_seconds
from warpdecode.errors import ConfigError

pytestmark = pytest.mark.usefixtures("single_thread")


def test_choose_nodes_maximises_expected_tokens_per_second():
    assert choose_nodes([1.5, 1.8, 1.9], [1.0, 1.0, 1.1, 1.5]) == 2
    assert choose_nodes([1.5, 1.8, 1.9], [1.0, 1.0, 1.0, 1.0]) == 3  # flat latency: the biggest tree
    assert choose_nodes([1.5, 1.5, 1.5], [1.0, 1.0, 1.0, 1.0]) == 1  # ties: the smaller tree
    assert choose_nodes([1.2, 2.0], [1.0, 1.0, 3.0]) == 1
    with pytest.raises(ValueError, match="latencies"):
        choose_nodes([1.5, 1.8], [1.0, 1.0])


def test_non_decreasing_pools_the_dips():
    assert non_decreasing([1.0, 1.3, 1.1, 1.4]) == pytest.approx([1.0, 1.2, 1.2, 1.4])
    assert non_decreasing([3.0, 2.0, 1.0]) == pytest.approx([2.0, 2.0, 2.0])
    assert non_decreasing([1.0, 2.0, 2.0, 5.0]) == [1.0, 2.0, 2.0, 5.0]  # already monotone: unchanged
    assert non_decreasing([]) == []


def test_verify_seconds_measures_every_row_count():
    seconds = verify_seconds(greedy_target(), 5, context=32, repeats=2)
    assert len(seconds) == 5 and all(s > 0 for s in seconds)
    assert seconds == sorted(seconds)
    with pytest.raises(ValueError, match="max_rows"):
        verify_seconds(greedy_target(), 0)


def test_auto_cuts_the_stored_tree_where_the_latency_curve_says(monkeypatch, tmp_path):
    target = greedy_target()
    curve = {"val_tau_by_nodes": [1.4, 1.7, 1.9, 2.0, 2.05, 2.1]}
    path = heads_package(target, tmp_path / "hydra", "hydra", training=curve)
    measured = []
    monkeypatch.setattr(learned, "verify_seconds", lambda model, rows: measured.append(rows) or [1.0] * 4 + [2.0] * (rows - 4))
    method = build_method("hydra", do_sample=False, options={"path": path, "num_nodes": "auto"})
    out = generate(target, None, [3, 7, 1, 9], max_new_tokens=24, stop_at_eos=False, method=method)
    assert measured == [7] and len(method.drafter.shape) == 3  # latency doubles past 4 rows: 3 nodes
    assert out.token_ids == naive_greedy(target, [3, 7, 1, 9], 24)


def test_auto_needs_the_stored_curve_and_the_static_tree(tmp_path):
    target = greedy_target()
    path = heads_package(target, tmp_path / "medusa", "medusa")
    with pytest.raises(ConfigError, match="val_tau_by_nodes"):
        generate(target, None, [1, 2], max_new_tokens=4,
                 method=build_method("medusa", options={"path": path, "num_nodes": "auto"}))
    with pytest.raises(ConfigError, match="'auto' with the static tree"):
        build_method("medusa", options={"path": path, "num_nodes": "auto", "tree": "chain"})
    with pytest.raises(ConfigError, match="'auto' with the static tree"):
        build_method("medusa", options={"path": path, "num_nodes": "most"})

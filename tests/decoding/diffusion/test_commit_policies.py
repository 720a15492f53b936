"""Each commit policy's rule on hand-set confidences, and the selection helpers they share."""

from __future__ import annotations

import pytest
import torch
from oracle_dlm import EOS, OracleDLM

from warpdecode.decoding import registry
from warpdecode.decoding.diffusion.decoder import diffusion_generate
from warpdecode.decoding.diffusion.policies.credit import CreditCommit
from warpdecode.decoding.diffusion.policies.fixed import FixedCommit
from warpdecode.decoding.diffusion.policies.local_leap import LocalLeapCommit
from warpdecode.decoding.diffusion.policies.prophet import ProphetCommit
from warpdecode.decoding.diffusion.policies.threshold import ThresholdCommit
from warpdecode.decoding.diffusion.protocols import StepView
from warpdecode.decoding.diffusion.selection import ensure_progress, top2_gap, top_k_active
from warpdecode.errors import ConfigError

PROMPT = [5, 6]
ANSWER = [9, 10, 11, 12, 13, 14, 15, 9]


def constant_oracle(confidence: float) -> OracleDLM:
    truth = torch.tensor([PROMPT + ANSWER])
    return OracleDLM(truth, torch.full(truth.shape, confidence))


def decode(policy, confidence: float, block_length: int = 8):  # type: ignore[no-untyped-def]
    out = diffusion_generate(constant_oracle(confidence), [PROMPT], policy, gen_length=8, block_length=block_length,
                             eos_token_id=EOS)
    assert out.answers == [ANSWER]
    return out.stats


def view(confidence: list[float]) -> StepView:
    c = torch.tensor([confidence])
    active = torch.ones_like(c, dtype=torch.bool)
    tokens = torch.arange(len(confidence))[None]
    logits = torch.zeros(1, len(confidence), 4)
    return StepView(logits, tokens, c, active, active, active, active, 0)


def test_top_k_active_takes_the_best_active_positions_per_row() -> None:
    scores = torch.tensor([[0.1, 0.9, 0.5, 0.7], [0.4, 0.3, 0.2, 0.1]])
    active = torch.tensor([[True, False, True, True], [False, False, True, False]])
    chosen = top_k_active(scores, active, torch.tensor([2, 3]))
    assert chosen.tolist() == [[False, False, True, True], [False, False, True, False]]
    assert ensure_progress(torch.zeros_like(active), scores, active).tolist() == [[False, False, False, True],
                                                                                 [False, False, True, False]]


def test_top2_gap_is_the_log_probability_margin() -> None:
    logits = torch.tensor([[[2.0, 0.5, -1.0]]])
    assert top2_gap(logits).item() == pytest.approx(1.5)


def test_fixed_commits_n_per_step_and_is_lossless_only_at_one() -> None:
    assert decode(FixedCommit(1), 0.9).steps == [8]
    assert decode(FixedCommit(3), 0.9, block_length=4).steps == [4]  # 3 + 1 per block of 4
    assert FixedCommit(1).lossless and not FixedCommit(2).lossless


def test_threshold_commits_above_the_threshold_or_the_best_one() -> None:
    assert decode(ThresholdCommit(0.9), 0.95).steps == [1]
    assert decode(ThresholdCommit(0.9), 0.85).steps == [8]
    chosen = ThresholdCommit(0.6).select(view([0.5, 0.7, 0.65, 0.2])).positions
    assert chosen.tolist() == [[False, True, True, False]]


def test_local_leap_relaxes_the_threshold_near_anchors_with_distance() -> None:
    # anchors at 0 and 7 (>= 0.9); required confidence 0.6, 0.675, 0.75, 0.825 at distance 1..4
    policy = LocalLeapCommit(anchor_threshold=0.9, relaxed_threshold=0.6, radius=4)
    chosen = policy.select(view([0.95, 0.65, 0.7, 0.8, 0.5, 0.3, 0.3, 0.92])).positions
    assert chosen[0].nonzero().flatten().tolist() == [0, 1, 2, 3, 7]
    assert policy.select(view([0.5, 0.89, 0.7])).positions.tolist() == [[False, True, False]]  # no anchor: best one


def test_prophet_goes_all_in_once_the_gap_clears_the_stage_threshold() -> None:
    assert decode(ProphetCommit(), 0.999).steps == [1]  # gap 9.6 >= 7.5 at the start
    # gap 3.1: one token per step until 6 of 8 are committed (the late stage, threshold 2.5), then all in
    stats = decode(ProphetCommit(), 0.6, block_length=4)
    assert stats.steps == [7] and stats.committed_per_step[-1] == [2]


def test_credit_lets_settled_underconfident_tokens_pass_sooner() -> None:
    assert decode(ThresholdCommit(0.9), 0.85).steps == [8]
    credit = CreditCommit(threshold=0.9, decay=0.7, weight=0.5, power=0.5)
    first = decode(credit, 0.85)
    assert first.committed_per_step == [[1], [7]]  # fused confidence 0.887, then 0.901 after two steps
    assert decode(credit, 0.85).steps == first.steps  # credits are cleared between generations


def test_policies_are_registered_and_refuse_bad_options() -> None:
    assert {"fixed", "threshold", "local_leap", "prophet", "credit"} <= set(registry.names("commit_policy"))
    for name, options in (("fixed", {"tokens_per_step": 0}), ("threshold", {"threshold": 1.5}),
                          ("local_leap", {"relaxed_threshold": 0.95}), ("prophet", {"late_gap": 9.0}),
                          ("credit", {"decay": 1.0})):
        with pytest.raises(ConfigError):
            registry.build("commit_policy", name, **options)

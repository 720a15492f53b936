"""Stop rules of the quantised self-drafts: SpecDec++ (acceptance), the learned router and Entropy Adaptive
Decoding (entropy). Lossless under greedy verification; with `trust`, the rule decides who writes."""

from __future__ import annotations

import pytest
import torch
from tiny_models import acceptance_head_package, greedy_target, naive_greedy

from warpdecode.decoding.generate import build_method, generate
from warpdecode.errors import CheckpointError, ConfigError

pytestmark = pytest.mark.usefixtures("single_thread")
PROMPT = [3, 7, 1, 9, 4, 4, 2]


@pytest.mark.parametrize("bias, threshold, chain", [
    (8.0, 0.5, 5),    # always predicts acceptance: the full num_tokens chain
    (-8.0, 0.5, 1),   # always predicts rejection: one token per step
    (0.0, 0.7, 2),    # p = 0.5 per token: 1 - 0.5 = 0.5 ≤ 0.7 goes on, 1 - 0.25 = 0.75 > 0.7 stops after 2
], ids=["accept", "reject", "half"])
def test_chain_length_follows_the_predicted_acceptance(tmp_path, bias, threshold, chain):
    model = greedy_target()
    head = acceptance_head_package(model, tmp_path / "head", bias=bias)
    method = build_method("int8_self", do_sample=False,
                          options={"num_tokens": 5, "acceptance_head": head, "stop_threshold": threshold})
    out = generate(model, None, PROMPT, max_new_tokens=40, stop_at_eos=False, method=method)
    assert out.token_ids == naive_greedy(model, PROMPT, 40)
    proposed = out.stats.proposed_per_step
    assert max(proposed) == chain and proposed.count(chain) >= len(proposed) - 2  # the last steps may be cut by the budget


def test_a_random_head_stays_greedy_identical(tmp_path):
    model = greedy_target()
    head = acceptance_head_package(model, tmp_path / "head", seed=1)
    method = build_method("int4_self", do_sample=False, options={"num_tokens": 8, "acceptance_head": head})
    out = generate(model, None, PROMPT, max_new_tokens=48, stop_at_eos=False, method=method)
    assert out.token_ids == naive_greedy(model, PROMPT, 48)


def test_bad_options_and_another_targets_head_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="stop_threshold"):
        build_method("int4_self", do_sample=False, options={"stop_threshold": 0.5})  # no rule to take it
    with pytest.raises(ConfigError, match="stop_threshold"):
        build_method("int4_self", do_sample=False, options={"acceptance_head": "x", "stop_threshold": 1.5})
    with pytest.raises(ConfigError, match="needs acceptance_head"):
        build_method("int4_self", do_sample=False, options={"stop": "router"})
    with pytest.raises(ConfigError, match="stop must be one of"):
        build_method("int4_self", do_sample=False, options={"stop": "sometimes"})
    with pytest.raises(ConfigError, match="entropy_window"):
        build_method("int4_self", do_sample=False, options={"stop": "entropy", "entropy_window": 0})
    with pytest.raises(ConfigError, match="top_k"):
        build_method("int4_self", do_sample=False, options={"acceptance_head": "x", "top_k": 2})
    other = acceptance_head_package(greedy_target(), tmp_path / "head")
    from tiny_models import random_model

    model = random_model(seed=9, std=0.3, vocab_size=64, n_layer=3, n_head=4, n_kv_head=2, d_model=32, d_ff=64,
                         max_seq_len=256)
    method = build_method("int8_self", do_sample=False, options={"acceptance_head": other})
    with pytest.raises(CheckpointError, match="trained for"):
        generate(model, None, PROMPT, max_new_tokens=4, method=method)


def divergent_reference(model, prompt: list[int], output: list[int]) -> int:
    """Output tokens that are not the target's argmax after the output before them (full recompute)."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1]  # (n, V)
    return int((logits.argmax(-1) != torch.tensor(output)).sum())


@pytest.mark.parametrize("threshold, chain", [(1e-6, 0), (1e6, 5)], ids=["never-sure", "always-sure"])
def test_entropy_rule_drafts_while_the_rolling_entropy_is_low(threshold, chain):
    model = greedy_target()
    method = build_method("int8_self", do_sample=False,
                          options={"num_tokens": 5, "stop": "entropy", "stop_threshold": threshold})
    out = generate(model, None, PROMPT, max_new_tokens=40, stop_at_eos=False, method=method)
    assert out.token_ids == naive_greedy(model, PROMPT, 40)
    assert max(out.stats.proposed_per_step) == chain


def test_entropy_switching_with_trust_lets_the_copy_write_and_counts_the_divergence():
    model = greedy_target()
    for threshold in (1e-6, 1e6):
        method = build_method("int4_self", do_sample=False, verifier="trust",
                              options={"num_tokens": 5, "stop": "entropy", "stop_threshold": threshold})
        assert not method.verifier.lossless
        out = generate(model, None, PROMPT, max_new_tokens=40, stop_at_eos=False, method=method)
        assert out.stats.divergent_tokens == divergent_reference(model, PROMPT, out.token_ids)
        if threshold < 1:  # the copy is never sure: the target writes every token
            assert out.token_ids == naive_greedy(model, PROMPT, 40) and out.stats.divergent_tokens == 0
        else:  # the copy writes 5 of every 6 tokens, unverified, and this target disagrees with some
            assert out.stats.accepted_per_step[:-1] == [5] * (len(out.stats.accepted_per_step) - 1)
            assert out.stats.divergent_tokens > 0 and out.token_ids != naive_greedy(model, PROMPT, 40)


@pytest.mark.parametrize("bias, chain", [(8.0, 5), (-8.0, 0)], ids=["confident", "never"])
def test_router_keeps_a_token_only_when_predicted_accepted(tmp_path, bias, chain):
    model = greedy_target()
    head = acceptance_head_package(model, tmp_path / "head", bias=bias)
    method = build_method("int8_self", do_sample=False, verifier="trust",
                          options={"num_tokens": 5, "stop": "router", "acceptance_head": head, "stop_threshold": 0.5})
    out = generate(model, None, PROMPT, max_new_tokens=30, stop_at_eos=False, method=method)
    assert max(out.stats.accepted_per_step) == chain
    assert out.stats.divergent_tokens == divergent_reference(model, PROMPT, out.token_ids)
    if chain == 0:
        assert out.token_ids == naive_greedy(model, PROMPT, 30)

"""FiRST routing as a drafter: the skip set comes from the routers at each request's prefill; greedy
output stays the target's under the greedy verifier, and `trust` lets the skipping model write."""

from __future__ import annotations

import pytest
import torch
from tiny_models import greedy_target, layer_router_package, naive_greedy, random_model

from warpdecode.decoding.drafters.first import load_layer_router
from warpdecode.decoding.generate import build_method, generate
from warpdecode.errors import CheckpointError, ConfigError
from warpdecode.models.layer_router import prompt_means, skipped_layers

pytestmark = pytest.mark.usefixtures("single_thread")
PROMPTS = [[3, 7, 1, 9, 4, 4, 2], [10, 11, 12, 13], [5, 6, 5, 6, 5, 6, 5, 6, 1]]


def five_layers():
    return random_model(seed=4, std=0.3, vocab_size=64, n_layer=5, n_head=4, n_kv_head=2, d_model=32, d_ff=64,
                        max_seq_len=256)


def expected_skip(model, router_path: str, prompt: list[int]) -> list[int]:
    """The routers' decision computed from a plain forward over the prompt."""
    router, _ = load_layer_router(router_path, model)
    L = model.config.n_layer
    with torch.inference_mode():
        hidden = model(torch.tensor([prompt]), hidden_layers=range(L)).hidden_states
        gates = router(prompt_means(torch.stack([hidden[layer] for layer in range(L)], dim=1)))[0]
    return skipped_layers(gates, 0.5)


@pytest.mark.parametrize("bits", [None, 4])
def test_the_routed_skip_set_drafts_losslessly(tmp_path, bits):
    model = five_layers()
    router = layer_router_package(model, tmp_path / "router", skip=(1, 3))
    method = build_method("first", do_sample=False, options={"router": router, "num_tokens": 3, "bits": bits})
    for prompt in PROMPTS:
        out = generate(model, None, prompt, max_new_tokens=30, stop_at_eos=False, method=method)
        assert out.token_ids == naive_greedy(model, prompt, 30)
        assert method.drafter.skip == [1, 3] and sum(out.stats.proposed_per_step) > 0


def test_the_decision_follows_the_prompt(tmp_path):
    model = five_layers()
    router = layer_router_package(model, tmp_path / "router", seed=0)
    method = build_method("first", do_sample=False, options={"router": router})
    decisions = []
    for prompt in PROMPTS:
        out = generate(model, None, prompt, max_new_tokens=20, stop_at_eos=False, method=method)
        assert out.token_ids == naive_greedy(model, prompt, 20)
        assert method.drafter.skip == expected_skip(model, router, prompt)
        decisions.append(tuple(method.drafter.skip))
    assert len(set(decisions)) > 1, "a random router should route these prompts differently"


def test_max_skip_and_threshold_override_the_package(tmp_path):
    model = five_layers()
    router = layer_router_package(model, tmp_path / "router", skip=(1, 3))
    method = build_method("first", do_sample=False, options={"router": router, "max_skip": 1})
    generate(model, None, PROMPTS[0], max_new_tokens=8, stop_at_eos=False, method=method)
    assert method.drafter.skip == [1]  # equal gates: the lower block first
    method = build_method("first", do_sample=False, options={"router": router, "threshold": 1e-9})
    out = generate(model, None, PROMPTS[0], max_new_tokens=8, stop_at_eos=False, method=method)
    assert method.drafter.skip == [] and out.token_ids == naive_greedy(model, PROMPTS[0], 8)


def test_trust_lets_the_skipping_model_write(tmp_path):
    model = five_layers()
    prompt = PROMPTS[0]
    nothing = layer_router_package(model, tmp_path / "none", skip=())
    method = build_method("first", do_sample=False, verifier="trust", options={"router": nothing, "num_tokens": 4})
    out = generate(model, None, prompt, max_new_tokens=30, stop_at_eos=False, method=method)
    assert out.token_ids == naive_greedy(model, prompt, 30) and out.stats.divergent_tokens == 0  # no block skipped
    most = layer_router_package(model, tmp_path / "most", skip=(1, 2, 3))
    method = build_method("first", do_sample=False, verifier="trust", options={"router": most, "num_tokens": 4})
    out = generate(model, None, prompt, max_new_tokens=30, stop_at_eos=False, method=method)
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + out.token_ids])).logits[0, len(prompt) - 1 : -1]
    assert out.stats.divergent_tokens == int((logits.argmax(-1) != torch.tensor(out.token_ids)).sum())
    assert out.stats.accepted_per_step[0] == 4


def test_bad_options_and_another_targets_router_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="router="):
        build_method("first", do_sample=False)
    with pytest.raises(ConfigError, match="threshold"):
        build_method("first", do_sample=False, options={"router": "x", "threshold": 0.0})
    with pytest.raises(ConfigError, match="max_skip"):
        build_method("first", do_sample=False, options={"router": "x", "max_skip": -1})
    other = layer_router_package(greedy_target(), tmp_path / "router")
    method = build_method("first", do_sample=False, options={"router": other})
    with pytest.raises(CheckpointError, match="trained for"):
        generate(five_layers(), None, PROMPTS[0], max_new_tokens=4, method=method)

"""The oracle drafter and verifier: speculation at a chosen acceptance, for timing on any shape."""

import pytest
import torch

from warpdecode.decoding.generate import generate
from warpdecode.decoding.specs import parse_method
from warpdecode.decoding.verifiers.oracle import accept_for_tau, chain_tau
from warpdecode.errors import ConfigError
from warpdecode.models.checkpoint import read_config
from warpdecode.models.random_shapes import SHAPES, random_config, random_model
from warpdecode.runtime.load import load_backbones


def test_accept_for_tau_inverts_chain_tau():
    assert chain_tau(0.5, 2) == pytest.approx(1.75)
    for tau, depth in [(1.0, 4), (2.4, 4), (3.9, 4), (2.0, 1), (5.0, 8)]:
        assert chain_tau(accept_for_tau(tau, depth), depth) == pytest.approx(tau, abs=1e-9)
    with pytest.raises(ConfigError, match=r"tau must be in \[1, 5\]"):
        accept_for_tau(5.5, 4)


def test_oracle_reaches_the_asked_tau_and_repeats_itself(single_thread):
    from tiny_models import greedy_target

    target = greedy_target()
    method = "oracle:num_tokens=4:verifier=oracle:verifier.tau=2.4:verifier.depth=4"
    runs = [generate(target, None, [1, 2, 3], max_new_tokens=240, stop_at_eos=False,
                     method=parse_method(method).build(do_sample=False)) for _ in range(2)]
    assert runs[0].stats.accepted_per_step == runs[1].stats.accepted_per_step  # seeded draws
    assert runs[0].stats.tau == pytest.approx(2.4, abs=0.25)
    assert max(runs[0].stats.accepted_per_step) <= 4 and runs[0].stats.proposed_per_step[0] == 4


def test_oracle_drafter_is_lossless_with_the_greedy_verifier(single_thread):
    from tiny_models import greedy_target

    target = greedy_target()
    plain = generate(target, None, [1, 2, 3], max_new_tokens=20, stop_at_eos=False)
    oracle = generate(target, None, [1, 2, 3], max_new_tokens=20, stop_at_eos=False,
                      method=parse_method("oracle:num_tokens=3:width=2").build(do_sample=False))
    assert oracle.token_ids == plain.token_ids


def test_random_shapes_build_with_the_checkpoint_shapes():
    config = read_config("random:smollm2-360m")
    assert (config.n_layer, config.d_model, config.kv_head_count) == (32, 960, 5) and config == random_config(
        "random:smollm2-360m")
    assert set(SHAPES) >= {"smollm2-135m", "llama3.1-8b"}
    with pytest.raises(ConfigError, match="unknown random-weights shape 'gpt5'"):
        read_config("random:gpt5")
    model = random_model("random:smollm2-135m", device=torch.device("cpu"), dtype=torch.bfloat16)
    assert model.embed.weight.dtype == torch.bfloat16 and model.config.vocab_size == 49152
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)


@pytest.mark.slow
def test_random_model_loads_as_a_backbone_with_the_default_tokenizer():
    backbones, tokenizer = load_backbones("random:smollm2-135m", None, ["torch"], dtype="fp32")
    out = generate(backbones["torch"], tokenizer, "Hello", max_new_tokens=4, stop_at_eos=False,
                   method=parse_method("oracle:verifier=oracle:verifier.accept=1.0").build(do_sample=False))
    assert len(out.token_ids) == 4 and out.stats.target_forwards == 1  # every draft node accepted
    with pytest.raises(ConfigError, match="no native quantised weights"):
        load_backbones("random:smollm2-135m", None, ["torch"], dtype="native")

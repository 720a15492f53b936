"""The distilled drafter: an oracle package is always accepted, packages are checked against the
target, bad options are refused, and a reduced draft vocabulary never proposes outside itself."""

from __future__ import annotations

import pytest
import torch
from tiny_models import distilled_package, greedy_target, naive_greedy, random_model

from warpdecode.decoding.drafters.distilled import DistilledDrafter
from warpdecode.decoding.generate import build_method, generate
from warpdecode.errors import CheckpointError, ConfigError

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    """The greedy target and a package holding every one of its blocks unchanged, over the full vocabulary."""
    model = greedy_target()
    blocks = tuple(range(model.config.n_layer))
    path = distilled_package(model, tmp_path_factory.mktemp("oracle") / "drafter", std=0.0, init_layers=blocks,
                             vocab=model.config.vocab_size)
    return model, path


@pytest.mark.parametrize("options", [{"num_tokens": 4}, {"num_tokens": 3, "top_k": 2}, {"num_tokens": 3, "num_nodes": 5}],
                         ids=["chain", "fans", "dynamic"])
def test_an_exact_copy_of_the_target_is_always_accepted(oracle, options):
    model, path = oracle
    prompt = [3, 9, 4, 1]
    out = generate(model, None, prompt, max_new_tokens=21, stop_at_eos=False,
                   method=build_method("distilled", options={"path": path} | options))
    assert out.token_ids == naive_greedy(model, prompt, 21)
    # every verify step accepts the whole draft depth, but the last ones, whose node budget the
    # remaining tokens cut
    depth, accepted = options["num_tokens"], out.stats.accepted_per_step
    assert accepted[:-2] == [depth] * (len(accepted) - 2)
    assert len(accepted) <= 6


def test_a_reduced_vocabulary_drafts_only_its_tokens(tmp_path):
    model = greedy_target()
    path = distilled_package(model, tmp_path / "drafter", vocab=10, init_layers=(0,))
    drafter = DistilledDrafter(path, num_tokens=3, top_k=4)
    out = generate(model, None, [1, 2, 3], max_new_tokens=12, stop_at_eos=False,
                   method=build_method("distilled", options={"path": path, "num_tokens": 3, "top_k": 4}))
    assert out.token_ids == naive_greedy(model, [1, 2, 3], 12)
    drafter.prepare(model)
    assert drafter.net is not None
    drafter.cache = drafter.new_draft_cache(32)
    logits = drafter.run_draft([1, 2, 3])
    assert logits.shape == (1, 64)
    assert torch.isinf(logits[0, 10:]).all() and torch.isfinite(logits[0, :10]).all()


def test_a_package_for_another_target_is_refused(tmp_path):
    path = distilled_package(greedy_target(), tmp_path / "drafter")
    other = random_model(seed=9, std=0.3, vocab_size=64, n_layer=2, n_head=4, n_kv_head=2, d_model=32, d_ff=64,
                         max_seq_len=256)
    with pytest.raises(CheckpointError, match="trained for 'tiny'"):
        generate(other, None, [1, 2], max_new_tokens=4, method=build_method("distilled", options={"path": path}))


def test_bad_options_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        DistilledDrafter(str(tmp_path / "missing"))
    path = distilled_package(greedy_target(), tmp_path / "drafter", vocab=4)
    with pytest.raises(ConfigError, match="num_tokens must be >= 1"):
        DistilledDrafter(path, num_tokens=0)
    with pytest.raises(ConfigError, match="exceeds the draft vocabulary of 4"):
        DistilledDrafter(path, top_k=5).prepare(greedy_target())
    eagle_dir = tmp_path / "not-distilled"
    from tiny_models import eagle_package

    eagle_package(greedy_target(), eagle_dir)
    with pytest.raises(CheckpointError, match="holds a 'eagle' drafter, not 'distilled'"):
        DistilledDrafter(str(eagle_dir)).prepare(greedy_target())


@pytest.mark.parametrize("bits", [4, 8])
def test_a_quantised_draft_stays_lossless_and_drafts_like_the_full_one(oracle, bits):
    model, path = oracle
    prompt = [3, 9, 4, 1]
    method = build_method("distilled", options={"path": path, "num_tokens": 4, "bits": bits})
    out = generate(model, None, prompt, max_new_tokens=21, stop_at_eos=False, method=method)
    assert out.token_ids == naive_greedy(model, prompt, 21)
    drafter = method.drafter
    assert isinstance(drafter, DistilledDrafter) and drafter.net is not None
    assert drafter.net.model.blocks[0].attn.qkv.quantized is not None  # type: ignore[union-attr]
    assert drafter.net.model.lm_head.quantized is not None  # type: ignore[union-attr]
    # the quantised copy of an exact draft still agrees with the target on most tokens
    assert sum(out.stats.accepted_per_step) >= 10


def test_bits_must_be_4_or_8(oracle):
    with pytest.raises(ConfigError, match="bits must be 4 or 8"):
        DistilledDrafter(oracle[1], bits=3)

"""Fused drafters: one verify forward over the merged trees of several training-free drafters."""

import pytest
import torch

from warpdecode.decoding.drafters.fused import FusedDrafter
from warpdecode.decoding.generate import build_method, generate
from warpdecode.errors import ConfigError
from warpdecode.models.config import ModelConfig
from warpdecode.models.transformer import Transformer


def test_fused_is_lossless_and_drafts_from_both(single_thread):
    config = ModelConfig(vocab_size=16, n_layer=1, n_head=2, d_model=16, d_ff=32, max_seq_len=128)
    torch.manual_seed(0)
    model = Transformer(config)
    model.init_weights(std=0.5)
    model.eval()
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    plain = generate(model, None, prompt, max_new_tokens=40, stop_at_eos=False)
    methods = {name: build_method(name) for name in ("prompt_lookup", "token_recycling", "fused")}
    outs = {name: generate(model, None, prompt, max_new_tokens=40, stop_at_eos=False, method=m) for name, m in methods.items()}
    assert all(o.token_ids == plain.token_ids for o in outs.values())
    assert outs["fused"].stats.tau >= max(outs["prompt_lookup"].stats.tau, outs["token_recycling"].stats.tau) - 0.2
    assert max(outs["fused"].stats.proposed_per_step) >= 1


@pytest.mark.parametrize("drafters", ["prompt_lookup", "fused,prompt_lookup", "draft_model,prompt_lookup"])
def test_bad_combinations_are_config_errors(drafters):
    with pytest.raises(ConfigError):
        FusedDrafter(drafters=drafters)

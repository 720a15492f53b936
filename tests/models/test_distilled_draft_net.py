"""The distilled draft network: layer choices, exact copies of the target, cached = teacher-forced."""

from __future__ import annotations

import pytest
import torch
from tiny_models import random_model

from warpdecode.errors import ConfigError
from warpdecode.models.cache import KVCache
from warpdecode.models.distilled_draft import DistilledDraftNet, check_init_layers, spread_layers


def target():
    return random_model(seed=1, std=0.3, vocab_size=48, n_layer=3, n_head=4, n_kv_head=2, d_model=32, d_ff=64,
                        max_seq_len=64)


def test_spread_layers_keeps_the_first_and_the_last():
    assert spread_layers(30, 4) == [0, 10, 19, 29]
    assert spread_layers(30, 1) == [0]
    assert spread_layers(3, 3) == [0, 1, 2]
    with pytest.raises(ConfigError, match="cannot be taken"):
        spread_layers(3, 4)


@pytest.mark.parametrize("layers", [[], [1, 0], [0, 0], [-1], [3]])
def test_bad_init_layers_are_refused(layers):
    with pytest.raises(ConfigError, match="strictly increasing"):
        check_init_layers(layers, 3)


@torch.no_grad()
def test_every_block_and_the_full_vocabulary_reproduce_the_target():
    model = target()
    net = DistilledDraftNet(model.config, 3, 48)
    net.init_from_target(model, [0, 1, 2], torch.arange(48))
    tokens = torch.randint(0, 48, (2, 9))
    torch.testing.assert_close(net(tokens, model.embed), model(tokens).logits)
    assert not net.frozen_head().weight.requires_grad
    assert "model.lm_head.weight" not in net.trainable_state()


@torch.no_grad()
def test_a_layer_subset_is_the_target_with_blocks_skipped_over_the_draft_vocabulary():
    model = target()
    vocab = torch.tensor([2, 5, 7, 40])
    net = DistilledDraftNet(model.config, 2, 4)
    net.init_from_target(model, [0, 2], vocab)
    tokens = torch.randint(0, 48, (1, 7))
    positions = torch.arange(7)[None]
    skipped = model(tokens, positions, hidden_layers=(3,), layer_gates=torch.tensor([[1.0, 0.0, 1.0]]))
    expected = model.head(skipped.hidden_states[3])[..., vocab]
    torch.testing.assert_close(net(tokens, model.embed), expected)


@torch.no_grad()
def test_cached_drafting_matches_the_teacher_forced_pass():
    model = target()
    net = DistilledDraftNet(model.config, 2, 48)
    net.init_from_target(model, [0, 1], torch.arange(48))
    tokens = torch.randint(0, 48, (1, 10))
    full = net(tokens, model.embed)
    cache = KVCache.for_model(net.config, 1, 32, dtype=torch.float32)
    first = net(tokens[:, :6], model.embed, cache=cache, logits_slice=slice(-1, None))
    steps = [net(tokens[:, i : i + 1], model.embed, cache=cache) for i in range(6, 10)]
    torch.testing.assert_close(first[0, -1], full[0, 5])
    torch.testing.assert_close(torch.cat(steps, dim=1)[0], full[0, 6:])


def test_init_layers_must_match_the_block_count():
    model = target()
    net = DistilledDraftNet(model.config, 2, 48)
    with pytest.raises(ConfigError, match="3 init_layers for a draft of 2 blocks"):
        net.init_from_target(model, [0, 1, 2], torch.arange(48))

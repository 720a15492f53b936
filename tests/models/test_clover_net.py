"""Clover's network: the cached drafting path (augmenting block with a KV cache, the decoder over the
committed context) computes exactly what the teacher-forced training unroll computes."""

from __future__ import annotations

import torch
from tiny_models import random_model

from warpdecode.models.cache import KVCache
from warpdecode.models.clover import CloverNet


@torch.no_grad()
def test_cached_drafting_equals_the_training_unroll():
    target = random_model(seed=1, std=0.3, vocab_size=48, n_layer=2, n_head=4, n_kv_head=2, d_model=32, d_ff=64,
                          max_seq_len=64)
    net = CloverNet(target.config, 40)
    net.init_from_target(target, torch.arange(40), std=0.3)
    T, steps = 9, 3
    features, tokens = torch.randn(1, T, 32), torch.randint(0, 48, (1, T))
    unrolled = net.unrolled(features, tokens, target.embed, steps)
    assert [tuple(x.shape) for x in unrolled] == [(1, T - 1, 40)] * steps
    for i in (0, 3, 5):  # start i: positions 0..i committed, x_{i+1} pending
        cache = KVCache.for_model(net.config, 1, 32)
        positions = torch.arange(i + 1)[None]
        # committed in two verifications, as the drafter feeds them
        cut = (i + 1) // 2
        states = torch.cat([net.augmented(features[:, :cut], positions[:, :cut], cache),
                            net.augmented(features[:, cut : i + 1], positions[:, cut:], cache)], dim=1)
        keys, values = net.context_kv(states, positions)
        h = states[:, -1:]
        for k in range(1, steps + 1):
            h = net.step(h, target.embed(tokens[:, i + k : i + k + 1]), torch.tensor([[i + k]]), keys, values)
            torch.testing.assert_close(net.logits(h)[0, 0], unrolled[k - 1][0, i], atol=1e-5, rtol=1e-5)


def test_the_head_is_frozen_and_not_stored():
    target = random_model(seed=1, std=0.3, vocab_size=48, n_layer=2, n_head=4, d_model=32, d_ff=64, max_seq_len=64)
    net = CloverNet(target.config, 40)
    net.init_from_target(target, torch.arange(40))
    assert not net.head.weight.requires_grad
    assert "augment.lm_head.weight" not in net.trainable_state()
    torch.testing.assert_close(net.head.weight, target.embed.weight[:40])

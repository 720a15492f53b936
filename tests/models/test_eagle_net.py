"""The EAGLE-style draft network: the training-time unroll computes exactly what drafting at inference computes."""

import pytest
import torch
import torch.nn.functional as F

from warpdecode.errors import ConfigError
from warpdecode.models.cache import KVCache
from warpdecode.models.config import ModelConfig
from warpdecode.models.eagle import EagleNet, shift_left, ttt_attention
from warpdecode.models.transformer import Transformer

pytestmark = pytest.mark.usefixtures("single_thread")


def tiny_pair(seed: int = 0, layout: str | None = None) -> tuple[Transformer, EagleNet]:
    """A random target (4 layers for EAGLE-3's shape, which reads three layer inputs, else 2) and an
    EAGLE network of `layout` for it."""
    torch.manual_seed(seed)
    target = Transformer(ModelConfig(vocab_size=50, n_layer=4 if layout == "eagle3" else 2, n_head=4, n_kv_head=2,
                                     d_model=32, d_ff=64, max_seq_len=64))
    target.init_weights(0.2)
    feature_layers = (0, 1, 3) if layout == "eagle3" else None
    net = EagleNet(target.config, draft_vocab_size=40, feature_layers=feature_layers, layout=layout)
    net.init_from_target(target, torch.arange(5, 45), std=0.2)
    return target.eval(), net.eval()


def ttt_mask(n: int, steps: int) -> torch.Tensor:
    """The naive reference's (n, steps * n) mask: keys of step 0 causal, of each later step only the same start."""
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    return torch.cat([causal] + [torch.eye(n, dtype=torch.bool)] * (steps - 1), dim=1)


def test_the_reference_mask_is_causal_then_diagonal():
    assert ttt_mask(3, 2).int().tolist() == [[1, 0, 0, 1, 0, 0], [1, 1, 0, 0, 1, 0], [1, 1, 1, 0, 0, 1]]


@pytest.mark.parametrize("steps", [1, 2, 4])
def test_ttt_attention_equals_masked_attention_over_every_step_with_gradients(steps):
    torch.manual_seed(steps)
    B, H, Hkv, n, D = 2, 4, 2, 7, 8
    q = torch.randn(B, H, n, D, dtype=torch.float64, requires_grad=True)
    keys = [torch.randn(B, Hkv, n, D, dtype=torch.float64, requires_grad=True) for _ in range(steps)]
    values = [torch.randn(B, Hkv, n, D, dtype=torch.float64, requires_grad=True) for _ in range(steps)]
    fast = ttt_attention(q, keys, values)
    naive = F.scaled_dot_product_attention(q, torch.cat(keys, dim=2), torch.cat(values, dim=2),
                                           attn_mask=ttt_mask(n, steps), enable_gqa=True)
    torch.testing.assert_close(fast, naive)
    upstream = torch.randn_like(fast)
    grads = torch.autograd.grad((fast * upstream).sum(), [q, *keys, *values])
    naive_grads = torch.autograd.grad((naive * upstream).sum(), [q, *keys, *values])
    for got, want in zip(grads, naive_grads, strict=True):
        torch.testing.assert_close(got, want)


def test_shift_left_pads_with_zeros():
    x = torch.tensor([[1, 2, 3, 4]])
    assert shift_left(x, 2, 3).tolist() == [[3, 4, 0]]


def test_head_is_the_targets_rows_of_the_draft_vocabulary():
    target, net = tiny_pair()
    assert torch.equal(net.frozen_head().weight, target.embed.weight[5:45])
    assert not net.frozen_head().weight.requires_grad
    assert "layer.lm_head.weight" not in net.trainable_state()


@torch.no_grad()
@pytest.mark.parametrize("layout", [None, "eagle", "eagle3"])
def test_unrolled_steps_equal_inference_drafting(layout):
    target, net = tiny_pair(layout=layout)
    T = 10
    tokens = torch.randint(0, 50, (1, T))
    features = net.target_feature(target(tokens, hidden_layers=net.feature_layers).hidden_states)  # (1, T, C)
    steps = net.unrolled(features, tokens, target.embed, steps=3)

    # Step 0 is the causal pass over the true pairs (f_i, x_{i+1}) at positions i + 1.
    positions = torch.arange(1, T)[None]
    hidden, logits = net(features[:, :-1], tokens[:, 1:], target.embed, positions)
    torch.testing.assert_close(steps[0][0], hidden, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(steps[0][1], logits, atol=1e-5, rtol=1e-5)

    # Step k at start i: true pairs 0..i in the cache, then the draft feeds its own features.
    for i in (0, 4, 6):
        cache = KVCache.for_model(net.config, 1, 32)
        out, _ = net(features[:, : i + 1], tokens[:, 1 : i + 2], target.embed, torch.arange(1, i + 2)[None], cache)
        feature = out[:, -1:]
        for k in (1, 2):
            feature, draft_logits = net(feature, tokens[:, i + 1 + k : i + 2 + k], target.embed,
                                        torch.tensor([[i + 1 + k]]), cache)
            torch.testing.assert_close(steps[k][0][:, i], feature[:, 0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(steps[k][1][:, i], draft_logits[:, 0], atol=1e-5, rtol=1e-5)


def test_eagle1_layout_has_no_norms_around_the_block_and_no_fc_bias():
    target, net = tiny_pair(layout="eagle")
    assert net.fc.bias is None and isinstance(net.block.attn_norm, torch.nn.Identity)
    assert isinstance(net.layer.norm, torch.nn.Identity)
    with pytest.raises(ConfigError, match="eagle layout"):
        EagleNet(target.config, draft_vocab_size=40, feature_layers=(1, 2), layout="eagle")
    with pytest.raises(ConfigError, match="eagle layout"):
        EagleNet(target.config, draft_vocab_size=40, layout="eagle2")


def test_fused_features_start_as_the_final_feature():
    target, _ = tiny_pair()
    net = EagleNet(target.config, draft_vocab_size=40, feature_layers=(0, 1, 2))
    net.init_from_target(target, torch.arange(5, 45), std=0.0)
    hidden = target(torch.randint(0, 50, (1, 6)), hidden_layers=(0, 1, 2)).hidden_states
    torch.testing.assert_close(net.target_feature(hidden), hidden[2])
    assert net.fuse is not None and net.fuse.weight.shape == (32, 96)
    assert "fuse.weight" in net.trainable_state()
    assert EagleNet(target.config, draft_vocab_size=40).fuse is None  # the final feature alone needs no fusion


@pytest.mark.parametrize("layers", [(1,), (1, 2, 2), (2, 5)])
def test_feature_layers_include_the_final_one_once(layers):
    target, _ = tiny_pair()
    with pytest.raises(ConfigError, match="feature_layers"):
        EagleNet(target.config, draft_vocab_size=40, feature_layers=layers)


def test_eagle3_layout_reads_three_hidden_states_into_a_two_c_wide_attention():
    target, net = tiny_pair(layout="eagle3")
    assert net.fc is None and net.fuse is not None and net.fuse.weight.shape == (32, 96)
    assert net.block.attn.q_proj.weight.shape == (32, 64) and net.block.attn.o_proj.weight.shape == (32, 32)
    assert isinstance(net.layer.norm, torch.nn.Identity) and not isinstance(net.out_norm, torch.nn.Identity)
    deep = ModelConfig(vocab_size=50, n_layer=30, n_head=4, d_model=32, d_ff=64, max_seq_len=64)
    assert EagleNet(deep, 40, layout="eagle3").feature_layers == (2, 15, 27)  # the peers' default
    for layers in ((1, 2), (1, 1, 2), (0, 1, 5), (0, 1, 2, 3)):
        with pytest.raises(ConfigError, match="three distinct target hidden states in 0..4"):
            EagleNet(target.config, draft_vocab_size=40, feature_layers=layers, layout="eagle3")

"""Medusa and Hydra heads: fresh heads are the LM head, Hydra's teacher-forced pass equals its inference
steps and reads exactly the tokens it should, the frozen head is never stored."""

import pytest
import torch

from warpdecode.models.config import ModelConfig
from warpdecode.models.medusa import HydraHeads, MedusaHeads
from warpdecode.models.transformer import Transformer

pytestmark = pytest.mark.usefixtures("single_thread")

VOCAB = torch.arange(5, 45)  # a 40-token draft vocabulary


def tiny_target(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    target = Transformer(ModelConfig(vocab_size=50, n_layer=2, n_head=4, n_kv_head=2, d_model=32, d_ff=64,
                                     max_seq_len=64))
    target.init_weights(0.2)
    return target.eval()


def randomised(net, std: float = 0.3):
    with torch.no_grad():
        for p in net.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * std)
    return net.eval()


def random_hydra(target: Transformer) -> HydraHeads:
    """3 two-block Hydra heads on a 40-token draft vocabulary, off their fresh (LM-head) state."""
    net = HydraHeads(32, 40, num_heads=3, num_layers=2)
    net.init_from_target(target, VOCAB)
    return randomised(net)


@pytest.mark.parametrize("heads", [MedusaHeads, HydraHeads])
def test_fresh_heads_are_the_lm_head_on_the_draft_vocabulary(heads):
    target = tiny_target()
    net = heads(32, 40, num_heads=3, num_layers=2)
    net.init_from_target(target, VOCAB)
    tokens = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        out = target(tokens, hidden_layers=(2,))
        features = out.hidden_states[2]  # (2, 7, C)
        logits = net(features) if heads is MedusaHeads else net(features, tokens, target.embed)
    assert logits.shape == (2, 7, 3, 40)
    for k in range(3):
        torch.testing.assert_close(logits[:, :, k], out.logits[:, :, VOCAB])
    assert torch.equal(net.head.weight, target.embed.weight[VOCAB]) and not net.head.weight.requires_grad
    assert "head.weight" not in net.trainable_state() and "draft_vocab" in net.trainable_state()


def test_medusa_heads_read_the_feature_alone():
    net = randomised(MedusaHeads(32, 40, num_heads=3, num_layers=1))
    features = torch.randn(4, 32)
    logits = net(features)  # (4, K, N)
    assert logits.shape == (4, 3, 40)
    for k in (1, 2, 3):
        torch.testing.assert_close(logits[:, k - 1], net.head(net.hidden(k, features)))


@torch.no_grad()
def test_hydra_teacher_forced_pass_equals_inference_steps():
    target = tiny_target()
    net = random_hydra(target)
    T = 9
    tokens = torch.randint(0, 50, (1, T))
    features = torch.randn(1, T, 32)
    logits = net(features, tokens, target.embed)  # (1, T, K, N)
    for i in (0, 3, 5):
        for k in (1, 2, 3):
            step = net.step(k, features[:, i], target.embed(tokens[:, i + 1 : i + 1 + k]))  # (1, N)
            torch.testing.assert_close(logits[:, i, k - 1], step)


@torch.no_grad()
def test_hydra_head_k_reads_exactly_the_k_tokens_after_its_feature():
    target = tiny_target()
    net = random_hydra(target)
    T, i = 9, 2
    tokens = torch.randint(0, 50, (1, T))
    features = torch.randn(1, T, 32)
    base = net(features, tokens, target.embed)[0, i]  # (K, N)
    for j in range(T):  # change token x_j only
        changed = tokens.clone()
        changed[0, j] = (changed[0, j] + 1) % 50
        after = net(features, changed, target.embed)[0, i]
        for k in (1, 2, 3):
            reads = i + 1 <= j <= i + k
            assert (not torch.equal(after[k - 1], base[k - 1])) == reads, (j, k)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="num_heads >= 1"):
        MedusaHeads(32, 40, num_heads=0, num_layers=1)
    with pytest.raises(ValueError, match="reads 2 token embeddings"):
        HydraHeads(32, 40, num_heads=3, num_layers=1).step(2, torch.zeros(1, 32), torch.zeros(1, 3, 32))

"""Int8 weight-only copies: the kernel against its dequantised reference, the copy against the model."""

import pytest
import torch

from warpdecode.models.cache import KVCache
from warpdecode.models.config import ModelConfig
from warpdecode.models.int8 import Int8Weight, int8_available, int8_copy
from warpdecode.models.transformer import Transformer

pytestmark = pytest.mark.skipif(not int8_available(), reason="no CPU int8 weight-only matmul in this torch build")


@pytest.mark.parametrize("width", [32, 8, 40])  # the kernel itself needs multiples of 16
def test_int8_matmul_matches_its_dequantised_weight(width):
    weight = torch.randn(24, width)
    q = Int8Weight.of(weight, torch.randn(24))
    assert q.qweight.dtype == torch.int8 and q.scales.shape == (24,) and q.qweight.shape[1] % 16 == 0
    assert (q.dequantized() - weight).abs().max() <= q.scales.float().max()  # a step at most (bf16 scales)
    x = torch.randn(2, 3, width)
    reference = x @ q.dequantized().T + q.bias.float()
    torch.testing.assert_close(q(x).float(), reference, atol=0.05, rtol=0.02)  # bf16 activations


@pytest.mark.parametrize("tied", [True, False])
def test_int8_copy_follows_the_model_and_leaves_it_unchanged(tied):
    config = ModelConfig(vocab_size=50, d_model=32, n_layer=2, n_head=4, n_kv_head=2, d_ff=64, max_seq_len=32,
                         tie_embeddings=tied)
    torch.manual_seed(0)
    model = Transformer(config).eval()
    model.init_weights()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    draft = int8_copy(model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert draft.lm_head is not None and draft.lm_head.int8 is not None and draft.blocks[0].attn.qkv.int8 is not None
    tokens = torch.randint(0, 50, (1, 12))
    with torch.inference_mode():
        ref = model(tokens).logits
        cache = KVCache.for_model(draft.config, 1, 16)
        got = torch.cat([draft(tokens[:, :8], cache=cache).logits, draft(tokens[:, 8:], cache=cache).logits], 1)
    assert got.shape == ref.shape
    assert (got.float() - ref).abs().max() < 0.1 * ref.abs().max()
    assert (got.float().argmax(-1) == ref.argmax(-1)).float().mean() > 0.8

"""The packed CPU linear path against its dense reference, and when it must not be used."""

from __future__ import annotations

import pytest
import torch

from warpdecode.kernels.packed_linear import FusedLinear, Linear, PackedWeight, can_pack
from warpdecode.models.cache import KVCache
from warpdecode.models.config import ModelConfig
from warpdecode.models.transformer import Transformer

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="oneDNN not available")


@pytest.mark.parametrize("rows", [1, 3, 8, 37])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_dense(rows: int, bias: bool) -> None:
    layer = Linear(48, 80, bias=bias)
    x = torch.randn(2, rows, 48)
    with torch.no_grad():
        dense = layer(x)
        assert layer.pack()
        packed = layer(x)
    assert packed.shape == dense.shape == (2, rows, 80)
    torch.testing.assert_close(packed, dense, atol=1e-5, rtol=1e-5)


def test_fused_linear_splits_like_the_separate_layers() -> None:
    layers = [Linear(32, n, bias=True) for n in (32, 8, 8)]
    fused = FusedLinear(layers)
    x = torch.randn(1, 5, 32)
    with torch.no_grad():
        reference = fused(x)
        assert fused.pack()
        outputs = fused(x)
    assert [o.shape[-1] for o in outputs] == [32, 8, 8]
    for got, want in zip(outputs, reference, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_stale_copy_is_not_used_after_the_weight_changes() -> None:
    layer = Linear(16, 16, bias=False)
    layer.pack()
    with torch.no_grad():
        layer.weight.mul_(-1.0)  # what an optimizer step or load_state_dict does
        x = torch.randn(1, 1, 16)
        torch.testing.assert_close(layer(x), x @ layer.weight.T)
    layer.weight = torch.nn.Parameter(torch.randn(16, 16))  # a new storage
    with torch.no_grad():
        torch.testing.assert_close(layer(x), x @ layer.weight.T)
    assert layer.pack()  # re-packing picks up the new weight
    assert layer.packed is not None and layer.packed.fresh_for((layer.weight,))


def test_autograd_uses_the_dense_weight() -> None:
    layer = Linear(16, 4)
    layer.pack()
    layer(torch.randn(3, 16)).sum().backward()
    assert layer.weight.grad is not None and layer.weight.grad.abs().sum() > 0


def test_unpackable_weights_are_left_dense() -> None:
    assert not can_pack(torch.zeros(4, 4, dtype=torch.bfloat16))
    with torch.inference_mode():
        assert not can_pack(torch.zeros(4, 4))  # inference tensors have no version counter
    assert PackedWeight.of((torch.zeros(4, 4, dtype=torch.float64),)) is None


@pytest.mark.parametrize("tied", [True, False])
def test_packed_transformer_decodes_like_the_dense_one(tied: bool) -> None:
    config = ModelConfig(vocab_size=97, d_model=64, n_layer=3, n_head=4, n_kv_head=2, d_ff=96, max_seq_len=64,
                         tie_embeddings=tied)
    model = Transformer(config).eval()
    model.init_weights()
    tokens = torch.randint(0, 97, (2, 9))

    def logits() -> torch.Tensor:
        cache = KVCache.for_model(config, 2, 16)
        with torch.inference_mode():
            prefill = model(tokens[:, :6], cache=cache).logits
            step = model(tokens[:, 6:], cache=cache).logits
        return torch.cat([prefill, step], dim=1)

    dense = logits()
    assert model.pack_for_cpu_inference() == 3 * 4 + 1  # qkv, o, gate-up, down per block, and the head
    torch.testing.assert_close(logits(), dense, atol=1e-4, rtol=1e-4)
    model.unpack()
    torch.testing.assert_close(logits(), dense)

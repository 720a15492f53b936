"""Weight-only quantised copies: each kernel against an independent dequantised reference, the copy against the model."""

import pytest
import torch

from warpdecode.errors import CapabilityError
from warpdecode.kernels.quantized import (
    BlockInt4Weight,
    BlockInt8Weight,
    Int4Weight,
    Int8Weight,
    TorchInt8Weight,
    quantized_available,
    resolve_quant_impl,
)
from warpdecode.models.cache import KVCache
from warpdecode.models.config import ModelConfig
from warpdecode.models.quantized import quantized_copy, quantized_target
from warpdecode.models.transformer import Transformer

needs_int8 = pytest.mark.skipif(not quantized_available(8), reason="no CPU int8 weight-only matmul in this torch build")
needs_int4 = pytest.mark.skipif(not quantized_available(4), reason="no CPU int4 weight-only matmul in this torch build")


IMPLS = ["torch", pytest.param("native", marks=pytest.mark.skipif(
    resolve_quant_impl("auto") != "native", reason="the native block matmul is unavailable here"))]
TOLERANCE = {"torch": "bf16 activations, scales and zeros", "native": "activations rounded to 8 bits per block of 32"}


@needs_int8
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("width", [32, 8, 40])  # torch's kernel needs multiples of 16, the native one of 32
def test_int8_matmul_matches_its_dequantised_weight(width, impl):
    weight = torch.randn(24, width)
    q = Int8Weight.of(weight, torch.randn(24), impl=impl)
    assert isinstance(q, TorchInt8Weight if impl == "torch" else BlockInt8Weight)
    step = q.dequantized().abs().amax(1) / 127
    assert q.dequantized().shape == (24, width)
    assert ((q.dequantized() - weight).abs().amax(1) <= step * 1.01 + 1e-6).all()  # a step at most
    x = torch.randn(2, 3, width)
    reference = x @ q.dequantized().T + q.bias_float
    # 8-bit activations: a step of max|x| / 127 per input, ~0.1 over 40 inputs of N(0, 1) (the exact
    # arithmetic is tested against its reference in tests/kernels/test_block_matmul.py)
    atol = 0.05 if impl == "torch" else 0.2
    torch.testing.assert_close(q(x).float(), reference, atol=atol, rtol=0.02, msg=TOLERANCE[impl])


def q4_1_weight(out_features: int, in_features: int) -> torch.Tensor:
    """A weight exactly representable as Q4_1 blocks of 32 inputs: `d * q + m`, each block using 0 and 15."""
    blocks = in_features // 32
    q = torch.randint(0, 16, (out_features, blocks, 32))
    q[:, :, 0], q[:, :, 1] = 0, 15
    d = torch.rand(out_features, blocks, 1) * 0.05 + 0.01
    m = -torch.rand(out_features, blocks, 1) * 0.3
    return (d * q + m).view(out_features, in_features)


@needs_int4
@pytest.mark.parametrize("impl", IMPLS)
def test_int4_recovers_q4_1_weights(impl):
    """A Q4_1 checkpoint's weights come back up to the rounding of scale and zero (bf16 for torch's
    kernel, fp16 for the native one: exact for a Q4_1 file's own fp16 values)."""
    weight = q4_1_weight(48, 64)
    q = Int4Weight.of(weight, impl=impl)
    x = torch.randn(5, 64)
    got = q(x)
    reference = (x.bfloat16().float() if impl == "torch" else x) @ weight.T
    assert (got - reference).abs().max() < 0.02 * reference.abs().max()
    if isinstance(q, BlockInt4Weight):
        groups, d, m = q.groups()
        dense = (groups.float().view(48, 2, 32) * d[..., None] + m[..., None]).view(48, 64)
        torch.testing.assert_close(dense, weight, atol=1e-3, rtol=1e-3)  # fp16 scale and minimum


@needs_int4
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape", [(24, 40), (16, 32), (7, 70)])  # padded in both dimensions where needed
def test_int4_matmul_matches_groupwise_reference(shape, impl):
    out_features, in_features = shape
    weight = torch.randn(out_features, in_features)
    q = Int4Weight.of(weight, torch.randn(out_features), impl=impl)
    x = torch.randn(2, 3, in_features)
    got = q(x)
    assert got.shape == (2, 3, out_features) and got.dtype == torch.float32
    padded = torch.nn.functional.pad(weight, (0, -in_features % 32)).view(out_features, -1, 32)
    low, high = padded.amin(-1, keepdim=True), padded.amax(-1, keepdim=True)
    scale = (high - low) / 15
    dequantized = (((padded - low) / scale).round() * scale + low).view(out_features, -1)[:, :in_features]
    assert (dequantized - weight).abs().max() <= scale.max() / 2 + 1e-6
    reference = x @ dequantized.T + q.bias.float()
    torch.testing.assert_close(got, reference, atol=0.1, rtol=0.03, msg=TOLERANCE[impl])


@pytest.mark.parametrize("bits", [8, pytest.param(4, marks=needs_int4)])
@pytest.mark.parametrize("tied", [True, False])
@needs_int8
def test_quantized_copy_follows_the_model_and_leaves_it_unchanged(tied, bits):
    config = ModelConfig(vocab_size=50, d_model=32, n_layer=2, n_head=4, n_kv_head=2, d_ff=64, max_seq_len=32,
                         tie_embeddings=tied)
    torch.manual_seed(0)
    model = Transformer(config).eval()
    model.init_weights()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    draft = quantized_copy(model, bits)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert isinstance(draft.lm_head.quantized, Int8Weight)  # the head stays int8 at any bit width
    assert isinstance(draft.blocks[0].attn.qkv.quantized, Int8Weight if bits == 8 else Int4Weight)
    assert isinstance(draft.blocks[0].mlp.down_proj.quantized, Int8Weight if bits == 8 else Int4Weight)
    tokens = torch.randint(0, 50, (1, 12))
    with torch.inference_mode():
        ref = model(tokens).logits
        cache = KVCache.for_model(draft.config, 1, 16)
        got = torch.cat([draft(tokens[:, :8], cache=cache).logits, draft(tokens[:, 8:], cache=cache).logits], 1)
    assert got.shape == ref.shape
    assert (got.float() - ref).abs().max() < 0.15 * ref.abs().max()
    assert (got.float().argmax(-1) == ref.argmax(-1)).float().mean() > 0.7


def test_quantized_copy_rejects_unsupported_bits():
    model = Transformer(ModelConfig(vocab_size=50, d_model=32, n_layer=1, n_head=4, d_ff=64, max_seq_len=32))
    with pytest.raises(CapabilityError, match="bits=4 or bits=8"):
        quantized_copy(model, 3)  # type: ignore[arg-type]


def tiny(tied: bool = True, mlp: str = "swiglu") -> Transformer:
    config = ModelConfig(vocab_size=50, d_model=32, n_layer=2, n_head=4, n_kv_head=2, d_ff=64, max_seq_len=32,
                         tie_embeddings=tied, mlp=mlp)
    torch.manual_seed(0)
    model = Transformer(config).eval()
    model.init_weights()
    return model


@needs_int4
@pytest.mark.parametrize("mlp", ["swiglu", "gelu_tanh"])
@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_target_holds_one_copy_of_each_weight(bits, mlp):
    """A `--dtype q8|q4` target keeps only its quantised weights (a fused group's layers hold none of
    their own), runs without packing, and answers with the checkpoint's fingerprint."""
    model = tiny(mlp=mlp)
    fingerprint = model.fingerprint()
    target = quantized_target(model, bits)
    assert target.weight_bits == bits and target.fingerprint() == fingerprint
    attn, mlp_module = target.blocks[0].attn, target.blocks[0].mlp
    assert all(p.numel() == 0 for name, p in target.named_parameters() if name.endswith("proj.weight"))
    assert attn.q_proj.quantized is None and attn.o_proj.quantized is not None
    if mlp == "gelu_tanh":  # the up projection runs directly: it shares its one-layer group's weight
        assert mlp_module.up_proj.quantized is mlp_module.gate_up.quantized
    assert target.pack_for_cpu_inference() == 0
    tokens = torch.randint(0, 50, (1, 12))
    with torch.inference_mode():
        ref, got = model(tokens).logits, target(tokens).logits
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.7
    torch.testing.assert_close(target.output_embeddings(), target.lm_head.quantized.dequantized())


@needs_int4
def test_copies_of_a_quantized_model():
    """The int4 copy of an int8 model re-quantises its int8 weights; a copy at the model's own bits is the
    model itself; an int8 copy of an int4 model is refused."""
    model = tiny(tied=False)
    q8 = quantized_target(model, 8)
    q4 = quantized_copy(q8, 4)
    assert isinstance(q4.blocks[1].attn.qkv.quantized, Int4Weight)
    assert q4.lm_head.quantized is q8.lm_head.quantized  # the int8 head is shared
    direct = Int4Weight.of(q8.blocks[1].mlp.down_proj.quantized.dequantized())
    x = torch.randn(3, direct.in_features)
    assert torch.equal(q4.blocks[1].mlp.down_proj.quantized(x), direct(x))
    assert quantized_copy(q4, 4) is q4
    with pytest.raises(CapabilityError, match="more weight bytes"):
        quantized_copy(q4, 8)


@needs_int4
@pytest.mark.parametrize("bits", [8, 4])
def test_a_quantized_target_verifies_rows_exactly_as_one_token_steps(bits):
    """Row-by-row attention: the logits of a 5-row forward after a 150-token prefix equal, bit for bit, those
    of five one-token steps (a verify forward computes what plain decoding would)."""
    model = tiny()
    model.config.max_seq_len = 256
    target = quantized_target(model, bits)
    assert all(block.attn.row_by_row for block in target.blocks)
    torch.manual_seed(1)
    ids = torch.randint(0, 50, (1, 155))
    with torch.inference_mode():
        cache = KVCache.for_model(target.config, 1, 200)
        target(ids[:, :150], cache=cache)
        steps = torch.cat([target(ids[:, 150 + i : 151 + i], cache=cache).logits for i in range(5)], 1)
        cache = KVCache.for_model(target.config, 1, 200)
        target(ids[:, :150], cache=cache)
        assert torch.equal(target(ids[:, 150:], cache=cache).logits, steps)


@needs_int8
@pytest.mark.parametrize("impl", IMPLS)
def test_int8_weights_stack_part_by_part(impl):
    """Parts quantised alone and stacked (as the GGUF head is made, a slice at a time) are the weight
    quantised whole; a part of rows that are not whole 16-channel tiles may only come last."""
    weight = torch.randn(37, 40)
    whole = Int8Weight.of(weight, impl=impl)
    stacked = Int8Weight.stacked((Int8Weight.of(weight[lo : lo + 16], impl=impl) for lo in (0, 16, 32)), 37)
    x = torch.randn(3, 40)
    assert type(stacked) is type(whole) and torch.equal(stacked(x), whole(x))
    assert torch.equal(stacked.dequantized(), whole.dequantized())
    with pytest.raises(ValueError, match="36 rows, not 37"):
        Int8Weight.stacked([Int8Weight.of(weight[:16], impl=impl), Int8Weight.of(weight[16:36], impl=impl)], 37)
    if impl == "native":
        with pytest.raises(ValueError, match="only the last"):
            Int8Weight.stacked([Int8Weight.of(weight[:8], impl=impl), Int8Weight.of(weight[8:], impl=impl)], 37)


def test_quantisation_in_row_chunks_equals_the_whole(monkeypatch):
    """`int4_groups` and `int8_rows` quantise a few rows at a time (bounded temporaries): every row is
    quantised alone, so any chunk size gives the same integers and scales as the definition at once."""
    from warpdecode.kernels import quantized as qz

    torch.manual_seed(0)
    w = torch.randn(37, 70) * torch.rand(37, 1)  # rows of different ranges; 70 inputs pad to 96 for int4
    w[5] = 0  # an all-zero row: the smallest scale
    q4, scale, low = qz.int4_groups(w)
    groups = torch.nn.functional.pad(w, (0, 26)).view(37, 3, 32)
    want_low, want_high = groups.amin(-1), groups.amax(-1)
    want_scale = ((want_high - want_low) / 15).clamp_min(1e-12)
    want_q = ((groups - want_low[..., None]) / want_scale[..., None]).round().clamp(0, 15).view(37, 96)
    assert q4.dtype == torch.uint8 and torch.equal(q4.float(), want_q)
    assert torch.equal(scale, want_scale) and torch.equal(low, want_low)
    q8, scales = qz.int8_rows(w)
    want_scales = (w.abs().amax(1) / 127).clamp_min(1e-12)
    assert torch.equal(scales, want_scales) and torch.equal(q8, (w / want_scales[:, None]).round().clamp(-127, 127).to(torch.int8))
    monkeypatch.setattr(qz, "ROWS_PER_CHUNK", 4)  # 37 rows: chunks of 4, the last one short
    assert all(torch.equal(a, b) for a, b in zip(qz.int4_groups(w), (q4, scale, low), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(qz.int8_rows(w), (q8, scales), strict=True))

"""The native decoder stack (`kernels/decoder_stack.py`) against the model's PyTorch layers (its
reference), and its invariance: a verified token, a row of a batch and a run on one thread compute
the same bits as a one-token step alone."""

from __future__ import annotations

import pytest
import torch

from warpdecode.kernels.decoder_stack import DecoderStack, native_library
from warpdecode.kernels.invariance import batch_invariant
from warpdecode.models.config import ModelConfig
from warpdecode.models.quantized import quantized_target
from warpdecode.models.transformer import Transformer

NATIVE = not isinstance(native_library(), str)
pytestmark = pytest.mark.skipif(not NATIVE, reason=f"native decoder stack unavailable: {native_library()}")

SHAPES = {
    "llama": {"vocab_size": 96, "n_layer": 3, "n_head": 4, "n_kv_head": 2, "d_model": 64, "d_ff": 160},
    # inputs that are not a multiple of 32 (padded widths), q/k/v biases, one key head
    "qwen2-like": {"vocab_size": 80, "n_layer": 2, "n_head": 4, "n_kv_head": 1, "d_model": 48, "d_ff": 100,
                   "qkv_bias": True},
}


def target(shape: str, bits: int = 4, seed: int = 3) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(max_seq_len=64, **SHAPES[shape]))
    model.init_weights(std=0.2)
    for name, p in model.named_parameters():  # nonzero biases and norm gains, so that both are exercised
        if name.endswith("bias") or "norm" in name:
            p.data.uniform_(0.5, 1.5) if "norm" in name else p.data.normal_(0, 0.1)
    return quantized_target(model.eval(), bits)


def steps(model: Transformer, prompt: list[int], n: int) -> tuple[list[int], list[torch.Tensor], object]:
    """Prefill then n greedy one-token steps: the tokens, every step's logits, and the cache."""
    cache = model.new_cache(1, 64)
    with torch.inference_mode():
        logits = [model.forward(torch.tensor([prompt]), cache=cache).logits[0, -1]]
        tokens = [int(logits[-1].argmax())]
        for _ in range(n):
            logits.append(model.forward(torch.tensor([[tokens[-1]]]), cache=cache).logits[0, -1])
            tokens.append(int(logits[-1].argmax()))
    return tokens, logits, cache


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("bits", [4, 8])
def test_stack_computes_what_the_layers_compute(shape, bits):
    model = target(shape, bits)
    assert isinstance(model.native_stack(), DecoderStack)
    prompt = [5, 17, 3, 9, 22, 41, 7]
    model.stack_impl = "native"
    _, native, native_cache = steps(model, prompt, 6)
    model.stack_impl = "torch"
    _, reference, reference_cache = steps(model, prompt, 6)
    for a, b in zip(native, reference, strict=True):
        # the activations are quantised to 8 bits per block: a last-bit difference upstream can move one
        # step of a block's grid, so the comparison is relative to the logits' spread
        assert float((a - b).abs().max()) < 0.05 * float(b.std())
    used = int(reference_cache.lengths[0])
    k_native, k_reference = native_cache.k[:, :, :, :used], reference_cache.k[:, :, :, :used]
    assert torch.allclose(k_native, k_reference, rtol=0.05, atol=0.05 * float(k_reference.std()))


@pytest.mark.parametrize("shape", SHAPES)
def test_a_verified_chain_and_tree_compute_the_steps_bits(shape):
    model = target(shape)
    model.stack_impl = "native"
    prompt = [5, 17, 3, 9]
    tokens, logits, cache = steps(model, prompt, 5)
    with torch.inference_mode():
        cache.truncate(len(prompt))
        chain = model.forward(torch.tensor([tokens[:5]]), cache=cache).logits[0]
        for i in range(5):
            assert torch.equal(chain[i], logits[i + 1])
        # a tree: node 0 the first token, nodes 1 and 2 its two children (node 2 the true one)
        cache.truncate(len(prompt))
        tree = torch.tensor([[tokens[0], (tokens[1] + 1) % 80, tokens[1]]])
        mask = torch.tensor([[[1, 0, 0], [1, 1, 0], [1, 0, 1]]], dtype=torch.bool)
        depth = torch.tensor([[0, 1, 1]]) + len(prompt)
        verified = model.forward(tree, depth, cache=cache, attention_mask=mask).logits[0]
    assert torch.equal(verified[0], logits[1]) and torch.equal(verified[2], logits[2])


def test_rows_of_a_batch_and_thread_counts_compute_the_same_bits():
    model = target("llama")
    model.stack_impl = "native"
    prompts = [[5, 17, 3], [9, 22, 41], [7, 7, 7]]
    threads = torch.get_num_threads()
    alone = []
    for p in prompts:
        torch.set_num_threads(1)
        try:
            alone.append(steps(model, p, 4)[1])
        finally:
            torch.set_num_threads(threads)
    cache = model.new_cache(3, 64)
    with torch.inference_mode(), batch_invariant():
        out = model.forward(torch.tensor(prompts), cache=cache).logits[:, -1]
        for i in range(4):
            for b in range(3):
                assert torch.equal(out[b], alone[b][i])
            out = model.forward(out.argmax(-1, keepdim=True), cache=cache).logits[:, -1]


def test_hidden_states_come_from_inside_the_stack():
    model = target("llama")
    model.stack_impl = "native"
    cache_a, cache_b = model.new_cache(1, 64), model.new_cache(1, 64)
    ids = torch.tensor([[5, 17, 3, 9]])
    with torch.inference_mode():
        plain = model.forward(ids, cache=cache_a)
        with_hidden = model.forward(ids, cache=cache_b, hidden_layers=(0, 1, 3))
    assert torch.equal(plain.logits, with_hidden.logits)
    assert torch.equal(with_hidden.hidden_states[0], model.embed(ids))
    assert with_hidden.hidden_states[1].shape == (1, 4, 64)
    assert not torch.equal(with_hidden.hidden_states[1], with_hidden.hidden_states[0])
    # the final hidden state is normed: the LM head of it is the logits
    assert torch.equal(model.head(with_hidden.hidden_states[3]), with_hidden.logits)


def test_what_the_stack_does_not_run():
    half = Transformer(ModelConfig(vocab_size=96, n_layer=2, n_head=4, d_model=64, d_ff=160, max_seq_len=64))
    half.blocks[0].attn.o_proj.quantized = target("llama").blocks[0].attn.o_proj.quantized
    assert "all quantised or all float" in half.native_stack()
    gpt2 = Transformer(ModelConfig(vocab_size=96, n_layer=2, n_head=4, d_model=64, d_ff=160, max_seq_len=64,
                                   norm="layernorm", mlp="gelu_tanh", position="learned"))
    assert "Llama-family" in gpt2.native_stack()
    model = target("llama")
    model.stack_impl = "native"
    with pytest.raises(ValueError, match="not a decode or verify step"), torch.inference_mode():
        model.forward(torch.tensor([[1, 2, 3]]))  # no cache: a training-style forward
    stack = model.native_stack()
    assert isinstance(stack, DecoderStack)
    cache = model.new_cache(1, 8)
    with pytest.raises(ValueError, match="past the cache"):
        x = torch.zeros(1, 9, 64)
        cos = torch.ones(1, 1, 9, 16)
        from warpdecode.kernels.exact_attention import Visibility

        stack(x, 0, 2, cos, cos, cache.k, cache.v, torch.zeros(1, dtype=torch.int64),
              Visibility.of_prefixes(torch.arange(1, 10)[None]))


def test_float32_one_token_steps_run_on_the_stack_and_match_the_layers():
    from warpdecode.kernels.dense_matmul import dense_matmul

    torch.manual_seed(5)
    model = Transformer(ModelConfig(max_seq_len=64, **SHAPES["qwen2-like"]))
    model.init_weights(std=0.2)
    model.eval()
    assert isinstance(model.native_stack(), DecoderStack)
    prompt = [5, 17, 3, 9, 22]
    model.stack_impl = "auto"
    _, native, _ = steps(model, prompt, 6)
    model.stack_impl = "torch"
    _, reference, _ = steps(model, prompt, 6)
    for a, b in zip(native, reference, strict=True):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)
    # weights replaced in another storage (`.to()`, a reload): the stack is rebuilt, never stale
    stack = model.native_stack()
    layer = model.blocks[0].attn.q_proj
    layer.weight.data = layer.weight.data.clone() * 0
    assert model.native_stack() is not stack
    # the dense head against its reference, a row alone and among others
    x, weight = torch.randn(3, 48), torch.randn(80, 48)
    y = dense_matmul(x, weight, impl="native")
    assert torch.allclose(y, x @ weight.T, atol=1e-4, rtol=1e-4)
    assert torch.equal(dense_matmul(x[1:2], weight, impl="native")[0], y[1])
    with pytest.raises(ValueError, match="impl must be one of"):
        dense_matmul(x, weight, impl="fast")


def test_a_layer_with_a_forward_hook_runs_its_pytorch_forward():
    """A LoRA adapter hooks its layers' forwards: with one attached, steps never take the stack (which would
    skip it), and the adapter's effect shows."""
    from warpdecode.models.lora import attach_lora

    torch.manual_seed(5)
    model = Transformer(ModelConfig(max_seq_len=64, **SHAPES["llama"]))
    model.init_weights(std=0.2)
    model.eval()
    assert isinstance(model.native_stack(), DecoderStack)
    prompt = [5, 17, 3]
    _, before, _ = steps(model, prompt, 3)
    adapters = attach_lora(model, rank=2, alpha=4.0)
    for p in adapters.parameters():  # a non-zero update (LoRA starts as the identity)
        p.data.normal_(0, 0.5)
    assert "forward hook" in model.native_stack()
    _, hooked, _ = steps(model, prompt, 3)
    model.stack_impl = "torch"
    _, reference, _ = steps(model, prompt, 3)
    for a, b, c in zip(hooked, reference, before, strict=True):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4) and not torch.allclose(a, c, atol=1e-3)


@pytest.mark.parametrize("shape", SHAPES)
def test_padding_rows_are_skipped_and_the_real_rows_keep_their_bits(shape):
    """Under `padded_rows`, a batch's rows padded to one width compute only their real positions: the
    real positions' logits and cache slots are the unpadded forward's bits, the padding's slots stay
    unwritten and its logits are zeros."""
    from warpdecode.kernels.invariance import padded_rows

    model = target(shape)
    model.stack_impl = "native"
    prompts, lengths = [[5, 17, 3, 9], [9, 22, 41, 2], [7, 7, 7, 1]], [3, 1, 4]
    new = torch.tensor([[11, 12, 13, 14], [15, 16, 17, 18], [19, 20, 21, 22]])
    mask = torch.tril(torch.ones(4, 4, dtype=torch.bool)).repeat(3, 1, 1)  # (B, T, T) chains
    for b, n in enumerate(lengths):  # the padding sees itself alone, as the continuous batch pads
        mask[b, n:, :] = False
        mask[b, range(n, 4), range(n, 4)] = True
    outs, caches = [], []
    for padded in (False, True):
        cache = model.new_cache(3, 64)
        cache.k.fill_(float("nan")), cache.v.fill_(float("nan"))  # unwritten slots stay NaN
        with torch.inference_mode(), batch_invariant():
            model.forward(torch.tensor(prompts), cache=cache)
            if padded:
                with padded_rows(lengths):
                    outs.append(model.forward(new, cache=cache, attention_mask=mask).logits)
            else:
                outs.append(model.forward(new, cache=cache, attention_mask=mask).logits)
        caches.append(cache)
    for b, n in enumerate(lengths):
        assert torch.equal(outs[1][b, :n], outs[0][b, :n])
        assert bool((outs[1][b, n:] == 0).all())
        for full, skipped in ((caches[0].k, caches[1].k), (caches[0].v, caches[1].v)):
            assert torch.equal(skipped[:, b, :, : 4 + n], full[:, b, :, : 4 + n])
            assert bool(skipped[:, b, :, 4 + n : 8].isnan().all())
    with pytest.raises(ValueError, match="keep must list ascending rows"):
        stack = model.native_stack()
        assert isinstance(stack, DecoderStack)
        cache = model.new_cache(1, 64)
        from warpdecode.kernels.exact_attention import Visibility

        x = torch.zeros(1, 2, model.config.d_model)
        cos = sin = torch.zeros(1, 1, 2, model.config.head_width)
        stack(x, 0, 1, cos, sin, cache.k, cache.v, torch.zeros(1, dtype=torch.int64),
              Visibility.of_prefixes(torch.tensor([[1, 2]])), torch.tensor([1, 0]))

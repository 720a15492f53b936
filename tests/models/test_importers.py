"""Hugging Face import/export: tiny random transformers models give the same logits in warpdecode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from random_weights import perturb_parameters
from safetensors.torch import load_file, save_file

from warpdecode.errors import CheckpointError, ConfigError
from warpdecode.models.checkpoint import WEIGHTS_FILE, load_pretrained, save_pretrained
from warpdecode.models.importers.hf import config_from_hf, config_to_hf, state_dict_from_hf
from warpdecode.models.tokenizer import Tokenizer, train_bpe
from warpdecode.models.transformer import Transformer

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("single_thread")

V = 300  # the byte-level BPE below has at most this many tokens
ATOL = 1e-4
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}


def hf_config(kind: str):  # type: ignore[no-untyped-def]
    common = {"vocab_size": V, "bos_token_id": 1, "eos_token_id": 2}
    llama = {
        "hidden_size": 32,
        "intermediate_size": 56,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
    }
    if kind == "llama_untied_llama3":
        return transformers.LlamaConfig(
            **common,
            **llama,
            tie_word_embeddings=False,
            rope_theta=500000.0,
            rope_scaling=dict(LLAMA3_ROPE),  # transformers adds rope_theta to it in place
        )
    if kind == "llama_tied":
        return transformers.LlamaConfig(**common, **llama, tie_word_embeddings=True, rms_norm_eps=1e-5)
    if kind == "llama_biases_wide_heads":  # head_dim * n_head != hidden_size
        return transformers.LlamaConfig(**common, **llama, head_dim=16, attention_bias=True, mlp_bias=True)
    if kind == "qwen2":
        return transformers.Qwen2Config(
            **common, **(llama | {"num_key_value_heads": 1}), tie_word_embeddings=False, rope_theta=1e6
        )
    if kind == "qwen2_tied":
        return transformers.Qwen2Config(**common, **llama, tie_word_embeddings=True)
    if kind == "mistral":  # same layout as Llama
        return transformers.MistralConfig(**common, **llama)
    assert kind == "gpt2"
    return transformers.GPT2Config(**common, n_embd=32, n_layer=2, n_head=4, n_positions=64)


KINDS = [
    "llama_untied_llama3",
    "llama_tied",
    "llama_biases_wide_heads",
    "qwen2",
    "qwen2_tied",
    "mistral",
    "gpt2",
]


def hf_model(kind: str):  # type: ignore[no-untyped-def]
    """A random HF model in eval mode, every parameter (norm gains and biases included) perturbed."""
    config = hf_config(kind)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    return perturb_parameters(model)


def to_warpdecode(hf) -> Transformer:  # type: ignore[no-untyped-def]
    config = config_from_hf(hf.config.to_dict())
    model = Transformer(config).eval()
    model.load_state_dict(state_dict_from_hf(hf.state_dict(), config))
    return model


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    tok = train_bpe(["some text to tokenize, and a little more text"] * 10, vocab_size=V)
    assert tok.vocab_size <= V
    return tok


def random_tokens(B: int = 3, T: int = 24) -> torch.Tensor:
    return torch.randint(0, V, (B, T))


@torch.no_grad()
@pytest.mark.parametrize("kind", KINDS)
def test_logits_match_transformers(kind: str) -> None:
    hf = hf_model(kind)
    model = to_warpdecode(hf)
    tokens = random_tokens()  # T = 24 > original_max_position_embeddings: every llama3 rope regime is used
    expected = hf(tokens).logits
    assert float(expected.std()) > 0.5  # a meaningful comparison, not two near-zero tensors
    torch.testing.assert_close(model(tokens).logits, expected, atol=ATOL, rtol=0)

    config = model.config
    assert config.tie_embeddings == (kind in ("llama_tied", "qwen2_tied", "gpt2"))
    assert (model.lm_head is None) == config.tie_embeddings
    assert config.n_kv_head == (1 if kind == "qwen2" else 4 if kind == "gpt2" else 2)
    assert config.head_dim == (16 if kind == "llama_biases_wide_heads" else 8)
    assert config.rope_theta == {"llama_untied_llama3": 500000.0, "qwen2": 1e6}.get(kind, 10000.0)
    assert config.rope_scaling == (LLAMA3_ROPE if kind == "llama_untied_llama3" else None)
    assert (config.bos_token_id, config.eos_token_ids) == (1, [2])


@torch.no_grad()
@pytest.mark.parametrize("kind", KINDS)
def test_save_pretrained_round_trip(kind: str, tokenizer: Tokenizer, tmp_path: Path) -> None:
    model = to_warpdecode(hf_model(kind))
    tokens = random_tokens()
    expected = model(tokens).logits
    save_pretrained(model, tokenizer, tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "config.json",
        WEIGHTS_FILE,
        "tokenizer.json",
        "tokenizer_config.json",
    ]

    reloaded_hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt").eval()
    torch.testing.assert_close(reloaded_hf(tokens).logits, expected, atol=ATOL, rtol=0)

    reloaded, reloaded_tokenizer = load_pretrained(tmp_path / "ckpt")
    assert reloaded.config == model.config
    torch.testing.assert_close(reloaded(tokens).logits, expected, atol=ATOL, rtol=0)
    text = "some more text"
    assert reloaded_tokenizer.encode(text) == tokenizer.encode(text)
    assert reloaded_tokenizer.decode(reloaded_tokenizer.encode(text)) == text


def test_config_to_hf_round_trip() -> None:
    for kind in KINDS:
        config = config_from_hf(hf_config(kind).to_dict())
        assert config_from_hf(config_to_hf(config)) == config


@pytest.fixture
def saved(tokenizer: Tokenizer, tmp_path: Path) -> Path:
    """A valid checkpoint directory to break in the error tests."""
    model = to_warpdecode(hf_model("llama_tied"))
    save_pretrained(model, tokenizer, tmp_path / "ckpt")
    return tmp_path / "ckpt"


def test_load_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not found"):
        load_pretrained(tmp_path / "nope")


def test_load_without_config(saved: Path) -> None:
    (saved / "config.json").unlink()
    with pytest.raises(CheckpointError, match="no config.json in"):
        load_pretrained(saved)


def test_load_truncated_weights(saved: Path) -> None:
    weights = saved / WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=f"corrupt weights file .*{WEIGHTS_FILE}"):
        load_pretrained(saved)


def test_load_config_that_does_not_match_weights(saved: Path) -> None:
    config = json.loads((saved / "config.json").read_text())
    config["intermediate_size"] = 64
    (saved / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="(?s)do not match its config.json.*mlp.gate_proj.weight"):
        load_pretrained(saved)


def test_load_config_with_fewer_layers_than_weights(saved: Path) -> None:
    config = json.loads((saved / "config.json").read_text())
    config["num_hidden_layers"] = 1
    (saved / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"incomplete: missing \[\], unexpected \['blocks.1"):
        load_pretrained(saved)


def test_load_corrupt_config(saved: Path) -> None:
    (saved / "config.json").write_text('{"model_type": "llama", ')
    with pytest.raises(CheckpointError, match="corrupt .*config.json"):
        load_pretrained(saved)


def test_load_weights_missing_a_tensor(saved: Path) -> None:
    weights = load_file(saved / WEIGHTS_FILE)
    del weights["model.layers.1.post_attention_layernorm.weight"]
    save_file(weights, saved / WEIGHTS_FILE)
    with pytest.raises(CheckpointError, match=r"incomplete: missing \['blocks.1.mlp_norm.weight'\]"):
        load_pretrained(saved)


def test_load_unknown_model_type(saved: Path) -> None:
    config = json.loads((saved / "config.json").read_text())
    config["model_type"] = "bert"
    (saved / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="unsupported model_type 'bert'"):
        load_pretrained(saved)


def test_unsupported_rope_scaling_is_refused() -> None:
    hf = transformers.LlamaConfig(
        vocab_size=V,
        hidden_size=32,
        num_attention_heads=4,
        intermediate_size=8,
        rope_scaling={"rope_type": "dynamic", "factor": 2.0},
    )
    config = config_from_hf(hf.to_dict())
    with pytest.raises(ConfigError, match="unsupported rope scaling type 'dynamic'"):
        Transformer(config)


def test_config_errors_name_the_field() -> None:
    with pytest.raises(CheckpointError, match="unsupported model_type None"):
        config_from_hf({})
    with pytest.raises(CheckpointError, match="lacks field 'hidden_size'"):
        config_from_hf(
            {"model_type": "llama", "vocab_size": 8, "num_attention_heads": 4, "num_hidden_layers": 1}
        )


def test_a_cache_entry_another_process_finished_first_is_kept(tmp_path):
    """`resolve` converts into the cache with `replace=False`: when a concurrent conversion of the same
    source finished first, its directory stays (readers may have its files open); a user-named output
    is replaced."""
    from tiny_models import save_tiny_model

    from warpdecode.models.checkpoint import convert

    source = save_tiny_model(tmp_path / "source")
    entry = convert(source, tmp_path / "cache" / "model", replace=False)
    (entry / "theirs").write_text("a reader's file")
    convert(source, entry, replace=False)  # the later of two concurrent conversions
    assert (entry / "theirs").is_file() and (entry / "config.json").is_file()
    assert not list(entry.parent.glob("model.*"))  # no temporary folder left behind
    convert(source, entry)
    assert not (entry / "theirs").exists()

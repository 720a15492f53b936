"""Models with random weights at the shapes of public checkpoints: `--model random:NAME`.

A decoding step's time depends on the shapes it runs, not on the weights' values, so the speed of
plain decoding and of speculation (with the oracle verifier, `decoding/verifiers/oracle.py`, for a
chosen τ) can be measured at the shape of a model whose weights are not on the machine. The text such
a model writes is meaningless. Its tokenizer is the default model's (ids below every vocabulary here).
"""

from __future__ import annotations

import torch

from warpdecode.errors import ConfigError
from warpdecode.models.config import ModelConfig
from warpdecode.models.transformer import Transformer

PREFIX = "random:"
SHAPES: dict[str, dict[str, object]] = {
    "smollm2-135m": {"vocab_size": 49152, "n_layer": 30, "n_head": 9, "n_kv_head": 3, "d_model": 576, "d_ff": 1536},
    "smollm2-360m": {"vocab_size": 49152, "n_layer": 32, "n_head": 15, "n_kv_head": 5, "d_model": 960, "d_ff": 2560},
    "llama3.2-1b": {"vocab_size": 128256, "n_layer": 16, "n_head": 32, "n_kv_head": 8, "d_model": 2048, "d_ff": 8192},
    "smollm2-1.7b": {"vocab_size": 49152, "n_layer": 24, "n_head": 32, "n_kv_head": 32, "d_model": 2048, "d_ff": 8192},
    "qwen2.5-1.5b": {"vocab_size": 151936, "n_layer": 28, "n_head": 12, "n_kv_head": 2, "d_model": 1536, "d_ff": 8960,
                         "qkv_bias": True},
    "llama3.1-8b": {"vocab_size": 128256, "n_layer": 32, "n_head": 32, "n_kv_head": 8, "d_model": 4096, "d_ff": 14336,
                        "tie_embeddings": False},
}
"""Shapes read from each checkpoint's config.json (`n_kv_head`: num_key_value_heads)."""


def is_random(source: str | None) -> bool:
    return source is not None and source.startswith(PREFIX)


def random_config(source: str, max_seq_len: int = 4096) -> ModelConfig:
    """The architecture of the `random:NAME` model."""
    name = source.removeprefix(PREFIX)
    if name not in SHAPES:
        raise ConfigError(f"unknown random-weights shape {name!r}; choose one of: {', '.join(SHAPES)}")
    return ModelConfig(**SHAPES[name], max_seq_len=max_seq_len)  # type: ignore[arg-type]


def random_model(source: str, *, device: torch.device, dtype: torch.dtype, seed: int = 0) -> Transformer:
    """The `random:NAME` model: `SHAPES[NAME]` with seeded random weights, built on `device` in `dtype`."""
    config = random_config(source)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Transformer(config).to(dtype)
    model.init_weights(std=0.02)
    return model.eval()

"""Tiny random models and the distribution distance shared by the decoding tests."""

import torch

from warpdecode.models.config import ModelConfig
from warpdecode.models.transformer import Transformer

DRAFTER_OPTIONS = {"draft_model": {"layers": 1, "num_tokens": 3}, "layer_skip": {"num_skip": 1, "window": 4}}
"""Options the drafters need on the tiny targets (the retrieval corpus comes from the `drafter_options` fixture)."""


def random_model(*, seed: int, std: float, **config) -> Transformer:
    """A `Transformer(ModelConfig(**config))` with seeded random weights (larger std: peakier outputs)."""
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(**config))
    model.init_weights(std=std)
    return model.eval()


def greedy_target() -> Transformer:
    """The 64-token model the greedy exactness suites decode with."""
    return random_model(seed=1, std=0.3, vocab_size=64, n_layer=3, n_head=4, n_kv_head=2, d_model=32, d_ff=64,
                        max_seq_len=256)


def tiny_vocab_target() -> Transformer:
    """An 8-token model, peaked enough that sampled drafts get accepted, for distribution tests."""
    return random_model(seed=3, std=0.8, vocab_size=8, n_layer=2, n_head=2, d_model=16, d_ff=32, max_seq_len=32)


def tv(samples: list[int], probs: torch.Tensor) -> float:
    """Total variation distance between the empirical distribution of `samples` and `probs` (V,)."""
    freq = torch.bincount(torch.tensor(samples), minlength=probs.numel()).double() / len(samples)
    return 0.5 * (freq - probs.double()).abs().sum().item()

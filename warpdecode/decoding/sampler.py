"""Token selection: greedy argmax or sampling after temperature / top-k / top-p filtering.

Filters are applied once, here, to the target's logits; every decoding algorithm selects tokens
through a `Sampler` so greedy and sampled paths share one definition.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from warpdecode.errors import ConfigError


@dataclass(frozen=True)
class SamplingConfig:
    do_sample: bool = False
    """Sample from the filtered distribution; False selects the argmax (greedy)."""
    temperature: float = 1.0
    """Softmax temperature (> 0) applied before top-k / top-p when sampling."""
    top_k: int | None = None
    """Keep only the k most likely tokens (None or 0: no limit)."""
    top_p: float | None = None
    """Keep the smallest set of tokens whose probability mass reaches top_p (0 < top_p <= 1)."""
    seed: int | None = None
    """Seed of the sampling generator, for reproducible sampled outputs."""

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ConfigError(f"--temperature must be > 0 when sampling, got {self.temperature}")
        if self.top_k is not None and self.top_k < 0:
            raise ConfigError(f"--top-k must be >= 0, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ConfigError(f"--top-p must be in (0, 1], got {self.top_p}")


class Sampler:
    def __init__(self, config: SamplingConfig, device: torch.device | str = "cpu") -> None:
        self.config = config
        self.generator: torch.Generator | None = None
        if config.do_sample:
            self.generator = torch.Generator(device=device)
            if config.seed is not None:
                self.generator.manual_seed(config.seed)
            else:
                self.generator.seed()

    def probs(self, logits: Tensor) -> Tensor:
        """Filtered target distribution.

        Args:
            logits: (B, V) float.
        Returns:
            (B, V) float32 probabilities; zero outside the top-k / top-p set.
        """
        c = self.config
        logits = logits.float() / c.temperature
        if c.top_k:
            kth = torch.topk(logits, min(c.top_k, logits.shape[-1]), dim=-1).values[:, -1:]  # (B, 1)
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if c.top_p is not None and c.top_p < 1:
            sorted_probs, order = probs.sort(dim=-1, descending=True)  # (B, V)
            # Drop a token when the mass strictly before it already reaches top_p (the top token always stays).
            drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= c.top_p
            drop = drop_sorted.scatter(-1, order, drop_sorted)
            probs = probs.masked_fill(drop, 0.0)
            probs = probs / probs.sum(-1, keepdim=True)
        return probs

    def select(self, logits: Tensor) -> Tensor:
        """Next token per row, (B,) int64, from (B, V) logits."""
        if not self.config.do_sample:
            return logits.argmax(dim=-1)
        return torch.multinomial(self.probs(logits), 1, generator=self.generator)[:, 0]

"""Token selection: greedy argmax or sampling, after the configured logits processors.

Every decoding algorithm selects tokens through a `Sampler`, so greedy and sampled paths share one
definition of the target distribution. Penalties (context-dependent, see `processors`) and the
caller's logits hooks (`hooks`) are applied by the engine to the target's logits through `penalize`;
the warpers (temperature, top-k, top-p, min-p, typical-p) inside `probs` when sampling.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from warpdecode.decoding.hooks import LogitsHooks
from warpdecode.decoding.processors import (
    FrequencyPresencePenalty,
    MinP,
    Penalty,
    RepetitionPenalty,
    Temperature,
    TokenHistory,
    TopK,
    TopP,
    TypicalP,
    Warper,
)
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
    min_p: float | None = None
    """Keep tokens with at least min_p times the top token's probability (0 <= min_p <= 1)."""
    typical_p: float | None = None
    """Locally typical sampling mass (0 < typical_p <= 1)."""
    repetition_penalty: float = 1.0
    """> 1 discourages tokens already in the prompt or output (Hugging Face's rule); 1 = off."""
    frequency_penalty: float = 0.0
    """Subtracted from a generated token's logit once per occurrence (OpenAI / vLLM rule)."""
    presence_penalty: float = 0.0
    """Subtracted from the logit of every token generated at least once (OpenAI / vLLM rule)."""

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ConfigError(f"--temperature must be > 0 when sampling, got {self.temperature}")
        if self.top_k is not None and self.top_k < 0:
            raise ConfigError(f"--top-k must be >= 0, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ConfigError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.min_p is not None and not 0 <= self.min_p <= 1:
            raise ConfigError(f"--min-p must be in [0, 1], got {self.min_p}")
        if self.typical_p is not None and not 0 < self.typical_p <= 1:
            raise ConfigError(f"--typical-p must be in (0, 1], got {self.typical_p}")
        if not self.repetition_penalty > 0:
            raise ConfigError(f"--repetition-penalty must be > 0, got {self.repetition_penalty}")

    def penalties(self) -> list[Penalty]:
        out: list[Penalty] = []
        if self.repetition_penalty != 1.0:
            out.append(RepetitionPenalty(self.repetition_penalty))
        if self.frequency_penalty or self.presence_penalty:
            out.append(FrequencyPresencePenalty(self.frequency_penalty, self.presence_penalty))
        return out

    def warpers(self) -> list[Warper]:
        """Sampling filters in Hugging Face's order; none apply to greedy decoding."""
        if not self.do_sample:
            return []
        out: list[Warper] = []
        if self.temperature != 1.0:
            out.append(Temperature(self.temperature))
        if self.top_k:
            out.append(TopK(self.top_k))
        if self.top_p is not None and self.top_p < 1:
            out.append(TopP(self.top_p))
        if self.min_p:
            out.append(MinP(self.min_p))
        if self.typical_p is not None and self.typical_p < 1:
            out.append(TypicalP(self.typical_p))
        return out


class Sampler:
    def __init__(self, config: SamplingConfig, device: torch.device | str = "cpu", hooks: LogitsHooks | None = None) -> None:
        """`hooks`: the caller's logits hooks, applied with the penalties (`decoding/hooks.py`)."""
        self.config = config
        self.penalties = hooks.around(config.penalties()) if hooks is not None else config.penalties()
        self.warpers = config.warpers()
        self.generator: torch.Generator | None = None
        if config.do_sample:
            self.generator = torch.Generator(device=device)
            if config.seed is not None:
                self.generator.manual_seed(config.seed)
            else:
                self.generator.seed()

    def penalize(self, logits: Tensor, history: TokenHistory) -> Tensor:
        """Apply the context-dependent penalties and the caller's logits hooks.

        Args:
            logits: (N, V) float, row r following the context `history` gives it.
        Returns:
            (N, V) float32 logits (the input itself when no penalty is configured).
        """
        for penalty in self.penalties:
            logits = penalty(logits.float(), history)
        return logits

    def probs(self, logits: Tensor) -> Tensor:
        """Filtered distribution the sampled token comes from.

        Args:
            logits: (B, V) float, already penalised.
        Returns:
            (B, V) float32 probabilities; zero where a warper filtered the token out.
        """
        logits = logits.float()
        for warp in self.warpers:
            logits = warp(logits)
        return torch.softmax(logits, dim=-1)

    def select(self, logits: Tensor) -> Tensor:
        """Next token per row, (B,) int64, from (B, V) penalised logits."""
        if not self.config.do_sample:
            return logits.argmax(dim=-1)
        return torch.multinomial(self.probs(logits), 1, generator=self.generator)[:, 0]

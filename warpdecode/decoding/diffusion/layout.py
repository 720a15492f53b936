"""The sequence a diffusion LM decodes into, and what a decode returns (shared by every decoder)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone


@dataclass
class DiffusionStats:
    steps: list[int] = field(default_factory=list)
    """Forwards each row took part in before its answer was complete."""
    forwards: int = 0
    """Forwards of the batch (the largest row's steps)."""
    committed_per_step: list[list[int]] = field(default_factory=list)
    """Per forward: tokens committed in each row (end-of-text filled by EoTP included)."""
    seconds: float = 0.0


@dataclass
class DiffusionOutput:
    answers: list[list[int]]
    """Each row's answer ids up to (not including) its first end-of-text."""
    sequences: Tensor
    """(B, L) the final sequences: prompt, answer region, end-of-text padding."""
    stats: DiffusionStats
    confidence: Tensor | None = None
    """(B, L) fp32 probability each answer position's token had when it was committed (1 for
    positions end-of-text stopping filled, 0 outside the answer); None where a decoder does not keep it."""


def check_diffusion_model(model: Backbone) -> int:
    """The model's mask token id; a ConfigError for a causal model or one without a mask token."""
    if model.config.causal:
        raise ConfigError("this model is autoregressive (causal); diffusion decoding needs a masked diffusion LM")
    if model.config.mask_token_id is None:
        raise ConfigError("this diffusion LM's config names no mask_token_id")
    return model.config.mask_token_id


def token_probs(logits: Tensor, mask_token_id: int) -> Tensor:
    """(..., V) logits → fp32 probabilities with the mask token excluded: a committed position never
    becomes a mask again (the model may still give the mask token mass, it is never a training target)."""
    return logits.float().index_fill(-1, torch.tensor([mask_token_id], device=logits.device), -torch.inf).softmax(-1)


def layout(prompts: list[list[int]], gen_length: int, mask_token_id: int, pad_token_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """Right-padded rows `prompt + [mask] * gen_length`.

    Returns:
        tokens (B, L) int64, answer (B, L) bool (the answer region), attention (B, L, L) bool (every
        position sees every real position; a padding position is seen only by itself).
    """
    if not prompts or any(not p for p in prompts):
        raise ConfigError("every prompt needs at least one token")
    lengths = torch.tensor([len(p) for p in prompts])
    L = int(lengths.max()) + gen_length
    tokens = torch.full((len(prompts), L), pad_token_id, dtype=torch.int64)
    for row, prompt in enumerate(prompts):
        tokens[row, : len(prompt)] = torch.tensor(prompt)
    answer, attention = answer_region(lengths, lengths + gen_length, L)
    tokens[answer] = mask_token_id
    return tokens, answer, attention


def answer_region(prompt_lengths: Tensor, lengths: Tensor, L: int) -> tuple[Tensor, Tensor]:
    """Rows of `lengths` real tokens (B,), the answer after `prompt_lengths` (B,), padded to L.

    Returns:
        answer (B, L) bool (positions [prompt length, length)), attention (B, L, L) bool (every
        position sees every real position; a padding position is seen only by itself).
    """
    index = torch.arange(L, device=lengths.device)[None, :]
    answer = (index >= prompt_lengths[:, None]) & (index < lengths[:, None])
    real = index < lengths[:, None]
    attention = real[:, None, :] | torch.eye(L, dtype=torch.bool, device=lengths.device)[None]
    return answer, attention


def answer_blocks(answer: Tensor, block_length: int, fill: int) -> Tensor:
    """(B, L) bool answer region → (B, L) int64 block index of every answer position, `fill` elsewhere."""
    relative = torch.arange(answer.shape[-1], device=answer.device) - answer.long().argmax(-1, keepdim=True)
    return torch.where(answer, relative // block_length, fill)

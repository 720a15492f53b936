"""Block-wise semi-autoregressive decoding of a masked diffusion LM (LLaDA / Fast-dLLM's loop).

The answer region (`gen_length` positions after the prompt) starts fully masked and is decoded in
blocks of `block_length` from left to right: each step runs the model over the whole sequence
(bidirectional attention), and the commit policy makes some masked positions of the current block
final. A row moves to its next block when its current one is complete; a batch decodes its rows
in lockstep, and a finished row commits nothing more.

End-of-text prediction (EoTP, `eot_stop=True`): once a committed answer token is end-of-text,
every masked position after it becomes end-of-text without further steps (the answer is over).

Steps are forwards (NFEs); the prompt is part of every forward (no KV reuse here).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from warpdecode.decoding.diffusion.protocols import CommitPolicy, StepView
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


def check_diffusion_model(model: Backbone) -> int:
    """The model's mask token id; a ConfigError for a causal model or one without a mask token."""
    if model.config.causal:
        raise ConfigError("this model is autoregressive (causal); diffusion decoding needs a masked diffusion LM")
    if model.config.mask_token_id is None:
        raise ConfigError("this diffusion LM's config names no mask_token_id")
    return model.config.mask_token_id


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
    index = torch.arange(L)[None, :]  # (1, L)
    tokens = torch.full((len(prompts), L), pad_token_id, dtype=torch.int64)
    for row, prompt in enumerate(prompts):
        tokens[row, : len(prompt)] = torch.tensor(prompt)
    answer = (index >= lengths[:, None]) & (index < lengths[:, None] + gen_length)  # (B, L)
    tokens[answer] = mask_token_id
    real = index < lengths[:, None] + gen_length  # (B, L)
    attention = real[:, None, :] | torch.eye(L, dtype=torch.bool)[None]  # (B, L, L)
    return tokens, answer, attention


def end_of_text_fill(tokens: Tensor, masked: Tensor, answer: Tensor, eos_token_id: int) -> Tensor:
    """(B, L) bool: masked positions after the first committed end-of-text of their row's answer."""
    committed_eos = answer & ~masked & (tokens == eos_token_id)  # (B, L)
    seen = committed_eos.long().cumsum(1) > 0
    return masked & seen


@torch.inference_mode()
def diffusion_generate(
    model: Backbone,
    prompts: list[list[int]],
    policy: CommitPolicy,
    *,
    gen_length: int,
    block_length: int,
    eos_token_id: int,
    eot_stop: bool = False,
) -> DiffusionOutput:
    """Decode the answers of `prompts` (token ids, no padding) greedily under `policy`."""
    mask_token_id = check_diffusion_model(model)
    if gen_length < 1 or block_length < 1:
        raise ConfigError(f"gen_length and block_length must be positive, got {gen_length}, {block_length}")
    longest = max(len(p) for p in prompts) + gen_length
    if longest > model.config.max_seq_len:
        raise ConfigError(f"prompt + gen_length = {longest} tokens exceeds the model's context of "
                          f"{model.config.max_seq_len}")
    device = model.embed.weight.device
    start = time.perf_counter()
    tokens, answer, attention = (t.to(device) for t in layout(prompts, gen_length, mask_token_id, eos_token_id))
    B, L = tokens.shape
    relative = torch.arange(L, device=device)[None, :] - (answer.long().argmax(1))[:, None]  # (B, L)
    block = torch.where(answer, relative // block_length, L)  # (B, L) block index of answer positions
    masked = answer.clone()
    stats = DiffusionStats(steps=[0] * B)
    policy.prepare(model)
    policy.reset(B, L)
    while masked.any():
        logits = model(tokens, attention_mask=attention).logits.float()  # (B, L, V)
        confidence, predicted = logits.softmax(-1).max(-1)
        current = torch.where(masked, block, L).amin(1, keepdim=True)  # (B, 1)
        in_block = block == current
        active = masked & in_block
        commit = policy.select(StepView(logits, predicted, confidence, active, masked, in_block, answer, stats.forwards))
        positions = commit.positions & masked
        if (active.any(1) & ~positions.any(1)).any():
            raise RuntimeError(f"commit policy {type(policy).__name__} made no progress on a row")
        running = masked.any(1)
        tokens = torch.where(positions, commit.tokens, tokens)
        masked = masked & ~positions
        if eot_stop:
            filled = end_of_text_fill(tokens, masked, answer, eos_token_id)
            tokens = tokens.masked_fill(filled, eos_token_id)
            positions = positions | filled
            masked = masked & ~filled
        stats.forwards += 1
        stats.steps = [s + int(r) for s, r in zip(stats.steps, running.tolist())]
        stats.committed_per_step.append(positions.sum(1).tolist())
    stats.seconds = time.perf_counter() - start
    answers = []
    for row in range(B):
        ids = tokens[row][answer[row]].tolist()
        answers.append(ids[: ids.index(eos_token_id)] if eos_token_id in ids else ids)
    return DiffusionOutput(answers, tokens.cpu(), stats)

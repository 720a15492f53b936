"""Block-wise semi-autoregressive decoding of a masked diffusion LM (LLaDA / Fast-dLLM's loop).

The answer region (`gen_length` positions after the prompt) starts fully masked and is decoded in
blocks of `block_length` from left to right: each step runs the model over the whole sequence
(bidirectional attention), and the commit policy makes some masked positions of the current block
final. A row moves to its next block when its current one is complete; a batch decodes its rows
in lockstep, and a finished row commits nothing more.

End-of-text prediction (EoTP, `eot_stop=True`): once a committed answer token is end-of-text,
every masked position after it becomes end-of-text without further steps (the answer is over).

Steps are forwards (NFEs). Without KV reuse (`kv_cache="none"`) every forward runs the whole
sequence; `prefix` and `dual` reuse keys/values within a block (approximate, see `kv_reuse.py`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor

from warpdecode.decoding.diffusion.kv_reuse import BlockKVReuse, check_kv_reuse
from warpdecode.decoding.diffusion.layout import (
    DiffusionOutput,
    DiffusionStats,
    answer_blocks,
    check_diffusion_model,
    layout,
    token_probs,
)
from warpdecode.decoding.diffusion.protocols import CommitPolicy, LoopDecoder, StepView
from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.models.backbone import Backbone

if TYPE_CHECKING:
    from warpdecode.decoding.constraints.protocol import Constraint

DECODER_DEFAULTS: dict[str, Any] = {"block_length": 8, "eot_stop": False, "kv_cache": "none"}
"""The options of `diffusion_generate` a method spec may set beside its commit policy's own."""


def split_decoder_options(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A method spec's options → (decoder options with their defaults, the commit policy's options)."""
    decoder = DECODER_DEFAULTS | {k: v for k, v in options.items() if k in DECODER_DEFAULTS}
    return decoder, {k: v for k, v in options.items() if k not in DECODER_DEFAULTS}


def exact_decoder(decoder: dict[str, Any]) -> bool:
    """Whether these decoder options keep a lossless policy lossless (no EoTP, no approximate cache)."""
    return not decoder["eot_stop"] and decoder["kv_cache"] == "none"


def sample_candidates(logits: Tensor, mask_token_id: int, temperature: float,
                      generator: torch.Generator | None) -> Tensor:
    """(B, L, V) logits → (B, L) one draw per position from softmax(logits / temperature), never the
    mask token (Gumbel-max: argmax of logits / temperature + Gumbel noise)."""
    scaled = logits.float().index_fill(-1, torch.tensor([mask_token_id], device=logits.device), -torch.inf) / temperature
    uniform = torch.rand(scaled.shape, generator=generator, device=scaled.device).clamp_min(1e-20)
    return (scaled - torch.log(-torch.log(uniform))).argmax(-1)


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
    kv_cache: str = "none",
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    constraints: Sequence[Constraint | None] | None = None,
) -> DiffusionOutput:
    """Decode the answers of `prompts` (token ids, no padding) under `policy`.

    `kv_cache`: `none` (every step runs the whole sequence), `prefix` or `dual` (Fast-dLLM's
    approximate reuse of the keys/values outside the current block, see `kv_reuse.py`).
    `temperature`: 0 predicts each position's most likely token; above 0 each step draws every
    masked position's candidate from softmax(logits / temperature) (LLaDA's Gumbel sampling, with
    `generator`), and the policies rank candidates by their untempered probability.
    `constraints`: one grammar state per prompt (None: a free row) whose stop tokens are `eos_token_id`;
    a commit is kept only while the row's answer stays completable (`constrained.py`).
    """
    mask_token_id = check_diffusion_model(model)
    check_kv_reuse(kv_cache)
    if temperature < 0:
        raise ConfigError(f"temperature must be >= 0, got {temperature}")
    if gen_length < 1 or block_length < 1:
        raise ConfigError(f"gen_length and block_length must be positive, got {gen_length}, {block_length}")
    longest = max(map(len, prompts), default=0) + gen_length
    if longest > model.config.max_seq_len:
        raise ConfigError(f"prompt + gen_length = {longest} tokens exceeds the model's context of "
                          f"{model.config.max_seq_len}")
    guard = None
    if constraints is not None and any(c is not None for c in constraints):
        from warpdecode.decoding.diffusion.constrained import GrammarCommits

        if len(constraints) != len(prompts):
            raise ConfigError(f"got {len(constraints)} constraints for {len(prompts)} prompts")
        if policy.replaces_loop:
            name = getattr(policy, "name", type(policy).__name__)  # the registered name
            raise CapabilityError(f"commit policy {name!r} runs its own loop: it takes no constraint")
        guard = GrammarCommits(constraints, eos_token_id=eos_token_id, mask_token_id=mask_token_id,
                               temperature=temperature, generator=generator)
    if policy.replaces_loop:
        decoder = cast(LoopDecoder, policy)
        decoder.prepare(model)
        return decoder.decode(model, prompts, gen_length=gen_length, block_length=block_length,
                             eos_token_id=eos_token_id, eot_stop=eot_stop, kv_cache=kv_cache, temperature=temperature)
    device = model.embed.weight.device
    start = time.perf_counter()
    tokens, answer, attention = (t.to(device) for t in layout(prompts, gen_length, mask_token_id, eos_token_id))
    B, L = tokens.shape
    block = answer_blocks(answer, block_length, L)  # (B, L)
    masked = answer.clone()
    committed_confidence = torch.zeros(B, L, device=device)  # (B, L)
    stats = DiffusionStats(steps=[0] * B)
    policy.prepare(model)
    policy.reset(B, L)
    reuse = BlockKVReuse(model, kv_cache, answer, attention) if kv_cache != "none" else None
    while masked.any():
        current = torch.where(masked, block, L).amin(1, keepdim=True)  # (B, 1)
        if reuse is None:
            logits = model(tokens, attention_mask=attention).logits  # (B, L, V)
        else:
            logits = reuse(tokens, block, current)
        probs = token_probs(logits, mask_token_id)  # (B, L, V)
        if temperature > 0:
            predicted = sample_candidates(logits, mask_token_id, temperature, generator)
            confidence = probs.gather(-1, predicted[..., None])[..., 0]
        else:
            confidence, predicted = probs.max(-1)
        in_block = block == current
        active = masked & in_block
        commit = policy.select(StepView(logits, predicted, confidence, active, masked, in_block, answer, stats.forwards))
        if guard is not None:
            commit = guard.keep(commit, tokens, masked, answer, logits)
        positions = commit.positions & masked
        if (active.any(1) & ~positions.any(1)).any():
            raise RuntimeError(f"commit policy {type(policy).__name__} made no progress on a row")
        running = masked.any(1)
        tokens = torch.where(positions, commit.tokens, tokens)
        chosen = probs.gather(-1, tokens[..., None])[..., 0]  # (B, L)
        committed_confidence = torch.where(positions, chosen, committed_confidence)
        masked = masked & ~positions
        if eot_stop:
            filled = end_of_text_fill(tokens, masked, answer, eos_token_id)
            tokens = tokens.masked_fill(filled, eos_token_id)
            committed_confidence = committed_confidence.masked_fill(filled, 1.0)
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
    return DiffusionOutput(answers, tokens.cpu(), stats, committed_confidence.cpu())

"""Free Draft-and-Verification (FreeDave): fewer forwards, the same output as one-token-per-step decoding.

One-token-per-step (static) decoding commits, at each state, the most confident masked position of
the current block. From one forward, FreeDave drafts the next `draft_length` static commits as if
the predictions would not change (the first is exactly the static choice), then runs every drafted
state in one batched forward: the state after j drafts tells what static decoding would commit next,
so draft j + 1 is accepted while it matches. The last accepted state's forward is already computed
and drafts the next round, so every forward commits at least one token and the output is the static
decoder's, token for token. A forward now carries up to `draft_length` rows: fewer sequential steps
at more compute per step (nearly free on a GPU, not on a CPU).
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from warpdecode.decoding.diffusion.layout import (
    DiffusionOutput,
    DiffusionStats,
    answer_blocks,
    check_diffusion_model,
    layout,
    token_probs,
)
from warpdecode.decoding.diffusion.protocols import Commit, StatelessPolicy, StepView
from warpdecode.decoding.diffusion.selection import top_k_active
from warpdecode.decoding.registry import register
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone


def static_choice(confidence: Tensor, masked: Tensor, block: Tensor) -> int | None:
    """The position static decoding commits: (L,) confidence / masked / block index → an index, or None
    when nothing is masked (ties go to the lowest position, as in `top_k_active`)."""
    if not masked.any():
        return None
    active = masked & (block == block[masked].min())
    return int(top_k_active(confidence[None], active[None], 1)[0].nonzero()[0, 0])


@register("commit_policy", "free_draft")
class FreeDraftVerify(StatelessPolicy):
    """FreeDave: decodes the whole generation itself (`replaces_loop`); `select` is the static rule it
    reproduces, used where a per-step choice is asked for."""

    lossless = True
    replaces_loop = True

    def __init__(self, draft_length: int = 4) -> None:
        if draft_length < 2:
            raise ConfigError(f"draft_length must be >= 2 (1 is static decoding), got {draft_length}")
        self.draft_length = draft_length

    def select(self, view: StepView) -> Commit:
        return Commit(top_k_active(view.confidence, view.active, 1), view.tokens)

    def decode(self, model: Backbone, prompts: list[list[int]], *, gen_length: int, block_length: int,
               eos_token_id: int, eot_stop: bool, kv_cache: str, temperature: float) -> DiffusionOutput:
        if len(prompts) != 1 or eot_stop or kv_cache != "none" or temperature > 0:
            raise ConfigError("free_draft decodes one prompt at a time, greedily, without eot_stop or kv_cache "
                              "(it reproduces `fixed` exactly)")
        if not prompts[0]:
            raise ConfigError("every prompt needs at least one token")
        return free_draft_generate(model, prompts[0], gen_length=gen_length, block_length=block_length,
                                   eos_token_id=eos_token_id, draft_length=self.draft_length)


@torch.inference_mode()
def free_draft_generate(model: Backbone, prompt: list[int], *, gen_length: int, block_length: int, eos_token_id: int,
                        draft_length: int = 4) -> DiffusionOutput:
    """Decode one prompt's answer exactly as `fixed` (one token per step, no end-of-text stop) would."""
    mask_token_id = check_diffusion_model(model)
    device = model.embed.weight.device
    start = time.perf_counter()
    tokens, answer, attention = (t.to(device) for t in layout([prompt], gen_length, mask_token_id, eos_token_id))
    tokens, answer = tokens[0], answer[0]  # (L,)
    L = tokens.shape[0]
    block = answer_blocks(answer, block_length, L)  # (L,)
    stats = DiffusionStats(steps=[0])

    def forward(states: Tensor) -> tuple[Tensor, Tensor]:
        """(N, L) states → (N, L) confidence and top-1 tokens, one batched forward."""
        stats.forwards += 1
        logits = model(states, attention_mask=attention.expand(len(states), -1, -1)).logits
        return token_probs(logits, mask_token_id).max(-1)

    masked = answer.clone()
    confidence, predicted = (t[0] for t in forward(tokens[None]))
    while masked.any():
        # Draft: the next static commits if the predictions stayed as they are.
        drafts: list[int] = []
        draft_masked = masked.clone()
        while len(drafts) < draft_length and (p := static_choice(confidence, draft_masked, block)) is not None:
            drafts.append(p)
            draft_masked[p] = False
        states, state_masks = tokens.repeat(len(drafts), 1), masked.repeat(len(drafts), 1)  # (m, L): j + 1 drafts
        for j, p in enumerate(drafts):
            states[j:, p] = predicted[p]
            state_masks[j:, p] = False
        # Verify: one batched forward of every drafted state that still has something to decode.
        incomplete = [j for j in range(len(drafts)) if state_masks[j].any()]
        outputs = forward(states[incomplete]) if incomplete else None
        accepted = 1
        while accepted < len(drafts):
            assert outputs is not None
            row = incomplete.index(accepted - 1)
            choice = static_choice(outputs[0][row], state_masks[accepted - 1], block)
            p = drafts[accepted]
            if choice != p or int(outputs[1][row, p]) != int(predicted[p]):
                break
            accepted += 1
        stats.committed_per_step.append([accepted])
        tokens, masked = states[accepted - 1], state_masks[accepted - 1]
        if masked.any():
            assert outputs is not None
            row = incomplete.index(accepted - 1)
            confidence, predicted = outputs[0][row], outputs[1][row]
    stats.steps = [stats.forwards]
    stats.seconds = time.perf_counter() - start
    ids = tokens[answer].tolist()
    return DiffusionOutput([ids[: ids.index(eos_token_id)] if eos_token_id in ids else ids], tokens[None].cpu(), stats)

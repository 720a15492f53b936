"""The forward (masking) process and LLaDA's bound on an answer's negative log-likelihood.

Per row a masking ratio t ~ U(eps, 1) is drawn and every answer token is replaced by the mask token
with probability t; the model predicts the masked tokens. In expectation over t and the masks,

    Σ_{masked i} CE_i / t  /  answer length

bounds the answer's per-token negative log-likelihood from above (LLaDA's supervised objective):
training minimises it, and exp of its average over held-out answers is a perplexity bound, the
diffusion LM's counterpart of an autoregressive model's held-out perplexity.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from warpdecode.decoding.diffusion.layout import answer_region
from warpdecode.models.backbone import Backbone


def mask_answer(tokens: Tensor, answer: Tensor, mask_token_id: int, min_ratio: float,
                generator: torch.Generator | None = None, stratified: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """Forward process: (noisy tokens (B, L), masked (B, L) bool, ratio t (B,)) for a batch.

    `stratified` draws the B ratios low-discrepancy, one per stratum: t_b = (u + b) / B for one shared
    uniform u (MDLM's variance reduction; each t is still uniform, so the loss stays unbiased).
    """
    B, L = tokens.shape
    u = torch.rand(1 if stratified else B, generator=generator, device=tokens.device)
    if stratified:
        u = (u + torch.arange(B, device=tokens.device)) / B
    t = min_ratio + (1 - min_ratio) * u
    masked = answer & (torch.rand(B, L, generator=generator, device=tokens.device) < t[:, None])
    return tokens.masked_fill(masked, mask_token_id), masked, t


def answer_nll_bound(model: Backbone, tokens: Tensor, prompt_lengths: Tensor, lengths: Tensor, mask_token_id: int,
                     min_ratio: float = 1e-3, generator: torch.Generator | None = None,
                     stratified: bool = False) -> Tensor:
    """(B,) one draw of the bound on each row's per-token answer NLL, in fp32.

    Args:
        tokens: (B, L) prompt then answer, right-padded; prompt_lengths, lengths: (B,) where each
            row's answer starts and ends.
    """
    answer, attention = answer_region(prompt_lengths, lengths, tokens.shape[1])
    noisy, masked, t = mask_answer(tokens, answer, mask_token_id, min_ratio, generator, stratified)
    logits = model(noisy, attention_mask=attention).logits  # (B, L, V)
    with torch.autocast(device_type=logits.device.type, enabled=False):
        ce = F.cross_entropy(logits.float().transpose(1, 2), tokens, reduction="none")  # (B, L)
    return (ce * masked).sum(1) / t / answer.sum(1).clamp(min=1)

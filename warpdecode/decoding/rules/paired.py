"""Decoding after two prompts at once, for the rules that contrast them (context-aware decoding,
USCD): one sequence whose next token is chosen from the logits after the request's prompt and after
a second, contrast prompt, each continued by the same generated tokens.

The two prompts are the two rows of one KV cache with ragged lengths (`KVCache` keeps a length per
row, and a forward writes each row at its own offset). Each prompt is prefilled on its own row (two
forwards without padding: a context-free row is often a tenth of its contextual one), and then every
step is ONE forward of two rows, the chosen token appended to both.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import Tensor

from warpdecode.decoding.outputs import DecodeStats
from warpdecode.decoding.processors import TokenHistory
from warpdecode.decoding.rules.protocols import Decoded, Emitter
from warpdecode.decoding.sampler import Sampler
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone

Combine = Callable[[Tensor], Tensor]
"""(2, V) float32 logits after the prompt (row 0) and after the contrast prompt (row 1) → the (1, V)
float32 scores the token is chosen from (-inf: never chosen)."""


@torch.inference_mode()
def decode_paired(target: Backbone, prompt_ids: list[int], contrast_ids: list[int], sampler: Sampler, emit: Emitter,
                  combine: Combine) -> Decoded:
    """Decode after `prompt_ids` with each step's scores `combine`d from both rows' logits; the sampler's
    penalties and the caller's hooks (with the request's own context) then its filters apply to them."""
    device = target.embed.weight.device
    target.pack_for_cpu_inference()
    longest = max(len(prompt_ids), len(contrast_ids))
    if longest + emit.max_new_tokens > target.config.max_seq_len:
        raise ConfigError(f"the contrast prompt has {len(contrast_ids)} tokens: with {emit.max_new_tokens} new "
                          f"tokens it exceeds the model's context of {target.config.max_seq_len}")
    cache = target.new_cache(2, longest + emit.max_new_tokens)
    stats = DecodeStats(prompt_tokens=len(prompt_ids))
    start = time.perf_counter()
    last = []
    for row, ids in enumerate((prompt_ids, contrast_ids)):
        view = cache.rows(row, row + 1)
        last.append(target(torch.tensor([ids], device=device), cache=view, logits_slice=slice(-1, None)).logits[:, -1])
        cache.set_rows(row, view)
    logits = torch.cat(last)  # (2, V)
    tokens = list(prompt_ids)
    while True:
        scores = sampler.penalize(combine(logits.float()), TokenHistory.single(tokens, len(prompt_ids)))
        token = int(sampler.select(scores)[0])
        tokens.append(token)
        if not stats.time_to_first_token:
            stats.time_to_first_token = time.perf_counter() - start
        if not emit.push(token):
            break
        logits = target(torch.tensor([[token], [token]], device=device), cache=cache).logits[:, -1]  # (2, V)
        stats.target_forwards += 1  # one forward of both rows
        stats.accepted_per_step.append(0)
        stats.proposed_per_step.append(0)
    return emit.decoded(stats, start)

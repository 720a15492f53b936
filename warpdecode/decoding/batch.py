"""Plain (one token per step) decoding of several prompts at once.

Prompts of different lengths are right-padded for one prefill forward: with a causal mask a real
token never sees the padding after it, and each row's cache is then cut back to its real length
(the padded slots are overwritten by the row's next tokens). Every step then appends one token per
row at the row's own offset (`KVCache` keeps per-row lengths). A finished row (stop token or its
token budget) leaves the batch, so the remaining rows stop paying for it.

With `hidden_layer` set, the hidden states of that layer are kept for every position a row ran
through the target: its prompt (from the prefill) and each new token but the last (from the step
that read it). Example: prompt [a b c], new tokens [d e] → 4 states, after a, b, c and d; the one after
c chose d and the one after d chose e. These are the states of one teacher-forced forward over
[a b c d e] without its last position (training features for drafters, see `datamodules/self_distill.py`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import overload

import torch

from warpdecode.decoding.outputs import DecodeStats, FinishReason
from warpdecode.decoding.processors import TokenHistory
from warpdecode.decoding.sampler import Sampler
from warpdecode.models.backbone import Backbone
from warpdecode.models.cache import KVCache


@dataclass
class _Row:
    prompt: list[int]
    budget: int
    new: list[int] = field(default_factory=list)
    finish: FinishReason | None = None
    stats: DecodeStats = field(default_factory=DecodeStats)
    hidden: list[torch.Tensor] = field(default_factory=list)  # (T_prompt, C) then (1, C) per step

    def push(self, token: int, stop_ids: set[int], elapsed: float) -> None:
        self.new.append(token)
        if token in stop_ids:
            self.finish = "eos"
        elif len(self.new) >= self.budget:
            self.finish = "length"
        if self.finish is not None:
            self.stats.seconds = elapsed
            self.stats.target_seconds = elapsed - self.stats.time_to_first_token
            self.stats.new_tokens = len(self.new)


def _select(sampler: Sampler, logits: torch.Tensor, rows: list[_Row]) -> list[int]:
    """Next token of each active row from its (V,) logits row, penalised with the row's own context."""
    if sampler.penalties:
        logits = torch.cat([
            sampler.penalize(logits[i : i + 1], TokenHistory.single(row.prompt + row.new, len(row.prompt)))
            for i, row in enumerate(rows)
        ])
    return sampler.select(logits).tolist()


Result = tuple[list[int], FinishReason, DecodeStats]
"""(new tokens, finish reason, stats) of one prompt."""
ResultWithHidden = tuple[list[int], FinishReason, DecodeStats, torch.Tensor]
"""A `Result` plus the (T_prompt + T_new - 1, C) hidden states of the requested layer."""


@overload
def decode_batch(target: Backbone, prompts: list[list[int]], sampler: Sampler, *, budgets: list[int],
                 stop_ids: set[int], hidden_layer: None = None) -> list[Result]: ...


@overload
def decode_batch(target: Backbone, prompts: list[list[int]], sampler: Sampler, *, budgets: list[int],
                 stop_ids: set[int], hidden_layer: int) -> list[ResultWithHidden]: ...


@torch.inference_mode()
def decode_batch(
    target: Backbone,
    prompts: list[list[int]],
    sampler: Sampler,
    *,
    budgets: list[int],
    stop_ids: set[int],
    hidden_layer: int | None = None,
) -> list[Result] | list[ResultWithHidden]:
    """Decode every prompt with plain decoding; `budgets[i]` new tokens at most for prompt i (each
    prompt plus its budget must fit the context). Returns (new tokens, finish reason, stats) per prompt;
    a row's `seconds` runs from the batch's start to the row's last token.

    With `hidden_layer` (0..L, see `BackboneOutput`), each result also holds the
    (T_prompt + T_new - 1, C) hidden states of that layer at the positions the row ran through the
    target (see the module docstring). Without it, no hidden state beyond what decoding needs is kept.
    """
    device = target.embed.weight.device
    target.pack_for_cpu_inference()
    rows = [_Row(p, b, stats=DecodeStats(prompt_tokens=len(p))) for p, b in zip(prompts, budgets, strict=True)]
    lengths = [len(p) for p in prompts]
    width = max(lengths)
    max_len = max(n + b for n, b in zip(lengths, budgets, strict=True))
    cache = KVCache.for_model(target.config, len(rows), max(max_len, width), dtype=target.embed.weight.dtype,
                              device=device)
    start = time.perf_counter()
    padded = torch.tensor([p + [0] * (width - len(p)) for p in prompts], device=device)  # (B, T) right-padded
    layers = (target.config.n_layer,) if hidden_layer is None else (target.config.n_layer, hidden_layer)
    out = target(padded, cache=cache, hidden_layers=layers, logits_slice=slice(0, 0))
    last = out.hidden_states[target.config.n_layer][torch.arange(len(rows)), torch.tensor(lengths) - 1]  # (B, C)
    if hidden_layer is not None:
        for row, states, n in zip(rows, out.hidden_states[hidden_layer], lengths, strict=True):
            row.hidden.append(states[:n])  # (T_prompt, C)
    cache.truncate(lengths)
    first = _select(sampler, target.head(last), rows)
    elapsed = time.perf_counter() - start
    for row, token in zip(rows, first, strict=True):
        row.stats.time_to_first_token = elapsed
        row.push(token, stop_ids, elapsed)

    active = [i for i, row in enumerate(rows) if row.finish is None]
    if len(active) < len(rows) and active:
        cache.keep_rows(active)
    while active:
        pending = torch.tensor([[rows[i].new[-1]] for i in active], device=device)  # (B_active, 1)
        step = target(pending, cache=cache, hidden_layers=() if hidden_layer is None else (hidden_layer,))
        logits = step.logits[:, -1]  # (B_active, V)
        if hidden_layer is not None:
            for i, states in zip(active, step.hidden_states[hidden_layer].unbind(0), strict=True):
                rows[i].hidden.append(states)  # (1, C)
        chosen = _select(sampler, logits, [rows[i] for i in active])
        elapsed = time.perf_counter() - start
        for i, token in zip(active, chosen, strict=True):
            rows[i].stats.target_forwards += 1
            rows[i].stats.accepted_per_step.append(0)
            rows[i].stats.proposed_per_step.append(0)
            rows[i].push(token, stop_ids, elapsed)
        still = [j for j, i in enumerate(active) if rows[i].finish is None]
        if len(still) < len(active) and still:
            cache.keep_rows(still)
        active = [active[j] for j in still]
    if hidden_layer is None:
        return [(row.new, row.finish or "length", row.stats) for row in rows]
    return [(row.new, row.finish or "length", row.stats, torch.cat(row.hidden)) for row in rows]

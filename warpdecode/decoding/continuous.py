"""Continuous (iteration-level) batching of plain decoding: rows join and leave between steps.

A `ContinuousBatch` owns a pool of `max_rows` KV-cache rows. `add` prefills a new request alone in
the first free row and picks its first token; `step` runs one forward of one token per row over
all the rows at once and picks each row's next token with the row's own sampler (its temperature,
filters, penalties and random generator); `remove` frees a finished or cancelled row, moving the
last row into its place so the rows in use stay `0 .. len(rows) - 1` (a forward reads a view of
exactly those rows, never padding).

Every forward runs batch-invariantly (`kernels/invariance.py`): a row's tokens at temperature 0
are the same whatever other rows share its steps, and whenever they joined or left. A sampled
row draws from its own generator, so with a seed it gives the same tokens at any batch size.

Example: rows A, B, C decode together; B finishes and is removed, C moves into B's cache row; D
is added in the third row and takes part from the next step on.

The pool is allocated unwritten: memory is taken as rows fill (a forward writes a slot before any
row reads it: a row's prefill attends over its own new keys, a step's attention over exactly the
row's own positions), so `max_rows` rows of `max_len` positions cost what the requests use.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from warpdecode.decoding.outputs import DecodeStats, FinishReason
from warpdecode.decoding.processors import TokenHistory
from warpdecode.decoding.sampler import Sampler
from warpdecode.errors import ConfigError
from warpdecode.kernels.invariance import batch_invariant
from warpdecode.models.backbone import Backbone
from warpdecode.models.cache import KVCache


@dataclass(eq=False)
class Row:
    """One request of a `ContinuousBatch`: its prompt, its new tokens so far and how it ended."""

    prompt: list[int]
    budget: int
    """New tokens at most."""
    sampler: Sampler
    new: list[int] = field(default_factory=list)
    finish: FinishReason | None = None
    """Set once the row is done: `eos` (a stop token, the last of `new`) or `length` (its budget)."""
    stats: DecodeStats = field(default_factory=DecodeStats)
    prompt_len: int = -1
    """Tokens of `prompt` that are the request's prompt; any after them were generated before the row
    joined (a request that decoded alone first), and count as generated for the penalties."""
    started: float = field(default_factory=time.perf_counter)

    def _push(self, token: int, stop_ids: set[int]) -> None:
        self.new.append(token)
        self.stats.target_forwards += 1
        if token in stop_ids:
            self.finish = "eos"
        elif len(self.new) >= self.budget:
            self.finish = "length"
        if self.finish is not None:
            self.stats.new_tokens = len(self.new)
            self.stats.seconds = time.perf_counter() - self.started


class ContinuousBatch:
    """Plain decoding of up to `max_rows` requests of up to `max_len` tokens each (prompt + new)."""

    def __init__(self, target: Backbone, *, max_rows: int, max_len: int, stop_ids: set[int]) -> None:
        if max_rows < 1:
            raise ConfigError(f"a batch needs at least one row, got max_rows={max_rows}")
        target.pack_for_cpu_inference()
        self.target = target
        self.stop_ids = stop_ids
        self.max_len = max_len
        self.cache = KVCache.for_model(target.config, max_rows, max_len, dtype=target.embed.weight.dtype,
                                       device=target.embed.weight.device, zeroed=False)
        self.rows: list[Row] = []
        """The rows being decoded; row i lives in cache row i."""

    @property
    def max_rows(self) -> int:
        return self.cache.batch

    @property
    def free(self) -> int:
        return self.max_rows - len(self.rows)

    @torch.inference_mode()
    def add(self, prompt: list[int], *, max_new_tokens: int, sampler: Sampler, prompt_len: int | None = None) -> Row:
        """Prefill `prompt` in a free row and pick its first token. The row joins the batch unless that
        token already finished it (check `row.finish`); the caller removes finished rows it was given.
        `prompt_len`: the request's own prompt is `prompt[:prompt_len]`, the rest was generated before
        (default: all of `prompt` is the prompt)."""
        if not self.free:
            raise ConfigError(f"the batch is full ({self.max_rows} rows)")
        if not prompt or max_new_tokens < 1 or len(prompt) + max_new_tokens > self.max_len:
            raise ConfigError(f"a prompt of {len(prompt)} tokens with {max_new_tokens} new tokens does not fit "
                              f"a batch row of {self.max_len} positions")
        own = len(prompt) if prompt_len is None else prompt_len
        row = Row(list(prompt), max_new_tokens, sampler, stats=DecodeStats(prompt_tokens=own), prompt_len=own)
        slot = len(self.rows)
        self.cache.lengths[slot] = 0
        view = self.cache.rows(slot, slot + 1)
        device = self.target.embed.weight.device
        with batch_invariant():
            out = self.target(torch.tensor([prompt], device=device), cache=view, logits_slice=slice(-1, None))
        self.cache.set_rows(slot, view)
        self.rows.append(row)
        row._push(self._select(row, out.logits[:, -1]), self.stop_ids)
        row.stats.time_to_first_token = time.perf_counter() - row.started
        return row

    @torch.inference_mode()
    def step(self) -> list[Row]:
        """One token for every row (one forward); returns the rows, each with its new token last."""
        if not self.rows:
            return []
        n = len(self.rows)
        if any(row.finish is not None for row in self.rows):
            raise ValueError("remove the finished rows before the next step")
        view = self.cache.rows(0, n)
        device = self.target.embed.weight.device
        pending = torch.tensor([[row.new[-1]] for row in self.rows], device=device)  # (n, 1)
        with batch_invariant():
            logits = self.target(pending, cache=view).logits[:, -1]  # (n, V)
        self.cache.set_rows(0, view)
        for i, row in enumerate(self.rows):
            row._push(self._select(row, logits[i : i + 1]), self.stop_ids)
        return list(self.rows)

    def remove(self, row: Row) -> None:
        """Free `row`'s cache row (the last row moves into it)."""
        slot = self.rows.index(row)
        last = len(self.rows) - 1
        if slot != last:
            self.cache.move_row(last, slot)
            self.rows[slot] = self.rows[last]
        self.rows.pop()
        self.cache.lengths[last] = 0

    @staticmethod
    def _select(row: Row, logits: torch.Tensor) -> int:
        """Next token of `row` from its (1, V) logits, penalised with the row's own context."""
        if row.sampler.penalties:
            logits = row.sampler.penalize(logits, TokenHistory.single(row.prompt + row.new, row.prompt_len))
        return int(row.sampler.select(logits)[0])

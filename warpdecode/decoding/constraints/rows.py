"""A batch of prompts each in its own grammar (or free): the rows of a `ContinuousBatch`, as the server
decodes them, one `ConstrainedDecoding` per constrained row (its own matcher state, forced tokens
drafted for free). Rows run batch-invariantly, so each row's greedy tokens are those of `generate()`
alone with the row's response format, and a seeded sampled row draws what it draws alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from warpdecode.decoding.batch import Result
from warpdecode.decoding.constraints.closing import BudgetClosing
from warpdecode.decoding.constraints.llguidance_matcher import Grammar
from warpdecode.decoding.constraints.tree_mask import ConstrainedDecoding
from warpdecode.decoding.continuous import ContinuousBatch, Row
from warpdecode.decoding.engine import Method
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.models.backbone import Backbone


def decode_rows(target: Backbone, prompts: list[list[int]], config: SamplingConfig, *, budgets: list[int],
                grammars: Sequence[Grammar | None], stop_ids: set[int], plain: Callable[[], Method],
                jump_forward: bool = True, closings: Sequence[BudgetClosing | None] | None = None) -> list[Result]:
    """Decode every prompt, row i in `grammars[i]` (None: free) with at most `budgets[i]` new tokens,
    closed within them by `closings[i]` when given (`closing.py`).

    `plain` builds the components of plain decoding (`build_method("none")`) for each constrained row
    (components keep per-request state). Returns (new tokens, finish reason, stats) per prompt, in order.
    """
    device = target.embed.weight.device
    max_len = max(len(p) + b for p, b in zip(prompts, budgets, strict=True))
    batch = ContinuousBatch(target, max_rows=len(prompts), max_len=max_len, stop_ids=stop_ids)
    rows: list[Row] = []
    for prompt, budget, grammar, closing in zip(prompts, budgets, grammars, closings or [None] * len(prompts), strict=True):
        constraint = None if grammar is None else ConstrainedDecoding(grammar.state(), jump_forward=jump_forward,
                                                                      closing=closing)
        row = batch.add(prompt, max_new_tokens=budget, sampler=Sampler(config, device=device),
                        method=None if constraint is None else plain(), constraint=constraint)
        if row.finish is not None:
            batch.remove(row)
        rows.append(row)
    while batch.rows:
        batch.step()
        for row in [r for r in batch.rows if r.finish is not None]:
            batch.remove(row)
    return [(row.new, row.finish or "length", row.stats) for row in rows]

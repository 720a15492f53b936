"""Step-interleaved A/B of a continuous batch's modes, in process, on the default model.

The same prompts (Spec-Bench first turns, `serve_load.py`'s) decode in several `ContinuousBatch`es
advanced one step each in turn, so that a loaded machine slows every arm alike; prints each arm's
tokens per second and its ratio to plain decoding, and checks every arm's tokens equal plain
decoding's. Arms: `none`; `prompt_lookup` with attention `old` (one SDPA per row and position) or
`ragged` (`ContinuousBatch(ragged_verify=True)`), drafting every step (`draft`), never (`plain`),
as `DraftBudget` chooses without cutting trees (`budget`, the server before 2026-11-28's cut), or as
the server does now (`cut`: `DraftBudget` with `keep`). An arm's `DraftBudget` lives across the groups,
as a server's does across requests.

    python scripts/continuous_ab.py --groups 6 --rows 1 --arms "old plain,ragged plain,old draft,ragged draft,old budget"
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import load_prompts

from warpdecode.decoding.continuous import ContinuousBatch, DraftBudget, Row
from warpdecode.decoding.generate import build_method
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.models.checkpoint import load_pretrained, resolve
from warpdecode.models.named import DEFAULT_MODEL

BUDGETS: dict[str, DraftBudget] = {}


class Arm:
    def __init__(self, name: str, model, tokenizer, texts: list[str], max_tokens: int) -> None:
        attention, _, mode = name.partition(" ")
        self.name, self.mode = name, mode or "plain"
        self.batch = ContinuousBatch(model, max_rows=16, max_len=2048, stop_ids=set(), ragged_verify=attention == "ragged")
        method = None if attention == "none" else "prompt_lookup"
        self.rows: list[Row] = [self.batch.add(tokenizer.encode(t), max_new_tokens=max_tokens,
                                               sampler=Sampler(SamplingConfig()),
                                               method=None if method is None else build_method(method)) for t in texts]
        self.budget = BUDGETS.setdefault(name, DraftBudget())
        self.seconds, self.tokens = 0.0, 0
        self.steps, self.drafting, self.verified = 0, 0, 0  # steps, of them drafting, draft positions verified

    def step(self) -> None:
        if not self.batch.rows:
            return
        rows = len(self.batch.rows)
        cut = self.mode == "cut"
        drafting = self.budget.choose(rows, True, cut=cut) if self.mode in ("budget", "cut") else self.mode == "draft"
        start = time.perf_counter()
        self.batch.step(None if drafting else 0, partial(self.budget.keep, rows) if drafting and cut else None)
        seconds = time.perf_counter() - start
        tokens = sum(len(row.last) for row in self.batch.rows)
        self.budget.observe(rows, drafting, tokens, seconds, width=self.batch.width)
        for row in self.batch.rows:
            self.budget.learn(row)
        self.seconds, self.tokens = self.seconds + seconds, self.tokens + tokens
        self.steps, self.drafting = self.steps + 1, self.drafting + drafting
        self.verified += self.batch.width - 1
        for row in [r for r in self.batch.rows if r.finish is not None]:
            self.batch.remove(row)


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=4, help="batches of --rows prompts, one after the other")
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--first", type=int, default=0, help="first prompt")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--arms", default="old plain,ragged plain,old draft,ragged draft,old budget,ragged budget")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    model, tokenizer = load_pretrained(resolve(DEFAULT_MODEL))
    prompts = load_prompts(args.first + args.groups * args.rows)[args.first :]
    names = ["none", *[a.strip() for a in args.arms.split(",") if a.strip()]]
    totals = {name: [0.0, 0, 0, 0, 0] for name in names}  # seconds, tokens, steps, drafting steps, verified drafts
    for group in range(args.groups):
        texts = prompts[group * args.rows : (group + 1) * args.rows]
        arms = [Arm(name, model, tokenizer, texts, args.max_tokens) for name in names]
        while any(arm.batch.rows for arm in arms):
            for arm in arms:
                arm.step()
        for arm in arms:
            if [row.new for row in arm.rows] != [row.new for row in arms[0].rows]:
                raise SystemExit(f"{arm.name}: tokens differ from plain decoding")
            for i, value in enumerate((arm.seconds, arm.tokens, arm.steps, arm.drafting, arm.verified)):
                totals[arm.name][i] += value
        print(group, {arm.name: round(arm.tokens / arm.seconds, 1) for arm in arms}, flush=True)
    base = totals["none"][1] / totals["none"][0]
    for name, (seconds, tokens, steps, drafting, verified) in totals.items():
        print(f"{name:>14}: {tokens / seconds:6.1f} tok/s  {tokens / seconds / base:.3f}x  {steps} steps, "
              f"{drafting} drafting, {verified} draft positions (widest row's) verified")


if __name__ == "__main__":
    main()

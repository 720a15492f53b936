"""Constrained decoding side by side: plain greedy and prompt lookup, each with and without jump-forward,
on JSON schemas with the default model (plus unconstrained plain greedy, for the masking overhead).

    python scripts/constrained_bench.py [--rounds 2] [--max-new-tokens 96] [--threads 2]

Runs are interleaved (every configuration on a prompt, then the next prompt, for `--rounds` rounds),
so machine load hits all of them alike. Reports per configuration: tokens/s (all new tokens over all
seconds), τ (docs/metrics.md: accepted draft tokens plus one bonus per verify forward), target forwards, how many outputs finished and validated
against their schema (`jsonschema`), speed relative to constrained plain greedy, and the share of the
time spent in the engine's grammar hook (masks, tree walks, commits). Constrained
configurations must produce identical tokens (checked).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jsonschema
import torch

from warpdecode.decoding.constraints.tree_mask import ConstrainedDecoding

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grammar_engines import SCHEMAS

import warpdecode

CONFIGS = [  # name, method, constrained, jump_forward
    ("unconstrained greedy", "none", False, False),
    ("constrained greedy", "none", True, False),
    ("constrained greedy + jump-forward", "none", True, True),
    ("constrained prompt_lookup", "prompt_lookup", True, False),
    ("constrained prompt_lookup + jump-forward", "prompt_lookup", True, True),
]
TASKS = {
    "person": "Invent a fictional person.",
    "order": "Invent an online shop order with two items.",
    "event": "Invent a team meeting event.",
}


CONSTRAINT_SECONDS = [0.0]
"""Time spent in the engine's grammar hook (masks, tree walks, commits), summed."""


def _timed_hook(name: str) -> None:
    """Wrap `ConstrainedDecoding.name` so its time adds to CONSTRAINT_SECONDS."""
    method = getattr(ConstrainedDecoding, name)

    def wrapper(self: ConstrainedDecoding, *args: object) -> object:
        start = time.perf_counter()
        try:
            return method(self, *args)
        finally:
            CONSTRAINT_SECONDS[0] += time.perf_counter() - start

    setattr(ConstrainedDecoding, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_flush_denormal(True)
    torch.set_num_threads(args.threads)
    model, tokenizer = warpdecode.load(args.model)
    for name in ("mask_next", "shape", "mask", "commit"):
        _timed_hook(name)
    totals = {name: {"tokens": 0, "seconds": 0.0, "forwards": 0, "accepted": 0, "valid": 0, "runs": 0, "hook": 0.0} for name, *_ in CONFIGS}
    for _ in range(args.rounds):
        for schema_name, task in TASKS.items():
            schema = SCHEMAS[schema_name]
            prompt = f"{task} Reply with JSON only, matching this JSON Schema: {json.dumps(schema)}"
            rf = {"type": "json_schema", "json_schema": {"name": schema_name, "schema": schema}}
            reference = None
            for name, method, constrained, jump_forward in CONFIGS:
                hook_before = CONSTRAINT_SECONDS[0]
                out = warpdecode.generate(model, tokenizer, prompt, max_new_tokens=args.max_new_tokens, method=method,
                                          response_format=rf if constrained else None, jump_forward=jump_forward)
                t = totals[name]
                t["tokens"] += out.stats.new_tokens
                t["seconds"] += out.stats.seconds
                t["forwards"] += out.stats.target_forwards
                t["accepted"] += sum(out.stats.accepted_per_step)
                t["runs"] += 1
                t["hook"] += CONSTRAINT_SECONDS[0] - hook_before
                if constrained:
                    if reference is None:
                        reference = out.token_ids
                    assert out.token_ids == reference, f"{name} differs from constrained greedy on {schema_name}"
                    if out.finish_reason == "eos":
                        jsonschema.validate(json.loads(out.text), schema)
                        t["valid"] += 1
                print(f"{schema_name:7s} {name:42s} {out.stats.new_tokens:3d} tokens {out.stats.seconds:6.2f} s "
                      f"{out.finish_reason:6s} {out.text[:70]!r}", flush=True)
    base = totals["constrained greedy"]
    base_speed = base["tokens"] / base["seconds"]
    print("\n| configuration | tokens/s | vs constrained greedy | τ | forwards | valid | grammar hook |")
    print("|---|---|---|---|---|---|---|")
    for name, t in totals.items():
        speed = t["tokens"] / t["seconds"]
        print(f"| {name} | {speed:.1f} | {speed / base_speed:.2f}x | {(t['accepted'] + t['forwards']) / t['forwards']:.2f} | "
              f"{t['forwards']} | {t['valid']}/{t['runs']} | {100 * t['hook'] / t['seconds']:.1f} % |")


if __name__ == "__main__":
    main()

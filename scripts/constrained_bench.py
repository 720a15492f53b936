"""Constrained decoding side by side: plain greedy and prompt lookup, each with and without jump-forward,
on JSON schemas with the default model (plus unconstrained plain greedy, for the masking overhead).

    python scripts/constrained_bench.py [--rounds 2] [--max-new-tokens 96] [--threads 2] [--methods int4_self]
    python scripts/constrained_bench.py --set schemas [--limit 8] [--schema-chars 1500]

`--set builtin` (the default): three hand-written schemas (`scripts/grammar_engines.py`) with task
prompts. `--set schemas`: the real schemas of `scripts/schema_set.py` (SchemaStore schemas vendored by
check-jsonschema, the JSON Schema meta-schemas), the first `--limit` that llguidance compiles (`schema_set.schemas` order), each
compiled strictly where it can and leniently otherwise; the coverage of both modes is printed first.
`--compare awrs` runs plain decoding (no jump-forward) with full masks and with adaptive rejection
(`constrained_sampling="awrs"`), greedy and sampled at temperature 1 (seeded per prompt and round),
instead of the speculation configurations.

Runs are interleaved (every configuration on a prompt, then the next prompt, for `--rounds` rounds),
so machine load hits all of them alike. Reports per configuration: tokens/s (all new tokens over all
seconds), τ (docs/metrics.md: accepted draft tokens plus one bonus per verify forward), target forwards, how many outputs finished and validated
against their schema (`jsonschema`), speed relative to constrained plain greedy, and the share of the
time spent in the engine's grammar hook (masks, tree walks, commits), and llguidance's time per
mask (`GrammarState.fill_mask`, p50 / p99 over every call), full masks and matcher checks
(`GrammarState.allows`) per new token. Greedy constrained configurations must produce identical
tokens (checked); with budget-aware closing (`close_at_budget`, the "+ closing" rows) the tokens before
the closing must be those, and both closing configurations must give the same output (checked).
Outputs are counted as valid (finished with EOS and validated), invalid
(finished but not valid: possible only under a lenient grammar), unverifiable (a `$ref` jsonschema
cannot resolve offline), "length" (the budget ran out: a valid prefix, never counted as valid) or
closed (the budget ran out and the output was closed: finish reason `length`, validated apart; the
closing's tokens are counted against the closed outputs' tokens). Closing tokens cost no forward and
count in tokens/s; the closing searches (`BudgetClosing.find`: rollouts, and schema checks on lenient
grammars) count in the grammar hook and their masks in the mask columns, and their number and time
are printed after the table.
Unconstrained outputs count as valid when the first fenced block, or else the outermost {...}, of the
text validates (the compliance baseline).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from warpdecode.decoding.constraints import closing as closing_module
from warpdecode.decoding.constraints.awrs import AdaptiveRejection
from warpdecode.decoding.constraints.llguidance_matcher import GrammarState
from warpdecode.decoding.constraints.tree_mask import ConstrainedDecoding
from warpdecode.decoding.generate import build_method, stop_token_ids
from warpdecode.decoding.specs import parse_spec
from warpdecode.errors import WarpdecodeError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grammar_engines import SCHEMAS
from schema_set import compile_modes, schemas, validate

import warpdecode

CONFIGS = [  # name, method, constrained, jump_forward, constrained_sampling, do_sample, close_at_budget
    ("unconstrained greedy", "none", False, False, "mask", False, False),
    ("constrained greedy", "none", True, False, "mask", False, False),
    ("constrained greedy + jump-forward", "none", True, True, "mask", False, False),
    ("constrained prompt_lookup", "prompt_lookup", True, False, "mask", False, False),
    ("constrained prompt_lookup + jump-forward", "prompt_lookup", True, True, "mask", False, False),
    ("constrained greedy + closing", "none", True, False, "mask", False, True),
    ("constrained prompt_lookup + jump-forward + closing", "prompt_lookup", True, True, "mask", False, True),
]
AWRS_CONFIGS = [  # --compare awrs: full mask vs adaptive rejection, plain decoding, no jump-forward
    ("constrained greedy", "none", True, False, "mask", False, False),
    ("constrained greedy, awrs", "none", True, False, "awrs", False, False),
    ("constrained sampling", "none", True, False, "mask", True, False),
    ("constrained sampling, awrs", "none", True, False, "awrs", True, False),
]
CLOSING_CONFIGS = [c for c in CONFIGS if c[1:] in {("none", True, False, "mask", False, False)} or c[6]]
"""--compare closing: constrained greedy and the two closing configurations (a run over every schema)."""
TASKS = {
    "person": "Invent a fictional person.",
    "order": "Invent an online shop order with two items.",
    "event": "Invent a team meeting event.",
}


CONSTRAINT_SECONDS = [0.0]
"""Time spent in the engine's grammar hook (masks, tree walks, commits), summed."""


_DEPTH = [0]


def _timed_hook(cls: type, name: str) -> None:
    """Wrap `cls.name` so its time adds to CONSTRAINT_SECONDS (outermost call only: an override that
    calls the base class's method counts once)."""
    method = cls.__dict__[name]

    def wrapper(self: ConstrainedDecoding, *args: object) -> object:
        _DEPTH[0] += 1
        start = time.perf_counter()
        try:
            return method(self, *args)
        finally:
            _DEPTH[0] -= 1
            if _DEPTH[0] == 0:
                CONSTRAINT_SECONDS[0] += time.perf_counter() - start

    setattr(cls, name, wrapper)


MASK_SECONDS: list[float] = []
"""Duration of every `GrammarState.fill_mask` call (llguidance's mask) since the last reset."""


def _timed_fill_mask() -> None:
    method = GrammarState.fill_mask

    def wrapper(self: GrammarState, bits: torch.Tensor) -> None:
        start = time.perf_counter()
        method(self, bits)
        MASK_SECONDS.append(time.perf_counter() - start)

    GrammarState.fill_mask = wrapper  # type: ignore[method-assign]


ROLLOUTS = [0, 0.0, 0]
"""Closing searches (`BudgetClosing.find` calls: the grammar's rollout, and on a lenient schema the closing
built from the schema and its validations), their seconds and the tokens they returned, since the last reset."""


def _timed_rollouts() -> None:
    method = closing_module.BudgetClosing.find

    def wrapper(*args: Any, **kwargs: Any) -> list[int] | None:
        start = time.perf_counter()
        out = method(*args, **kwargs)
        ROLLOUTS[0] += 1
        ROLLOUTS[1] += time.perf_counter() - start
        ROLLOUTS[2] += len(out or ())
        return out

    closing_module.BudgetClosing.find = wrapper  # type: ignore[method-assign]


CHECKS = [0]
"""`GrammarState.allows` calls (adaptive rejection's matcher checks) since the last reset."""


def _counted_checks() -> None:
    method = GrammarState.allows

    def wrapper(self: GrammarState, token: int) -> bool:
        CHECKS[0] += 1
        return method(self, token)

    GrammarState.allows = wrapper  # type: ignore[method-assign]


def builtin_tasks() -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    """(name, prompt, response format, schema) of the hand-written schemas."""
    out = []
    for schema_name, task in TASKS.items():
        schema = SCHEMAS[schema_name]
        prompt = f"{task} Reply with JSON only, matching this JSON Schema: {json.dumps(schema)}"
        out.append((schema_name, prompt, {"type": "json_schema", "json_schema": {"name": schema_name, "schema": schema}},
                    schema))
    return out


def schema_tasks(model: Any, tokenizer: Any, limit: int, schema_chars: int) -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    """The first `limit` schemas of the set that compile (strictly if they can), after a coverage report."""
    stops = stop_token_ids(model, tokenizer)
    out, items, covered = [], schemas(), {"strict": 0, "lenient": 0}
    for item in items:
        modes = dict(compile_modes(item, tokenizer, model.config.vocab_size, stops))
        for mode, reason in modes.items():
            covered[mode] += reason is None
        if modes["strict"] is not None:
            print(f"strict refuses {item.name}: {modes['strict'][:120]}")
        if modes["lenient"] is not None:
            print(f"lenient refuses {item.name}: {modes['lenient'][:120]}")
        usable = "strict" if modes["strict"] is None else "lenient" if modes["lenient"] is None else None
        if usable is not None and len(out) < limit:
            out.append((f"{item.name} ({usable})", item.prompt(schema_chars), item.response_format(usable == "lenient"),
                        item.schema))
    print(f"coverage: strict {covered['strict']}/{len(items)}, lenient {covered['lenient']}/{len(items)}\n")
    return out


def extra_configs(methods: str) -> list[tuple[Any, ...]]:
    """`--methods`' rows: each drafter built once (its state restarts per request), constrained without and
    with jump-forward."""
    out: list[tuple[Any, ...]] = []
    for spec in filter(None, (m.strip() for m in methods.split(","))):
        name, options = parse_spec(spec)
        method = build_method(name, options=options)
        out += [(f"constrained {spec}", method, True, False, "mask", False, False),
                (f"constrained {spec} + jump-forward", method, True, True, "mask", False, False)]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compare", choices=["speculation", "awrs", "closing"], default="speculation",
                        help="awrs: full masks vs adaptive rejection (constrained_sampling), greedy and sampled (T=1); "
                             "closing: constrained greedy and the two budget-aware closing rows only")
    parser.add_argument("--set", choices=["builtin", "schemas"], default="builtin")
    parser.add_argument("--limit", type=int, default=8, help="schemas of --set schemas (the smallest that compile)")
    parser.add_argument("--schema-chars", type=int, default=1500, help="characters of the schema in a --set schemas prompt")
    parser.add_argument("--methods", default="", help="more drafters (NAME[:KEY=VALUE...], comma-separated) for the "
                                                      "speculation comparison: each constrained, without and with jump-forward")
    args = parser.parse_args()
    torch.set_flush_denormal(True)
    torch.set_num_threads(args.threads)
    model, tokenizer = warpdecode.load(args.model)
    for cls in (ConstrainedDecoding, AdaptiveRejection):
        for name in ("mask_next", "shape", "mask", "commit"):
            if name in cls.__dict__:
                _timed_hook(cls, name)
    _timed_fill_mask()
    _counted_checks()
    _timed_rollouts()
    configs: list[tuple[Any, ...]] = {"speculation": CONFIGS, "awrs": AWRS_CONFIGS, "closing": CLOSING_CONFIGS}[args.compare]
    if args.compare == "speculation":
        try:
            configs = configs + extra_configs(args.methods)
        except WarpdecodeError as error:
            print(f"error: --methods: {error}", file=sys.stderr)
            sys.exit(2)
    tasks = builtin_tasks() if args.set == "builtin" else schema_tasks(model, tokenizer, args.limit, args.schema_chars)
    totals = {name: {"tokens": 0, "seconds": 0.0, "forwards": 0, "accepted": 0, "runs": 0, "hook": 0.0, "masks": [],
                     "valid": 0, "invalid": 0, "unverifiable": 0, "not json": 0, "length": 0, "checks": 0,
                     "closed": 0, "closed invalid": 0, "closed tokens": 0, "closing tokens": 0, "rollouts": 0,
                     "rollout seconds": 0.0, "rollout tokens": 0} for name, *_ in configs}
    for round_ in range(args.rounds):
        for index, (task_name, prompt, rf, schema) in enumerate(tasks):
            reference = closed_reference = None
            for name, method, constrained, jump_forward, sampling, do_sample, close in configs:
                hook_before = CONSTRAINT_SECONDS[0]
                MASK_SECONDS.clear()
                CHECKS[0] = 0
                ROLLOUTS[:] = [0, 0.0, 0]
                out = warpdecode.generate(model, tokenizer, prompt, max_new_tokens=args.max_new_tokens, method=method,
                                          response_format=rf if constrained else None, jump_forward=jump_forward,
                                          constrained_sampling=sampling, do_sample=do_sample, close_at_budget=close,
                                          seed=1000 * round_ + index if do_sample else None)
                t = totals[name]
                t["tokens"] += out.stats.new_tokens
                t["seconds"] += out.stats.seconds
                t["forwards"] += out.stats.target_forwards
                t["accepted"] += sum(out.stats.accepted_per_step)
                t["runs"] += 1
                t["hook"] += CONSTRAINT_SECONDS[0] - hook_before
                t["masks"] += MASK_SECONDS
                t["checks"] += CHECKS[0]
                t["rollouts"] += ROLLOUTS[0]
                t["rollout seconds"] += ROLLOUTS[1]
                t["rollout tokens"] += ROLLOUTS[2]
                closing = out.stats.closing_tokens
                if constrained and close:
                    model_part = out.token_ids[: len(out.token_ids) - closing]
                    assert reference is not None and model_part == reference[: len(model_part)], \
                        f"{name}: the tokens before the closing differ from constrained greedy on {task_name}"
                    closed_reference = closed_reference or out.token_ids
                    assert out.token_ids == closed_reference, f"{name} closes differently on {task_name}"
                elif constrained:
                    if reference is None and not do_sample:
                        reference = out.token_ids
                    assert do_sample or out.token_ids == reference, f"{name} differs from constrained greedy on {task_name}"
                if constrained and closing:
                    verdict = "closed" if validate(out.text, schema) == "valid" else "closed invalid"
                    t["closed tokens"] += out.stats.new_tokens
                    t["closing tokens"] += closing
                elif constrained:
                    verdict = validate(out.text, schema) if out.finish_reason == "eos" else "length"
                else:
                    verdict = validate(out.text, schema, extract=True)
                t[verdict] += 1
                print(f"{task_name[:40]:40s} {name:42s} {out.stats.new_tokens:3d} tokens {out.stats.seconds:6.2f} s "
                      f"{out.finish_reason:6s} {verdict:12s} {out.text[:60]!r}", flush=True)
    base = totals["constrained greedy"]
    base_speed = base["tokens"] / base["seconds"]
    print("\n| configuration | tokens/s | vs constrained greedy | τ | forwards | valid | invalid | length | closed (valid) |"
          " closing tokens | grammar hook | mask p50 / p99 (µs) | full masks per token | checks per token |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, t in totals.items():
        speed = t["tokens"] / t["seconds"]
        masks = sorted(t["masks"])
        timing = (f"{1e6 * statistics.median(masks):.0f} / {1e6 * masks[int(0.99 * (len(masks) - 1))]:.0f}"
                  if masks else "–")
        invalid = t["invalid"] + t["not json"]
        print(f"| {name} | {speed:.1f} | {speed / base_speed:.2f}x | {(t['accepted'] + t['forwards']) / t['forwards']:.2f} | "
              f"{t['forwards']} | {t['valid']}/{t['runs']} | {invalid}{' + ' + str(t['unverifiable']) + ' unverifiable' if t['unverifiable'] else ''} | "
              f"{t['length']} | {_closed(t)} | {100 * t['hook'] / t['seconds']:.1f} % | {timing} | {len(masks) / t['tokens']:.2f} | "
              f"{t['checks'] / t['tokens']:.2f} |")
    for name, t in totals.items():
        if t["rollouts"]:
            print(f"{name}: {t['rollouts']} closing searches ({t['rollouts'] / t['runs']:.1f} per output), "
                  f"{1e3 * t['rollout seconds'] / t['rollouts']:.2f} ms each, {1e6 * t['rollout seconds'] / max(1, t['rollout tokens']):.0f} µs "
                  f"per closing token found, {100 * t['rollout seconds'] / t['seconds']:.1f} % of the decode time")


def _closed(t: dict[str, Any]) -> str:
    """The closed outputs (valid of all) and the closing's share of their tokens, as two table cells."""
    if not t["closed"] + t["closed invalid"]:
        return "– | –"
    share = t["closing tokens"] / t["closed tokens"]
    return (f"{t['closed']}/{t['closed'] + t['closed invalid']} | {t['closing tokens']} of {t['closed tokens']} "
            f"({100 * share:.1f} %)")


if __name__ == "__main__":
    main()

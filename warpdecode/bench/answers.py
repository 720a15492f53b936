"""Answer quality of a GSM8K benchmark run: did a lossy method change the final answer?

    python -m warpdecode.bench.answers runs/bench-judge-gsm8k

Reads the `results.json` of a `warpdecode bench --prompts gsm8k` run, decodes every output, takes
the last number of each answer and reports per row: accuracy against the GSM8K reference answers
(`#### <number>`), and answer agreement, the share of prompts whose final number equals the one of
plain greedy decoding (the `none` row). Lossless rows agree on every prompt by construction; a
lossy row (typical acceptance, `trust`, `judge`) shows here what its token-level divergence does to
the task. Writes `answers.json` and `answers.md` next to the results.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from warpdecode.bench.prompts import gsm8k_test_rows
from warpdecode.bench.specs import BASELINE
from warpdecode.data.gsm8k import final_number
from warpdecode.errors import ConfigError

GSM8K_ID = re.compile(r"gsm8k/test-(\d+)$")


def score_answers(results: Mapping[str, Any], decode: Callable[[list[int]], str],
                  references: Mapping[str, str]) -> list[dict[str, Any]]:
    """Per row of `results`: prompts, accuracy against `references` (prompt id → reference number)
    and agreement with the baseline row's final numbers."""
    answers: dict[str, dict[str, str | None]] = {}
    for m in results["measurements"]:
        if m["prompt_id"] not in references:
            raise ConfigError(f"prompt {m['prompt_id']!r} has no GSM8K reference answer (run with --prompts gsm8k)")
        answers.setdefault(m["row"], {})[m["prompt_id"]] = final_number(decode(m["token_ids"]))
    if BASELINE not in answers:
        raise ConfigError(f"the results have no {BASELINE!r} row to compare answers with")
    baseline = answers[BASELINE]
    scores = []
    for row, by_prompt in answers.items():
        n = len(by_prompt)
        scores.append({"row": row, "prompts": n,
                       "accuracy": sum(a == references[p] for p, a in by_prompt.items()) / n,
                       "agreement": sum(a == baseline.get(p) for p, a in by_prompt.items()) / n})
    return scores


def gsm8k_references() -> dict[str, str]:
    """Prompt id of the `gsm8k` bench set → the reference final number."""
    return {f"gsm8k/test-{i}": row["answer"].rsplit("####", 1)[-1].strip().replace(",", "")
            for i, row in enumerate(gsm8k_test_rows())}


def markdown(scores: list[dict[str, Any]]) -> str:
    lines = ["| method | prompts | accuracy | same final answer as greedy |", "|---|---:|---:|---:|"]
    lines += [f"| `{s['row']}` | {s['prompts']} | {100 * s['accuracy']:.1f} % | {100 * s['agreement']:.1f} % |"
              for s in scores]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a `warpdecode bench --prompts gsm8k` output folder")
    args = parser.parse_args(argv)
    path = args.run / "results.json"
    if not path.is_file():
        raise SystemExit(f"{path} not found: pass the --out folder of a `warpdecode bench` run")
    results = json.loads(path.read_text())
    from warpdecode.models.checkpoint import load_pretrained

    _, tokenizer = load_pretrained(results["config"]["model"])
    scores = score_answers(results, tokenizer.decode, gsm8k_references())
    (args.run / "answers.json").write_text(json.dumps(scores, indent=2) + "\n")
    (args.run / "answers.md").write_text(markdown(scores))
    print(markdown(scores), end="")


if __name__ == "__main__":
    main()

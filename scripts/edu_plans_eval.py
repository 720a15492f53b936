"""EDU plan-guided summaries (`edu_plans`) against greedy decoding and best-of-N with as many candidates, on
Spec-Bench's summarization prompts, side by side (each prompt runs every configuration in turn, so machine
noise spreads over all of them).

    PYTHONPATH=. python scripts/edu_plans_eval.py --prompts 6 --max-new-tokens 80 --candidates 4 --threads 1

Prompts: the first `--prompts` summarization first turns (../shared/datasets/spec_bench), through the chat
template. No reference summaries exist offline, so quality is read against the article itself:

* `R1-P` / `R2-P`: ROUGE-1/2 precision against the article (`metrics/source_overlap.py`: the share of the
  summary's word n-grams the article holds, pooled over prompts), a faithfulness proxy;
* `R2-F lead3`: ROUGE-2 F1 against the article's first three sentences (the lead-3 stand-in reference);
* `R2-P pool`: the same over every candidate of a search (before its reranker chooses);
* `rep-3`: the share of repeated word 3-grams within a summary (`metrics/open_ended.py`), mean over prompts;
* `words`: the summary's length; `tokens`: every row's generated tokens (the search's cost);
* `time`: the median over prompts of each prompt's wall time over greedy's.

best_of_n (`--candidates` samples at `--temperature`) is ranked either by the mean log-probability or by
the same `PlanScorer` as edu_plans without its plan term (ROUGE-2 precision against the article + mean
log-probability); `--edu-specs` lists the edu_plans specs to run (each plan decoded greedily).
`--no-best-of-n` runs greedy and those only (ablations). `--out FILE` writes every output as JSON,
`--report FILE` prints the table of such a file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch

from warpdecode.data.datasets import dataset_file
from warpdecode.decoding import registry
from warpdecode.decoding.generate import generate
from warpdecode.decoding.search.edu import sentences
from warpdecode.decoding.search.plan_scorer import PlanScorer
from warpdecode.decoding.search.protocols import SearchStrategy
from warpdecode.decoding.specs import parse_spec
from warpdecode.metrics.open_ended import RepetitionRate, WordIds
from warpdecode.metrics.source_overlap import SourceOverlap, words

HEAD = "Summarize: "


def rouge2_f1(text: str, reference: str) -> float:
    """ROUGE-2 F1 with clipped bigram counts."""
    a, b = Counter(pairwise(words(text))), Counter(pairwise(words(reference)))
    overlap = sum((a & b).values())
    if not overlap:
        return 0.0
    p, r = overlap / sum(a.values()), overlap / sum(b.values())
    return 2 * p * r / (p + r)


def configurations(n: int, source: str, edu_specs: list[str], best_of_n: bool) -> dict[str, Callable[[], SearchStrategy | None]]:
    configs: dict[str, Callable[[], SearchStrategy | None]] = {"greedy": lambda: None}
    if best_of_n:
        configs[f"best_of_n:n={n} (mean_logprob)"] = lambda: registry.build("search", "best_of_n", n=n,
                                                                            scorer="mean_logprob")
        configs[f"best_of_n:n={n} (PlanScorer)"] = lambda: registry.build("search", "best_of_n", n=n,
                                                                          scorer=PlanScorer(source))
    for spec in edu_specs:
        name, options = parse_spec(spec)
        configs[spec] = lambda name=name, options=options: registry.build("search", name, **options)
    return configs


def report(records: list[dict[str, Any]]) -> None:
    """The table of the module docstring, one row per configuration in the order first run."""
    print("| configuration | R1-P | R2-P | R2-P pool | R2-F lead3 | rep-3 | words | tokens | time vs greedy |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    greedy = {r["id"]: r for r in records if r["config"] == "greedy"}
    for name in dict.fromkeys(r["config"] for r in records):
        mine = [r for r in records if r["config"] == name]
        overlap = [SourceOverlap(1), SourceOverlap(2), SourceOverlap(2)]
        for metric in overlap[:2]:
            metric.update([words(r["text"]) for r in mine], [words(r["source"]) for r in mine])
        pool = [(c, r["source"]) for r in mine for c in r["candidates"] or [r["text"]]]
        overlap[2].update([words(c) for c, _ in pool], [words(s) for _, s in pool])
        rep, ids = RepetitionRate(3), WordIds()
        rep.update([ids(" ".join(words(r["text"]))) for r in mine])
        lead = statistics.mean(rouge2_f1(r["text"], " ".join(sentences(r["source"])[:3])) for r in mine)
        ratio = statistics.median(r["seconds"] / greedy[r["id"]]["seconds"] for r in mine)
        print(f"| `{name}` | {float(overlap[0].compute()):.3f} | {float(overlap[1].compute()):.3f} | "
              f"{float(overlap[2].compute()):.3f} | {lead:.3f} | {float(rep.compute()):.3f} | "
              f"{statistics.mean(len(words(r['text'])) for r in mine):.0f} | {sum(r['tokens'] for r in mine)} | "
              f"{ratio:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=80)
    parser.add_argument("--candidates", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--edu-specs", default="edu_plans:plans=4:guide=prompt,edu_plans:plans=4:guide=both",
                        help="comma-separated edu_plans method specs to run")
    parser.add_argument("--no-best-of-n", action="store_true", help="run greedy and the edu_plans specs only")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--report", type=Path, default=None, help="print the table of a saved --out file and stop")
    args = parser.parse_args()
    if args.report is not None:
        report(json.loads(args.report.read_text()))
        return
    from warpdecode.models.checkpoint import load_pretrained, resolve

    torch.set_flush_denormal(True)
    torch.set_num_threads(args.threads)
    model, tokenizer = load_pretrained(resolve(args.model))
    rows = [json.loads(line) for line in dataset_file("spec_bench/question.jsonl").read_text().splitlines()]
    chosen = [r for r in rows if r["category"] == "summarization"][args.offset : args.offset + args.prompts]
    generate(model, tokenizer, "Hello", max_new_tokens=4)  # warm-up
    records: list[dict[str, Any]] = []
    for j, row in enumerate(chosen):
        prompt = row["turns"][0]
        source = prompt.removeprefix(HEAD)
        configs = configurations(args.candidates, source, args.edu_specs.split(","), not args.no_best_of_n)
        for name, build in configs.items():
            search = build()
            sampled = name.startswith("best_of_n")
            started = time.perf_counter()
            out = generate(model, tokenizer, prompt, max_new_tokens=args.max_new_tokens, chat=True, search=search,
                           do_sample=sampled, temperature=args.temperature if sampled else 1.0,
                           seed=j if sampled else None)
            records.append({"id": row["question_id"], "config": name, "text": out.text, "seconds": time.perf_counter() - started,
                            "tokens": out.stats.search_tokens or len(out.token_ids), "source": source,
                            "candidates": [c.text for c in out.sequences]})
            if args.out is not None:  # as it goes: a cut-short run keeps its outputs
                args.out.write_text(json.dumps(records, indent=1))
    print(f"model {args.model}, {len(chosen)} prompts from {args.offset}, {args.max_new_tokens} new tokens at most, "
          f"{args.candidates} candidates, best_of_n at T {args.temperature}")
    report(records)

if __name__ == "__main__":
    main()

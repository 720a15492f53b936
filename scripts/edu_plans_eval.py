"""EDU plan-guided summaries (`edu_plans`) against greedy decoding and best-of-N with as many candidates, on
Spec-Bench's summarization prompts, side by side (each prompt runs every configuration in turn, so machine
noise spreads over all of them).

    PYTHONPATH=. python scripts/edu_plans_eval.py --prompts 6 --max-new-tokens 80 --candidates 4 --threads 1

Prompts: the first `--prompts` summarization first turns (../shared/datasets/spec_bench), through the chat
template. No reference summaries exist offline, so quality is read against the article itself:

* `R1-P` / `R2-P`: ROUGE-1/2 precision against the article (`metrics/source_overlap.py`: the share of the
  summary's word n-grams the article holds, pooled over prompts), a faithfulness proxy;
* `R2-F lead3`: ROUGE-2 F1 against the article's first three sentences (the lead-3 stand-in reference);
* `rep-3`: the share of repeated word 3-grams within a summary (`metrics/open_ended.py`), mean over prompts;
* `words`: the summary's length; `tokens`: every row's generated tokens (the search's cost);
* `time`: the median over prompts of each prompt's wall time over greedy's.

best_of_n samples at `--temperature` and is ranked either by the mean log-probability or by the same
`PlanScorer` as edu_plans without its plan term (ROUGE-2 precision against the article + mean
log-probability); edu_plans decodes each plan greedily. `--out FILE` writes every output as JSON.
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


def configurations(n: int, source: str) -> dict[str, Callable[[], SearchStrategy | None]]:
    return {
        "greedy": lambda: None,
        f"best_of_n:n={n} (mean_logprob)": lambda: registry.build("search", "best_of_n", n=n, scorer="mean_logprob"),
        f"best_of_n:n={n} (PlanScorer)": lambda: registry.build("search", "best_of_n", n=n, scorer=PlanScorer(source)),
        f"edu_plans:plans={n}": lambda: registry.build("search", "edu_plans", plans=n),
        f"edu_plans:plans={n}:guide=both": lambda: registry.build("search", "edu_plans", plans=n, guide="both"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=80)
    parser.add_argument("--candidates", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from warpdecode.models.checkpoint import load_pretrained, resolve

    torch.set_flush_denormal(True)
    torch.set_num_threads(args.threads)
    model, tokenizer = load_pretrained(resolve(args.model))
    rows = [json.loads(line) for line in dataset_file("spec_bench/question.jsonl").read_text().splitlines()]
    chosen = [r for r in rows if r["category"] == "summarization"][args.offset : args.offset + args.prompts]
    generate(model, tokenizer, "Hello", max_new_tokens=4)  # warm-up
    records: list[dict[str, Any]] = []
    names: list[str] = []
    for j, row in enumerate(chosen):
        prompt = row["turns"][0]
        source = prompt.removeprefix(HEAD)
        configs = configurations(args.candidates, source)
        names = list(configs)
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
    print("| configuration | R1-P | R2-P | R2-F lead3 | rep-3 | words | tokens | time vs greedy |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    greedy = {r["id"]: r for r in records if r["config"] == "greedy"}
    for name in names:
        mine = [r for r in records if r["config"] == name]
        overlap = [SourceOverlap(1), SourceOverlap(2)]
        for metric in overlap:
            metric.update([words(r["text"]) for r in mine], [words(r["source"]) for r in mine])
        rep, ids = RepetitionRate(3), WordIds()
        rep.update([ids(" ".join(words(r["text"]))) for r in mine])
        lead = statistics.mean(rouge2_f1(r["text"], " ".join(sentences(r["source"])[:3])) for r in mine)
        ratio = statistics.median(r["seconds"] / greedy[r["id"]]["seconds"] for r in mine)
        print(f"| `{name}` | {float(overlap[0].compute()):.3f} | {float(overlap[1].compute()):.3f} | {lead:.3f} | "
              f"{float(rep.compute()):.3f} | {statistics.mean(len(words(r['text'])) for r in mine):.0f} | "
              f"{sum(r['tokens'] for r in mine)} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()

"""Context-aware decoding against greedy decoding on Spec-Bench's RAG and summarization prompts: how much
of the generated text the source holds, and the cost per token, side by side (every configuration
decodes each prompt in turn, so machine noise spreads over all of them).

    PYTHONPATH=. python scripts/context_contrast.py --prompts 4 --max-new-tokens 128 --alphas 0.5,1 --threads 1

Prompts: the first `--prompts` first turns of each category (../shared/datasets), through the chat
template. The context CAD removes: a RAG prompt's passages (everything before its last line, the
question); a summarization prompt's article (everything after "Summarize: "). Prints one markdown row
per configuration and category: source overlap of generated word 2- and 3-grams
(`metrics/source_overlap.py`), mean tokens generated, ms per decoding step after the first token and
its ratio to greedy's, and the ratio of the time to the first token (prefill; ratios are medians over
prompts of each prompt's ratio); `--out FILE` also writes every output (and its source) as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import torch

from warpdecode.data.datasets import dataset_file
from warpdecode.decoding import registry
from warpdecode.decoding.generate import generate
from warpdecode.metrics.source_overlap import SourceOverlap, words
from warpdecode.models.checkpoint import load_pretrained, resolve
from warpdecode.models.named import DEFAULT_MODEL


def split(category: str, prompt: str) -> tuple[str, str]:
    """(context, source) of a prompt: the text CAD removes, and the text the overlap is measured against."""
    if category == "rag":
        context = prompt[: prompt.rstrip().rfind("\n") + 1]
        return context, context
    head = "Summarize: "
    assert prompt.startswith(head), prompt[:40]
    return prompt[len(head) :], prompt[len(head) :]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--alphas", default="0.5,1")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_flush_denormal(True)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_pretrained(resolve(args.model))
    rows = [json.loads(line) for line in dataset_file("spec_bench/question.jsonl").read_text().splitlines()]
    configs = ["greedy"] + [f"cad alpha={a}" for a in args.alphas.split(",")]
    records: list[dict[str, Any]] = []
    generate(model, tokenizer, "Hello", max_new_tokens=4)  # warm-up
    for category in ("rag", "summarization"):
        for row in [r for r in rows if r["category"] == category][: args.prompts]:
            prompt = row["turns"][0]
            context, source = split(category, prompt)
            for name in configs:
                rule = None if name == "greedy" else registry.build(
                    "rule", "cad", alpha=float(name.split("=")[1]), context=context)
                out = generate(model, tokenizer, prompt, max_new_tokens=args.max_new_tokens, chat=True, rule=rule)
                stats = out.stats
                records.append({"category": category, "id": row["question_id"], "config": name, "text": out.text,
                                "tokens": len(out.token_ids), "prefill_s": stats.time_to_first_token,
                                "step_s": (stats.seconds - stats.time_to_first_token) / max(len(out.token_ids) - 1, 1),
                                "source": source})
                if args.out is not None:  # as it goes: a cut-short run keeps its outputs
                    args.out.write_text(json.dumps(records, indent=1))
    print(f"model {args.model}, {args.prompts} prompts per category, {args.max_new_tokens} new tokens at most")
    print("| category | configuration | overlap-2 | overlap-3 | tokens | ms / step | vs greedy | prefill vs greedy |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for category in ("rag", "summarization"):
        mine = [r for r in records if r["category"] == category]
        greedy = {r["id"]: r for r in mine if r["config"] == "greedy"}
        for name in configs:
            chosen = [r for r in mine if r["config"] == name]
            overlap = [SourceOverlap(2), SourceOverlap(3)]
            for metric in overlap:
                metric.update([words(r["text"]) for r in chosen], [words(r["source"]) for r in chosen])
            step = statistics.median(r["step_s"] / greedy[r["id"]]["step_s"] for r in chosen)
            prefill = statistics.median(r["prefill_s"] / greedy[r["id"]]["prefill_s"] for r in chosen)
            print(f"| {category} | {name} | {float(overlap[0].compute()):.3f} | {float(overlap[1].compute()):.3f} | "
                  f"{statistics.mean(r['tokens'] for r in chosen):.0f} | "
                  f"{1000 * statistics.median(r['step_s'] for r in chosen):.1f} | {step:.2f}x | {prefill:.2f}x |")


if __name__ == "__main__":
    main()

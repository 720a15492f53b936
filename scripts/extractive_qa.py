"""Exact-extract against greedy decoding on an extractive QA set built offline from Spec-Bench's RAG
questions, side by side: each question is decoded by every configuration in turn.

    PYTHONPATH=. python scripts/extractive_qa.py --limit 40 --threads 1

The set: Spec-Bench's `rag` rows (../shared/datasets/spec_bench/question.jsonl) hold retrieved passages,
one per line, then the question, and `reference` answer lists. A row is kept when one of its reference
answers (at most 6 words) appears verbatim in one of its passages; the first such passage is the
passage, so every kept question has an answer that is a span of its passage. Prompt: `--format chat`,
through the model's chat template, "Answer the question with the shortest span copied from the
passage..." (an answer ends with the template's end token); `--format completion`, "Passage: ...
Question: ... Answer:" without a template (an answer ends at a newline, which is then a stop token;
the answer's first token follows a space, as a span's first token does in the passage).
Scores: SQuAD's exact match and token F1 against every reference answer (the best one), over the
generated text cut at its first line. Cost: seconds per question and per generated token, medians,
and the ratio to greedy's (the loop runs on a loaded CPU: compare ratios).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import string
import time
from collections import Counter
from typing import Any

import torch

from warpdecode.data.datasets import dataset_file
from warpdecode.decoding import registry
from warpdecode.decoding.generate import encode_prompt, generate
from warpdecode.decoding.rules.exact_extract import passage_bounds
from warpdecode.models.checkpoint import load_pretrained, resolve
from warpdecode.models.named import DEFAULT_MODEL

INSTRUCTION = ("Answer the question with the shortest span copied from the passage, and nothing else.\n\n"
               "Passage: {passage}\n\nQuestion: {question}")
COMPLETION = "Passage: {passage}\nQuestion: {question}\nAnswer:"


def qa_set(limit: int) -> list[dict[str, Any]]:
    """Spec-Bench RAG rows whose short reference answer is a span of one of their passages."""
    rows = [json.loads(line) for line in dataset_file("spec_bench/question.jsonl").read_text().splitlines()]
    out = []
    for row in rows:
        if row["category"] != "rag":
            continue
        *passages, question = row["turns"][0].strip().split("\n")
        answers = [a for group in row.get("reference") or [] for a in group if 0 < len(a.split()) <= 6]
        found = next(((p, a) for p in passages for a in answers if a in p), None)
        if found is not None:
            out.append({"id": row["question_id"], "passage": found[0], "question": question.strip(), "answers": answers})
    return out[:limit]


def normalize(text: str) -> str:
    """SQuAD's answer normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(c for c in text.lower() if c not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def f1(prediction: str, answer: str) -> float:
    pred, gold = normalize(prediction).split(), normalize(answer).split()
    common = sum((Counter(pred) & Counter(gold)).values())
    if not common:
        return 0.0
    precision, recall = common / len(pred), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--max-length", type=int, default=12, help="exact_extract's longest span")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--format", choices=("chat", "completion"), default="chat")
    args = parser.parse_args()
    torch.set_flush_denormal(True)
    torch.set_num_threads(args.threads)
    model, tokenizer = load_pretrained(resolve(args.model))
    assert tokenizer is not None
    items = qa_set(args.limit)
    stops = sorted(set(model.config.eos_token_ids) | set(tokenizer.encode("\n", add_special_tokens=False)))
    names = ("greedy", f"exact_extract:max_length={args.max_length}")
    scores: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    seconds: dict[str, list[float]] = {name: [] for name in names}
    per_token: dict[str, list[float]] = {name: [] for name in names}
    for item in items:
        chat = args.format == "chat"
        ids = encode_prompt(tokenizer, (INSTRUCTION if chat else COMPLETION).format(**item), chat=chat)
        begin, end = passage_bounds(tokenizer, ids, item["passage"])
        rules = {names[0]: None,
                 names[1]: registry.build("rule", "exact_extract", max_length=args.max_length, begin=begin, end=end)}
        for name, rule in rules.items():
            start = time.perf_counter()
            out = generate(model, tokenizer, ids, max_new_tokens=args.max_new_tokens, rule=rule,
                           eos_token_id=None if chat else stops)
            elapsed = time.perf_counter() - start
            text = out.text.strip().split("\n")[0]
            em = max(float(normalize(text) == normalize(a)) for a in item["answers"])
            scores[name].append((em, max(f1(text, a) for a in item["answers"])))
            seconds[name].append(elapsed)
            per_token[name].append(elapsed / max(1, len(out.token_ids)))
            print(f"{item['id']} {name}: {text!r} (answers {item['answers'][:3]})", flush=True)
    base_q, base_t = statistics.median(seconds[names[0]]), statistics.median(per_token[names[0]])
    print(f"\n{len(items)} questions, {args.model}, {args.format} prompts")
    print("| decoding | EM | F1 | s / question | vs greedy | ms / token | vs greedy |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in names:
        em = 100 * statistics.mean(s[0] for s in scores[name])
        f = 100 * statistics.mean(s[1] for s in scores[name])
        q, t = statistics.median(seconds[name]), statistics.median(per_token[name])
        print(f"| `{name}` | {em:.1f} | {f:.1f} | {q:.2f} | {q / base_q:.2f}x | {1000 * t:.0f} | {t / base_t:.2f}x |")


if __name__ == "__main__":
    main()

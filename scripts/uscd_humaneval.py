"""USCD against greedy decoding on HumanEval, side by side in one process: each problem is decoded by
both in turn (so machine noise spreads over both), and every completion runs in the sandbox against
the problem's tests, as `warpdecode eval --task humaneval` runs them (completion protocol, cut at its
stop sequences).

    PYTHONPATH=. python scripts/uscd_humaneval.py --model qwen2.5-coder-0.5b-instruct --limit 8 --threads 1

Prints a line per problem as it is scored (so a cut-short run still says something), then one markdown
row per method: pass@1, tokens, ms per decoding step after the first token and its ratio to greedy's
(the median over problems of each problem's ratio). USCD's lame prompt is the problem's prompt without
its docstring examples (`data.humaneval.without_examples`); `--uscd` takes its options as a spec.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from warpdecode.bench.eval import EvalConfig, HumanEvalTask
from warpdecode.decoding import registry
from warpdecode.decoding.generate import generate
from warpdecode.decoding.specs import parse_spec
from warpdecode.models.checkpoint import load_pretrained, resolve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--uscd", default="uscd")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_flush_denormal(True)
    torch.set_num_threads(args.threads)
    model, tokenizer = load_pretrained(resolve(args.model))
    assert tokenizer is not None
    name, options = parse_spec(args.uscd)
    methods = {"greedy": None, args.uscd: registry.build("rule", name, **options)}
    task = HumanEvalTask(EvalConfig(task="humaneval", limit=args.limit, max_new_tokens=args.max_new_tokens))
    results: dict[str, list[tuple[bool, int, float]]] = {m: [] for m in methods}
    for problem in task.problems():
        texts, line = [], [problem.task_id]
        for method, rule in methods.items():
            out = generate(model, tokenizer, task.prompt(problem), max_new_tokens=args.max_new_tokens,
                           chat=task.config.use_chat, stop=task.stop, rule=rule)
            step = (out.stats.seconds - out.stats.time_to_first_token) / max(len(out.token_ids) - 1, 1)
            texts.append(out.text)
            results[method].append((False, len(out.token_ids), step))
        for method, (_, correct, reason) in zip(methods, task.score(problem, texts), strict=True):
            _, tokens, step = results[method][-1]
            results[method][-1] = (correct, tokens, step)
            line.append(f"{method}: {'pass' if correct else 'fail'} ({tokens} tokens, {1000 * step:.0f} ms/step; "
                        f"{reason[:60]})")
        print(" | ".join(line), flush=True)
    greedy = results["greedy"]
    print(f"\nmodel {args.model}, HumanEval's first {len(greedy)} problems, greedy")
    print("| method | pass@1 | tokens | ms / step | vs greedy |")
    print("|---|---:|---:|---:|---:|")
    for method, rows in results.items():
        ratio = statistics.median(r[2] / g[2] for r, g in zip(rows, greedy, strict=True))
        print(f"| {method} | {sum(r[0] for r in rows)}/{len(rows)} | {sum(r[1] for r in rows)} | "
              f"{1000 * statistics.median(r[2] for r in rows):.0f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()

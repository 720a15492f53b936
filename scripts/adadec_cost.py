"""AdaDec's cost per token against greedy decoding, side by side on HumanEval prompts: each prompt is
decoded by greedy decoding and by AdaDec in turn (the completion protocol without a chat template,
HumanEval's stop strings, as `warpdecode eval` runs it).

    PYTHONPATH=. python scripts/adadec_cost.py --path runs/adadec/qwen-coder --problems 2,4,7,11 --threads 1

Prints per prompt the tokens, ms per token and the steps that paused (AdaDec's extra forwards /
(lookahead - 1): a pause costs `lookahead` forwards of k rows instead of one forward of one row), then
the medians over problems and rounds and their ratio. The machine is a shared CPU: compare the ratio, not the milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from warpdecode.data.humaneval import STOP_SEQUENCES, humaneval_problems
from warpdecode.decoding import registry
from warpdecode.decoding.generate import generate
from warpdecode.runtime.load import load_backbones


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--dtype", default="q4")
    parser.add_argument("--path", required=True, help="the adadec package")
    parser.add_argument("--problems", default="0-7", help="HumanEval problem numbers: 0-7 or 2,4,7")
    parser.add_argument("--max-new-tokens", type=int, default=192)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.set_flush_denormal(True)
    backbones, tokenizer = load_backbones(args.model, None, ["torch"], device="cpu", dtype=args.dtype, threads=args.threads)
    model = backbones["torch"]
    rule = registry.build("rule", "adadec", path=args.path)
    numbers = [int(n) for part in args.problems.split(",") for n in
               (range(int(part.split("-")[0]), int(part.split("-")[1]) + 1) if "-" in part else [part])]
    problems = [humaneval_problems(max(numbers) + 1)[n] for n in numbers]
    per_token: dict[str, list[float]] = {"greedy": [], "adadec": []}
    for chosen in (None, rule):  # warm-up: weight packing, first-call allocations
        generate(model, tokenizer, problems[0].prompt, max_new_tokens=4, chat=False, rule=chosen)
    for problem in problems * args.rounds:
        row = []
        for name, chosen in (("greedy", None), ("adadec", rule)):
            start = time.perf_counter()
            out = generate(model, tokenizer, problem.prompt, max_new_tokens=args.max_new_tokens, stop=STOP_SEQUENCES,
                           chat=False, rule=chosen)
            seconds = time.perf_counter() - start
            per_token[name].append(seconds / len(out.token_ids))
            row.append((len(out.token_ids), 1000 * seconds / len(out.token_ids), out.stats.target_forwards))
        (n0, ms0, _), (n1, ms1, f1) = row
        paused = (f1 - (n1 - 1)) / (rule.lookahead - 1)
        print(f"{problem.task_id}: greedy {n0} tokens {ms0:.0f} ms/token | adadec {n1} tokens {ms1:.0f} ms/token, "
              f"~{paused:.0f} pauses", flush=True)
    greedy, adadec = statistics.median(per_token["greedy"]), statistics.median(per_token["adadec"])
    print(f"\nmedian ms/token: greedy {1000 * greedy:.0f}, adadec {1000 * adadec:.0f}, ratio {adadec / greedy:.2f}x")


if __name__ == "__main__":
    main()

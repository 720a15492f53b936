"""In-context navigation against n samples: how different the n answers to one prompt are, and what they cost.

    PYTHONPATH=. python scripts/icn_diversity.py --prompts 8 --n 3 --max-new-tokens 128 --threads 1

For each Spec-Bench writing/roleplay first turn (../shared/datasets), on the default model: `icn:n=N`
greedy (each answer asked for with the earlier ones in the context), `icn:n=N` sampled, and `sample:n=N`
(N samples in one batch) at the same temperature, run back to back per prompt. Prints per configuration
the mean over prompts of the self-BLEU-4 among a prompt's N answers (lower: more different), distinct-2
over all answers, the mean target log-probability per token of the answers (under their own contexts),
tokens and seconds (a loaded machine: read the ratios).
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from warpdecode.bench.prompts import load_prompts
from warpdecode.commands.common import _load_target
from warpdecode.decoding import registry
from warpdecode.decoding.generate import generate
from warpdecode.metrics.open_ended import DistinctN, SelfBLEU, WordIds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer, _, _ = _load_target(None, None, "torch", "cpu", args.threads, "fp32")
    prompts = load_prompts("spec_bench", categories="writing,roleplay")[: args.prompts]
    configs = {f"icn:n={args.n} greedy": (False, "icn"), f"icn:n={args.n} T {args.temperature}": (True, "icn"),
               f"sample:n={args.n} T {args.temperature}": (True, "sample")}
    answers: dict[str, list[list[str]]] = {name: [] for name in configs}
    logprob: dict[str, list[float]] = {name: [] for name in configs}
    tokens = dict.fromkeys(configs, 0)
    seconds = dict.fromkeys(configs, 0.0)
    for i, prompt in enumerate(prompts):
        for name, (sampling, strategy) in configs.items():
            started = time.perf_counter()
            out = generate(target, tokenizer, prompt.text, max_new_tokens=args.max_new_tokens, do_sample=sampling,
                           temperature=args.temperature if sampling else 1.0, seed=i if sampling else None,
                           search=registry.build("search", strategy, n=args.n))
            seconds[name] += time.perf_counter() - started
            answers[name].append([c.text for c in out.sequences])
            logprob[name] += [c.logprob / max(1, len(c.token_ids)) for c in out.sequences]
            tokens[name] += sum(len(c.token_ids) for c in out.sequences)
        print(f"prompt {i + 1}/{len(prompts)} done", flush=True)
    words = WordIds()
    print("| answers | self-BLEU-4 (mean over prompts) | distinct-2 | log-prob / token | tokens | seconds |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in configs:
        bleus = []
        for texts in answers[name]:
            metric = SelfBLEU(4)
            metric.update([words(t) for t in texts])
            value = float(metric.compute())
            if not math.isnan(value):
                bleus.append(value)
        distinct = DistinctN(2)
        distinct.update([words(t) for texts in answers[name] for t in texts])
        print(f"| {name} | {sum(bleus) / max(1, len(bleus)):.3f} | {float(distinct.compute()):.3f} "
              f"| {sum(logprob[name]) / len(logprob[name]):.3f} | {tokens[name]} | {seconds[name]:.1f} |")


if __name__ == "__main__":
    main()

"""RankGen measured on the recipe's held-out pairs (docs/notes/rankgen.md).

`accuracy`: on the validation pairs of `configs/search/rankgen.yaml` (held-out GSM8K train problems, their
negatives read from the recipe's cache), how often the true continuation is ranked first among its own
negatives (all, only the same-document spans, only the target's own sample) by the trained encoder, and, on
the first `--baseline-pairs`, by the target's log-probability of each continuation after the prefix (summed
and per token).

`generate`: continuations of the first `--prompts` held-out prefixes by greedy decoding, nucleus sampling,
best-of-n with the target's log-probability (`best_of_n:n=beams*samples`) and RankGen beam search, interleaved
per prefix: rep-4 and distinct-2 over tokens, the target's perplexity of the continuation, unigram F1 with
the true continuation (its first tokens, as many as the pair holds), the mean RankGen score, tokens the
search sampled and seconds.

    python scripts/rankgen_eval.py accuracy --path runs/rankgen/smollm2.safetensors --baseline-pairs 40
    python scripts/rankgen_eval.py generate --path runs/rankgen/smollm2.safetensors --prompts 20 --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
import yaml

from warpdecode.datamodules.rankgen_pairs import MODEL, RANDOM, Pair, RankGenDataModule
from warpdecode.decoding import registry
from warpdecode.decoding.generate import generate
from warpdecode.metrics.open_ended import DistinctN, RepetitionRate
from warpdecode.models.rankgen import RankGenNet, load_rankgen

RECIPE = Path(__file__).resolve().parents[1] / "configs" / "search" / "rankgen.yaml"


def held_out_pairs() -> tuple[RankGenDataModule, list[Pair]]:
    args = yaml.safe_load(RECIPE.read_text())["data"]["init_args"]
    data = RankGenDataModule(**args)
    data.setup("fit")
    return data, data.pairs["val"]


@torch.inference_mode()
def continuation_logprobs(model: Any, prefix: list[int], continuations: list[list[int]]) -> list[list[float]]:
    """Each continuation's token log-probabilities after `prefix` (one right-padded batch)."""
    width = len(prefix) + max(len(c) for c in continuations)
    rows = [prefix + c + [0] * (width - len(prefix) - len(c)) for c in continuations]
    logprobs = torch.log_softmax(model(torch.tensor(rows)).logits.float(), -1)  # (N, T, V)
    return [[float(logprobs[i, len(prefix) - 1 + j, t]) for j, t in enumerate(c)] for i, c in enumerate(continuations)]


def accuracy(args: argparse.Namespace) -> None:
    data, pairs = held_out_pairs()
    model = data.target
    net = load_rankgen(args.path, model)
    right: Counter[str] = Counter()
    seen: Counter[str] = Counter()
    start = time.perf_counter()
    for i, pair in enumerate(pairs):
        candidates = [pair.positive, *pair.negatives]
        scorers = {"rankgen": net.scores(pair.prefix, candidates)}
        if i < args.baseline_pairs:  # the target reads every candidate: the costly part
            lps = continuation_logprobs(model, pair.prefix, candidates)
            scorers |= {"rankgen_subset": scorers["rankgen"], "logprob_sum": [sum(lp) for lp in lps],
                        "logprob_mean": [sum(lp) / max(1, len(lp)) for lp in lps]}
        for kind_name, kinds in (("all", {RANDOM, MODEL}), ("random", {RANDOM}), ("model", {MODEL})):
            own = [j + 1 for j, k in enumerate(pair.kinds) if k in kinds]
            if not own:
                continue
            for name, scores in scorers.items():
                seen[name, kind_name] += 1
                right[name, kind_name] += scores[0] > max(scores[j] for j in own)
    print(f"{len(pairs)} held-out pairs, {len(pairs[0].negatives)} negatives each, the target's log-probability "
          f"on the first {min(args.baseline_pairs, len(pairs))}, {time.perf_counter() - start:.0f} s")
    for name in ("rankgen", "rankgen_subset", "logprob_sum", "logprob_mean"):
        print(f"{name:>13}: " + "  ".join(f"{k} {right[name, k] / seen[name, k]:.3f} (n={seen[name, k]})"
                                          for k in ("all", "random", "model") if seen[name, k]))


def unigram_f1(generated: list[int], reference: list[int]) -> float:
    common = sum((Counter(generated) & Counter(reference)).values())
    if not common:
        return 0.0
    precision, recall = common / len(generated), common / len(reference)
    return 2 * precision * recall / (precision + recall)


def generation(args: argparse.Namespace) -> None:
    data, pairs = held_out_pairs()
    model = data.target
    net: RankGenNet = load_rankgen(args.path, model)
    sampling = {"do_sample": True, "top_p": args.top_p}
    n = args.beams * args.samples
    methods: dict[str, dict[str, Any]] = {
        "greedy": {},
        "sample": sampling,
        f"best_of_{n}": {**sampling, "search": registry.build("search", "best_of_n", n=n)},
        "rankgen": {**sampling, "search": registry.build("search", "rankgen", path=args.path, beams=args.beams,
                                                         samples=args.samples, chunk=args.chunk)},
    }
    results: dict[str, dict[str, list[float]]] = {m: {} for m in methods}
    texts: dict[str, list[list[int]]] = {m: [] for m in methods}
    prompts = [p for p in pairs if len(p.prefix) >= 16][: args.prompts]
    for i, pair in enumerate(prompts):
        for name, options in methods.items():
            start = time.perf_counter()
            out = generate(model, None, pair.prefix, max_new_tokens=args.max_new_tokens, seed=args.seed + i, **options)
            seconds = time.perf_counter() - start
            tokens = list(out.token_ids)
            texts[name].append(tokens)
            lp = continuation_logprobs(model, pair.prefix, [tokens])[0] if tokens else [0.0]
            values = {"ppl": float(torch.tensor(lp).neg().mean().exp()),
                      "f1": unigram_f1(tokens[: len(pair.positive)], pair.positive),
                      "rankgen": net.scores(pair.prefix, [tokens])[0],
                      "tokens": float(out.stats.search_tokens or len(tokens)), "seconds": seconds}
            for k, v in values.items():
                results[name].setdefault(k, []).append(v)
    print(f"{len(prompts)} held-out prefixes, {args.max_new_tokens} new tokens, top_p {args.top_p}, "
          f"rankgen beams={args.beams} samples={args.samples} chunk={args.chunk}")
    for name, values in results.items():
        rep, distinct = RepetitionRate(4), DistinctN(2)
        rep.update(texts[name])
        distinct.update(texts[name])
        print(f"{name:>12}: rep-4 {float(rep.compute()):.3f}  distinct-2 {float(distinct.compute()):.3f}  "
              + "  ".join(f"{k} {statistics.mean(v):.3f}" for k, v in values.items())
              + f"  median-ppl {statistics.median(values['ppl']):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("accuracy", "generate"))
    parser.add_argument("--path", required=True, help="a trained RankGen encoder file")
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--beams", type=int, default=2)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baseline-pairs", type=int, default=60, help="pairs the target's log-probability ranks")
    args = parser.parse_args()
    torch.set_flush_denormal(True)
    accuracy(args) if args.what == "accuracy" else generation(args)


if __name__ == "__main__":
    main()

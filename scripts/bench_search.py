"""Search strategies measured side by side on the default model (docs/search.md, docs/notes/search.md).

`beam` (default): warpdecode's beam search vs Hugging Face `generate(num_beams=...)` on the same weights and
threads. Each prompt runs ours, then the peer, then ours... (interleaved, after one warm-up pair) so
machine noise hits both alike; the outputs must be identical (all returned sequences), and the ratio of
the summed median times is the number to read.

`first_finish`: First Finish Search vs best-of-N (log-probability scorer) with the same n, seed and GSM8K
questions: tokens spent, wall time and GSM8K accuracy of the answer each returns, beside greedy.

`diverse_beam`: diverse beam search (one beam per group, Hamming penalty `--diversity-penalty`) vs beam
search with as many beams, every beam returned: how alike a prompt's returned sequences are (self-BLEU-4
among them, distinct-2 over them), the mean log-probability per token of the returned sequences, and the
time, prompts interleaved.

    python scripts/bench_search.py --num-beams 4 --max-new-tokens 48 --prompts 6 --repeats 3 --threads 1
    python scripts/bench_search.py --strategy first_finish --n 4 --prompts 10 --max-new-tokens 192
    python scripts/bench_search.py --strategy diverse_beam --num-beams 4 --prompts 8 --max-new-tokens 48
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from warpdecode.bench.answers import final_number
from warpdecode.bench.peers import load_transformers_model
from warpdecode.bench.prompts import gsm8k_test_rows, load_prompts
from warpdecode.decoding import registry
from warpdecode.decoding.generate import encode_prompt, generate
from warpdecode.metrics.open_ended import DistinctN, SelfBLEU
from warpdecode.models.checkpoint import load_pretrained, resolve
from warpdecode.models.named import DEFAULT_MODEL


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", choices=("beam", "first_finish", "diverse_beam"), default="beam")
    parser.add_argument("--diversity-penalty", type=float, default=1.0, help="diverse_beam: Hamming penalty λ")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--n", type=int, default=4, help="first_finish: samples per question")
    parser.add_argument("--temperature", type=float, default=0.7, help="first_finish: sampling temperature")
    parser.add_argument("--num-beams", type=int, default=4)
    parser.add_argument("--num-return-sequences", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--prompts", type=int, default=6, help="half from Spec-Bench (one per category), half HumanEval")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    directory = resolve(args.model)
    model, tokenizer = load_pretrained(directory)
    if args.strategy == "first_finish":
        first_finish(model, tokenizer, args)
        return
    if args.strategy == "diverse_beam":
        diverse_beam(model, tokenizer, args)
        return
    peer = load_transformers_model(directory)
    spec = load_prompts("spec_bench", limit=1)[: (args.prompts + 1) // 2]
    code = load_prompts("humaneval")[: args.prompts // 2]
    prompts = [encode_prompt(tokenizer, p.text, chat=p.chat) for p in spec + code]
    options = {"num_beams": args.num_beams, "num_return_sequences": args.num_return_sequences}

    def ours(ids: list[int]) -> tuple[list[list[int]], float]:
        start = time.perf_counter()
        out = generate(model, tokenizer, ids, max_new_tokens=args.max_new_tokens, **options)
        return [s.token_ids for s in out.sequences], time.perf_counter() - start

    def theirs(ids: list[int]) -> tuple[list[list[int]], float]:
        start = time.perf_counter()
        with torch.inference_mode():
            out = peer.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=0,
                                return_dict_in_generate=True, output_scores=True, **options)
        seconds = time.perf_counter() - start
        lengths = (out.beam_indices >= 0).sum(1).tolist()
        return [out.sequences[i, len(ids) : len(ids) + n].tolist() for i, n in enumerate(lengths)], seconds

    ours(prompts[0]), theirs(prompts[0])  # warm-up
    rows = []
    for i, ids in enumerate(prompts):
        mine, peer_times, my_times = None, [], []
        for _ in range(args.repeats):
            mine, t = ours(ids)
            my_times.append(t)
            ref, t = theirs(ids)
            peer_times.append(t)
        rows.append({"prompt": i, "prompt_tokens": len(ids), "new_tokens": len(mine[0]) if mine else 0,
                     "identical": mine == ref, "ours_s": statistics.median(my_times),
                     "transformers_s": statistics.median(peer_times)})
        r = rows[-1]
        print(f"prompt {i}: {r['prompt_tokens']:4d} + {r['new_tokens']:3d} tokens  ours {r['ours_s']:.2f} s  "
              f"transformers {r['transformers_s']:.2f} s  x{r['transformers_s'] / r['ours_s']:.2f}  "
              f"identical {r['identical']}", flush=True)
    total = sum(r["transformers_s"] for r in rows) / sum(r["ours_s"] for r in rows)
    print(f"num_beams={args.num_beams} threads={args.threads}: warpdecode is {total:.2f}x transformers "
          f"(summed medians), outputs identical on {sum(r['identical'] for r in rows)}/{len(rows)} prompts")
    if args.json:
        print(json.dumps(rows))


def first_finish(model: Any, tokenizer: Any, args: argparse.Namespace) -> None:
    """FFS vs best-of-N vs greedy on GSM8K questions: tokens spent, seconds, correct answers."""
    rows = gsm8k_test_rows()[: args.prompts]
    totals = {name: {"tokens": 0, "seconds": 0.0, "correct": 0} for name in ("greedy", "best_of_n", "first_finish")}
    for i, row in enumerate(rows):
        reference = row["answer"].split("####")[-1].strip().replace(",", "")
        runs = {"greedy": {}, **{name: {"do_sample": True, "temperature": args.temperature, "seed": i,
                                        "search": registry.build("search", name, n=args.n)}
                                 for name in ("best_of_n", "first_finish")}}
        line = []
        for name, options in runs.items():
            out = generate(model, tokenizer, row["question"], max_new_tokens=args.max_new_tokens, **options)
            spent = out.stats.search_tokens or out.stats.new_tokens
            correct = final_number(out.text) == reference
            totals[name]["tokens"] += spent
            totals[name]["seconds"] += out.stats.seconds
            totals[name]["correct"] += correct
            line.append(f"{name} {spent:4d} tok {out.stats.seconds:5.1f} s {'ok' if correct else '--'}")
        print(f"q{i}: " + "  ".join(line), flush=True)
    for name, t in totals.items():
        print(f"{name:>12}: {t['tokens']:6d} tokens  {t['seconds']:7.1f} s  {t['correct']}/{len(rows)} correct")
    print(f"first_finish spent {totals['first_finish']['tokens'] / totals['best_of_n']['tokens']:.2f}x best_of_n's "
          f"tokens and {totals['first_finish']['seconds'] / totals['best_of_n']['seconds']:.2f}x its time (n={args.n})")
    if args.json:
        print(json.dumps(totals))


def diverse_beam(model: Any, tokenizer: Any, args: argparse.Namespace) -> None:
    """Diverse beam search (G = num_beams groups of one beam) vs beam search, every beam returned."""
    spec = load_prompts("spec_bench", limit=1)[: (args.prompts + 1) // 2]
    code = load_prompts("humaneval")[: args.prompts // 2]
    prompts = [encode_prompt(tokenizer, p.text, chat=p.chat) for p in spec + code]
    beams = args.num_beams
    configs = {"beam": {"num_beams": beams},
               "diverse_beam": {"num_beams": beams, "num_beam_groups": beams, "diversity_penalty": args.diversity_penalty}}
    totals = {name: {"self_bleu": [], "distinct2": [], "logprob": [], "seconds": 0.0} for name in configs}
    for ids in prompts:
        for name, options in configs.items():
            out = generate(model, tokenizer, ids, max_new_tokens=args.max_new_tokens, num_return_sequences=beams,
                           **options)
            seqs = [s.token_ids for s in out.sequences]
            bleu, distinct = SelfBLEU(4), DistinctN(2)
            bleu.update(seqs)
            distinct.update(seqs)
            totals[name]["self_bleu"].append(float(bleu.compute()))
            totals[name]["distinct2"].append(float(distinct.compute()))
            totals[name]["logprob"].append(statistics.mean(s.logprob / max(1, len(s.token_ids))
                                                           for s in out.sequences))
            totals[name]["seconds"] += out.stats.seconds
    for name, t in totals.items():
        print(f"{name:>12}: self-BLEU-4 among a prompt's beams {statistics.mean(t['self_bleu']):.3f}  distinct-2 "
              f"{statistics.mean(t['distinct2']):.3f}  log-prob/token {statistics.mean(t['logprob']):.3f}  "
              f"{t['seconds']:.1f} s")
    print(f"diverse_beam took {totals['diverse_beam']['seconds'] / totals['beam']['seconds']:.2f}x beam's time "
          f"({beams} beams, λ {args.diversity_penalty}, {len(prompts)} prompts)")
    if args.json:
        print(json.dumps(totals))


if __name__ == "__main__":
    main()

"""Beam search, warpdecode vs Hugging Face `generate(num_beams=...)`, on the same weights and threads.

Each prompt runs ours, then the peer, then ours... (interleaved, after one warm-up pair) so machine noise
hits both alike; the outputs must be identical (all returned sequences), and the ratio of the summed
median times is the number to read.

    python scripts/bench_beam.py --num-beams 4 --max-new-tokens 48 --prompts 6 --repeats 3 --threads 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from warpdecode.bench.peers import load_transformers_model
from warpdecode.bench.prompts import load_prompts
from warpdecode.decoding.generate import encode_prompt, generate
from warpdecode.models.checkpoint import load_pretrained, resolve
from warpdecode.models.named import DEFAULT_MODEL


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
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


if __name__ == "__main__":
    main()

"""Plain greedy decoding, warpdecode vs Hugging Face `generate()`, on the same weights in one process.

Runs are interleaved (ours, peer, ours, peer, ...) after a warm-up so machine noise hits both
alike; the ratio is the number to read. With `--random-init CONFIG` the weights are random (for
machines without the default model's package): speed does not depend on the weight values.

    python -m warpdecode.bench.vs_transformers --model smollm2-135m-instruct --max-new-tokens 64
    python -m warpdecode.bench.vs_transformers --random-init configs/models/smollm2-135m-instruct.json --device cuda
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from warpdecode.bench.peers import TransformersGenerate
from warpdecode.decoding.generate import encode_prompt, generate
from warpdecode.models.checkpoint import load_pretrained, resolve, save_pretrained
from warpdecode.models.device import synchronize, torch_device
from warpdecode.models.importers.hf import config_from_hf
from warpdecode.models.tokenizer import Tokenizer
from warpdecode.models.transformer import Transformer

PROMPTS = [
    "Explain in detail how a hash table handles collisions.",
    "Write a Python function that checks whether a string is a palindrome.",
    "What are the main causes of the French Revolution?",
    "Summarize the plot of Romeo and Juliet in a few sentences.",
]


@dataclass
class Row:
    prompt: int
    new_tokens: int
    ours_tokens_per_second: float
    peer_tokens_per_second: float
    identical: bool

    @property
    def speedup(self) -> float:
        return self.ours_tokens_per_second / self.peer_tokens_per_second


def _timed_ours(model: Transformer, tokenizer: Tokenizer | None, ids: list[int], n: int) -> tuple[list[int], float]:
    synchronize(model.embed.weight.device)
    out = generate(model, tokenizer, ids, max_new_tokens=n)
    return out.token_ids, out.stats.seconds


def run(args: argparse.Namespace) -> list[Row]:
    torch.manual_seed(0)
    workdir = None
    if args.random_init:
        config = config_from_hf(json.loads(Path(args.random_init).read_text()))
        model = Transformer(config)
        model.init_weights()
        workdir = tempfile.TemporaryDirectory()
        model_dir = Path(workdir.name)
        save_pretrained(model, None, model_dir)
        tokenizer: Tokenizer | None = None
        gen = torch.Generator().manual_seed(0)
        prompts = [torch.randint(3, config.vocab_size, (args.prompt_tokens,), generator=gen).tolist() for _ in PROMPTS]
    else:
        model_dir = resolve(args.model)
        model, tokenizer = load_pretrained(model_dir)
        prompts = [encode_prompt(tokenizer, p, chat=None) for p in PROMPTS]
    device = torch_device(args.device)
    model = model.to(device).eval()
    peer = TransformersGenerate(model_dir, device=args.device)

    def peer_run(ids: list[int]) -> tuple[list[int], float]:
        synchronize(device)
        result = peer.generate(ids, args.max_new_tokens)
        return result.token_ids, result.seconds

    _timed_ours(model, tokenizer, prompts[0], 8)  # warm-up both paths
    peer_run(prompts[0])
    rows = []
    for i, ids in enumerate(prompts):
        ours_t, peer_t = [], []
        for _ in range(args.repeats):
            ours_tokens, seconds = _timed_ours(model, tokenizer, ids, args.max_new_tokens)
            ours_t.append(len(ours_tokens) / seconds)
            peer_tokens, seconds = peer_run(ids)
            peer_t.append(len(peer_tokens) / seconds)
        rows.append(Row(i, len(ours_tokens), statistics.median(ours_t), statistics.median(peer_t),
                        ours_tokens == peer_tokens))
    if workdir is not None:
        workdir.cleanup()
    return rows


def report(rows: list[Row], device: str, threads: int) -> str:
    lines = [
        f"device: {device}, torch threads: {threads}, torch {torch.__version__}",
        "",
        "| prompt | new tokens | warpdecode tok/s | transformers tok/s | ratio | identical |",
        "|---:|---:|---:|---:|---:|:---:|",
    ]
    for r in rows:
        lines.append(f"| {r.prompt} | {r.new_tokens} | {r.ours_tokens_per_second:.1f} | "
                     f"{r.peer_tokens_per_second:.1f} | {r.speedup:.2f}x | {'yes' if r.identical else 'NO'} |")
    ratio = statistics.median(r.speedup for r in rows)
    lines.append(f"\nmedian ratio warpdecode / transformers: {ratio:.2f}x")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--random-init", help="HF config.json to instantiate with random weights instead of --model")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=32, help="prompt length with --random-init")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args()
    torch.set_flush_denormal(True)
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    rows = run(args)
    print(report(rows, args.device, torch.get_num_threads()))
    print(f"({time.perf_counter() - start:.0f} s)")
    if args.out:
        args.out.write_text(json.dumps([asdict(r) | {"speedup": r.speedup} for r in rows], indent=2))


if __name__ == "__main__":
    main()

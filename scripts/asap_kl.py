"""ASAp vs masking on a small grammar whose exact conditional can be enumerated: KL to it vs samples.

    python scripts/asap_kl.py [--regex '[a-c]{1,3}x|b{4}'] [--samples 2000] [--seeds 5] [--plot docs/notes/asap-kl.png]

The model is the tests' 64-token random target (tests/tiny_models.py `greedy_target`) with its logits
scaled by `--sharpen` (a peaked model makes masking's bias visible), on the tests' character
tokenizer, after the prompt `--prompt`. The grammar is a regex with a finite language: every string
(and its stop token) is enumerated, giving the exact conditional P(s | s in L) = P(s) / P(L).

For n = 1 ... `--samples` it reports, averaged over `--seeds`:

* KL(samples || exact): the empirical distribution of the first n samples against the exact
  conditional, for masking (each token from the model restricted to the allowed ones) and for ASAp
  (`decoding/constraints/asap.py`, estimates corrected after every sample);
* KL(sampler || exact): the distribution the next sample comes from, exactly (enumerated): constant
  for masking, ASAp's after n corrections.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

from warpdecode.decoding.constraints.asap import ASAp, exact_conditional, kl, masked_policy
from warpdecode.decoding.constraints.formats import compile_response_format
from warpdecode.models.tokenizer import char_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from tiny_models import greedy_target

ALPHABET = '{}[]":,.-+ 0123456789abcdefghijklmnopqrstuvwxyz'
ALPHABET += "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[: 62 - len(ALPHABET)]  # tests/decoding/test_constraints.py's


def empirical_kl(counts: dict[tuple[int, ...], int], n: int, exact: dict[tuple[int, ...], float]) -> float:
    return sum(c / n * math.log(c / n / exact[s]) for s, c in counts.items() if c)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--regex", default="[a-c]{1,3}x|b{4}")
    parser.add_argument("--prompt", default="ab ba")
    parser.add_argument("--sharpen", type=float, default=3.0)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer, model = char_tokenizer(ALPHABET), greedy_target()
    prompt = tokenizer.encode(args.prompt)
    memo: dict[tuple[int, ...], torch.Tensor] = {}

    def next_probs(prefix: tuple[int, ...]) -> torch.Tensor:
        if prefix not in memo:
            with torch.inference_mode():
                logits = model(torch.tensor([prompt + list(prefix)])).logits[0, -1]
            memo[prefix] = torch.softmax(logits.double() * args.sharpen, -1)
        return memo[prefix]

    grammar = compile_response_format({"type": "regex", "regex": args.regex}, tokenizer, vocab_size=64,
                                      stop_ids={tokenizer.eos_token_id})
    exact = exact_conditional(grammar.state(), next_probs)
    masked = exact_conditional(grammar.state(), next_probs, policy=masked_policy(next_probs))
    strings, masked_probs = list(masked), torch.tensor(list(masked.values()))
    print(f"{len(exact)} strings; KL(masked || exact) = {kl(masked, exact):.4f} nats")
    checkpoints = sorted({round(10 ** (k / 8)) for k in range(int(8 * math.log10(args.samples)) + 1)} | {args.samples})
    curves: dict[str, list[float]] = {name: [0.0] * len(checkpoints) for name in
                                      ("masking samples", "ASAp samples", "ASAp sampler")}
    for seed in range(args.seeds):
        generator = torch.Generator().manual_seed(seed)
        asap = ASAp(grammar.state(), next_probs)
        counts: dict[str, dict[tuple[int, ...], int]] = {"masking samples": {}, "ASAp samples": {}}
        for n in range(1, args.samples + 1):
            drawn = strings[int(torch.multinomial(masked_probs, 1, generator=generator))]
            counts["masking samples"][drawn] = counts["masking samples"].get(drawn, 0) + 1
            path = tuple(asap.sample(generator))
            counts["ASAp samples"][path] = counts["ASAp samples"].get(path, 0) + 1
            if n in checkpoints:
                i = checkpoints.index(n)
                for name in ("masking samples", "ASAp samples"):
                    curves[name][i] += empirical_kl(counts[name], n, exact) / args.seeds
                current = exact_conditional(grammar.state(), next_probs, policy=asap.distribution)
                curves["ASAp sampler"][i] += kl(current, exact) / args.seeds
    print("| samples | KL(masking samples ‖ exact) | KL(ASAp samples ‖ exact) | KL(ASAp sampler ‖ exact) |")
    print("|---:|---:|---:|---:|")
    for i, n in enumerate(checkpoints):
        print(f"| {n} | {curves['masking samples'][i]:.4f} | {curves['ASAp samples'][i]:.4f} | {curves['ASAp sampler'][i]:.4f} |")
    if args.plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for name, style in (("masking samples", "-"), ("ASAp samples", "-"), ("ASAp sampler", "--")):
            ax.plot(checkpoints, curves[name], style, label=f"KL({name} ‖ exact)")
        ax.axhline(kl(masked, exact), color="grey", linestyle=":", label="KL(masking sampler ‖ exact)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("samples")
        ax.set_ylabel("KL (nats)")
        ax.set_title(f"/{args.regex}/, tiny random model, mean of {args.seeds} seeds", fontsize=10)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()

"""Multi-draft acceptance diagnostic: each scheme against the optimal rate, on small vocabularies.

With k i.i.d. drafts X_1..X_k ~ q and a target p, a lossless verifier emits Y ~ p and accepts a
draft when Y ∈ {X_i}. The best any verifier can do is the optimal transport value

    max P(Y ∈ {X_1..X_k}) = min over token sets T of [ p(T) + 1 - q(T)^k ]

(max-flow / min-cut between draft multisets and tokens), computable by enumerating the 2^V sets
of a small vocabulary. This module computes it exactly next to the exact acceptance of SpecInfer's
recursive rejection (`speculative_sampling`) and SpecTr's k-sequential selection (`spectr`):

    python -m warpdecode.bench.multidraft --vocab 8 --drafts 2,3,4 --pairs 200
"""

from __future__ import annotations

import argparse
import itertools
import statistics

import torch
from torch import Tensor

from warpdecode.decoding.verifiers.spectr import accepted_mass, smallest_valid_rho
from warpdecode.decoding.verifiers.speculative_sampling import residual

MAX_VOCAB = 16


def optimal_acceptance(p: Tensor, q: Tensor, k: int) -> float:
    """min over token sets T of p(T) + 1 - q(T)^k, for (V,) p and q with V <= 16."""
    V = p.shape[0]
    if V > MAX_VOCAB:
        raise ValueError(f"optimal acceptance enumerates 2^V sets; V={V} > {MAX_VOCAB}")
    masks = torch.tensor(list(itertools.product((0.0, 1.0), repeat=V)), dtype=torch.float64)  # (2^V, V)
    return float((masks @ p.double() + 1 - (masks @ q.double()) ** k).min())


def specinfer_acceptance(p: Tensor, q: Tensor, k: int) -> float:
    """Exact: step i accepts with a_i = Σ min(q, p_i), p_{i+1} = norm(max(p_i - q, 0)) (independent of the draws)."""
    rejected, current = 1.0, p.double()
    for _ in range(k):
        rejected *= 1 - float(torch.minimum(q.double(), current).sum())
        current = residual(current, q.double())
    return 1 - rejected


def spectr_acceptance(p: Tensor, q: Tensor, k: int) -> float:
    """Exact: 1 - (1 - β(ρ*))^k with ρ* the smallest valid ρ."""
    kept, _ = accepted_mass(p.double(), q.double(), smallest_valid_rho(p.double(), q.double(), k), k)
    return 1 - (1 - float(kept.sum())) ** k


def compare(vocab: int, drafts: list[int], pairs: int, scale: float, seed: int) -> list[dict[str, float]]:
    """Mean acceptance per scheme over random (p, q) pairs (softmax of Gaussian logits × scale)."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    samples = [(torch.softmax(torch.randn(vocab, generator=gen) * scale, -1),
                torch.softmax(torch.randn(vocab, generator=gen) * scale, -1)) for _ in range(pairs)]
    for k in drafts:
        opt = [optimal_acceptance(p, q, k) for p, q in samples]
        row = {"k": k, "single draft": statistics.mean(specinfer_acceptance(p, q, 1) for p, q in samples),
               "specinfer": statistics.mean(specinfer_acceptance(p, q, k) for p, q in samples),
               "spectr": statistics.mean(spectr_acceptance(p, q, k) for p, q in samples),
               "optimal": statistics.mean(opt)}
        rows.append(row)
    return rows


def table(rows: list[dict[str, float]]) -> str:
    lines = ["| drafts k | single draft | SpecInfer (recursive) | SpecTr (k-seq) | optimal | SpecInfer / optimal | SpecTr / optimal |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['k']} | {r['single draft']:.3f} | {r['specinfer']:.3f} | {r['spectr']:.3f} | {r['optimal']:.3f} | "
                     f"{r['specinfer'] / r['optimal']:.3f} | {r['spectr'] / r['optimal']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=8)
    parser.add_argument("--drafts", default="2,3,4", help="comma-separated numbers of i.i.d. drafts")
    parser.add_argument("--pairs", type=int, default=200, help="random (p, q) pairs averaged")
    parser.add_argument("--scale", type=float, default=1.5, help="logit scale: larger = peakier distributions")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = compare(args.vocab, [int(k) for k in args.drafts.split(",")], args.pairs, args.scale, args.seed)
    print(f"vocabulary {args.vocab}, {args.pairs} random (p, q) pairs, logit scale {args.scale}, seed {args.seed}\n")
    print(table(rows))


if __name__ == "__main__":
    main()

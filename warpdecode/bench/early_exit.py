"""How much of the model could an early exit skip? Top-1 agreement of exits along the target's answers.

Early-exit self-speculation (LayerSkip, Kangaroo) and the exit policies that go with it (CALM-style
confidence exits, learned exit classifiers) draft a token from a block's output through the final
norm and the LM head. Before training such a policy, measure what it could choose from: for every
block l, the share of answer positions where the exit after block l gives the full model's token,
and, at a few blocks, that share among the positions where the exit is confident (top-1 probability
above a threshold) with the share of positions that is. An exit after block l costs about l / L of a
step; it pays as a drafter only where its agreement is well above that fraction.

    python -m warpdecode.bench.early_exit --answers 48 --out runs/early-exit

Answers: the target's greedy answers of the drafter recipes' self-distillation cache (val split,
regenerated when missing). Writes results.json and results.md under `--out`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from warpdecode.datamodules.self_distill import Example
from warpdecode.errors import ConfigError
from warpdecode.models.transformer import Transformer

THRESHOLDS = (0.5, 0.8, 0.9)


@torch.inference_mode()
def exit_agreement(target: Transformer, examples: Sequence[Example], confidence_blocks: Sequence[int],
                   thresholds: Sequence[float] = THRESHOLDS) -> dict[str, Any]:
    """`agreement[l - 1]`: share of answer positions where the exit after block l (1..L) predicts the
    full model's token; `confident[l][t]`: (share of positions whose exit-l top-1 probability exceeds
    t, agreement among them) for each block of `confidence_blocks`; `positions`: how many."""
    L = target.config.n_layer
    if not set(confidence_blocks) <= set(range(1, L + 1)):
        raise ConfigError(f"confidence blocks must be in 1..{L}, got {list(confidence_blocks)}")
    hits = torch.zeros(L)
    confidence: dict[int, list[torch.Tensor]] = {b: [] for b in confidence_blocks}
    total = 0
    for example in tqdm(examples, desc="early exits", unit="answer", disable=None):
        tokens = torch.from_numpy(example.tokens.astype("int64"))[None]
        start = example.prompt_length - 1
        if tokens.shape[1] - 1 <= start:
            continue
        out = target(tokens, hidden_layers=tuple(range(1, L + 1)))
        final = out.logits[0, start:-1].argmax(-1)  # (A,)
        for block in range(1, L + 1):
            hidden = out.hidden_states[block][0, start:-1]
            logits = target.head(hidden if block == L else target.norm(hidden))
            agrees = logits.argmax(-1) == final
            hits[block - 1] += agrees.sum()
            if block in confidence:
                top = logits.float().softmax(-1).max(-1).values
                confidence[block].append(torch.stack([top, agrees.float()], dim=1))
        total += final.numel()
    if total == 0:
        raise ConfigError("no answer position to measure (the examples hold no answer)")
    confident: dict[int, dict[float, tuple[float, float]]] = {}
    for block, rows in confidence.items():
        table = torch.cat(rows)
        confident[block] = {}
        for threshold in thresholds:
            chosen = table[:, 0] > threshold
            share = float(chosen.float().mean())
            confident[block][threshold] = (share, float(table[chosen, 1].mean()) if chosen.any() else float("nan"))
    return {"positions": total, "agreement": (hits / total).tolist(), "confident": confident}


def markdown(result: dict[str, Any], n_layer: int) -> str:
    lines = [f"{result['positions']} answer positions.", "", "| exit after block | share of the blocks | top-1 agreement |",
             "|---:|---:|---:|"]
    lines += [f"| {b} | {b / n_layer:.0%} | {a:.3f} |" for b, a in enumerate(result["agreement"], start=1)]
    lines += ["", "| exit after block | top-1 probability > | share of positions | agreement there |", "|---:|---:|---:|---:|"]
    for block, table in result["confident"].items():
        lines += [f"| {block} | {t} | {share:.2f} | {agree:.3f} |" for t, (share, agree) in table.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--answers", type=int, default=48, help="answers of the val split to measure")
    parser.add_argument("--blocks", default="20,24,26,28", help="blocks whose confident exits to tabulate")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.answers < 1:
        parser.error("--answers must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    from warpdecode.datamodules.self_distill import SelfDistillDataModule
    from warpdecode.models.checkpoint import load_pretrained

    try:
        blocks = [int(b) for b in args.blocks.split(",") if b.strip()]
        data = SelfDistillDataModule(args.model, max_prompts=2048)  # the drafter recipes' cache
        data.prepare_data()
        data.setup("validate")
        target, _ = load_pretrained(args.model)
        result = exit_agreement(target, data.datasets["val"].examples[: args.answers], blocks)
    except (ConfigError, ValueError) as e:
        parser.exit(2, f"error: {e}\n")
    text = markdown(result, target.config.n_layer)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
        (args.out / "results.md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()

"""Cost per token and open-ended text statistics of the decoding rules and hooks against greedy decoding,
side by side: every configuration decodes each prompt in turn, rounds interleaved, on the default model.

    PYTHONPATH=. python scripts/rule_costs.py --prompts 4 --max-new-tokens 64 --rounds 2 --threads 1
    PYTHONPATH=. python scripts/rule_costs.py --set open-ended --prompts 8 --max-new-tokens 256 --rounds 1

Prompts: the first turns of Spec-Bench's writing and roleplay questions (../shared/datasets). Prints one
markdown row per configuration: ms per token, its ratio to greedy's (medians over prompts and rounds),
distinct-2 / distinct-3 and rep-4 of the generated tokens (`metrics/open_ended.py`); `--set open-ended`
(the rules against greedy and top-p) adds the median of the per-prompt ratios to greedy on the same
prompt (paired, steadier on a loaded machine), self-BLEU-4 across the prompts' outputs and the target's
perplexity of its own text (teacher forced after the prompt, pooled over tokens).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from warpdecode.data.datasets import dataset_file
from warpdecode.decoding import registry
from warpdecode.decoding.generate import encode_prompt, generate
from warpdecode.metrics.open_ended import DistinctN, RepetitionRate, SelfBLEU
from warpdecode.models.checkpoint import load_pretrained, resolve
from warpdecode.models.named import DEFAULT_MODEL


def identity_processor(input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """A caller's processor that reads its input and changes nothing: the hook's own overhead."""
    scores[0, int(input_ids[0, -1])] += 0.0
    return scores


CONFIGS: dict[str, dict[str, Any]] = {
    "greedy": {},
    "greedy + logits_processor": {"logits_processor": [identity_processor]},
    "greedy + stop (never met)": {"stop": ["\u2603\u2603"]},
    "greedy + bad_words_ids (5 words)": {"bad_words": ["very", "really", "just", "Hawaii", "the best"]},
    "prompt_lookup": {"method": "prompt_lookup"},
    "prompt_lookup + logits_processor": {"method": "prompt_lookup", "logits_processor": [identity_processor]},
    "top-p 0.9, T 0.8": {"do_sample": True, "temperature": 0.8, "top_p": 0.9, "seed": 0},
    "contrastive (alpha 0.6, k 4)": {"penalty_alpha": 0.6, "top_k": 4},
    "mirostat v2 (tau 5, eta 0.1), T 0.8": {"mirostat": 2, "do_sample": True, "temperature": 0.8, "seed": 0},
}

OPEN_ENDED: dict[str, dict[str, Any]] = {
    "greedy": {},
    "top-p 0.95": {"do_sample": True, "top_p": 0.95, "seed": 0},
    "top-p 0.95, T 0.8": {"do_sample": True, "temperature": 0.8, "top_p": 0.95, "seed": 0},
    "contrastive (alpha 0.6, k 4)": {"penalty_alpha": 0.6, "top_k": 4},
    "momentum (alpha 0.2, k 5, linear)": {"rule": "momentum"},
    "mirostat v2 (tau 5, eta 0.1), T 0.8": {"mirostat": 2, "do_sample": True, "temperature": 0.8, "seed": 0},
    "cntp (10 trials, H 0.01-1.5), T 0.8, top-p 0.95": {"rule": "cntp", "do_sample": True, "temperature": 0.8,
                                                        "top_p": 0.95, "seed": 0},
}


@torch.inference_mode()
def text_nll(model: Any, prompt: list[int], new: list[int]) -> tuple[float, int]:
    """The target's summed NLL of `new` after `prompt` (teacher forced, no warpers), and its length."""
    if not new:
        return 0.0, 0
    logits = model(torch.tensor([prompt + new]), logits_slice=slice(len(prompt) - 1, len(prompt) + len(new) - 1)).logits
    return float(torch.nn.functional.cross_entropy(logits[0].float(), torch.tensor(new), reduction="sum")), len(new)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--first", type=int, default=0, help="index of the first prompt (to split a run over processes)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--set", choices=["hooks", "open-ended"], default="hooks")
    parser.add_argument("--dump", help="write the outputs and timings so far to this JSON after every prompt")
    parser.add_argument("--from-dump", nargs="+", help="print the table of such JSONs (the prompts they hold, "
                        "pooled) instead of running")
    args = parser.parse_args()
    torch.set_flush_denormal(True)
    torch.set_num_threads(args.threads)
    model, tokenizer = load_pretrained(resolve(DEFAULT_MODEL))
    assert tokenizer is not None
    rows = [json.loads(line) for line in dataset_file("spec_bench/question.jsonl").read_text().splitlines()]
    turns = [r["turns"][0] for r in rows if r["category"] in ("writing", "roleplay")]
    every = [encode_prompt(tokenizer, t, chat=True) for t in turns]
    prompts = every[args.first : args.first + args.prompts]
    bad = [tokenizer.encode(" " + w, add_special_tokens=False) for w in CONFIGS["greedy + bad_words_ids (5 words)"]["bad_words"]]
    configs = CONFIGS if args.set == "hooks" else OPEN_ENDED
    calls: dict[str, Callable[[list[int]], Any]] = {}
    for name, kwargs in configs.items():
        options = {k: v for k, v in kwargs.items() if k != "bad_words"} | ({"bad_words_ids": bad} if "bad_words" in kwargs else {})
        if "rule" in options:
            options["rule"] = registry.build("rule", options["rule"])
        calls[name] = lambda ids, o=options: generate(model, tokenizer, ids, max_new_tokens=args.max_new_tokens, **o)
    if args.from_dump:
        per_token, outputs = {name: [] for name in configs}, {name: [] for name in configs}
        prompts = []
        for path in args.from_dump:
            done = json.loads(Path(path).read_text())
            prompts += every[done["first"] : done["first"] + len(done["outputs"]["greedy"])]
            for name in configs:
                per_token[name] += done["per_token"][name]
                outputs[name] += done["outputs"][name]
    else:
        per_token, outputs = run(calls, prompts, args.rounds, args.dump, args.first)
    report(model, prompts, list(configs), per_token, outputs, open_ended=args.set == "open-ended")


def run(calls: dict[str, Callable[[list[int]], Any]], prompts: list[list[int]], rounds: int,
        dump: str | None, first: int) -> tuple[dict[str, list[float]], dict[str, list[list[int]]]]:
    """Seconds per token of every call on every prompt (prompts outer, calls inner, `rounds` times) and
    the first round's outputs."""
    for call in calls.values():  # warm-up
        call(prompts[0][:8])
    per_token: dict[str, list[float]] = {name: [] for name in calls}
    outputs: dict[str, list[list[int]]] = {name: [] for name in calls}
    for round_ in range(rounds):
        for ids in prompts:
            for name, call in calls.items():
                start = time.perf_counter()
                out = call(ids)
                per_token[name].append((time.perf_counter() - start) / len(out.token_ids))
                if round_ == 0:
                    outputs[name].append(out.token_ids)
            if dump:
                Path(dump).write_text(json.dumps({"first": first, "per_token": per_token, "outputs": outputs}))
    return per_token, outputs


def report(model: Any, prompts: list[list[int]], names: list[str], per_token: dict[str, list[float]],
           outputs: dict[str, list[list[int]]], *, open_ended: bool) -> None:
    base = statistics.median(per_token["greedy"])
    extra = " paired vs greedy | self-BLEU-4 | perplexity | tokens |" if open_ended else ""
    print("| configuration | ms / token | vs greedy | distinct-2 | distinct-3 | rep-4 |" + extra)
    print("|---|---|---|---|---|---|" + "---|" * extra.count("|"))
    for name in names:
        metrics = [DistinctN(2), DistinctN(3), RepetitionRate(4)]
        for metric in metrics:
            metric.update(outputs[name])
        d2, d3, r4 = (float(m.compute()) for m in metrics)
        ms = statistics.median(per_token[name])
        row = f"| {name} | {ms * 1000:.1f} | {ms / base:.2f}x | {d2:.3f} | {d3:.3f} | {r4:.3f} |"
        if open_ended:
            paired = statistics.median(a / b for a, b in zip(per_token[name], per_token["greedy"], strict=True))
            row += f" {paired:.2f}x |"
            bleu = SelfBLEU(4)
            bleu.update(outputs[name])
            nll = [text_nll(model, ids, new) for ids, new in zip(prompts, outputs[name], strict=True)]
            count = sum(n for _, n in nll)
            row += f" {float(bleu.compute()):.3f} | {math.exp(sum(x for x, _ in nll) / count):.2f} | {count} |"
        print(row, flush=True)


if __name__ == "__main__":
    main()

"""Constrained against free diffusion decoding of a trained diffusion LM on the verifiable tasks:
validity, accuracy, steps and speed, interleaved.

Every task of `data/parallel_tasks.py` gets the grammar its answers follow (`task_format`: a task-wide
regex or Lark grammar for the digit and bracket tasks, a regex built from the prompt's letters for the
letter tasks); every reference answer of the evaluation examples is checked to be in its grammar
before decoding. Each commit policy decodes each evaluation example alone, free and constrained, the
order of the two alternating from example to example, and a markdown table reports per policy and
task: valid answers (ended with end-of-text inside the region, in the grammar), accuracy (the task's
checker), mean steps, and answer-region tokens per second of the constrained decode relative to the
free one (free seconds / constrained seconds, summed over the examples).

    python scripts/constrained_diffusion_eval.py --model runs/dlm-tasks/model [--limit 100] [--threads 1]
"""

from __future__ import annotations

import argparse
import re
import string
import time
from dataclasses import dataclass
from typing import Any

import torch

from warpdecode.bench.diffusion import PolicySpec
from warpdecode.bench.specs import parse_method
from warpdecode.data.parallel_tasks import EVAL_SEED, TaskExample, example, task_names
from warpdecode.decoding.constraints.formats import compile_response_format
from warpdecode.decoding.diffusion.decoder import diffusion_generate
from warpdecode.models.backbone import Backbone
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.models.tokenizer import Tokenizer

POLICIES = "fixed:eot_stop=true,threshold:eot_stop=true,fixed:tokens_per_step=2:eot_stop=true,prophet:eot_stop=true"
CLOSERS = 'start: c+\nc: ")" | "]" | "}"'
SORTED_DIGITS = "|".join(f"{d}+" + "".join(f"{e}*" for e in string.digits[i + 1:]) for i, d in enumerate(string.digits))
"""Non-empty digit strings in ascending order: `0+1*2*…9*|1+2*…9*|…|9+`."""


def task_format(ex: TaskExample) -> tuple[dict[str, Any], str]:
    """The response format an answer of `ex` follows and a Python regex of the same language.

    * `add`: a sum of two numbers below 10^4, no leading zero: `0|[1-9][0-9]{0,4}`;
    * `sort`: ascending digits (`SORTED_DIGITS`);
    * `close`: closing brackets, the Lark grammar `start: c+` of `)`, `]`, `}`;
    * `copy`, `reverse`, `perm`: as many characters as the payload, each one of the payload's;
    * `fill`: the payload with every blank `_` a letter.
    """
    if ex.task == "add":
        regex = "0|[1-9][0-9]{0,4}"
    elif ex.task == "sort":
        regex = SORTED_DIGITS
    elif ex.task == "close":
        return {"type": "grammar", "grammar": CLOSERS}, r"[)\]}]+"
    elif ex.task in ("copy", "reverse", "perm"):
        regex = f"[{''.join(sorted(set(ex.payload)))}]{{{len(ex.payload)}}}"
    elif ex.task == "fill":
        regex = "".join("[a-z]" if c == "_" else c for c in ex.payload)
    else:
        raise ValueError(f"no grammar for task {ex.task!r}")
    return {"type": "regex", "regex": regex}, regex


def in_grammar(ex: TaskExample, text: str) -> bool:
    return re.fullmatch(task_format(ex)[1], text) is not None


def check_references(examples: list[TaskExample]) -> None:
    """Every reference answer is in its example's grammar (AssertionError otherwise)."""
    for ex in examples:
        assert in_grammar(ex, ex.answer), f"{ex.prompt}{ex.answer} is not in its grammar {task_format(ex)[1]}"


@dataclass
class Tally:
    """One policy on one task, free or constrained."""
    valid: int = 0
    correct: int = 0
    steps: int = 0
    seconds: float = 0.0
    examples: int = 0

    def add(self, ex: TaskExample, text: str, ended: bool, steps: int, seconds: float) -> None:
        self.valid += ended and in_grammar(ex, text)
        self.correct += ex.correct(text)
        self.steps += steps
        self.seconds += seconds
        self.examples += 1


def evaluate(model: Backbone, tokenizer: Tokenizer, examples: list[TaskExample], policies: list[str], *,
             gen_length: int = 16, block_length: int = 8) -> dict[tuple[str, str], dict[bool, Tally]]:
    """(policy, task) → {constrained: tally}; each example decoded alone, free and constrained in
    alternating order."""
    eos = tokenizer.eos_token_id
    assert eos is not None
    specs = [PolicySpec(m.name, dict(m.options)) for m in map(parse_method, policies)]
    built = [(spec.label, spec.build(), spec.decoder_options(block_length)) for spec in specs]
    tallies: dict[tuple[str, str], dict[bool, Tally]] = {}
    for index, ex in enumerate(examples):
        grammar = compile_response_format(task_format(ex)[0], tokenizer, vocab_size=model.config.vocab_size,
                                          stop_ids={eos})
        assert grammar is not None
        prompt = tokenizer.encode(ex.prompt)
        for number, (label, policy, options) in enumerate(built):
            tally = tallies.setdefault((label, ex.task), {False: Tally(), True: Tally()})
            for constrained in (False, True) if (index + number) % 2 == 0 else (True, False):
                start = time.perf_counter()
                out = diffusion_generate(model, [prompt], policy, gen_length=gen_length, eos_token_id=eos,
                                         constraints=[grammar.state()] if constrained else None, **options)
                seconds = time.perf_counter() - start
                answer = out.answers[0]
                tally[constrained].add(ex, tokenizer.decode(answer), len(answer) < gen_length, out.stats.steps[0],
                                       seconds)
    return tallies


def table(tallies: dict[tuple[str, str], dict[bool, Tally]]) -> list[str]:
    """Markdown rows: per policy and task, then per policy over all tasks."""
    header = ("| policy | task | valid free | valid constrained | accuracy free | accuracy constrained | "
              "steps free | steps constrained | tok/s constrained/free |")
    lines = [header, "|---|---|" + "---:|" * 7]
    policies = list(dict.fromkeys(label for label, _ in tallies))
    for label in policies:
        rows = [(task, t) for (lab, task), t in tallies.items() if lab == label]
        total = {c: Tally(valid=sum(t[c].valid for _, t in rows), correct=sum(t[c].correct for _, t in rows),
                          steps=sum(t[c].steps for _, t in rows), seconds=sum(t[c].seconds for _, t in rows),
                          examples=sum(t[c].examples for _, t in rows)) for c in (False, True)}
        for task, t in rows + [("**all**", total)]:
            free, con = t[False], t[True]
            n = free.examples
            lines.append(f"| `{label}` | {task} | {100 * free.valid / n:.0f} % | {100 * con.valid / n:.0f} % | "
                         f"{100 * free.correct / n:.0f} % | {100 * con.correct / n:.0f} % | {free.steps / n:.2f} | "
                         f"{con.steps / n:.2f} | {free.seconds / con.seconds:.2f}x |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a trained masked diffusion LM directory")
    parser.add_argument("--tasks", default="all")
    parser.add_argument("--limit", type=int, default=100, help="evaluation examples per task")
    parser.add_argument("--policies", default=POLICIES, help="commit policies, comma-separated specs")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_flush_denormal(True)
    torch.set_num_threads(args.threads)
    names = task_names(args.tasks)
    check_references([example(name, EVAL_SEED, i) for name in names for i in range(500)])
    examples = [example(name, EVAL_SEED, i) for i in range(args.limit) for name in names]
    model, tokenizer = load_pretrained(args.model)
    model.eval()
    evaluate(model, tokenizer, examples[:1], ["fixed"])  # warm-up: the first forward packs the weights
    start = time.perf_counter()
    tallies = evaluate(model, tokenizer, examples, args.policies.split(","))
    print("\n".join(table(tallies)))
    print(f"\n{len(examples)} examples x {len(args.policies.split(','))} policies x 2 in "
          f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()

"""Constrained against unconstrained diffusion decoding: validity, steps and speed, interleaved.

For each format (a regex per verifiable task, a Lark bracket grammar, a small JSON schema) and commit
policy, decode the task prompts with and without the grammar, one prompt at a time, alternating the two
in every round (answer region 16, 24 for JSON; blocks of 8), and print a markdown table: valid answers (a complete string of the grammar), mean
steps, and answer-region tokens per second of the constrained run relative to the unconstrained one.

    python scripts/constrained_diffusion.py [--model DIR] [--prompts 20] [--rounds 3]

Without --model it builds the untrained character diffusion LM of the tests (peaked random weights),
over the task alphabet plus `"` and `,` so that JSON can be written; --recipe-shape gives it the CPU
recipe's size instead (the speed of a step does not depend on training).
"""

from __future__ import annotations

import argparse
import json
import re
import time

import jsonschema
import torch

from warpdecode.data.parallel_tasks import ALPHABET, EVAL_SEED, example
from warpdecode.decoding import registry
from warpdecode.decoding.constraints.formats import compile_response_format
from warpdecode.decoding.diffusion.decoder import diffusion_generate
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.models.config import ModelConfig
from warpdecode.models.tokenizer import char_tokenizer
from warpdecode.models.transformer import Transformer

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "ok": {"type": "boolean"}},
          "required": ["n", "ok"], "additionalProperties": False}
BRACKETS = 'start: c+\nc: ")" | "]" | "}"'
FORMATS = {  # name → (task of the prompts, response format, validity check of an answer ended by end-of-text,
    # answer region)
    "add: [0-9]{1,4}": ("add", {"type": "regex", "regex": "[0-9]{1,4}"}, lambda t: re.fullmatch("[0-9]{1,4}", t), 16),
    "sort: [0-9]{2,8}": ("sort", {"type": "regex", "regex": "[0-9]{2,8}"}, lambda t: re.fullmatch("[0-9]{2,8}", t), 16),
    "close: Lark closers": ("close", {"type": "grammar", "grammar": BRACKETS}, lambda t: re.fullmatch(r"[)\]}]+", t),
                            16),
    "json: {n, ok}": ("copy", {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}}, None, 24),
}
POLICIES = ["fixed", "threshold:threshold=0.9", "threshold:threshold=0.5", "prophet"]


def untrained_model(recipe_shape: bool) -> tuple[Transformer, object]:
    """The tests' tiny character diffusion LM, or one of the CPU recipe's shape (configs/diffusion/
    parallel-tasks.yaml: 4 layers of width 256, ~3.2M parameters) with the same peaked random weights."""
    tokenizer = char_tokenizer(ALPHABET + '",')
    torch.manual_seed(2)
    shape = ({"n_layer": 4, "n_head": 8, "d_model": 256, "d_ff": 688} if recipe_shape
             else {"n_layer": 2, "n_head": 2, "d_model": 32, "d_ff": 64})
    model = Transformer(ModelConfig(vocab_size=tokenizer.vocab_size, **shape, max_seq_len=64, causal=False,
                                    mask_token_id=tokenizer.backend.token_to_id("<|mask|>"), eos_token_ids=[0]))
    model.init_weights(std=0.6)
    return model.eval(), tokenizer


def valid_json(text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def valid(outs: list, tokenizer, gen_length: int, check) -> str:
    """How many answers ended inside the region with a valid string, of how many."""
    ok = 0
    for out in outs:
        text, ended = tokenizer.decode(out.answers[0]), len(out.answers[0]) < gen_length
        ok += bool(ended and (check(text) if check else valid_json(text)))
    return f"{ok}/{len(outs)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--recipe-shape", action="store_true", help="the untrained model in the CPU recipe's shape")
    args = parser.parse_args()
    torch.set_flush_denormal(True)
    torch.set_num_threads(1)
    model, tokenizer = load_pretrained(args.model) if args.model else untrained_model(args.recipe_shape)
    eos = tokenizer.eos_token_id
    diffusion_generate(model, [tokenizer.encode("copy:ab=")], registry.build("commit_policy", "fixed"), gen_length=8,
                       block_length=8, eos_token_id=eos)  # warm-up: the first forward packs the weights
    print("| format | policy | valid free | valid constrained | steps free | steps constrained | region tok/s ratio |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, (task, fmt, check, gen_length) in FORMATS.items():
        grammar = compile_response_format(fmt, tokenizer, vocab_size=model.config.vocab_size, stop_ids={eos})
        assert grammar is not None
        prompts = [tokenizer.encode(example(task, EVAL_SEED, i).prompt) for i in range(args.prompts)]
        for spec in POLICIES:
            name_, *options = spec.split(":")
            kwargs = {k: float(v) for k, v in (o.split("=") for o in options)}
            seconds = {False: 0.0, True: 0.0}
            results: dict[bool, list] = {False: [], True: []}
            for round_ in range(args.rounds):
                for constrained in (False, True) if round_ % 2 == 0 else (True, False):
                    for prompt in prompts:
                        start = time.perf_counter()
                        out = diffusion_generate(model, [prompt], registry.build("commit_policy", name_, **kwargs),
                                                 gen_length=gen_length, block_length=8, eos_token_id=eos,
                                                 constraints=[grammar.state()] if constrained else None)
                        seconds[constrained] += time.perf_counter() - start
                        if round_ == 0:
                            results[constrained].append(out)

            steps = {c: sum(o.stats.steps[0] for o in results[c]) / len(results[c]) for c in (False, True)}
            print(f"| {name} | {spec} | {valid(results[False], tokenizer, gen_length, check)} | "
                  f"{valid(results[True], tokenizer, gen_length, check)} | {steps[False]:.1f} | "
                  f"{steps[True]:.1f} | {seconds[False] / seconds[True]:.2f}x |", flush=True)


if __name__ == "__main__":
    main()

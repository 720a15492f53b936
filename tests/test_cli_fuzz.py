"""Fuzzing the CLI: malformed flag values and malformed files of every kind warpdecode reads.

Every case must end like a tool a user can trust: either it works (status 0), or it stops with status 2
and exactly one `error: ...` line on stderr; never a traceback, a hang or a huge allocation. Cases whose
input is plainly wrong must be refused (status 2). The flag cases are derived from the commands'
signatures (a new flag is fuzzed by type without being listed here); the file cases corrupt a copy of a
valid model directory, inference package, drafter package, GGUF file or training recipe.

All cases run in one worker process (tests/cli_fuzz_worker.py): one interpreter start, a per-case alarm,
and a cap on the data segment so an allocation bomb fails instead of exhausting the machine.
"""

from __future__ import annotations

import inspect
import io
import json
import os
import shutil
import subprocess
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from built_once import built_once
from tiny_models import distilled_package, eagle_package, save_tiny_model

from warpdecode import commands
from warpdecode.models.named import DEFAULT_MODEL, named_model_gguf

pytestmark = pytest.mark.slow

CASE_SECONDS = 60
"""A case past this is a hang: they take milliseconds to a second, and a loaded machine must not fail them."""
PEAK_MIB = 3072
WORKER = Path(__file__).with_name("cli_fuzz_worker.py")

# --- flag values, by the parameter's type --------------------------------------------------------------

COMMANDS: dict[str, tuple[Callable[..., Any], list[str], bool]] = {
    # command → (function, a valid invocation that ends fast, whether any value may run it to the end)
    "generate": (commands.generate, ["generate", "--model", "{model}", "--prompt", "hello", "--max_new_tokens", "4",
                                     "--threads", "1"], True),
    "convert": (commands.convert, ["convert", "{model}", "{out}/converted"], True),
    "convert_drafter": (commands.convert_drafter, ["convert_drafter", "{distilled}", "{out}/hf", "--format", "hf",
                                                   "--model", "{model}"], True),
    "methods": (commands.methods, ["methods"], True),
    "export": (commands.export, ["export", "{out}/package", "--model", "{model}"], False),
    "bench": (commands.bench, ["bench", "--model", "{model}", "--limit", "1", "--categories", "qa", "--max_new_tokens", "4",
                               "--peers", "none", "--methods", "none", "--threads", "1", "--out", "{out}/bench"], False),
    "eval": (commands.eval, ["eval", "--task", "gsm8k", "--model", "{model}", "--limit", "1", "--max_new_tokens", "4",
                             "--threads", "1"], False),
    "regress": (commands.regress, ["regress", "{package}", "--record", "{out}/record.json", "--max_new_tokens", "4"], False),
    "prompts": (commands.prompts, ["prompts", "{out}/prompts.jsonl", "--max_prompts", "4"], False),
    "self_chat": (commands.self_chat, ["self_chat", "{out}/chat.jsonl", "--model", "{model}", "--num_prompts", "2",
                                       "--max_new_tokens", "4", "--batch_size", "2"], False),
    # never run to the end: it serves until a signal (tests/serve runs it); only its refusals are fuzzed here
    "serve": (commands.serve, ["serve", "--model", "{model}", "--port", "0", "--max_queue", "1"], False),
}

WRONG_TYPE: dict[type, tuple[str, ...]] = {int: ("abc", "1.5", ""), float: ("abc", "nan", "1e999x"), bool: ("maybe",),
                                          dict: ("{", "[1, 2]", "7")}
"""Values that are never valid for a flag of the type: the command must refuse them."""
ODD: dict[type, tuple[str, ...]] = {int: ("-1", "0", "99999999999999999999"), float: ("-1", "0", "inf", "1e308"),
                                    str: ("", "/nonexistent/x", "a" * 300)}
"""Values a flag of the type may or may not take: the command works or refuses them in one line, in bounded time."""


def _base_type(hint: Any) -> type | None:
    """int for `int`, `int | None`; dict for `dict[str, Any] | None`; None for what is not fuzzed by type."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    kinds = {typing.get_origin(a) or a for a in args if a is not type(None)}
    for kind in (bool, int, float, dict, str):
        if kind in kinds:
            return kind
    return None


def flag_cases() -> list[tuple[str, list[str], str]]:
    cases = []
    for name, (function, base, quick) in COMMANDS.items():
        hints = typing.get_type_hints(function)
        for param in inspect.signature(function).parameters.values():
            if param.kind is not inspect.Parameter.KEYWORD_ONLY:
                continue
            kind = _base_type(hints[param.name])
            flag = f"--{param.name}"
            stripped = _without_flag(base, flag)
            for value in WRONG_TYPE.get(kind, ()) if kind else ():
                cases.append((f"{name}{flag}={value!r}", [*stripped, flag, value], "error"))
            if quick and kind is not None and not (param.name == "model" or param.name == "package"):
                for value in ODD.get(kind, ()):
                    cases.append((f"{name}{flag}={value[:20]!r}", [*stripped, flag, value], "clean"))
    return cases


def _without_flag(argv: list[str], flag: str) -> list[str]:
    if flag not in argv:
        return list(argv)
    i = argv.index(flag)
    return argv[:i] + argv[i + 2:]


SEMANTIC: list[tuple[str, list[str]]] = [
    ("serve-port", ["serve", "--model", "{model}", "--port", "70000"]),
    ("serve-max-queue-0", ["serve", "--model", "{model}", "--max_queue", "0"]),
    ("serve-method", ["serve", "--model", "{model}", "--method", "bogus"]),
    ("serve-method-list", ["serve", "--model", "{model}", "--method", "none,prompt_lookup"]),
    ("serve-backend", ["serve", "--model", "{model}", "--backend", "bogus"]),
    ("serve-threads-0", ["serve", "--model", "{model}", "--threads", "0"]),
    ("serve-max-num-seqs-0", ["serve", "--model", "{model}", "--max_num_seqs", "0"]),
    ("serve-max-model-len-huge", ["serve", "--model", "{model}", "--max_model_len", "99999999"]),
    ("serve-max-model-len-1", ["serve", "--model", "{model}", "--max_model_len", "1"]),
    ("serve-chunked-prefill-0", ["serve", "--model", "{model}", "--chunked_prefill_size", "0"]),
    # values of the right type that are still wrong: each must be refused with one line
    ("generate-threads-0", ["generate", "--model", "{model}", "--prompt", "hi", "--threads", "0"]),
    ("generate-threads-negative", ["generate", "--model", "{model}", "--prompt", "hi", "--threads", "-3"]),
    ("generate-max-new-tokens-negative", ["generate", "--model", "{model}", "--prompt", "hi", "--max_new_tokens", "-1"]),
    ("generate-temperature-negative", ["generate", "--model", "{model}", "--prompt", "hi", "--temperature", "-1"]),
    ("generate-temperature-inf", ["generate", "--model", "{model}", "--prompt", "hi", "--temperature", "inf"]),
    ("generate-top-p-above-1", ["generate", "--model", "{model}", "--prompt", "hi", "--top_p", "1.5"]),
    ("generate-top-k-negative", ["generate", "--model", "{model}", "--prompt", "hi", "--top_k", "-1"]),
    ("generate-min-p-above-1", ["generate", "--model", "{model}", "--prompt", "hi", "--min_p", "1.5"]),
    ("generate-repetition-penalty-0", ["generate", "--model", "{model}", "--prompt", "hi", "--repetition_penalty", "0"]),
    ("generate-backend", ["generate", "--model", "{model}", "--prompt", "hi", "--backend", "bogus"]),
    ("generate-device", ["generate", "--model", "{model}", "--prompt", "hi", "--device", "bogus"]),
    ("generate-device-gpu-index", ["generate", "--model", "{model}", "--prompt", "hi", "--device", "cuda:99"]),
    ("generate-method", ["generate", "--model", "{model}", "--prompt", "hi", "--method", "bogus"]),
    ("generate-method-spec", ["generate", "--model", "{model}", "--prompt", "hi", "--method", "prompt_lookup:max_ngram=abc"]),
    ("generate-method-option-type", ["generate", "--model", "{model}", "--prompt", "hi", "--method", "prompt_lookup",
                                     "--method_options", '{"max_ngram": "abc"}']),
    ("generate-method-option-name", ["generate", "--model", "{model}", "--prompt", "hi", "--method", "prompt_lookup",
                                     "--method_options", '{"bogus": 1}']),
    ("generate-method-spec-option-name", ["generate", "--model", "{model}", "--prompt", "hi", "--method",
                                         "prompt_lookup:bogus=1"]),
    ("generate-method-spec-not-key-value", ["generate", "--model", "{model}", "--prompt", "hi", "--method",
                                            "prompt_lookup:num_tokens"]),
    ("generate-method-list", ["generate", "--model", "{model}", "--prompt", "hi", "--methods", "none,prompt_lookup"]),
    ("generate-json-schema-missing", ["generate", "--model", "{model}", "--prompt", "hi", "--json_schema", "/nonexistent/s.json"]),
    ("generate-grammar-missing", ["generate", "--model", "{model}", "--prompt", "hi", "--grammar", "/nonexistent/g.lark"]),
    ("generate-regex-invalid", ["generate", "--model", "{model}", "--prompt", "hi", "--regex", "a(b"]),
    ("generate-regex-lookahead", ["generate", "--model", "{model}", "--prompt", "hi", "--regex", "a(?=b)"]),
    ("generate-choice-empty", ["generate", "--model", "{model}", "--prompt", "hi", "--choice", ","]),
    ("generate-two-constraints", ["generate", "--model", "{model}", "--prompt", "hi", "--regex", "a", "--choice", "a,b"]),
    ("generate-constrained-sampling-name", ["generate", "--model", "{model}", "--prompt", "hi", "--regex", "a",
                                            "--constrained_sampling", "bogus"]),
    ("generate-awrs-top-k", ["generate", "--model", "{model}", "--prompt", "hi", "--regex", "a", "--temperature", "1",
                             "--top_k", "5", "--constrained_sampling", "awrs"]),
    ("generate-close-at-budget-no-constraint", ["generate", "--model", "{model}", "--prompt", "hi", "--close_at_budget",
                                               "true"]),
    ("generate-diffusion-close-at-budget", ["generate", "--model", "{dlm}", "--prompt", "x", "--max_new_tokens", "8",
                                            "--regex", "a", "--close_at_budget", "true"]),
    ("generate-diffusion-regex-invalid", ["generate", "--model", "{dlm}", "--prompt", "x", "--max_new_tokens", "8",
                                          "--regex", "a(b"]),
    ("generate-diffusion-choice-empty", ["generate", "--model", "{dlm}", "--prompt", "x", "--max_new_tokens", "8",
                                         "--choice", ","]),
    ("generate-diffusion-constraint-own-loop", ["generate", "--model", "{dlm}", "--prompt", "x", "--max_new_tokens", "8",
                                                "--regex", "[0-9]+", "--method", "free_draft"]),
    ("generate-diffusion-constrained-sampling", ["generate", "--model", "{dlm}", "--prompt", "x", "--max_new_tokens", "8",
                                                 "--regex", "a", "--constrained_sampling", "awrs"]),
    ("generate-verifier", ["generate", "--model", "{model}", "--prompt", "hi", "--method", "prompt_lookup",
                           "--verifier", "bogus"]),
    ("generate-verifier-spec", ["generate", "--model", "{model}", "--prompt", "hi", "--method", "prompt_lookup",
                                "--verifier", "typical:bogus=1"]),
    ("generate-controller-spec", ["generate", "--model", "{model}", "--prompt", "hi", "--method", "prompt_lookup",
                                  "--controller", "adaptive:initial=four"]),
    ("generate-backend-list", ["generate", "--model", "{model}", "--prompt", "hi", "--backends", "torch,cudagraphs"]),
    ("generate-controller", ["generate", "--model", "{model}", "--prompt", "hi", "--method", "prompt_lookup",
                             "--controller", "bogus"]),
    ("generate-package-is-a-model", ["generate", "--package", "{model}", "--prompt", "hi"]),
    ("generate-package-half-precision", ["generate", "--package", "{package}", "--prompt", "hi", "--dtype", "bf16"]),
    ("generate-dtype", ["generate", "--model", "{model}", "--prompt", "hi", "--dtype", "int3"]),
    ("bench-dtype", ["bench", "--model", "{model}", "--dtype", "int3", "--out", "{out}/b"]),
    ("generate-model-and-package", ["generate", "--model", "{model}", "--package", "{package}", "--prompt", "hi"]),
    ("generate-model-missing", ["generate", "--model", "/nonexistent/model", "--prompt", "hi"]),
    ("generate-model-empty-name", ["generate", "--model", "", "--prompt", "hi"]),
    ("generate-model-garbage-file", ["generate", "--model", "{garbage}", "--prompt", "hi"]),
    ("generate-model-empty-dir", ["generate", "--model", "{empty_dir}", "--prompt", "hi"]),
    ("generate-prompt-beyond-context", ["generate", "--model", "{model}", "--prompt", "hello world " * 400]),
    ("generate-no-prompt", ["generate", "--model", "{model}"]),
    ("generate-stop-empty-in-list", ["generate", "--model", "{model}", "--prompt", "hi", "--stop", '["a", ""]']),
    ("generate-bad-words-only-commas", ["generate", "--model", "{model}", "--prompt", "hi", "--bad_words", ",,"]),
    ("generate-eos-token-id-negative-in-list", ["generate", "--model", "{model}", "--prompt", "hi", "--eos_token_id",
                                                "[2, -5]"]),
    ("generate-unknown-flag", ["generate", "--model", "{model}", "--prompt", "hi", "--bogus", "1"]),
    ("generate-num-beams-too-many", ["generate", "--model", "{model}", "--prompt", "hi", "--num_beams", "100000"]),
    ("generate-return-more-than-beams", ["generate", "--model", "{model}", "--prompt", "hi", "--num_beams", "2",
                                         "--num_return_sequences", "3"]),
    ("generate-return-sequences-greedy", ["generate", "--model", "{model}", "--prompt", "hi", "--num_return_sequences", "2"]),
    ("generate-early-stopping", ["generate", "--model", "{model}", "--prompt", "hi", "--num_beams", "2",
                                 "--early_stopping", "sometimes"]),
    ("generate-beam-groups-divide", ["generate", "--model", "{model}", "--prompt", "hi", "--num_beams", "4",
                                     "--num_beam_groups", "3", "--diversity_penalty", "1"]),
    ("generate-diversity-without-groups", ["generate", "--model", "{model}", "--prompt", "hi", "--num_beams", "4",
                                           "--diversity_penalty", "1"]),
    ("generate-beams-with-drafter", ["generate", "--model", "{model}", "--prompt", "hi", "--num_beams", "2",
                                     "--method", "prompt_lookup"]),
    ("generate-search-greedy", ["generate", "--model", "{model}", "--prompt", "hi", "--method", "best_of_n:n=2"]),
    ("generate-search-option", ["generate", "--model", "{model}", "--prompt", "hi", "--temperature", "1",
                                "--method", "best_of_n:scorer=bogus"]),
    ("generate-astar-budget-0", ["generate", "--model", "{model}", "--prompt", "hi", "--method", "astar:max_tokens=0"]),
    ("generate-astar-model-without-name", ["generate", "--model", "{model}", "--prompt", "hi", "--method",
                                           "astar:scorer=model"]),
    ("generate-astar-scorer-model-missing", ["generate", "--model", "{model}", "--prompt", "hi", "--method",
                                             "astar:scorer=model:scorer_model={empty_dir}"]),
    ("generate-pg-td-no-reward", ["generate", "--model", "{model}", "--prompt", "hi", "--method", "pg_td"]),
    ("generate-pg-td-sampling", ["generate", "--model", "{model}", "--prompt", "hi", "--temperature", "1",
                                 "--method", "pg_td:pattern=a"]),
    ("generate-pg-td-k-0", ["generate", "--model", "{model}", "--prompt", "hi", "--method", "pg_td:k=0:pattern=a"]),
    ("generate-pg-td-bad-pattern", ["generate", "--model", "{model}", "--prompt", "hi", "--method", "pg_td:pattern=("]),
    ("generate-deal-beams-over-top-k", ["generate", "--model", "{model}", "--prompt", "hi", "--method",
                                        "deal:num_beams=4:top_k=2:keywords=a"]),
    ("generate-deal-no-keywords", ["generate", "--model", "{model}", "--prompt", "hi", "--method", "deal"]),
    ("generate-deal-sampling", ["generate", "--model", "{model}", "--prompt", "hi", "--temperature", "1",
                                "--method", "deal:keywords=a"]),
    ("generate-deal-head-missing", ["generate", "--model", "{model}", "--prompt", "hi", "--method",
                                    "deal:reward=head:path={out}/none.safetensors"]),
    ("generate-rankgen-no-path", ["generate", "--model", "{model}", "--prompt", "hi", "--temperature", "1",
                                  "--method", "rankgen"]),
    ("generate-rankgen-missing", ["generate", "--model", "{model}", "--prompt", "hi", "--temperature", "1",
                                  "--method", "rankgen:path={out}/none.safetensors"]),
    ("generate-rankgen-greedy", ["generate", "--model", "{model}", "--prompt", "hi", "--method",
                                 "rankgen:path={out}/none.safetensors"]),
    ("generate-rankgen-beams-0", ["generate", "--model", "{model}", "--prompt", "hi", "--temperature", "1",
                                  "--method", "rankgen:path={out}/none.safetensors:beams=0"]),
    ("generate-rankgen-chunk-0", ["generate", "--model", "{model}", "--prompt", "hi", "--temperature", "1",
                                  "--method", "rankgen:path={out}/none.safetensors:chunk=0"]),
    ("generate-transfer-q-no-model", ["generate", "--model", "{model}", "--prompt", "hi", "--method", "transfer_q"]),
    ("generate-transfer-q-alpha", ["generate", "--model", "{model}", "--prompt", "hi", "--method",
                                   "transfer_q:alpha=inf:keywords=a:reward=keywords"]),
    ("generate-superposed-k-0", ["generate", "--model", "{model}", "--prompt", "hi", "--method", "superposed:k=0"]),
    ("generate-superposed-corpus", ["generate", "--model", "{model}", "--prompt", "hi", "--method",
                                    "superposed:corpus={out}/none.txt"]),
    ("generate-rule-option", ["generate", "--model", "{model}", "--prompt", "hi", "--method",
                              "contrastive:penalty_alpha=7:top_k=4"]),
    ("generate-rule-greedy", ["generate", "--model", "{model}", "--prompt", "hi", "--method", "mirostat:version=2"]),
    ("generate-momentum-alpha", ["generate", "--model", "{model}", "--prompt", "hi", "--method", "momentum:alpha=-1"]),
    ("generate-momentum-resistance", ["generate", "--model", "{model}", "--prompt", "hi", "--method",
                                      "momentum:resistance=square"]),
    ("generate-momentum-top-k", ["generate", "--model", "{model}", "--prompt", "hi", "--method", "momentum:top_k=0"]),
    ("generate-cntp-greedy", ["generate", "--model", "{model}", "--prompt", "hi", "--method", "cntp"]),
    ("generate-cntp-entropy", ["generate", "--model", "{model}", "--prompt", "hi", "--temperature", "1", "--method",
                               "cntp:entropy_low=2:entropy_high=1"]),
    ("generate-cntp-trials", ["generate", "--model", "{model}", "--prompt", "hi", "--temperature", "1", "--method",
                              "cntp:max_trials=0"]),
    ("generate-momentum-sampling", ["generate", "--model", "{model}", "--prompt", "hi", "--temperature", "1",
                                    "--method", "momentum"]),
    ("generate-icn-n", ["generate", "--model", "{model}", "--prompt", "hi", "--method", "icn:n=0"]),
    ("generate-cad-no-context", ["generate", "--model", "{model}", "--prompt", "hi", "--method", "cad:alpha=0.5"]),
    ("generate-cad-alpha", ["generate", "--model", "{model}", "--prompt", "hi", "--method", "cad:alpha=-1:context=hi"]),
    ("generate-cad-context-missing", ["generate", "--model", "{model}", "--prompt", "hi", "--method",
                                      "cad:context=elephant"]),
    ("generate-cad-unescaped-colon", ["generate", "--model", "{model}", "--prompt", "Note: hi", "--method",
                                      "cad:context=Note: "]),
    ("generate-cad-with-drafter", ["generate", "--model", "{model}", "--prompt", "hi there", "--method",
                                   "cad:context=hi:controller=adaptive"]),
    ("generate-uscd-threshold", ["generate", "--model", "{model}", "--prompt", "hi", "--method", "uscd:threshold=2"]),
    ("generate-uscd-beta", ["generate", "--model", "{model}", "--prompt", "hi", "--method", "uscd:beta=nan"]),
    ("eval-uscd-option", ["eval", "--task", "humaneval", "--model", "{model}", "--limit", "1", "--method",
                          "uscd:plausibility=-1"]),
    ("generate-adadec-no-threshold", ["generate", "--model", "{model}", "--prompt", "hi", "--method", "adadec"]),
    ("generate-adadec-negative-threshold", ["generate", "--model", "{model}", "--prompt", "hi", "--method",
                                            "adadec:threshold=-1"]),
    ("generate-adadec-path-not-a-package", ["generate", "--model", "{model}", "--prompt", "hi", "--method",
                                            "adadec:path={empty_dir}"]),
    ("generate-adadec-top-k-1", ["generate", "--model", "{model}", "--prompt", "hi", "--method",
                                 "adadec:threshold=1:top_k=1"]),
    ("generate-exact-extract-empty-passage", ["generate", "--model", "{model}", "--prompt", "hi", "--method",
                                              "exact_extract:begin=1000"]),
    ("generate-exact-extract-max-length-0", ["generate", "--model", "{model}", "--prompt", "hi", "--method",
                                             "exact_extract:max_length=0"]),
    ("generate-exact-extract-penalty", ["generate", "--model", "{model}", "--prompt", "hi", "--method",
                                        "exact_extract", "--repetition_penalty", "1.3"]),
    ("eval-rule-option", ["eval", "--model", "{model}", "--task", "humaneval", "--method", "adadec:lookahead=0:threshold=1"]),
    ("unknown-command", ["bogus"]),
    ("bench-backends", ["bench", "--model", "{model}", "--backends", "bogus", "--out", "{out}/b"]),
    ("bench-methods", ["bench", "--model", "{model}", "--methods", "bogus", "--out", "{out}/b"]),
    ("bench-prompts", ["bench", "--model", "{model}", "--prompts", "bogus", "--out", "{out}/b"]),
    ("bench-prompts-garbage-file", ["bench", "--model", "{model}", "--prompts", "{garbage}", "--out", "{out}/b"]),
    ("bench-categories", ["bench", "--model", "{model}", "--categories", "bogus", "--out", "{out}/b"]),
    ("bench-peers", ["bench", "--model", "{model}", "--peers", "bogus", "--out", "{out}/b"]),
    ("bench-limit-negative", ["bench", "--model", "{model}", "--limit", "-1", "--out", "{out}/b"]),
    ("bench-threads-0", ["bench", "--model", "{model}", "--threads", "0", "--out", "{out}/b"]),
    ("bench-out-is-a-file", ["bench", "--model", "{model}", "--limit", "1", "--categories", "qa", "--max_new_tokens", "2",
                             "--peers", "none", "--methods", "none", "--out", "{garbage}"]),
    ("eval-task", ["eval", "--model", "{model}", "--task", "bogus"]),
    ("eval-no-task", ["eval", "--model", "{model}"]),
    ("eval-limit-0", ["eval", "--model", "{model}", "--task", "gsm8k", "--limit", "0"]),
    ("eval-scorer", ["eval", "--model", "{model}", "--task", "humaneval", "--scorer", "bogus"]),
    ("eval-offset-negative", ["eval", "--model", "{model}", "--task", "humaneval", "--offset", "-1"]),
    ("eval-offset-past-the-set", ["eval", "--model", "{model}", "--task", "gsm8k", "--offset", "100000"]),
    ("eval-scorer-without-search", ["eval", "--model", "{model}", "--task", "humaneval", "--limit", "1",
                                    "--scorer", "public_tests"]),
    ("eval-samples-greedy", ["eval", "--model", "{model}", "--task", "humaneval", "--num_return_sequences", "2"]),
    ("eval-samples-0", ["eval", "--model", "{model}", "--task", "humaneval", "--num_return_sequences", "0"]),
    ("eval-temperature-negative", ["eval", "--model", "{model}", "--task", "gsm8k", "--temperature", "-1"]),
    ("eval-max-new-tokens-0", ["eval", "--model", "{model}", "--task", "gsm8k", "--max_new_tokens", "0"]),
    ("eval-timeout-0", ["eval", "--model", "{model}", "--task", "humaneval", "--timeout", "0"]),
    ("eval-workers-0", ["eval", "--model", "{model}", "--task", "humaneval", "--workers", "0"]),
    ("eval-threads-0", ["eval", "--model", "{model}", "--task", "gsm8k", "--threads", "0"]),
    ("eval-method", ["eval", "--model", "{model}", "--task", "gsm8k", "--method", "bogus"]),
    ("eval-method-spec", ["eval", "--model", "{model}", "--task", "gsm8k", "--method", "prompt_lookup:bogus=1"]),
    ("eval-method-list", ["eval", "--model", "{model}", "--task", "gsm8k", "--methods", "none,prompt_lookup"]),
    ("eval-backend", ["eval", "--model", "{model}", "--task", "gsm8k", "--backend", "bogus"]),
    ("eval-model-missing", ["eval", "--model", "/nonexistent/model", "--task", "gsm8k"]),
    ("eval-output-is-a-dir", ["eval", "--model", "{model}", "--task", "gsm8k", "--output", "{empty_dir}"]),
    ("eval-output-under-a-file", ["eval", "--model", "{model}", "--task", "gsm8k", "--output", "{garbage}/r.json"]),
    ("regress-package-missing", ["regress", "/nonexistent/package", "--record", "{out}/r.json"]),
    ("regress-check-garbage", ["regress", "{package}", "--check", "{garbage}"]),
    ("regress-check-missing", ["regress", "{package}", "--check", "/nonexistent/record.json"]),
    ("regress-backend", ["regress", "{package}", "--record", "{out}/r.json", "--backend", "bogus"]),
    ("regress-methods", ["regress", "{package}", "--record", "{out}/r.json", "--methods", "bogus"]),
    ("regress-methods-spec", ["regress", "{package}", "--record", "{out}/r.json", "--methods", "none,prompt_lookup:x=1"]),
    ("regress-neither", ["regress", "{package}"]),
    ("prompts-sources", ["prompts", "{out}/p.jsonl", "--sources", "bogus"]),
    ("prompts-weights-source", ["prompts", "{out}/p.jsonl", "--weights", '{"bogus": 1}']),
    ("prompts-weights-value", ["prompts", "{out}/p.jsonl", "--weights", '{"stdlib_docstrings": "abc"}']),
    ("prompts-max-prompts-negative", ["prompts", "{out}/p.jsonl", "--max_prompts", "-1"]),
    ("self-chat-model-missing", ["self_chat", "{out}/s.jsonl", "--model", "/nonexistent/model"]),
    ("self-chat-num-prompts-0", ["self_chat", "{out}/s.jsonl", "--model", "{model}", "--num_prompts", "0"]),
    ("self-chat-batch-size-0", ["self_chat", "{out}/s.jsonl", "--model", "{model}", "--batch_size", "0"]),
    ("self-chat-temperature-negative", ["self_chat", "{out}/s.jsonl", "--model", "{model}", "--temperature", "-1"]),
    ("self-chat-top-p-0", ["self_chat", "{out}/s.jsonl", "--model", "{model}", "--top_p", "0"]),
    ("self-chat-threads-0", ["self_chat", "{out}/s.jsonl", "--model", "{model}", "--threads", "0"]),
    ("convert-source-missing", ["convert", "/nonexistent/model", "{out}/c"]),
    ("convert-source-garbage", ["convert", "{garbage}", "{out}/c"]),
    ("convert-out-is-a-file", ["convert", "{model}", "{garbage}"]),
    ("convert-drafter-format", ["convert_drafter", "{distilled}", "{out}/x", "--format", "onnx", "--model", "{model}"]),
    ("convert-drafter-gguf-name", ["convert_drafter", "{distilled}", "{out}/x", "--format", "gguf", "--model", "{model}"]),
    ("convert-drafter-no-format", ["convert_drafter", "{distilled}", "{out}/x", "--model", "{model}"]),
    ("convert-drafter-eagle-layout", ["convert_drafter", "{eagle}", "{out}/x", "--format", "eagle", "--model", "{model}"]),
    ("convert-drafter-eagle3-layout", ["convert_drafter", "{eagle}", "{out}/x", "--format", "eagle3", "--model", "{model}"]),
    ("convert-drafter-kind", ["convert_drafter", "{eagle}", "{out}/x", "--format", "hf", "--model", "{model}"]),
    ("convert-drafter-medusa-of-distilled", ["convert_drafter", "{distilled}", "{out}/x", "--format", "medusa", "--model",
                                             "{model}"]),
    ("convert-drafter-source-missing", ["convert_drafter", "/nonexistent/d", "{out}/x", "--format", "hf", "--model",
                                        "{model}"]),
    ("convert-drafter-source-garbage", ["convert_drafter", "{garbage}", "{out}/x", "--format", "hf", "--model", "{model}"]),
    ("convert-drafter-import-empty-dir", ["convert_drafter", "{empty_dir}", "{out}/x", "--format", "warpdecode", "--model",
                                          "{model}"]),
    ("convert-drafter-import-garbage", ["convert_drafter", "{garbage}", "{out}/x", "--format", "warpdecode", "--model",
                                        "{model}"]),
    ("convert-drafter-out-is-a-file", ["convert_drafter", "{distilled}", "{garbage}", "--format", "hf", "--model",
                                       "{model}"]),
    ("convert-drafter-model-missing", ["convert_drafter", "{distilled}", "{out}/x", "--format", "hf", "--model",
                                       "/nonexistent/model"]),
    ("export-model-missing", ["export", "{out}/p", "--model", "/nonexistent/model"]),
    ("export-drafters-missing", ["export", "{out}/p", "--model", "{model}", "--drafters", "/nonexistent/drafter"]),
    ("export-hidden-layers-text", ["export", "{out}/p", "--model", "{model}", "--hidden_layers", "abc"]),
    ("export-hidden-layers-range", ["export", "{out}/p", "--model", "{model}", "--hidden_layers", "99"]),
    ("export-quantize", ["export", "{out}/p", "--model", "{model}", "--quantize", "bogus"]),
    ("export-method", ["export", "{out}/p", "--model", "{model}", "--method", "bogus"]),
    ("export-method-spec", ["export", "{out}/p", "--model", "{model}", "--method", "hydra:bogus=1"]),
    ("fit-config-missing", ["fit", "--config", "/nonexistent/recipe.yaml"]),
]

# --- malformed files ------------------------------------------------------------------------------------

Mutation = Callable[[Path], None]


def _write(name: str, data: str | bytes) -> Mutation:
    def mutate(directory: Path) -> None:
        path = directory / name
        if path.is_symlink() or path.exists():
            path.unlink()
        path.write_bytes(data.encode() if isinstance(data, str) else data)
    return mutate


def _json_edit(name: str, edit: Callable[[Any], Any]) -> Mutation:
    def mutate(directory: Path) -> None:
        path = directory / name
        path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    return mutate


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda d: {**d, key: value}


def _truncate(name: str, keep: float) -> Mutation:
    def mutate(directory: Path) -> None:
        path = directory / name
        data = path.read_bytes()
        path.write_bytes(data[:int(len(data) * keep)])
    return mutate


def _safetensors_header(header: dict[str, Any], size: int | None = None) -> bytes:
    raw = json.dumps(header).encode()
    return (len(raw) if size is None else size).to_bytes(8, "little") + raw


def _manifest_files(edit: Callable[[dict[str, Any]], None]) -> Mutation:
    def apply(manifest: dict[str, Any]) -> dict[str, Any]:
        edit(manifest)
        return manifest
    return _json_edit("manifest.json", apply)


def _symlink_out(name: str) -> Mutation:
    """Replace a listed file by a symlink to a copy outside the package (same bytes: its hash still matches)."""
    def mutate(directory: Path) -> None:
        path = directory / name
        outside = directory.parent / f"outside-{directory.name}-{path.name}"
        shutil.copyfile(path, outside)
        path.unlink()
        path.symlink_to(outside)
    return mutate


def _unlisted_fused_graph(directory: Path) -> None:
    """Point the manifest's fused graph at a file the manifest does not list."""
    shutil.copyfile(directory / "backbone.fused.onnx", directory / "other.onnx")
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["backbone"]["fused_graph"] = "other.onnx"
    (directory / "manifest.json").write_text(json.dumps(manifest))


LOOP_TEMPLATE = "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}"
HUGE_TEMPLATE = "{{ 'x' * 3000000000 }}"

MODEL_FILES: list[tuple[str, Mutation]] = [
    ("config-empty", _write("config.json", "")),
    ("config-garbage", _write("config.json", "{not json")),
    ("config-list", _write("config.json", "[]")),
    ("config-object-empty", _write("config.json", "{}")),
    ("config-vocab-40gb-logits", _json_edit("config.json", _set("vocab_size", 10_000_000_000))),
    ("config-million-layers", _json_edit("config.json", _set("num_hidden_layers", 1_000_000))),
    ("config-layers-text", _json_edit("config.json", _set("num_hidden_layers", "two"))),
    ("config-hidden-negative", _json_edit("config.json", _set("hidden_size", -32))),
    ("config-heads-zero", _json_edit("config.json", _set("num_attention_heads", 0))),
    ("config-heads-not-dividing", _json_edit("config.json", _set("num_attention_heads", 3))),
    ("config-context-huge", _json_edit("config.json", _set("max_position_embeddings", 10**12))),
    ("config-eos-text", _json_edit("config.json", _set("eos_token_id", "end"))),
    ("safetensors-empty", _write("model.safetensors", b"")),
    ("safetensors-truncated", _truncate("model.safetensors", 0.5)),
    ("safetensors-garbage", _write("model.safetensors", os.urandom(4096))),
    ("safetensors-header-size-huge", _write("model.safetensors", _safetensors_header({}, size=1 << 62))),
    ("safetensors-header-not-json", _write("model.safetensors", (16).to_bytes(8, "little") + b"\xff" * 16)),
    ("safetensors-offsets-beyond-file", _write("model.safetensors", _safetensors_header(
        {"model.embed_tokens.weight": {"dtype": "F32", "shape": [300, 32], "data_offsets": [0, 38400]}}))),
    ("safetensors-wrong-shapes", _write("model.safetensors", _safetensors_header(
        {"model.embed_tokens.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}) + b"\0" * 16)),
    ("tokenizer-empty", _write("tokenizer.json", "")),
    ("tokenizer-garbage", _write("tokenizer.json", "{not json")),
    ("tokenizer-list", _write("tokenizer.json", "[]")),
    ("tokenizer-wrong-model", _write("tokenizer.json", '{"model": {"type": "Bogus"}}')),
    ("tokenizer-config-garbage", _write("tokenizer_config.json", "{not json")),
    ("tokenizer-config-list", _write("tokenizer_config.json", "[]")),
    ("chat-template-syntax", _json_edit("tokenizer_config.json", _set("chat_template", "{% for %}"))),
    ("chat-template-loop", _json_edit("tokenizer_config.json", _set("chat_template", LOOP_TEMPLATE))),
    ("chat-template-huge-output", _json_edit("tokenizer_config.json", _set("chat_template", HUGE_TEMPLATE))),
    ("chat-template-attribute", _json_edit("tokenizer_config.json",
                                           _set("chat_template", "{{ messages.__class__.__mro__ }}"))),
    ("chat-template-not-text", _json_edit("tokenizer_config.json", _set("chat_template", 7))),
]

PACKAGE_FILES: list[tuple[str, Mutation]] = [
    ("manifest-empty", _write("manifest.json", "")),
    ("manifest-garbage", _write("manifest.json", "{not json")),
    ("manifest-list", _write("manifest.json", "[]")),
    ("manifest-format", _json_edit("manifest.json", _set("format", "other"))),
    ("manifest-version-future", _json_edit("manifest.json", _set("format_version", 99))),
    ("manifest-version-text", _json_edit("manifest.json", _set("format_version", "1"))),
    ("manifest-no-files", _json_edit("manifest.json", lambda m: {k: v for k, v in m.items() if k != "files"})),
    ("manifest-files-list", _json_edit("manifest.json", _set("files", []))),
    ("manifest-entry-parent", _manifest_files(lambda m: m["files"].update({"../x": {"sha256": "0" * 64, "bytes": 1}}))),
    ("manifest-entry-absolute", _manifest_files(lambda m: m["files"].update({"/etc/hostname": {"sha256": "0" * 64,
                                                                                                "bytes": 1}}))),
    ("manifest-entry-string", _manifest_files(lambda m: m["files"].update({"backbone.onnx": "deadbeef"}))),
    ("manifest-entry-no-sha256", _manifest_files(lambda m: m["files"]["backbone.onnx"].pop("sha256"))),
    ("manifest-entry-bytes-text", _manifest_files(lambda m: m["files"]["backbone.onnx"].update({"bytes": "many"}))),
    ("manifest-target-missing", _json_edit("manifest.json", lambda m: {k: v for k, v in m.items() if k != "target"})),
    ("manifest-config-text", _manifest_files(lambda m: m["target"].update({"config": "llama"}))),
    ("manifest-config-vocab-huge", _manifest_files(lambda m: m["target"]["config"].update({"vocab_size": 10**10}))),
    ("manifest-hidden-layers-text", _manifest_files(lambda m: m["backbone"].update({"hidden_layers": "last"}))),
    ("manifest-fused-graph-missing", _manifest_files(lambda m: m["backbone"].update({"fused_graph": "nope.onnx"}))),
    ("manifest-fused-graph-outside", _manifest_files(lambda m: m["backbone"].update({"fused_graph": "../x.onnx"}))),
    ("manifest-fused-graph-unlisted", _unlisted_fused_graph),
    ("manifest-drafter-outside", _manifest_files(lambda m: m.update({"drafters": {"eagle": "../../"}}))),
    ("package-graph-symlink-out", _symlink_out("backbone.onnx.data")),
    ("package-tokenizer-symlink-out", _symlink_out("tokenizer.json")),
]

DRAFTER_FILES: list[tuple[str, Mutation]] = [
    ("drafter-json-empty", _write("drafter.json", "")),
    ("drafter-json-garbage", _write("drafter.json", "{not json")),
    ("drafter-json-list", _write("drafter.json", "[]")),
    ("drafter-json-object-empty", _write("drafter.json", "{}")),
    ("drafter-json-kind", _json_edit("drafter.json", _set("kind", "bogus"))),
    ("drafter-json-config-text", _json_edit("drafter.json", _set("config", "eagle"))),
    ("drafter-json-tree-text", _json_edit("drafter.json", _set("tree", "wide"))),
    ("drafter-json-target-other", _json_edit("drafter.json", lambda d: {**d, "target": {**d["target"],
                                                                                          "fingerprint": "0" * 16}})),
    ("drafter-weights-garbage", _write("drafter.safetensors", os.urandom(2048))),
    ("drafter-weights-truncated", _truncate("drafter.safetensors", 0.5)),
]

GGUF_HEADER = b"GGUF" + (3).to_bytes(4, "little")
GGUF_ARGV = ["generate", "--model", "{case_dir}/model.gguf", "--prompt", "hi"]
def _eagle_weights(extra: dict[str, list[int]]) -> bytes:
    """An EAGLE-1 checkpoint for the tiny target (d_model 32): fc, plus `extra` tensors of those shapes."""
    from safetensors.torch import save

    return save({"fc.weight": torch.zeros(32, 64), **{name: torch.zeros(shape) for name, shape in extra.items()}})


MEDUSA_ARGV = ["convert_drafter", "{case_dir}", "{out}/d", "--format", "warpdecode", "--model", "{model}"]
RECIPE_ARGV = ["fit", "--config", "{case_dir}/recipe.yaml", "--trainer.logger", "false"]
CORPUS_ARGV = ["generate", "--model", "{model}", "--prompt", "hi", "--method", "retrieval:corpus={case_dir}/corpus.npy"]
RECORD_ARGV = ["regress", "{package}", "--check", "{case_dir}/record.json"]

def _gguf_head() -> bytes:
    """The default model's first 64 KiB: a GGUF cut short inside its header."""
    with named_model_gguf(DEFAULT_MODEL).open("rb") as f:
        return f.read(1 << 16)


def _npy(array: np.ndarray) -> Callable[[], bytes]:
    def data() -> bytes:
        buffer = io.BytesIO()
        np.save(buffer, array)
        return buffer.getvalue()
    return data


STANDALONE_FILES: list[tuple[str, str, bytes | Callable[[], bytes], list[str]]] = [
    # (case, file written into the case's directory, its bytes, the command that reads it)
    ("gguf-empty", "model.gguf", b"", GGUF_ARGV),
    ("gguf-bad-magic", "model.gguf", b"NOPE" + b"\0" * 60, GGUF_ARGV),
    ("gguf-truncated-header", "model.gguf", _gguf_head, GGUF_ARGV),
    ("gguf-huge-counts", "model.gguf", GGUF_HEADER + (1 << 60).to_bytes(8, "little") * 2, GGUF_ARGV),
    ("gguf-huge-string", "model.gguf", GGUF_HEADER + (0).to_bytes(8, "little") + (1).to_bytes(8, "little")
     + (1 << 60).to_bytes(8, "little") + b"key", GGUF_ARGV),
    ("medusa-weights-garbage", "medusa_lm_head.safetensors", lambda: os.urandom(1024), MEDUSA_ARGV),
    ("medusa-weights-no-config", "medusa_lm_head.safetensors",
     _safetensors_header({"0.0.linear.weight": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}) + b"\0" * 4,
     MEDUSA_ARGV),
    ("eagle-weights-truncated", "model.safetensors",
     _safetensors_header({"fc.weight": {"dtype": "F32", "shape": [32, 64], "data_offsets": [0, 8192]}}), MEDUSA_ARGV),
    ("eagle-weights-wrong-shapes", "model.safetensors", lambda: _eagle_weights({"layers.0.self_attn.q_proj.weight": [8, 8]}),
     MEDUSA_ARGV),
    ("eagle-weights-missing-layer", "model.safetensors", lambda: _eagle_weights({}), MEDUSA_ARGV),
    ("recipe-empty", "recipe.yaml", b"", RECIPE_ARGV),
    ("recipe-syntax", "recipe.yaml", b"model: [unclosed\n", RECIPE_ARGV),
    ("recipe-python-tag", "recipe.yaml", b"model: !!python/object/apply:os.system ['echo pwned']\n", RECIPE_ARGV),
    ("recipe-not-mapping", "recipe.yaml", b"- 1\n- 2\n", RECIPE_ARGV),
    ("recipe-unknown-key", "recipe.yaml", b"bogus_section: 1\n", RECIPE_ARGV),
    ("recipe-unknown-class", "recipe.yaml", b"model:\n  class_path: os.system\n", RECIPE_ARGV),
    ("recipe-wrong-type", "recipe.yaml", b"trainer:\n  max_epochs: many\n", RECIPE_ARGV),
    ("corpus-garbage", "corpus.npy", b"\x93NUMPY garbage", CORPUS_ARGV),
    ("corpus-pickled", "corpus.npy", b"\x93NUMPY\x01\x00v\x00{'descr': '|O', 'fortran_order': False, 'shape': (2,), }"
     + b" " * 57 + b"\n" + b"\x80\x04K\x01.", CORPUS_ARGV),
    ("corpus-floats", "corpus.npy", _npy(np.linspace(0, 9, 50)), CORPUS_ARGV),
    ("corpus-out-of-vocab", "corpus.npy", _npy(np.array([5, 10**9, 7, 8])), CORPUS_ARGV),
    ("record-garbage", "record.json", b"\xd2\x00garbage", RECORD_ARGV),
    ("record-list", "record.json", b"[]", RECORD_ARGV),
    ("record-fields", "record.json", b'{"format": "warpdecode-regression", "prompts": 5}', RECORD_ARGV),
    ("record-types", "record.json", json.dumps({"format": "warpdecode-regression", "fingerprint": "x", "backend": "torch",
                                                "max_new_tokens": "many", "prompts": [], "methods": [],
                                                "results": {}}).encode(), RECORD_ARGV),
]


def file_cases() -> list[tuple[str, list[str]]]:
    cases = [(f"model:{name}", ["generate", "--model", "{case_dir}", "--prompt", "hello", "--max_new_tokens", "2",
                                "--chat", "true" if name.startswith("chat") else "false"]) for name, _ in MODEL_FILES]
    cases += [(f"package:{name}", ["generate", "--package", "{case_dir}", "--prompt", "hello", "--max_new_tokens", "2"])
              for name, _ in PACKAGE_FILES]
    cases += [(f"drafter:{name}", ["generate", "--model", "{model}", "--prompt", "hello", "--max_new_tokens", "2",
                                   "--method", "eagle:path={case_dir}"])
              for name, _ in DRAFTER_FILES]
    cases += [(f"file:{name}", argv) for name, _, _, argv in STANDALONE_FILES]
    return cases


ALL_CASES: list[tuple[str, list[str], str]] = [
    *flag_cases(), *((name, argv, "error") for name, argv in SEMANTIC), *((name, argv, "error") for name, argv in file_cases())]

# --- running them ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_results(tmp_path_factory: pytest.TempPathFactory, dlm_dir: Path) -> dict[str, dict[str, Any]]:
    """Every case run once in one worker process (shared by the pytest-xdist workers: `built_once`)."""
    results = built_once(tmp_path_factory, "fuzz", lambda base: _run_cases(base / "fuzz", dlm_dir)) / "results.json"
    return json.loads(results.read_text())


def _run_cases(root: Path, dlm_dir: Path) -> None:
    """Build the cases' inputs under `root`, run every case, and leave `root / "results.json"`."""
    from warpdecode.export.package import export_package
    from warpdecode.models.checkpoint import load_pretrained

    root.mkdir()
    model_dir = save_tiny_model(root / "model")
    model, tokenizer = load_pretrained(model_dir)
    package = export_package(model, tokenizer, root / "package", source="tiny")
    drafter = Path(eagle_package(model, root / "eagle"))
    distilled = Path(distilled_package(model, root / "distilled"))
    garbage = root / "garbage.bin"
    garbage.write_bytes(os.urandom(1024))
    (root / "empty").mkdir()
    fixed = {"model": model_dir, "package": package, "garbage": garbage, "empty_dir": root / "empty",
             "eagle": drafter, "distilled": distilled, "dlm": dlm_dir}

    sources: dict[str, tuple[Path, Mutation | None]] = {}
    for name, mutate in MODEL_FILES:
        sources[f"model:{name}"] = (model_dir, mutate)
    for name, mutate in PACKAGE_FILES:
        sources[f"package:{name}"] = (package, mutate)
    for name, mutate in DRAFTER_FILES:
        sources[f"drafter:{name}"] = (drafter, mutate)

    cases = []
    for i, (case_id, template, _) in enumerate(ALL_CASES):
        case_dir = root / "cases" / f"{i:03d}"
        out = root / "out" / f"{i:03d}"
        out.mkdir(parents=True)
        if case_id in sources:
            source, mutate = sources[case_id]
            shutil.copytree(source, case_dir, symlinks=True)
            assert mutate is not None
            mutate(case_dir)
        elif case_id.startswith("file:"):
            case_dir.mkdir(parents=True)
            _, filename, data, _ = next(f for f in STANDALONE_FILES if f"file:{f[0]}" == case_id)
            (case_dir / filename).write_bytes(data() if callable(data) else data)
        values = {**fixed, "case_dir": case_dir, "out": out}
        argv = [_fill(arg, values) for arg in template]
        cases.append({"id": case_id, "argv": argv, "cwd": str(out)})

    (root / "cases.json").write_text(json.dumps(cases))
    results = root / "results.json"
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parent), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, str(WORKER), str(root / "cases.json"), str(results),
                           "--timeout", str(CASE_SECONDS)], env=env, capture_output=True, text=True, check=False,
                          timeout=CASE_SECONDS * len(cases) + 60)
    done = json.loads(results.read_text()) if results.exists() else {}
    assert proc.returncode == 0, f"the fuzz worker died after {len(done)} cases: {proc.stderr[-3000:]}"


def _fill(arg: str, values: dict[str, Path]) -> str:
    for key, value in values.items():
        arg = arg.replace("{" + key + "}", str(value))
    return arg


@pytest.mark.parametrize(("case_id", "expect"), [(case_id, expect) for case_id, _, expect in ALL_CASES],
                         ids=[case_id for case_id, _, _ in ALL_CASES])
def test_cli_case_ends_cleanly(case_id: str, expect: str, fuzz_results: dict[str, dict[str, Any]]) -> None:
    if case_id == "generate-device-gpu-index" and torch.cuda.device_count() > 99:
        pytest.skip("this machine has a GPU of that index")
    result = fuzz_results[case_id]
    stderr = result["stderr"]
    assert result["status"] != "timeout", f"{case_id} ran past {CASE_SECONDS} s"
    assert "Traceback" not in stderr, f"{case_id} ended in a traceback:\n{stderr}"
    if expect == "error":
        assert result["status"] == 2, f"{case_id} was not refused (status {result['status']}): {stderr[-500:]}"
    else:
        assert result["status"] in (0, 2), f"{case_id} ended with status {result['status']}: {stderr[-500:]}"
    if result["status"] == 2:
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), f"{case_id} printed {len(lines)} lines:\n{stderr}"
    assert result["peak_mib"] < PEAK_MIB, f"{case_id}: the process peaked at {result['peak_mib']} MiB"


def test_every_flag_of_every_command_is_fuzzed() -> None:
    """The flag cases follow the signatures: every command is here, and every typed keyword flag gets its
    wrong-type values."""
    from warpdecode.cli import command_functions

    assert set(COMMANDS) == {f.__name__ for f in command_functions()}
    fuzzed = {case_id.split("=")[0] for case_id, _, _ in flag_cases()}
    for name, (function, _, _) in COMMANDS.items():
        hints = typing.get_type_hints(function)
        for param in inspect.signature(function).parameters.values():
            if param.kind is inspect.Parameter.KEYWORD_ONLY and _base_type(hints[param.name]) in WRONG_TYPE:
                assert f"{name}--{param.name}" in fuzzed

"""The non-training subcommands: typed functions whose signatures and docstrings are the CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from warpdecode.models.named import DEFAULT_MODEL


def convert(source: str, out: Path) -> None:
    """Convert a checkpoint into a warpdecode model directory (safetensors, config.json, tokenizer.json).

    Args:
        source: a Hugging Face checkpoint directory, a .gguf file, or a model name such as
            smollm2-135m-instruct.
        out: output directory (created; replaced if it exists).
    """
    from warpdecode.models.checkpoint import convert as run_convert

    path = run_convert(source, out)
    print(f"wrote {path}")


def generate(
    *,
    model: str = DEFAULT_MODEL,
    prompt: str,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    typical_p: float | None = None,
    repetition_penalty: float = 1.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    seed: int | None = None,
    chat: bool | None = None,
    method: str = "none",
    method_options: dict[str, Any] | None = None,
    verifier: str | None = None,
    verifier_options: dict[str, Any] | None = None,
    controller: str = "fixed",
    controller_options: dict[str, Any] | None = None,
    json_output: bool = False,
    threads: int | None = None,
) -> None:
    """Generate text from a prompt, streaming it to the terminal.

    Args:
        model: model directory, .gguf file, or model name.
        prompt: the prompt text.
        max_new_tokens: largest number of tokens to generate.
        temperature: 0 for greedy decoding; > 0 samples at this temperature.
        top_k: sample only among the k most likely tokens.
        top_p: nucleus sampling mass in (0, 1].
        min_p: keep tokens with at least this fraction of the top token's probability.
        typical_p: locally typical sampling mass in (0, 1].
        repetition_penalty: > 1 discourages tokens already in the prompt or output (1: off); also greedy.
        frequency_penalty: subtracted from a generated token's logit per occurrence; also greedy.
        presence_penalty: subtracted from the logit of every token generated so far; also greedy.
        seed: random seed for sampling.
        chat: wrap the prompt in the model's chat template (default: when the model has one).
        method: decoding method (a drafter from `warpdecode methods`); none = plain decoding.
        method_options: the drafter's options as JSON, e.g. '{"layers": 10}' for draft_model.
        verifier: acceptance rule; default: greedy matching, or speculative sampling when sampling.
        verifier_options: the verifier's options as JSON.
        controller: draft budget per step: fixed, or adaptive (grows while drafts are accepted).
        controller_options: the controller's options as JSON, e.g. '{"initial": 4}'.
        json_output: print one JSON object {"text", "token_ids", "stats"} instead of streaming (also --json).
        threads: CPU threads for torch (default: torch's choice).
    """
    from warpdecode.decoding.generate import build_method
    from warpdecode.decoding.generate import generate as run_generate
    from warpdecode.errors import ConfigError
    from warpdecode.models.checkpoint import load_pretrained

    if temperature < 0:
        raise ConfigError(f"--temperature must be >= 0, got {temperature}")
    if threads is not None:
        torch.set_num_threads(threads)
    built = build_method(method, do_sample=temperature > 0, verifier=verifier, options=method_options,
                         verifier_options=verifier_options, controller=controller,
                         controller_options=controller_options)
    target, tokenizer = load_pretrained(model)

    def stream(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    out = run_generate(
        target,
        tokenizer,
        prompt,
        max_new_tokens=max_new_tokens,
        do_sample=temperature > 0,
        temperature=temperature if temperature > 0 else 1.0,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        typical_p=typical_p,
        repetition_penalty=repetition_penalty,
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
        seed=seed,
        chat=chat,
        method=built,
        streamer=None if json_output else stream,
    )
    if json_output:
        print(json.dumps({"text": out.text, "token_ids": out.token_ids, "finish_reason": out.finish_reason,
                          "stats": out.stats.to_dict()}))
    else:
        s = out.stats
        print()
        print(f"[{s.new_tokens} tokens in {s.seconds:.2f} s, {s.tokens_per_second:.1f} tok/s, tau {s.tau:.2f}, "
              f"first token {s.time_to_first_token * 1000:.0f} ms, stop: {out.finish_reason}]", file=sys.stderr)


def methods(*, json_output: bool = False) -> None:
    """List the registered decoding components: drafters (methods), verifiers and controllers.

    Args:
        json_output: print JSON instead of a table (also --json).
    """
    from warpdecode.decoding import registry

    rows: list[dict[str, Any]] = []
    for kind in registry.KINDS:
        for name in registry.names(kind):
            cls = registry.get(kind, name)
            rows.append({
                "kind": kind,
                "name": name,
                # a drafter's output is decided by its verifier; the default verifiers are lossless
                "lossless": getattr(cls, "lossless", kind == "drafter" or None),
                "needs_training": getattr(cls, "needs_training", False),
                "options": registry.options(cls),
                "summary": (cls.__module__ and sys.modules[cls.__module__].__doc__ or "").strip().splitlines()[0],
            })
    if json_output:
        print(json.dumps(rows, indent=2, default=str))
        return
    for row in rows:
        lossless = {True: "lossless", False: "LOSSY", None: ""}[row["lossless"]]
        options = ", ".join(f"{k}={v['default']}" for k, v in row["options"].items())
        print(f"{row['kind']:<10} {row['name']:<22} {lossless:<9} {'trained' if row['needs_training'] else '':<8} "
              f"{options}")
        print(f"{'':<10} {row['summary']}")
    print("\nDrafters are lossless with the default verifier (greedy, or speculative_sampling when sampling).")


def bench(
    *,
    model: str = DEFAULT_MODEL,
    methods: str | list[str | dict[str, Any]] = "none,prompt_lookup",
    prompts: str = "spec_bench",
    categories: str | None = None,
    limit: int | None = None,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    peers: str = "auto",
    threads: int | None = None,
    warmup_tokens: int = 8,
    out: Path = Path("runs/bench"),
) -> None:
    """Benchmark decoding methods side by side on a prompt set; writes results.json, results.md, speedup.png.

    For each prompt every method runs in turn (interleaved, after a warm-up), so machine noise spreads
    over all of them; plain greedy `none` always runs and is the speedup baseline. Example:

        warpdecode bench --methods prompt_lookup,draft_model:layers=10:num_tokens=4 --prompts spec_bench --limit 2

    Args:
        model: model directory, .gguf file, or model name.
        methods: comma-separated specs NAME[:KEY=VALUE...]: a drafter from `warpdecode methods` and its
            options, e.g. prompt_lookup:num_tokens=4,draft_model:layers=10. Values are int, float,
            true/false, null or text. In a --config file: a list of specs or of {name: ..., KEY: VALUE} mappings.
        prompts: prompt set(s), comma-separated: spec_bench, humaneval, stdlib_code (read from
            $WARPDECODE_DATASETS, default <repo>/../shared/datasets).
        categories: only these comma-separated categories of the sets, e.g. summarization,rag.
        limit: at most this many prompts per category (default: the whole set).
        max_new_tokens: largest number of tokens generated per prompt.
        temperature: 0 for greedy decoding (output compared with plain greedy); > 0 samples.
        top_k: sample only among the k most likely tokens.
        top_p: nucleus sampling mass in (0, 1].
        seed: sampling seed of the first prompt (prompt i uses seed + i).
        peers: auto (transformers rows when transformers is installed), transformers, or none.
        threads: CPU threads for torch (default: torch's choice); peers run on the same threads.
        warmup_tokens: tokens each method generates once before measuring (0: no warm-up).
        out: output directory.
    """
    from warpdecode.bench.harness import BenchConfig, run_bench
    from warpdecode.bench.report import write

    config = BenchConfig(model=model, prompts=prompts, categories=categories, limit=limit, max_new_tokens=max_new_tokens,
                         temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, peers=peers, threads=threads,
                         warmup_tokens=warmup_tokens)
    result = run_bench(config, methods=methods)
    paths = write(result, out)
    print(result.table())
    print(f"\n{len(result.skipped_too_long)} prompt(s) skipped as too long; wrote {', '.join(map(str, paths.values()))}")

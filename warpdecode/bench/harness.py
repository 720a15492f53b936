"""`run_bench`: every method (and peer) on the same prompts, in one process, interleaved.

For each prompt every row runs once, in an order rotated by one per prompt, so machine noise (shared
cores, CPU steal) and cache effects spread over all rows. Each row first runs a short warm-up. Plain
greedy `none` always runs: speedups are ratios to it in the same run (docs/metrics.md), and at
temperature 0 every row's tokens are compared with it.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from warpdecode.bench import peers as peer_lib
from warpdecode.bench.machine import PeakRSS, load_average, machine_info
from warpdecode.bench.prompts import BenchPrompt, load_prompts
from warpdecode.bench.results import (
    TRANSFORMERS,
    BenchConfig,
    BenchResult,
    Measurement,
    RowInfo,
    aggregate,
    first_difference,
)
from warpdecode.bench.specs import BASELINE, MethodSpec, parse_methods
from warpdecode.decoding import registry
from warpdecode.decoding.engine import Method
from warpdecode.decoding.generate import encode_prompt, generate
from warpdecode.decoding.protocols import ResolvesSettings
from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.checkpoint import resolve, save_pretrained
from warpdecode.models.device import torch_device, torch_dtype
from warpdecode.runtime.load import TORCH, load_backbones, open_package, parse_backends
from warpdecode.runtime.package import LOSSY_BACKENDS

PEERS = ("auto", "transformers", "none")


def row_label(spec: MethodSpec, backend: str) -> str:
    """`prompt_lookup` on torch, `prompt_lookup@onnxruntime` on another backend."""
    return spec.label if backend == TORCH else f"{spec.label}@{backend}"


def _peer_rows(config: BenchConfig, specs: list[MethodSpec], model_dir: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """Transformers rows: greedy, then its version of each listed method that has one."""
    if config.peers == "none":
        return {}, {}
    dtype = torch_dtype(config.dtype)
    try:
        base = peer_lib.TransformersGenerate(model_dir, device=config.device, dtype=dtype)
    except CapabilityError as e:
        if config.peers == "auto":
            return {}, {TRANSFORMERS: str(e)}
        raise
    built: dict[str, Any] = {TRANSFORMERS: base}
    skipped: dict[str, str] = {}
    for spec in specs:
        equivalent = peer_lib.TRANSFORMERS_EQUIVALENTS.get(spec.name)
        if equivalent is None:
            continue
        defaults = {k: v["default"] for k, v in registry.options(registry.get("drafter", spec.name)).items()}
        label = f"{TRANSFORMERS}/{spec.label}"
        try:
            built[label] = peer_lib.TransformersGenerate(model_dir, model=base.model, device=config.device,
                                                         dtype=dtype,
                                                         generate_kwargs=equivalent(defaults | spec.options, model_dir))
        except (CapabilityError, OSError, ValueError) as e:
            skipped[label] = f"{type(e).__name__}: {e}"
    return built, skipped


def _prepared_methods(runs: list[tuple[MethodSpec, str]], backbones: dict[str, Backbone],
                      sampling: bool) -> tuple[dict[str, Method], dict[str, str]]:
    """Each run's method, prepared for its backend (outside any timed decode), and the rows whose
    method cannot run on their backend (`CapabilityError`, e.g. PPD's input embeddings on an ONNX
    Runtime graph) with the reason; the baseline must run."""
    built: dict[str, Method] = {}
    unsupported: dict[str, str] = {}
    for spec, backend in runs:
        label, method = row_label(spec, backend), spec.build(do_sample=sampling)
        try:
            method.drafter.prepare(backbones[backend])
            method.verifier.prepare(backbones[backend])
        except CapabilityError as e:
            if spec.label == BASELINE:
                raise
            unsupported[label] = f"{type(e).__name__}: {e}"
            continue
        built[label] = method
    return built, unsupported


def run_bench(
    config: BenchConfig | None = None,
    *,
    methods: str | list[Any] | None = None,
    prompts: list[BenchPrompt] | None = None,
    progress: bool = True,
) -> BenchResult:
    """Run the benchmark described by `config` (or by `methods` with the other defaults).

    `prompts` replaces the named set of `config.prompts` (already limited). Raises `ConfigError` for
    bad specs or sets before any model is loaded, `CapabilityError` for `peers="transformers"`
    without transformers installed.
    """
    config = config or BenchConfig()
    backends = parse_backends(config.backends)
    if config.package and config.device != "cpu":
        raise ConfigError("bench --package runs on the CPU; --device cuda benchmarks --model on torch")
    package = open_package(config.package)
    if package is not None and not package.config.causal:
        raise ConfigError("this package holds a masked diffusion LM: bench its model directory with --model "
                          "(commit policies on parallel_bench); the package decodes with generate --package")
    specs = parse_methods(methods if methods is not None else config.methods,
                          defaults=package.drafter_options() if package else None)
    config.methods = [s.label for s in specs]
    if config.peers not in PEERS:
        raise ConfigError(f"--peers must be one of {', '.join(PEERS)}, got {config.peers!r}")
    if config.temperature < 0 or config.max_new_tokens < 1 or config.warmup_tokens < 0:
        raise ConfigError(f"need --temperature >= 0, --max-new-tokens >= 1, --warmup-tokens >= 0; got "
                          f"{config.temperature}, {config.max_new_tokens}, {config.warmup_tokens}")
    chosen = prompts if prompts is not None else load_prompts(config.prompts, limit=config.limit, categories=config.categories)
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    start = time.perf_counter()
    machine = machine_info(torch_device(config.device))
    sampling = config.temperature > 0
    backbones, tokenizer = load_backbones(config.model if package is None else None, package,
                                          list(dict.fromkeys([TORCH, *backends])), device=config.device,
                                          dtype=config.dtype, threads=config.threads)
    context = backbones[TORCH].config.max_seq_len
    if tokenizer is None:
        raise ConfigError("bench needs a tokenizer; the package was exported without one")
    encoded: list[tuple[BenchPrompt, list[int]]] = []
    too_long: list[tuple[BenchPrompt, list[int]]] = []
    for p in chosen:
        ids = encode_prompt(tokenizer, p.text, chat=p.chat)
        (encoded if len(ids) + config.max_new_tokens <= context else too_long).append((p, ids))
    if not encoded:
        raise ConfigError(f"all {len(chosen)} prompts are longer than the context ({context} tokens) "
                          f"minus --max-new-tokens {config.max_new_tokens}")
    # torch runs the baseline even when only other backends were asked for
    runs = [(s, b) for b in dict.fromkeys([TORCH] + backends) for s in specs if b in backends or s.label == BASELINE]
    built_methods, unsupported = _prepared_methods(runs, backbones, sampling)
    runs = [(s, b) for s, b in runs if row_label(s, b) in built_methods]
    if package is None:
        peer_models, skipped_rows = _peer_rows(config, specs, resolve(config.model))
    else:  # the peers load the package's weights from a temporary checkpoint
        with tempfile.TemporaryDirectory(prefix="warpdecode-peer-") as tmp:
            if config.peers != "none":
                save_pretrained(backbones[TORCH].torch_model(), tokenizer, tmp)
            peer_models, skipped_rows = _peer_rows(config, specs, Path(tmp))
    skipped_rows = unsupported | skipped_rows
    rows = [RowInfo(row_label(s, b), "warpdecode", built_methods[row_label(s, b)].verifier.lossless
                    and b not in LOSSY_BACKENDS, s.options, b) for s, b in runs]
    rows += [RowInfo(label, "transformers", True, peer_lib.describe(p.generate_kwargs)) for label, p in peer_models.items()]
    temperature = config.temperature if sampling else 1.0

    def run_row(row: RowInfo, ids: list[int], max_new: int, seed: int) -> Measurement:
        with PeakRSS() as peak:
            if row.kind == "warpdecode":
                out = generate(backbones[row.backend], tokenizer, ids, max_new_tokens=max_new, do_sample=sampling, seed=seed,
                               temperature=temperature, top_k=config.top_k, top_p=config.top_p,
                               method=built_methods[row.label])
                s = out.stats
                tokens, seconds, ttft, draft = out.token_ids, s.seconds, s.time_to_first_token, s.draft_seconds
                forwards, accepted, proposed = s.target_forwards, sum(s.accepted_per_step), sum(s.proposed_per_step)
                divergent: int | None = s.divergent_tokens
            else:
                peer = peer_models[row.label].generate(ids, max_new, do_sample=sampling, seed=seed, temperature=temperature,
                                                       top_k=config.top_k, top_p=config.top_p)
                tokens, seconds, ttft, draft = peer.token_ids, peer.seconds, None, None
                forwards, accepted, proposed, divergent = None, None, None, None
        return Measurement(row=row.label, prompt_tokens=len(ids), new_tokens=len(tokens), seconds=seconds,
                           time_to_first_token=ttft, target_forwards=forwards, accepted=accepted, proposed=proposed,
                           draft_seconds=draft, peak_rss_mib=peak.mib, token_ids=tokens, divergent=divergent)

    if config.warmup_tokens:
        for row in rows:
            run_row(row, encoded[0][1], config.warmup_tokens, config.seed)
    measurements: list[Measurement] = []
    with tqdm(total=len(encoded) * len(rows), desc="bench", unit="gen", disable=not progress) as bar:
        for i, (prompt, ids) in enumerate(encoded):
            shift = i % len(rows)
            done = {}
            for row in rows[shift:] + rows[:shift]:
                bar.set_postfix_str(f"{prompt.id} {row.label}", refresh=False)
                done[row.label] = run_row(row, ids, config.max_new_tokens, config.seed + i)
                bar.update()
            for row in rows:
                m = done[row.label]
                m.prompt_id, m.category = prompt.id, prompt.category
                m.identical = None if sampling else m.token_ids == done[BASELINE].token_ids
                m.first_difference = None if sampling else first_difference(m.token_ids, done[BASELINE].token_ids)
                measurements.append(m)
    for row in rows:
        drafter = built_methods[row.label].drafter if row.kind == "warpdecode" else None
        if isinstance(drafter, ResolvesSettings):
            row.resolved = drafter.resolved_settings()
    categories = list(dict.fromkeys(p.category for p, _ in encoded))
    return BenchResult(
        config=config, machine=machine | {"load_average_end": load_average()}, rows=rows, measurements=measurements,
        aggregates=aggregate(rows, measurements, categories, sampling), categories=categories,
        skipped_too_long=[p.id for p, _ in too_long], skipped_rows=skipped_rows,
        wall_seconds=time.perf_counter() - start,
    )

"""`run_bench`: every method (and peer) on the same prompts, in one process, interleaved.

For each prompt every row runs once, in an order rotated by one per prompt, so machine noise (shared
cores, CPU steal) and cache effects spread over all rows. Each row first runs a short warm-up. Plain
greedy `none` always runs: speedups are ratios to it in the same run (docs/metrics.md), and at
temperature 0 every row's tokens are compared with it. What a run produces is typed in `results`.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, replace
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
from warpdecode.decoding.generate import encode_prompt, generate, stop_token_ids
from warpdecode.decoding.protocols import ResolvesSettings
from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.checkpoint import resolve, save_pretrained
from warpdecode.models.device import torch_device, torch_dtype
from warpdecode.models.named import NAMED_MODELS, named_model_gguf
from warpdecode.models.random_shapes import is_random
from warpdecode.models.tokenizer import Tokenizer
from warpdecode.runtime.load import TORCH, load_backbones, open_package, parse_backends, parse_dtypes
from warpdecode.runtime.package import LOSSY_BACKENDS, InferencePackage

PEERS = ("auto", "transformers", "llama.cpp", "none")


def row_label(spec: MethodSpec, backend: str, dtype: str | None = None) -> str:
    """`prompt_lookup` on torch, `prompt_lookup@onnxruntime` on another backend, `prompt_lookup@q4` in a
    precision `dtype` other than the run's reference."""
    return spec.label + ("" if backend == TORCH else f"@{backend}") + ("" if dtype is None else f"@{dtype}")


def _backbone_key(row: RowInfo, reference: str) -> str:
    """Where `_loaded` keeps the row's backbone: its backend in the reference precision, else its precision."""
    return row.backend if row.dtype == reference else row.dtype


def _drafter_options(spec: MethodSpec) -> dict[str, Any]:
    """The options of `spec`'s drafter, its defaults filled in (what a peer's version of the method gets)."""
    defaults = {k: v["default"] for k, v in registry.options(registry.get("drafter", spec.name)).items()}
    return defaults | spec.options


def _peer_rows(config: BenchConfig, specs: list[MethodSpec], model_dir: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """Transformers rows: greedy, then its version of each listed method that has one."""
    if config.peers in ("none", peer_lib.LlamaCppGenerate.name):
        return {}, {}
    dtype = torch_dtype(parse_dtypes(config.dtype, False)[0])
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
        label = f"{TRANSFORMERS}/{spec.label}"
        try:
            built[label] = peer_lib.TransformersGenerate(model_dir, model=base.model, device=config.device,
                                                         dtype=dtype,
                                                         generate_kwargs=equivalent(_drafter_options(spec), model_dir))
        except (CapabilityError, OSError, ValueError) as e:
            skipped[label] = f"{type(e).__name__}: {e}"
    return built, skipped


def _checked(config: BenchConfig,
             methods: str | list[Any] | None) -> tuple[list[str], list[str], InferencePackage | None, list[MethodSpec]]:
    """The backends, the precisions (reference first), the verified package and the method specs of
    `config` (whose `methods` become the specs' labels); `ConfigError` for a setting that cannot run,
    before any model is loaded."""
    backends = parse_backends(config.backends)
    dtypes = parse_dtypes(config.dtype, config.package is not None)
    if len(dtypes) > 1 and backends != [TORCH]:
        raise ConfigError(f"several --dtype values ({config.dtype}) run on the torch backend only, not {config.backends}")
    if config.package and config.device != "cpu":
        raise ConfigError("bench --package runs on the CPU; --device cuda benchmarks --model on torch")
    package = open_package(config.package)
    if package is not None and not package.config.causal:
        raise ConfigError("this package holds a masked diffusion LM: bench its model directory with --model "
                          "(commit policies on parallel_bench); the package decodes with generate --package")
    specs = parse_methods(methods if methods is not None else config.methods,
                          defaults=registry.package_options(package.drafter_directories()) if package else None)
    config.methods = [s.label for s in specs]
    if config.peers not in PEERS:
        raise ConfigError(f"--peers must be one of {', '.join(PEERS)}, got {config.peers!r}")
    if config.temperature < 0 or config.max_new_tokens < 1 or config.warmup_tokens < 0:
        raise ConfigError(f"need --temperature >= 0, --max-new-tokens >= 1, --warmup-tokens >= 0; got "
                          f"{config.temperature}, {config.max_new_tokens}, {config.warmup_tokens}")
    return backends, dtypes, package, specs


def _loaded(config: BenchConfig, package: InferencePackage | None, backends: list[str],
            dtypes: list[str]) -> tuple[dict[str, Backbone], Tokenizer]:
    """The model (or package) on torch and on each of `backends` in the reference precision `dtypes[0]`,
    keyed by backend, and on torch in each other precision, keyed by it; and its tokenizer."""
    backbones, tokenizer = load_backbones(config.model if package is None else None, package,
                                          list(dict.fromkeys([TORCH, *backends])), device=config.device,
                                          dtype=dtypes[0], threads=config.threads)
    for dtype in dtypes[1:]:
        backbones[dtype] = load_backbones(config.model, None, [TORCH], device=config.device, dtype=dtype)[0][TORCH]
    if tokenizer is None:
        raise ConfigError("bench needs a tokenizer; the package was exported without one")
    return backbones, tokenizer


Encoded = list[tuple[BenchPrompt, list[int]]]
"""Prompts with their token ids."""


def _encoded(prompts: list[BenchPrompt], tokenizer: Tokenizer, context: int, max_new_tokens: int) -> tuple[Encoded, Encoded]:
    """The prompts' token ids: those that fit the `context` with `max_new_tokens` more, and those that do
    not (skipped); `ConfigError` when none fits."""
    encoded: Encoded = []
    too_long: Encoded = []
    for p in prompts:
        ids = encode_prompt(tokenizer, p.text, chat=p.chat)
        (encoded if len(ids) + max_new_tokens <= context else too_long).append((p, ids))
    if not encoded:
        raise ConfigError(f"all {len(prompts)} prompts are longer than the context ({context} tokens) "
                          f"minus --max-new-tokens {max_new_tokens}")
    return encoded, too_long


def _method_rows(specs: list[MethodSpec], backends: list[str], dtypes: list[str], backbones: dict[str, Backbone],
                 sampling: bool) -> tuple[list[RowInfo], dict[str, Method], dict[str, str]]:
    """A row for each method on each backend (torch runs the baseline even when only other backends
    were asked for) and on torch in each other precision, with its method prepared for its backbone
    outside any timed decode; and the rows whose method cannot run there (`CapabilityError`, e.g. PPD's
    input embeddings on an ONNX Runtime graph, int4_self on an int4 target without layers=) with the
    reason. The baselines must run."""
    rows: list[RowInfo] = []
    built: dict[str, Method] = {}
    unsupported: dict[str, str] = {}
    reference = dtypes[0]
    runs = [(s, b, reference) for b in dict.fromkeys([TORCH] + backends) for s in specs
            if b in backends or s.label == BASELINE]
    runs += [(s, TORCH, d) for d in dtypes[1:] for s in specs]
    for spec, backend, dtype in runs:
        label = row_label(spec, backend, None if dtype == reference else dtype)
        row = RowInfo(label=label, kind="warpdecode", lossless=False, settings=spec.options, backend=backend, dtype=dtype)
        method, backbone = spec.build(do_sample=sampling), backbones[_backbone_key(row, reference)]
        try:
            method.drafter.prepare(backbone)
            method.verifier.prepare(backbone)
        except CapabilityError as e:
            if spec.label == BASELINE:
                raise
            unsupported[label] = f"{type(e).__name__}: {e}"
            continue
        built[label] = method
        rows.append(replace(row, lossless=method.verifier.lossless and backend not in LOSSY_BACKENDS))
    return rows, built, unsupported


def _llama_cpp_row(config: BenchConfig, specs: list[MethodSpec], backbone: Backbone,
                   tokenizer: Tokenizer) -> tuple[dict[str, Any], dict[str, str]]:
    """llama.cpp's greedy decoding of --model's GGUF file (a named model's or a .gguf path), with `--peers auto`
    (a one-line note when llama-cpp-python is not installed) or `--peers llama.cpp`; and for each listed
    `prompt_lookup` method, llama.cpp's own prompt-lookup drafting with its n-gram and draft sizes
    (`llama.cpp/<its label>`; the controller and the chain scaling are warpdecode's own)."""
    name = peer_lib.LlamaCppGenerate.name
    if config.peers not in ("auto", name) or config.temperature > 0:
        return {}, {}
    if config.model in NAMED_MODELS:
        gguf = named_model_gguf(config.model)
    elif config.model.endswith(".gguf"):
        gguf = Path(config.model)
    else:
        return {}, {} if config.peers == "auto" else {name: "--model is not a GGUF file"}
    modes: dict[str, tuple[int, int] | None] = {name: None}
    for spec in specs:
        if spec.name == "prompt_lookup":
            options = _drafter_options(spec)
            sizes = (int(options["max_ngram"]), int(options["num_tokens"]))
            if sizes not in modes.values():  # one row per n-gram and draft size (controllers are warpdecode's)
                modes[f"{name}/{spec.label}"] = sizes
    peers: dict[str, Any] = {}
    try:
        for label, mode in modes.items():
            peers[label] = peer_lib.LlamaCppGenerate(gguf, threads=config.threads or torch.get_num_threads(),
                                                     context=backbone.config.max_seq_len,
                                                     stop_ids=stop_token_ids(backbone, tokenizer), prompt_lookup=mode)
    except CapabilityError as e:
        return {}, {name: str(e)}
    return peers, {}


def _peers(config: BenchConfig, specs: list[MethodSpec], package: InferencePackage | None,
           backbones: dict[str, Backbone], tokenizer: Tokenizer) -> tuple[dict[str, Any], dict[str, str]]:
    """`_peer_rows` on the model's checkpoint; for a package or a random-weights model, on its weights
    written to a temporary one; and llama.cpp on the model's GGUF file."""
    if package is None and not is_random(config.model):
        built, skipped = _peer_rows(config, specs, resolve(config.model))
        llama, llama_skipped = _llama_cpp_row(config, specs, backbones[TORCH], tokenizer)
        return built | llama, skipped | llama_skipped
    with tempfile.TemporaryDirectory(prefix="warpdecode-peer-") as tmp:
        if config.peers != "none":
            save_pretrained(backbones[TORCH].torch_model(), tokenizer, tmp)
        return _peer_rows(config, specs, Path(tmp))


@dataclass
class _Runner:
    """Runs one row on one prompt and measures it: the rows' prepared methods on their backbones, and the
    peers, with the sampling settings of `config`."""

    config: BenchConfig
    backbones: dict[str, Backbone]
    """Keyed by `_backbone_key`."""
    tokenizer: Tokenizer
    methods: dict[str, Method]
    peers: dict[str, Any]
    dtypes: list[str]
    """The run's precisions, the reference first."""

    @property
    def sampling(self) -> bool:
        return self.config.temperature > 0

    def measure(self, row: RowInfo, ids: list[int], max_new_tokens: int, seed: int) -> Measurement:
        run = self._decode if row.kind == "warpdecode" else self._peer
        with PeakRSS() as peak:
            measured = run(row, ids, max_new_tokens, seed)
        return replace(measured, peak_rss_mib=peak.mib)  # known once the block has ended

    def _decode(self, row: RowInfo, ids: list[int], max_new_tokens: int, seed: int) -> Measurement:
        c = self.config
        backbone = self.backbones[_backbone_key(row, self.dtypes[0])]
        out = generate(backbone, self.tokenizer, ids, max_new_tokens=max_new_tokens,
                       do_sample=self.sampling, seed=seed, temperature=c.temperature if self.sampling else 1.0,
                       top_k=c.top_k, top_p=c.top_p, method=self.methods[row.label])
        s = out.stats
        return Measurement(row=row.label, prompt_tokens=len(ids), new_tokens=len(out.token_ids), seconds=s.seconds,
                           time_to_first_token=s.time_to_first_token, target_forwards=s.target_forwards,
                           accepted=sum(s.accepted_per_step), proposed=sum(s.proposed_per_step),
                           draft_seconds=s.draft_seconds, peak_rss_mib=None, token_ids=out.token_ids,
                           divergent=s.divergent_tokens)

    def _peer(self, row: RowInfo, ids: list[int], max_new_tokens: int, seed: int) -> Measurement:
        c = self.config
        out = self.peers[row.label].generate(ids, max_new_tokens, do_sample=self.sampling, seed=seed,
                                             temperature=c.temperature if self.sampling else 1.0, top_k=c.top_k,
                                             top_p=c.top_p)
        return Measurement(row=row.label, prompt_tokens=len(ids), new_tokens=len(out.token_ids), seconds=out.seconds,
                           time_to_first_token=out.time_to_first_token, target_forwards=None, accepted=None, proposed=None,
                           draft_seconds=None, peak_rss_mib=None, token_ids=out.token_ids)


def _measured(runner: _Runner, rows: list[RowInfo], encoded: Encoded, progress: bool) -> list[Measurement]:
    """A warm-up of every row, then every row on every prompt, in an order rotated by one per prompt."""
    config = runner.config
    if config.warmup_tokens:
        for row in rows:
            runner.measure(row, encoded[0][1], config.warmup_tokens, config.seed)
    measurements: list[Measurement] = []
    with tqdm(total=len(encoded) * len(rows), desc="bench", unit="gen", disable=not progress) as bar:
        for i, (prompt, ids) in enumerate(encoded):
            shift = i % len(rows)
            done = {}
            for row in rows[shift:] + rows[:shift]:
                bar.set_postfix_str(f"{prompt.id} {row.label}", refresh=False)
                done[row.label] = runner.measure(row, ids, config.max_new_tokens, config.seed + i)
                bar.update()
            reference = done[BASELINE] if len(runner.dtypes) > 1 else None
            measurements += [_compared(done[row.label], prompt, done[_baseline_of(row, runner.dtypes[0])], reference,
                                       runner.sampling) for row in rows]
    return measurements


def _baseline_of(row: RowInfo, reference: str) -> str:
    """The plain-greedy row `row` is compared with: `none` in the row's own precision (`none` for the
    reference precision, its backends and the peers)."""
    return BASELINE if row.kind != "warpdecode" or row.dtype == reference else row_label(MethodSpec(BASELINE), TORCH, row.dtype)


def _compared(m: Measurement, prompt: BenchPrompt, baseline: Measurement, reference: Measurement | None,
              sampling: bool) -> Measurement:
    """`m` on `prompt`, compared with the baseline's tokens on it and, with several precisions, with the
    reference precision's `none` (no comparison when sampling)."""
    if sampling:
        return replace(m, prompt_id=prompt.id, category=prompt.category)
    return replace(m, prompt_id=prompt.id, category=prompt.category, identical=m.token_ids == baseline.token_ids,
                   first_difference=first_difference(m.token_ids, baseline.token_ids),
                   reference_identical=None if reference is None else m.token_ids == reference.token_ids,
                   reference_difference=None if reference is None else first_difference(m.token_ids, reference.token_ids))


def _resolved(row: RowInfo, methods: dict[str, Method]) -> RowInfo:
    """`row` with the options its drafter chose itself when prepared (`num_nodes=auto` → a size)."""
    drafter = methods[row.label].drafter if row.kind == "warpdecode" else None
    return replace(row, resolved=drafter.resolved_settings()) if isinstance(drafter, ResolvesSettings) else row


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
    backends, dtypes, package, specs = _checked(config, methods)
    chosen = prompts if prompts is not None else load_prompts(config.prompts, limit=config.limit, categories=config.categories)
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    start = time.perf_counter()
    machine = machine_info(torch_device(config.device))
    sampling = config.temperature > 0
    backbones, tokenizer = _loaded(config, package, backends, dtypes)
    encoded, too_long = _encoded(chosen, tokenizer, backbones[TORCH].config.max_seq_len, config.max_new_tokens)
    rows, built_methods, unsupported = _method_rows(specs, backends, dtypes, backbones, sampling)
    peer_models, skipped_peers = _peers(config, specs, package, backbones, tokenizer)
    rows += [RowInfo(label=label, kind="llama.cpp" if isinstance(p, peer_lib.LlamaCppGenerate) else "transformers",
                     lossless=True, settings=peer_lib.describe(p.generate_kwargs)) for label, p in peer_models.items()]
    runner = _Runner(config=config, backbones=backbones, tokenizer=tokenizer, methods=built_methods, peers=peer_models,
                     dtypes=dtypes)
    measurements = _measured(runner, rows, encoded, progress)
    rows = [_resolved(row, built_methods) for row in rows]
    categories = list(dict.fromkeys(p.category for p, _ in encoded))
    return BenchResult(
        config=config, machine=machine | {"load_average_end": load_average()}, rows=rows, measurements=measurements,
        aggregates=aggregate(rows, measurements, categories, sampling), categories=categories,
        skipped_too_long=[p.id for p, _ in too_long], skipped_rows=unsupported | skipped_peers,
        wall_seconds=time.perf_counter() - start,
    )

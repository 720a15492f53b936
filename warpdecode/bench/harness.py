"""`run_bench`: every method (and peer) on the same prompts, in one process, interleaved.

For each prompt every row runs once, in an order rotated by one per prompt, so machine noise (shared
cores, CPU steal) and cache effects spread over all rows. Each row first runs a short warm-up. Plain
greedy `none` always runs: speedups are ratios to it in the same run (docs/metrics.md), and at
temperature 0 every row's tokens are compared with it.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from tqdm.auto import tqdm

from warpdecode.bench import peers as peer_lib
from warpdecode.bench.machine import PeakRSS, load_average, machine_info
from warpdecode.bench.prompts import BenchPrompt, load_prompts
from warpdecode.bench.specs import BASELINE, MethodSpec, parse_methods
from warpdecode.decoding import registry
from warpdecode.decoding.engine import Method
from warpdecode.decoding.generate import encode_prompt, generate
from warpdecode.decoding.protocols import ResolvesSettings
from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.checkpoint import resolve, save_pretrained
from warpdecode.models.device import torch_device, torch_dtype
from warpdecode.models.named import DEFAULT_MODEL
from warpdecode.runtime.load import TORCH, load_backbones, open_package, parse_backends
from warpdecode.runtime.package import LOSSY_BACKENDS

PEERS = ("auto", "transformers", "none")
TRANSFORMERS = "transformers"
ALL = "all"


@dataclass
class BenchConfig:
    model: str = DEFAULT_MODEL
    package: str | None = None
    """An inference package (`warpdecode export`) to run instead of `model`."""
    backends: str = TORCH
    """Comma-separated backends every method runs on: torch and cudagraphs for `model`, the
    onnxruntime ones for `package`."""
    methods: list[str] = field(default_factory=lambda: [BASELINE])
    """Canonical method specs, baseline first (see `warpdecode.bench.specs`)."""
    prompts: str = "spec_bench"
    categories: str | None = None
    limit: int | None = None
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    peers: str = "auto"
    threads: int | None = None
    warmup_tokens: int = 8
    device: str = "cpu"
    """Where `model` runs on torch, and the peers with it: cpu or cuda[:N]."""
    dtype: str = "fp32"
    """Precision of `model` and the peers (`models.device.DTYPES`)."""

    def command(self, out: Path | None = None) -> str:
        """The `warpdecode bench` command line that repeats this run."""
        source = (f"--package {self.package}" if self.package else f"--model {self.model}") + (
            f" --backends {self.backends}" if self.package or self.backends != TORCH else "")
        parts = ["warpdecode bench", source, f"--methods {','.join(self.methods)}",
                 f"--prompts {self.prompts}", f"--max-new-tokens {self.max_new_tokens}"]
        optional = {"categories": self.categories, "limit": self.limit, "temperature": self.temperature or None, "top-k": self.top_k,
                    "top-p": self.top_p, "threads": self.threads, "peers": None if self.peers == "auto" else self.peers,
                    "device": None if self.device == "cpu" else self.device,
                    "dtype": None if self.dtype == "fp32" else self.dtype}
        parts += [f"--{k} {v}" for k, v in optional.items() if v is not None]
        return " ".join(parts + ([f"--out {out}"] if out is not None else []))


@dataclass
class RowInfo:
    label: str
    kind: Literal["warpdecode", "transformers"]
    lossless: bool
    """Output must equal plain greedy at temperature 0 (every drafter with its default verifier, on
    a full-precision backend)."""
    settings: dict[str, Any]
    backend: str = TORCH
    resolved: dict[str, Any] = field(default_factory=dict)
    """Options the drafter chose itself when prepared (`num_nodes=auto` → the size it measured best)."""


def row_label(spec: MethodSpec, backend: str) -> str:
    """`prompt_lookup` on torch, `prompt_lookup@onnxruntime` on another backend."""
    return spec.label if backend == TORCH else f"{spec.label}@{backend}"


@dataclass(kw_only=True)
class Measurement:
    """One generation of one row on one prompt (built by keyword: the fields are many and alike).
    Metric definitions: docs/metrics.md."""

    row: str
    prompt_id: str = ""
    category: str = ""
    prompt_tokens: int
    new_tokens: int
    seconds: float
    """warpdecode: `DecodeStats.seconds`; peers: wall time of the `generate()` call."""
    time_to_first_token: float | None
    target_forwards: int | None
    accepted: int | None
    """Accepted draft tokens, summed over the verify forwards (bonus tokens not included)."""
    proposed: int | None
    draft_seconds: float | None
    """warpdecode: time in the drafter (`DecodeStats.draft_seconds`); the rest of `seconds` is the
    prefill and the verify forwards."""
    peak_rss_mib: float | None
    """Peak RSS of the process during the call, above the RSS just before it (MiB)."""
    identical: bool | None = None
    """Token-identical to `none` on this prompt; None when sampling."""
    token_ids: list[int]
    divergent: int | None = None
    """Emitted tokens the target's argmax disagreed with (`DecodeStats.divergent_tokens`); lossy
    verifiers only."""
    first_difference: int | None = None
    """Index of the first new token that differs from `none`'s on this prompt (a length difference
    counts at the shorter length); None when identical or sampling."""


@dataclass
class Aggregate:
    """One row over the prompts of one category (or `all`)."""

    row: str
    category: str
    prompts: int
    new_tokens: int
    seconds: float
    tokens_per_second: float
    """Total new tokens / total seconds over the prompts."""
    speedup: float
    """`tokens_per_second` / that of `none` over the same prompts."""
    median_speedup: float
    """Median over the prompts of the per-prompt ratio of tokens/s to `none`'s: unlike `speedup`, a
    burst of machine noise during a few generations barely moves it."""
    speedup_vs_transformers: float | None
    """Transformers modes only: `tokens_per_second` / that of transformers greedy."""
    tau: float | None
    tau_without_bonus: float | None
    acceptance_rate: float | None
    time_to_first_token: float | None
    """Mean over the prompts (seconds)."""
    peak_rss_mib: float | None
    """Largest over the prompts."""
    identical: int | None
    """Prompts whose output equals `none`'s (None when sampling)."""
    first_difference: int | None = None
    """The earliest `Measurement.first_difference` over the prompts (None when all are identical)."""
    agreement: float | None = None
    """Lossy verifiers at temperature 0: the share of new tokens that are the target's own greedy
    choice after the emitted prefix (1 − divergent / new tokens)."""


@dataclass
class BenchResult:
    config: BenchConfig
    machine: dict[str, Any]
    rows: list[RowInfo]
    measurements: list[Measurement]
    aggregates: list[Aggregate]
    categories: list[str]
    skipped_too_long: list[str]
    """Prompts skipped because prompt + max_new_tokens exceeds the model's context."""
    skipped_rows: dict[str, str]
    """Peer rows that could not run → reason."""
    wall_seconds: float

    def aggregate(self, row: str, category: str = ALL) -> Aggregate:
        for a in self.aggregates:
            if a.row == row and a.category == category:
                return a
        raise KeyError((row, category))

    def table(self) -> str:
        from warpdecode.bench.report import overall_table

        return overall_table(self)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"command": self.config.command()}


def _rate(m: Measurement) -> float:
    return m.new_tokens / m.seconds if m.seconds > 0 else 0.0


def aggregate(result_rows: list[RowInfo], measurements: list[Measurement], categories: list[str],
              sampling: bool) -> list[Aggregate]:
    """Aggregates of every row per category and over all prompts (definitions: docs/metrics.md)."""
    out = []
    for category in categories + [ALL]:
        chosen = [m for m in measurements if category in (ALL, m.category)]
        baseline = {m.prompt_id: _rate(m) for m in chosen if m.row == BASELINE}
        rate: dict[str, float] = {}
        for row in result_rows:
            ms = [m for m in chosen if m.row == row.label]
            seconds = sum(m.seconds for m in ms)
            rate[row.label] = sum(m.new_tokens for m in ms) / seconds if seconds > 0 else 0.0
        for row in result_rows:
            ms = [m for m in chosen if m.row == row.label]
            ours = row.kind == "warpdecode"
            steps = sum(m.target_forwards or 0 for m in ms)
            accepted = sum(m.accepted or 0 for m in ms)
            proposed = sum(m.proposed or 0 for m in ms)
            peaks = [m.peak_rss_mib for m in ms if m.peak_rss_mib is not None]
            greedy_peer = rate.get(TRANSFORMERS)
            out.append(Aggregate(
                row=row.label, category=category, prompts=len(ms), new_tokens=sum(m.new_tokens for m in ms),
                seconds=sum(m.seconds for m in ms), tokens_per_second=rate[row.label],
                speedup=rate[row.label] / rate[BASELINE] if rate[BASELINE] else 0.0,
                median_speedup=statistics.median(_rate(m) / baseline[m.prompt_id] if baseline[m.prompt_id] else 0.0
                                                 for m in ms) if ms else 0.0,
                speedup_vs_transformers=rate[row.label] / greedy_peer if greedy_peer and not ours else None,
                tau=(accepted + steps) / steps if ours and steps else None,
                tau_without_bonus=accepted / steps if ours and steps else None,
                acceptance_rate=accepted / proposed if ours and proposed else None,
                time_to_first_token=sum(m.time_to_first_token or 0.0 for m in ms) / len(ms) if ours and ms else None,
                peak_rss_mib=max(peaks) if peaks else None,
                identical=None if sampling else sum(bool(m.identical) for m in ms),
                first_difference=min((m.first_difference for m in ms if m.first_difference is not None), default=None),
                agreement=(agreement(ms) if ours and not row.lossless and row.backend not in LOSSY_BACKENDS and not sampling
                           else None),
            ))
    return out


def first_difference(tokens: list[int], reference: list[int]) -> int | None:
    """Index of the first position where `tokens` and `reference` differ; a length difference counts at
    the shorter length; None when they are equal. [1, 2, 3] vs [1, 2, 4] → 2; [1, 2] vs [1, 2, 3] → 2."""
    if tokens == reference:
        return None
    return next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), min(len(tokens), len(reference)))


def agreement(ms: list[Measurement]) -> float | None:
    """1 − divergent / new tokens over `ms` (None when nothing was generated)."""
    new = sum(m.new_tokens for m in ms)
    return 1 - sum(m.divergent or 0 for m in ms) / new if new else None


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
                          defaults=registry.package_options(package.drafter_directories()) if package else None)
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

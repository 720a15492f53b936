"""What a benchmark run produced: its configuration, rows, measurements and aggregates (docs/metrics.md).

The result types live apart from the running (`harness.run_bench`) and the rendering (`report`), which
both import them: a result can be reloaded from results.json and reported without running anything.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from warpdecode.bench.specs import BASELINE
from warpdecode.decoding.outputs import compute_tau
from warpdecode.models.named import DEFAULT_MODEL
from warpdecode.runtime.load import TORCH
from warpdecode.runtime.package import LOSSY_BACKENDS

TRANSFORMERS = "transformers"
"""The row of transformers' own greedy `generate()` (the peers' baseline)."""
ALL = "all"
"""The category of the aggregates over every prompt."""


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
    """Precision of `model` and the peers (`models.device.DTYPES` or `QUANTIZED`), or several,
    comma-separated: every method runs on each (on torch), the first is the reference."""

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
    kind: Literal["warpdecode", "transformers", "llama.cpp"]
    lossless: bool
    """Output must equal plain greedy at temperature 0 (every drafter with its default verifier, on
    a full-precision backend)."""
    settings: dict[str, Any]
    backend: str = TORCH
    dtype: str = "fp32"
    """The precision the row's model runs in (`BenchConfig.dtype` lists those of a run, the reference first)."""
    resolved: dict[str, Any] = field(default_factory=dict)
    """Options the drafter chose itself when prepared (`num_nodes=auto` → the size it measured best)."""



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
    reference_identical: bool | None = None
    """With several precisions (`--dtype fp32,q4`): token-identical to `none` in the first (reference)
    precision, so a quantised row's quality stays visible; None when sampling or with one precision."""
    reference_difference: int | None = None
    """As `first_difference`, against `none` in the reference precision."""


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
    reference_identical: int | None = None
    """With several precisions: prompts whose output equals `none`'s in the reference precision (None
    when sampling or with one precision)."""
    reference_first_difference: int | None = None
    """The earliest `Measurement.reference_difference` over the prompts."""
    agreement: float | None = None
    """Lossy verifiers at temperature 0: the share of new tokens that are the target's own greedy
    choice after the emitted prefix (1 − divergent / new tokens)."""
    decode_tokens_per_second: float | None = None
    """Σ (new tokens − 1) / Σ (seconds − time to first token) over the prompts: the rate after the
    prefill and first token (None when a prompt's time to first token is unknown)."""


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
                tau=compute_tau(accepted, steps) if ours and steps else None,
                tau_without_bonus=compute_tau(accepted, steps, bonus=False) if ours and steps else None,
                acceptance_rate=accepted / proposed if ours and proposed else None,
                time_to_first_token=(sum(m.time_to_first_token for m in ms if m.time_to_first_token is not None) / len(ms)
                                     if ms and all(m.time_to_first_token is not None for m in ms) else None),
                peak_rss_mib=max(peaks) if peaks else None,
                identical=None if sampling else sum(bool(m.identical) for m in ms),
                first_difference=min((m.first_difference for m in ms if m.first_difference is not None), default=None),
                reference_identical=(None if any(m.reference_identical is None for m in ms)
                                     else sum(bool(m.reference_identical) for m in ms)),
                reference_first_difference=min((m.reference_difference for m in ms if m.reference_difference is not None),
                                               default=None),
                agreement=(agreement(ms) if ours and not row.lossless and row.backend not in LOSSY_BACKENDS and not sampling
                           else None),
                decode_tokens_per_second=decode_rate(ms),
            ))
    return out


def decode_rate(ms: list[Measurement]) -> float | None:
    """`Aggregate.decode_tokens_per_second` of one row's measurements."""
    if not ms or any(m.time_to_first_token is None for m in ms):
        return None
    seconds = sum(m.seconds - (m.time_to_first_token or 0.0) for m in ms if m.new_tokens > 1)
    tokens = sum(m.new_tokens - 1 for m in ms if m.new_tokens > 1)
    return tokens / seconds if seconds > 0 else None


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

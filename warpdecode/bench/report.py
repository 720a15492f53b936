"""Reports of a `BenchResult`: `results.json` (every number), `results.md` (tables), `speedup.png`."""

from __future__ import annotations

import json
from pathlib import Path

from warpdecode.bench.results import ALL, Aggregate, BenchConfig, BenchResult, Measurement, RowInfo, aggregate
from warpdecode.metrics.plots import pyplot

NA = "–"
COLUMNS = ("method", "tok/s", "decode tok/s", "speedup", "median speedup", "τ", "τ w/o bonus", "α", "TTFT ms", "peak MiB", "identical",
           "agreement", "vs transformers")


def _num(value: float | None, fmt: str, suffix: str = "") -> str:
    return NA if value is None else f"{value:{fmt}}{suffix}"


def _loads(values: list[float] | None) -> str:
    return NA if values is None else "/".join(f"{v:.1f}" for v in values)


def identical_cell(a: Aggregate, reference: bool = False) -> str:
    """`identical` (or, with `reference`, `vs ref`): yes, or how many prompts agree and from which token."""
    same, first = (a.reference_identical, a.reference_first_difference) if reference else (a.identical, a.first_difference)
    if same is None:
        return "n/a"
    if same == a.prompts:
        return "yes"
    return f"no ({same}/{a.prompts}" + (f", from token {first})" if first is not None else ")")


def overall_table(result: BenchResult, category: str = ALL) -> str:
    """One markdown row per method and peer over the prompts of `category` (default: all); with several
    precisions a `vs ref` column beside `identical`."""
    several = "," in result.config.dtype
    at = COLUMNS.index("identical") + 1
    columns = [*COLUMNS[:at], "vs ref", *COLUMNS[at:]] if several else list(COLUMNS)
    numeric = COLUMNS.index("identical") - 1
    lines = ["| " + " | ".join(columns) + " |",
             "|---|" + "---:|" * numeric + ":---:|" * (len(columns) - numeric - 3) + "---:|---:|"]
    for row in result.rows:
        a = result.aggregate(row.label, category)
        ttft = None if a.time_to_first_token is None else a.time_to_first_token * 1000
        cells = [f"`{row.label}`", _num(a.tokens_per_second, ".1f"), _num(a.decode_tokens_per_second, ".1f"),
                 _num(a.speedup, ".2f", "x"),
                 _num(a.median_speedup, ".2f", "x"), _num(a.tau, ".2f"),
                 _num(a.tau_without_bonus, ".2f"), _num(a.acceptance_rate, ".2f"), _num(ttft, ".0f"),
                 _num(a.peak_rss_mib, ".0f"), identical_cell(a), *([identical_cell(a, reference=True)] if several else []),
                 _num(None if a.agreement is None else 100 * a.agreement, ".1f", " %"), _num(a.speedup_vs_transformers, ".2f", "x")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def category_table(result: BenchResult) -> str:
    """Speedup over `none` per category; for drafting methods also τ and α."""
    labels = [r.label for r in result.rows if r.label != "none"]
    lines = ["| category | prompts | " + " | ".join(f"`{label}`" for label in labels) + " |",
             "|---|---:|" + "---:|" * len(labels)]
    for category in result.categories + [ALL]:
        cells = []
        for label in labels:
            a = result.aggregate(label, category)
            extra = f" (τ {a.tau:.2f}, α {a.acceptance_rate:.2f})" if a.tau is not None and a.acceptance_rate is not None else ""
            cells.append(f"{a.speedup:.2f}x{extra}")
        name = "**all**" if category == ALL else category
        lines.append(f"| {name} | {result.aggregate('none', category).prompts} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(result: BenchResult, out: Path | None = None) -> str:
    c, m = result.config, result.machine
    mode = "greedy (temperature 0)" if c.temperature == 0 else f"sampling at temperature {c.temperature}"
    skipped = ""
    if result.skipped_too_long:
        skipped = (f"\n{len(result.skipped_too_long)} prompt(s) skipped: prompt + {c.max_new_tokens} new tokens exceeds "
                   f"the context ({', '.join(result.skipped_too_long[:10])}{' ...' if len(result.skipped_too_long) > 10 else ''}).")
    rows_skipped = "".join(f"\n- `{label}` not run: {reason}" for label, reason in result.skipped_rows.items())
    rows_skipped += "".join(f"\n- `{row.label}` chose " + ", ".join(f"{k}={v}" for k, v in row.resolved.items())
                            for row in result.rows if row.resolved)
    prompts = result.aggregate("none").prompts
    gpu = f"GPU {m['gpu']} ({m['device']}, CUDA {m['cuda']}); " if "gpu" in m else ""
    return f"""# Benchmark: {c.prompts}

```sh
{c.command(out)}
```

Model `{c.model}`, {prompts} prompts, {c.max_new_tokens} new tokens at most, {mode}, {m['torch_threads']} torch
threads. Machine: {gpu}{m['cpu']} ({m['cpu_count']} CPUs), torch {m['torch']}, transformers {m['transformers']},
{m['date']}, load average {_loads(m['load_average'])} at the start and {_loads(m.get('load_average_end'))} at the end;
wall time {result.wall_seconds:.0f} s.{skipped}{rows_skipped}

## All prompts

Tokens/s = total new tokens / total seconds; speedup = that over `none`'s in this run (interleaved);
median speedup = median over prompts of the per-prompt ratio (robust to a burst of machine noise);
τ, α summed over all verify forwards; TTFT = mean time to first token; peak MiB = largest RSS rise
during one generation; identical = output equals `none`'s token for token (n/a when sampling; "from
token i": the earliest new-token position at which a prompt's output differs);
with several precisions (`--dtype fp32,q4`), identical compares a row with `none` in its own precision
and vs ref with `none` in the first (reference) one;
agreement (lossy rows) = share of new tokens that are the target's own greedy choice after the emitted
prefix; vs transformers = speedup over transformers' own greedy `generate()` in this run. Definitions:
docs/metrics.md.

{overall_table(result)}

## Speedup over `none` by category

{category_table(result)}
"""


def plot(result: BenchResult, path: Path) -> None:
    """Grouped bars: speedup over `none` of every other row, per category and over all prompts."""
    plt = pyplot()

    labels = [r.label for r in result.rows if r.label != "none"]
    groups = result.categories + [ALL]
    width = 0.8 / max(1, len(labels))
    fig, ax = plt.subplots(figsize=(min(16.0, 3.0 + 1.1 * len(groups)), 5.0))
    top = 1.0
    for j, label in enumerate(labels):
        xs = [i + (j - (len(labels) - 1) / 2) * width for i in range(len(groups))]
        heights = [result.aggregate(label, g).speedup for g in groups]
        ax.bar(xs, heights, width, label=label)
        top = max(top, *heights)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylim(0, top * (1.15 + 0.06 * len(labels)))  # headroom for the legend
    ax.set_xticks(range(len(groups)), groups, rotation=30, ha="right")
    ax.set_ylabel("speedup over plain greedy (same run)")
    ax.set_title(f"{result.config.model} on {result.config.prompts}, {result.config.max_new_tokens} new tokens")
    if labels:
        ax.legend(fontsize=8, loc="upper left", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(result: BenchResult, out: Path) -> dict[str, Path]:
    """Write results.json, results.md and speedup.png into `out` (created)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "markdown": out / "results.md", "plot": out / "speedup.png"}
    paths["json"].write_text(json.dumps(result.to_dict(), indent=1) + "\n")
    paths["markdown"].write_text(markdown(result, out))
    plot(result, paths["plot"])
    return paths


def load(path: Path) -> BenchResult:
    """A `BenchResult` from a results.json, with the aggregates recomputed from its measurements."""
    data = json.loads(Path(path).read_text())
    config = BenchConfig(**data["config"])
    rows = [RowInfo(**r) for r in data["rows"]]
    measurements = [Measurement(**m) for m in data["measurements"]]
    return BenchResult(
        config=config, machine=data["machine"], rows=rows, measurements=measurements,
        aggregates=aggregate(rows, measurements, data["categories"], config.temperature > 0),
        categories=data["categories"], skipped_too_long=data["skipped_too_long"], skipped_rows=data["skipped_rows"],
        wall_seconds=data["wall_seconds"],
    )


def main() -> None:
    """`python -m warpdecode.bench.report DIR`: rewrite DIR's results.md and plot from its results.json."""
    import sys

    for directory in map(Path, sys.argv[1:]):
        result = load(directory / "results.json")
        (directory / "results.md").write_text(markdown(result, directory))
        plot(result, directory / "speedup.png")
        print(overall_table(result))


if __name__ == "__main__":
    main()

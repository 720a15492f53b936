"""`warpdecode bench` for masked diffusion LMs: commit policies side by side on the verifiable tasks.

Every example of the evaluation set (`data/parallel_tasks.py`) is decoded by every policy in turn
(interleaved, after a warm-up), so machine noise spreads over all of them. The baseline is static
decoding, `fixed` at one token per step without end-of-text stopping, and always runs first. For
each policy: accuracy (exact answers; `perm` accepts any permutation), steps (forwards, NFEs),
tokens/s, and, against the baseline in the same run, the step reduction, the wall-clock speedup and
the accuracy change in points. Once per model: the answer perplexity bound on the reference answers
(LLaDA's NLL bound, `decoding/diffusion/likelihood.py`), a quality measure independent of decoding.
Specs are `POLICY[:KEY=VALUE...]` with the policy's options plus the
decoder's `block_length`, `eot_stop` and `kv_cache`, e.g. `threshold:threshold=0.8:eot_stop=true:kv_cache=dual`.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from warpdecode.bench.machine import machine_info
from warpdecode.bench.specs import SYNTAX, format_value, parse_method
from warpdecode.data.parallel_tasks import TaskExample, evaluation_set, task_names
from warpdecode.decoding import registry
from warpdecode.decoding.diffusion.decoder import diffusion_generate, exact_decoder, split_decoder_options
from warpdecode.decoding.diffusion.kv_reuse import check_kv_reuse
from warpdecode.decoding.diffusion.layout import check_diffusion_model
from warpdecode.decoding.diffusion.likelihood import answer_nll_bound
from warpdecode.decoding.diffusion.protocols import CommitPolicy
from warpdecode.errors import ConfigError
from warpdecode.metrics.plots import pyplot
from warpdecode.models.backbone import Backbone
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.models.tokenizer import Tokenizer

BASELINE = "fixed"
PERPLEXITY_DRAWS = 4
"""Draws of the forward process averaged by `answer_perplexity` (the bound is a Monte Carlo estimate)."""


@dataclass(frozen=True)
class PolicySpec:
    name: str
    options: dict[str, Any]

    @property
    def label(self) -> str:
        return ":".join([self.name] + [f"{k}={format_value(v)}" for k, v in self.options.items()])

    def decoder_options(self, block_length: int) -> dict[str, Any]:
        return split_decoder_options({"block_length": block_length} | self.options)[0]

    def build(self) -> CommitPolicy:
        policy: CommitPolicy = registry.build("commit_policy", self.name, **split_decoder_options(self.options)[1])
        return policy


def parse_policies(text: str) -> list[PolicySpec]:
    """`fixed,threshold:threshold=0.8` → checked specs, the baseline `fixed` first (added if missing)."""
    specs = []
    for part in text.split(","):
        if not part.strip():
            raise ConfigError(f"empty policy in {text!r}; expected {SYNTAX}")
        method = parse_method(part)
        spec = PolicySpec(method.name, method.options)
        spec.build()  # unknown names and options fail here, before the model loads
        check_kv_reuse(spec.decoder_options(1)["kv_cache"])
        for key in ("block_length",):
            value = spec.options.get(key)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"policy {spec.label!r}: {key} must be a positive integer")
        specs.append(spec)
    labels = [s.label for s in specs]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"policy listed twice in {text!r}")
    return [PolicySpec(BASELINE, {})] + [s for s in specs if s.label != BASELINE]


@dataclass
class DiffusionBenchConfig:
    model: str
    methods: list[str] = field(default_factory=lambda: [BASELINE])
    tasks: str = "all"
    limit: int = 20
    """Examples per task."""
    gen_length: int = 16
    block_length: int = 8
    threads: int | None = None

    def command(self, out: Path | None = None) -> str:
        parts = [f"warpdecode bench --model {self.model} --methods {','.join(self.methods)} --prompts parallel_bench",
                 f"--categories {self.tasks} --limit {self.limit} --max-new-tokens {self.gen_length}",
                 f"--block-length {self.block_length}"]
        parts += [f"--threads {self.threads}"] if self.threads else []
        return " ".join(parts + ([f"--out {out}"] if out else []))


@dataclass
class Run:
    method: str
    task: str
    prompt: str
    output: str
    correct: bool
    steps: int
    seconds: float
    tokens: int


@dataclass
class PolicyRow:
    method: str
    lossless: bool
    examples: int
    accuracy: float
    steps: float
    """Mean steps per example."""
    tokens_per_second: float
    step_reduction: float
    """Baseline steps / these steps (totals)."""
    speedup: float
    """Baseline seconds / these seconds (totals)."""
    accuracy_delta: float
    """Accuracy minus the baseline's, in percentage points."""
    identical: int
    """Examples whose answer equals the baseline's answer."""


def summarise(runs: list[Run], method: str, lossless: bool, baseline: list[Run]) -> PolicyRow:
    """One policy's row over `runs`; `baseline` holds the baseline's runs of the same examples, in order."""
    mine = [r for r in runs if r.method == method]
    identical = sum(r.output == b.output for r, b in zip(mine, baseline))
    steps, seconds = sum(r.steps for r in mine), sum(r.seconds for r in mine)
    accuracy = 100 * sum(r.correct for r in mine) / len(mine)
    base_accuracy = 100 * sum(r.correct for r in baseline) / len(baseline)
    return PolicyRow(method, lossless, len(mine), accuracy, steps / len(mine), sum(r.tokens for r in mine) / seconds,
                     sum(r.steps for r in baseline) / steps, sum(r.seconds for r in baseline) / seconds,
                     accuracy - base_accuracy, identical)


@dataclass
class DiffusionBenchResult:
    config: DiffusionBenchConfig
    machine: dict[str, Any]
    rows: list[PolicyRow]
    per_task: dict[str, list[PolicyRow]]
    runs: list[Run]
    wall_seconds: float
    answer_perplexity: float
    """exp of LLaDA's NLL bound averaged over the evaluation answers (`answer_perplexity`)."""

    def table(self, rows: list[PolicyRow] | None = None) -> str:
        lines = ["| policy | lossless | accuracy % | Δ points | identical | steps | step reduction | tok/s | speedup |",
                 "|---|:---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows if rows is not None else self.rows:
            lines.append(f"| `{r.method}` | {'yes' if r.lossless else 'no'} | {r.accuracy:.1f} | {r.accuracy_delta:+.1f} | "
                         f"{r.identical}/{r.examples} | "
                         f"{r.steps:.2f} | {r.step_reduction:.2f}x | {r.tokens_per_second:.0f} | {r.speedup:.2f}x |")
        return "\n".join(lines)

    def markdown(self, out: Path | None = None) -> str:
        c, m = self.config, self.machine
        tasks = "\n\n".join(f"### {task}\n\n{self.table(rows)}" for task, rows in self.per_task.items())
        return (f"# Diffusion LM commit policies: parallel_bench\n\n```sh\n{c.command(out)}\n```\n\n"
                f"Model `{c.model}`, {len(self.runs) // len(self.rows)} examples ({c.limit} per task), answer region "
                f"{c.gen_length} positions in blocks of {c.block_length}, greedy. Machine: {m['cpu']} "
                f"({m['cpu_count']} CPUs), {m['torch_threads']} torch threads, torch {m['torch']}, {m['date']}; "
                f"wall time {self.wall_seconds:.0f} s. Answer perplexity bound (exp of LLaDA's NLL bound over "
                f"the reference answers, {PERPLEXITY_DRAWS} draws of the masking): {self.answer_perplexity:.3f}.\n\n"
                f"Baseline `{BASELINE}`: one token per step (static decoding). Steps = forwards (NFEs); identical = answers "
                f"equal to the baseline's; a lossless policy must have them all. End-of-text stopping (`eot_stop`) "
                f"and KV reuse (`kv_cache`, approximate) make any policy lossy.\n\n"
                f"## All tasks\n\n{self.table()}\n\n## Per task\n\n{tasks}\n")

    def write(self, out: Path) -> dict[str, Path]:
        out.mkdir(parents=True, exist_ok=True)
        paths = {"json": out / "results.json", "markdown": out / "results.md", "plot": out / "accuracy_vs_steps.png"}
        paths["json"].write_text(json.dumps(asdict(self), indent=2, default=str) + "\n")
        paths["markdown"].write_text(self.markdown(out))
        self.plot(paths["plot"])
        return paths

    def plot(self, path: Path) -> None:
        plt = pyplot()

        fig, ax = plt.subplots(figsize=(7.0, 4.5))
        for row in self.rows:
            ax.scatter(row.step_reduction, row.accuracy, s=40)
            ax.annotate(row.method, (row.step_reduction, row.accuracy), fontsize=7, xytext=(4, 3), textcoords="offset points")
        ax.set_xlabel(f"step reduction over `{BASELINE}` (x)")
        ax.set_ylabel("accuracy (%)")
        ax.set_title("Commit policies: accuracy against steps saved")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)


@torch.inference_mode()
def answer_perplexity(model: Backbone, tokenizer: Tokenizer, examples: list[TaskExample], gen_length: int,
                      draws: int = PERPLEXITY_DRAWS, batch_size: int = 128) -> float:
    """exp of the mean per-token NLL bound (`likelihood.answer_nll_bound`) of the reference answers,
    laid out as in training (answer, then end-of-text up to `gen_length`); stratified masking ratios
    (lower variance, same expectation) from fixed seeds, so two models compare on the same masks. (`perm` is scored on its one reference permutation.)"""
    eos, vocab = tokenizer.eos_token_id, tokenizer.backend.get_vocab()
    assert eos is not None and model.config.mask_token_id is not None
    rows = [e.encode(vocab, eos, gen_length) for e in examples]
    total, count = 0.0, 0
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        tokens = torch.nn.utils.rnn.pad_sequence([torch.tensor(ids) for ids, _ in chunk], batch_first=True,
                                                 padding_value=eos)
        prompt_lengths = torch.tensor([p for _, p in chunk])
        for draw in range(draws):
            generator = torch.Generator().manual_seed(draw)
            nll = answer_nll_bound(model, tokens, prompt_lengths, prompt_lengths + gen_length,
                                   model.config.mask_token_id, generator=generator, stratified=True)
            total, count = total + float(nll.sum()), count + len(chunk)
    return math.exp(total / count)


def run_diffusion_bench(config: DiffusionBenchConfig, *, progress: bool = True) -> DiffusionBenchResult:
    """Decode the evaluation set with every policy of `config.methods`, the baseline first; checks
    specs and settings before the model loads."""
    specs = parse_policies(",".join(config.methods))
    config.methods = [s.label for s in specs]
    if config.limit < 1 or config.gen_length < 1 or config.block_length < 1:
        raise ConfigError("--limit, --max-new-tokens and --block-length must be positive")
    examples: list[TaskExample] = evaluation_set(",".join(task_names(config.tasks)), per_task=config.limit)
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    start = time.perf_counter()
    machine = machine_info()
    model, tokenizer = load_pretrained(config.model)
    check_diffusion_model(model)
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ConfigError("the diffusion LM's tokenizer has no end-of-text token")
    longest = max(len(e.answer) for e in examples)
    if longest >= config.gen_length:
        raise ConfigError(f"--max-new-tokens {config.gen_length} leaves no room for answers of {longest} tokens")
    policies = [(spec, spec.build(), spec.decoder_options(config.block_length)) for spec in specs]
    warm = tokenizer.encode(examples[0].prompt)
    for _, policy, options in policies:
        diffusion_generate(model, [warm], policy, gen_length=config.gen_length, eos_token_id=eos, **options)
    runs: list[Run] = []
    for ex in tqdm(examples, desc="examples", disable=not progress):
        ids = tokenizer.encode(ex.prompt)
        for spec, policy, options in policies:
            out = diffusion_generate(model, [ids], policy, gen_length=config.gen_length, eos_token_id=eos, **options)
            text = tokenizer.decode(out.answers[0])
            runs.append(Run(spec.label, ex.task, ex.prompt, text, ex.correct(text), out.stats.steps[0],
                            out.stats.seconds, len(out.answers[0]) + 1))  # + the end-of-text token

    def rows(selected: list[Run]) -> list[PolicyRow]:
        baseline = [r for r in selected if r.method == BASELINE]
        return [summarise(selected, spec.label, policy.lossless and exact_decoder(options), baseline)
                for spec, policy, options in policies]

    per_task = {task: rows([r for r in runs if r.task == task]) for task in task_names(config.tasks)}
    perplexity = answer_perplexity(model, tokenizer, examples, config.gen_length)
    return DiffusionBenchResult(config, machine, rows(runs), per_task, runs, time.perf_counter() - start, perplexity)

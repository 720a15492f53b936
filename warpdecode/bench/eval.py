"""`warpdecode eval`: the quality of one decoding method on an evaluation set, with what it cost.

For each problem the method generates `num_return_sequences` samples (independent `generate()` calls,
sample i of problem j seeded `seed + j * n + i`); each sample is scored as it comes:

* `humaneval`: the candidate program runs in `warpdecode.sandbox` against the problem's tests; pass@1
  and pass@k (Chen et al.'s unbiased estimator) over the problems;
* `gsm8k`: the extracted final answer is compared with the reference number; accuracy over samples.

Besides quality: generated tokens, target forwards (after the prefills) and wall seconds of generation,
summed; and the diversity of the samples: distinct-2 over all of them, and with several samples per
problem the mean over problems of the self-BLEU-4 among its samples (`metrics/open_ended.py`, in words).
"""

from __future__ import annotations

import json
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from copy import copy
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from warpdecode.data.gsm8k import INSTRUCTION, GSM8KProblem, extract_answer, gsm8k_problems
from warpdecode.data.humaneval import (
    STOP_SEQUENCES,
    TIMEOUT_SECONDS,
    HumanEvalProblem,
    chat_candidate,
    chat_prompt,
    check_program,
    humaneval_problems,
    public_test_fraction,
    public_test_program,
    public_tests,
    truncate_completion,
)
from warpdecode.decoding.engine import Method
from warpdecode.decoding.generate import generate
from warpdecode.decoding.outputs import Candidate
from warpdecode.decoding.rules.protocols import DecodingRule
from warpdecode.decoding.search.protocols import SearchStrategy
from warpdecode.decoding.search.scorers import Scorer
from warpdecode.errors import ConfigError
from warpdecode.io import atomic_file
from warpdecode.metrics.open_ended import DistinctN, SelfBLEU, WordIds
from warpdecode.metrics.pass_at_k import mean_pass_at_k
from warpdecode.models.backbone import Backbone
from warpdecode.models.tokenizer import Tokenizer
from warpdecode.progress import ProgressLines, log_line
from warpdecode.sandbox import Limits, isolation, run_programs


@dataclass(frozen=True)
class EvalConfig:
    task: str
    method: str = "none"
    limit: int | None = None
    offset: int = 0
    """Skip the set's first `offset` problems (then take `limit`)."""
    num_return_sequences: int = 1
    """Samples per problem, from independent `generate()` calls."""
    num_beams: int = 1
    """> 1: each sample is the best of a beam search with this many beams (docs/search.md)."""
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    chat: bool | None = None
    """Through the model's chat template; None: the task's default (`Task.default_chat`)."""
    timeout: float = TIMEOUT_SECONDS
    """Wall-clock limit of one HumanEval program."""
    workers: int = 1
    """HumanEval programs run at once."""
    scorer: str | None = None
    """A task scorer that replaces the search's own, per problem (`Task.scorer`): public_tests."""

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ConfigError(f"--task must be one of {', '.join(TASKS)}, got {self.task!r}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"--limit must be >= 1, got {self.limit}")
        if self.offset < 0:
            raise ConfigError(f"--offset must be >= 0, got {self.offset}")
        if self.num_return_sequences < 1:
            raise ConfigError(f"--num-return-sequences must be >= 1, got {self.num_return_sequences}")
        if self.num_beams < 1:
            raise ConfigError(f"--num-beams must be >= 1, got {self.num_beams}")
        if self.num_return_sequences > 1 and self.temperature == 0:
            raise ConfigError("--num-return-sequences > 1 needs --temperature > 0 (greedy samples are all the same)")
        if self.temperature < 0:
            raise ConfigError(f"--temperature must be >= 0, got {self.temperature}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.workers < 1:
            raise ConfigError(f"--workers must be >= 1, got {self.workers}")
        if not self.timeout > 0:
            raise ConfigError(f"--timeout must be > 0, got {self.timeout}")
        if self.scorer is not None and self.scorer not in TASKS[self.task].scorers:
            raise ConfigError(f"--scorer {self.scorer!r} is not one of task {self.task}'s: "
                              f"{', '.join(TASKS[self.task].scorers) or 'it has none'}")

    @property
    def use_chat(self) -> bool | None:
        """`generate(chat=...)`: None applies the model's chat template when it has one."""
        return TASKS[self.task].default_chat if self.chat is None else self.chat


@dataclass(frozen=True)
class Sample:
    text: str
    """The generated text, whole."""
    scored: str
    """What was scored: the HumanEval candidate's completion / code, or the extracted GSM8K answer ("" if none)."""
    correct: bool
    reason: str
    """The sandbox's reason (HumanEval), or `expected N` (GSM8K)."""
    new_tokens: int
    """Tokens generated for this sample: a search's over all its rows (`DecodeStats.search_tokens`)."""
    target_forwards: int
    seconds: float
    seed: int | None


@dataclass
class ProblemResult:
    id: str
    samples: list[Sample] = field(default_factory=list)

    @property
    def correct(self) -> int:
        return sum(s.correct for s in self.samples)


class Task(ABC):
    """An evaluation set: its problems, each problem's prompt, and the scoring of its samples."""

    default_chat: ClassVar[bool | None]
    metric: ClassVar[str]
    scorers: ClassVar[tuple[str, ...]] = ()
    """The names `scorer` takes."""

    def __init__(self, config: EvalConfig) -> None:
        self.config = config

    @abstractmethod
    def problems(self) -> list[Any]:
        ...

    def window(self, problems: list[Any]) -> list[Any]:
        """`config.limit` problems from `config.offset` on (ConfigError when none is left)."""
        end = None if self.config.limit is None else self.config.offset + self.config.limit
        chosen = problems[self.config.offset : end]
        if not chosen:
            raise ConfigError(f"--offset {self.config.offset} is past the set's {len(problems)} problems")
        return chosen

    @abstractmethod
    def problem_id(self, problem: Any) -> str:
        ...

    @abstractmethod
    def prompt(self, problem: Any) -> str:
        ...

    @property
    def stop(self) -> tuple[str, ...]:
        """Stop strings that end a sample's generation (its text ends before the stop string)."""
        return ()

    @abstractmethod
    def score(self, problem: Any, texts: list[str]) -> list[tuple[str, bool, str]]:
        """(what was scored, correct, reason) of each generated text."""

    def scorer(self, problem: Any, name: str) -> Scorer:
        """The scorer `name` for a search's candidates on `problem` (what the model may see, never the
        hidden tests)."""
        raise ConfigError(f"task {self.config.task} has no scorer {name!r}")


class HumanEvalTask(Task):
    """Completion protocol by default (the model continues the prompt's code, cut at `STOP_SEQUENCES`)."""

    default_chat = False
    metric = "pass@1"
    scorers = ("public_tests",)

    def problems(self) -> list[HumanEvalProblem]:
        return self.window(humaneval_problems())

    def problem_id(self, problem: HumanEvalProblem) -> str:
        return problem.task_id

    def prompt(self, problem: HumanEvalProblem) -> str:
        return chat_prompt(problem) if self.config.use_chat else problem.prompt

    @property
    def stop(self) -> tuple[str, ...]:
        return () if self.config.use_chat else STOP_SEQUENCES

    def candidate(self, problem: HumanEvalProblem, text: str) -> tuple[str, str]:
        """(what is scored, the program's code) of a generated text: the completion cut at the stop
        sequences (a search takes no stop strings yet: its samples run to the budget or EOS), or the
        chat reply's code."""
        if self.config.use_chat:
            code = chat_candidate(problem, text)
            return code, code
        completion = truncate_completion(text, STOP_SEQUENCES)
        return completion, problem.prompt + completion

    def score(self, problem: HumanEvalProblem, texts: list[str]) -> list[tuple[str, bool, str]]:
        scored, candidates = zip(*(self.candidate(problem, text) for text in texts), strict=True)
        limits = Limits(wall_seconds=self.config.timeout)
        results = run_programs([check_program(problem, c) for c in candidates], limits, workers=self.config.workers)
        return [(s, r.passed, r.reason if r.passed else f"{r.status}: {r.reason}") for s, r in zip(scored, results, strict=True)]


    def scorer(self, problem: HumanEvalProblem, name: str) -> Scorer:
        return PublicTestsScorer(self, problem)


@dataclass(frozen=True)
class PublicTestsScorer:
    """The fraction of the problem's public tests (its docstring's examples, `public_tests`: what the
    model sees in its prompt) a candidate passes in the sandbox, ties broken by the candidate's mean
    token probability: score = fraction + 1e-3 · exp(mean log-probability) (the fraction moves in steps
    of at least 1/len(tests) > 1e-3). A problem without examples ranks by the tie-break alone."""

    task: HumanEvalTask
    problem: HumanEvalProblem

    def score(self, prompt: list[int], candidates: Sequence[Candidate]) -> list[float]:
        tiebreak = [1e-3 * math.exp(c.logprob / max(1, len(c.token_ids))) for c in candidates]
        tests = public_tests(self.problem)
        if not tests:
            return tiebreak
        programs = [public_test_program(self.task.candidate(self.problem, c.text)[1], tests) for c in candidates]
        results = run_programs(programs, Limits(wall_seconds=self.task.config.timeout), workers=self.task.config.workers)
        return [public_test_fraction(r.stdout, len(tests)) + t for r, t in zip(results, tiebreak, strict=True)]


class GSM8KTask(Task):
    """Zero-shot, asking for "The answer is <number>"; through the model's chat template where it has one."""

    default_chat = None
    metric = "accuracy"

    def problems(self) -> list[GSM8KProblem]:
        return self.window(gsm8k_problems())

    def problem_id(self, problem: GSM8KProblem) -> str:
        return problem.id

    def prompt(self, problem: GSM8KProblem) -> str:
        return INSTRUCTION.format(question=problem.question)

    def score(self, problem: GSM8KProblem, texts: list[str]) -> list[tuple[str, bool, str]]:
        answers = [extract_answer(text) for text in texts]
        return [(a or "", a == problem.reference, f"expected {problem.reference}") for a in answers]


TASKS: dict[str, type[Task]] = {"humaneval": HumanEvalTask, "gsm8k": GSM8KTask}


@dataclass
class EvalResult:
    config: EvalConfig
    model: str
    problems: list[ProblemResult]
    sandbox: str | None
    """The isolation the HumanEval programs ran under (`Isolation.describe`)."""

    def summary(self) -> dict[str, Any]:
        samples = [s for p in self.problems for s in p.samples]
        n = self.config.num_return_sequences
        method = self.config.method + (f" + num_beams={self.config.num_beams}" if self.config.num_beams > 1 else "")
        summary: dict[str, Any] = {"task": self.config.task, "method": method, "model": self.model,
                                   "problems": len(self.problems), "samples_per_problem": n}
        if self.config.task == "humaneval":
            counts = [len(p.samples) for p in self.problems]
            correct = [p.correct for p in self.problems]
            summary["pass@k"] = {str(k): mean_pass_at_k(counts, correct, k) for k in sorted({1, 10, 100, n}) if k <= n}
            summary["pass@1"] = summary["pass@k"]["1"]
        summary["accuracy"] = sum(s.correct for s in samples) / len(samples)
        summary |= {"tokens": sum(s.new_tokens for s in samples),
                    "target_forwards": sum(s.target_forwards for s in samples),
                    "seconds": sum(s.seconds for s in samples)}
        summary |= diversity([[s.text for s in p.samples] for p in self.problems])
        return summary

    def to_dict(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "model": self.model, "sandbox": self.sandbox, "summary": self.summary(),
                "problems": [{"id": p.id, "correct": p.correct, "samples": [asdict(s) for s in p.samples]}
                             for p in self.problems]}

    def write(self, path: Path) -> None:
        atomic_file(path, lambda f: f.write((json.dumps(self.to_dict(), indent=2) + "\n").encode()))

    def table(self) -> str:
        s = self.summary()
        quality = "pass@1" if "pass@1" in s else "accuracy"
        return "\n".join([
            f"| task | method | problems × samples | {quality} | tokens | target forwards | wall s |",
            "|---|---|---:|---:|---:|---:|---:|",
            (f"| {s['task']} | `{s['method']}` | {s['problems']} × {s['samples_per_problem']} | {100 * s[quality]:.1f} % "
             f"| {s['tokens']} | {s['target_forwards']} | {s['seconds']:.1f} |"),
        ])


def diversity(texts_per_problem: list[list[str]]) -> dict[str, float | None]:
    """distinct-2 over every text (in words), and the mean over problems with two or more texts of the
    self-BLEU-4 among them (None without such problems)."""
    words = WordIds()
    distinct = DistinctN(2)
    distinct.update([words(t) for texts in texts_per_problem for t in texts])
    bleus = []
    for texts in texts_per_problem:
        if len(texts) >= 2:
            metric = SelfBLEU(4)
            metric.update([words(t) for t in texts])
            value = float(metric.compute())
            if not math.isnan(value):  # nan when fewer than two samples reach 4 words
                bleus.append(value)
    pooled = float(distinct.compute())
    return {"distinct_2": None if math.isnan(pooled) else pooled,
            "self_bleu_4": sum(bleus) / len(bleus) if bleus else None}


def run_eval(target: Backbone, tokenizer: Tokenizer, method: str | Method, config: EvalConfig, *, model_name: str,
             search: SearchStrategy | None = None, rule: DecodingRule | None = None,
             emit: Callable[[str], None] = log_line) -> EvalResult:
    """Generate and score every sample of `config.task`'s `config.limit` problems from `config.offset` with `method`, or
    with the `search` strategy (best-of-N, First Finish Search...; each sample is its best candidate;
    `config.scorer` gives it the task's scorer of each problem), or the decoding `rule`."""
    task = TASKS[config.task](config)
    if config.scorer is not None and not hasattr(search, "scorer"):
        raise ConfigError(f"--scorer ranks a search's candidates: give --method a search that takes a scorer "
                          f"(e.g. best_of_n:n=4), got {config.method!r}")
    problems = task.problems()
    n, sampling = config.num_return_sequences, config.temperature > 0
    # beam searches take no stop strings yet: their samples are cut when scored
    stop = task.stop if config.num_beams == 1 and (search is None or search.takes_stop_strings) else ()
    lines = ProgressLines(f"eval {config.task}", total=len(problems) * n, unit="samples", every=30.0, emit=emit)
    results, passed = [], 0
    for j, problem in enumerate(problems):
        strategy = search
        if search is not None and config.scorer is not None:
            strategy = copy(search)
            strategy.scorer = task.scorer(problem, config.scorer)  # type: ignore[attr-defined]
        outputs = []
        for i in range(n):
            seed = config.seed + j * n + i if sampling else None
            started = time.perf_counter()
            out = generate(target, tokenizer, task.prompt(problem), max_new_tokens=config.max_new_tokens,
                           do_sample=sampling, temperature=config.temperature if sampling else 1.0,
                           top_k=config.top_k, top_p=config.top_p, seed=seed, chat=config.use_chat, method=method,
                           stop=stop, num_beams=config.num_beams, search=strategy, rule=rule)
            outputs.append((out, time.perf_counter() - started, seed))
            lines.update(j * n + i + 1, correct=f"{passed}/{j * n} scored")
        scores = task.score(problem, [out.text for out, _, _ in outputs])
        samples = [Sample(out.text, scored, correct, reason, out.stats.search_tokens or len(out.token_ids),
                          out.stats.target_forwards, seconds, seed)
                   for (out, seconds, seed), (scored, correct, reason) in zip(outputs, scores, strict=True)]
        results.append(ProblemResult(task.problem_id(problem), samples))
        passed += sum(s.correct for s in samples)
    sandbox = isolation().describe() if config.task == "humaneval" else None
    return EvalResult(config, model_name, results, sandbox)

"""The scheduler: one thread that owns the model and decodes the accepted requests together.

The HTTP side never touches the model. It `submit`s a `Job` (refused at once with 429 when the
bounded queue is full, 503 once the server is closing) and reads the job's events — text
increments, then one `Finished` or `Failed` — through the job's `emit` callback, which the app points
at its own event loop. A job whose client went away is `cancel`led: skipped if still queued, stopped
at its next token if decoding.

Continuous batching (`decoding/continuous.py`): up to `max_num_seqs` requests decode together, one
forward per step for all of them; a request joins at the next step after it arrives (its prefill
runs alone) and leaves when it ends, freeing its row for the next one. Every row computes what it
computes alone (batch invariance), so a request's answer does not depend on the others.

Speculation in the batch: a request whose method drafts (`speculation`, or the server's `--method`)
with a drafter that `supports_batch` (prompt lookup, token recycling, ...) drafts in its batch row,
with components of its own; each step's forward verifies every row's tree at once. Whether a step
drafts at all is chosen from the step times measured at the current batch size, and each row's tree
is cut to the levels whose measured acceptance pays for their measured cost (`DraftBudget`): at one
row every step drafts; speculation pays at a few rows and costs more than it gives at many (docs/serve.md).

A drafter that cannot draft in a batch (a draft model, EAGLE, ...) runs in the engine's one loop
(`decoding/engine.run`) while its request is the only one. When another request arrives, it stops
after its current step and joins the batch, carrying its tokens so far (one prefill of them), and
decodes plainly from then on. A lossless method gives the same answer at temperature 0 in every
case (the batched one bit for bit; the lone one up to floating-point near-ties between a verify
forward and a plain step), and the same distribution when sampling.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

import torch

from warpdecode.decoding.constraints.closing import BudgetClosing
from warpdecode.decoding.constraints.llguidance_matcher import Grammar
from warpdecode.decoding.constraints.tree_mask import ConstrainedDecoding
from warpdecode.decoding.continuous import ContinuousBatch, DraftBudget, Row
from warpdecode.decoding.engine import Method, run
from warpdecode.decoding.generate import build_method, stop_token_ids
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.decoding.scoring import TokenLogprob
from warpdecode.decoding.specs import MethodSpec
from warpdecode.decoding.stop_strings import StopMatcher
from warpdecode.errors import WarpdecodeError, one_line
from warpdecode.models.backbone import Backbone
from warpdecode.models.tokenizer import StreamDecoder, Tokenizer
from warpdecode.serve.logprobs import RequestLogprobs
from warpdecode.serve.metrics import ServerMetrics
from warpdecode.serve.protocol import ApiError, Usage, bad_request

MAX_BUILT_METHODS = 8
"""Built methods kept for reuse (a drafter loads its weights once, in `prepare`)."""


@dataclass(frozen=True)
class Delta:
    text: str
    tokens: int
    logprobs: list[TokenLogprob] | None = None
    """Its tokens' log-probabilities (a job that streams them); its text may lag its tokens (a character
    or a stop string held back)."""


@dataclass(frozen=True)
class Finished:
    reason: Literal["stop", "length"]
    usage: Usage
    logprobs: list[TokenLogprob] | None = None
    """Every new token's log-probability (a job that asked for them at the end, `Job.stream` False)."""


@dataclass(frozen=True)
class Failed:
    error: ApiError


Event = Delta | Finished | Failed


@dataclass
class Job:
    """One request's decoding: prompt ids that fit the context with `max_tokens` new tokens."""

    ids: list[int]
    max_tokens: int
    sampling: SamplingConfig
    spec: MethodSpec
    stops: tuple[str, ...]
    emit: Callable[[Event], None]
    grammar: Grammar | None = None
    """The compiled `response_format` its output keeps to (None: free text)."""
    close_at_budget: bool = False
    """Close its constrained output within `max_tokens` (`decoding/constraints/closing.py`)."""
    logprobs: int | None = None
    """Report the target's log-probability of every new token with this many most likely alternatives
    (`decoding/scoring.py`; None: none)."""
    stream: bool = False
    """Hand the log-probabilities over with each `Delta` (each step's tokens scored as they come) instead
    of in `Finished` (a scorer's tokens scored in one forward at the end)."""
    arrival: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        self.cancelled.set()


class _Stop(Exception):
    """Raised from the engine's token callback to end a request's solo run (it ended, or must join the batch)."""


class _Output:
    """A job's output side: tokens → text increments through its stop strings, metrics, and the end."""

    def __init__(self, job: Job, tokenizer: Tokenizer, metrics: ServerMetrics, target: Backbone,
                 prefill_chunk: int | None) -> None:
        self.job, self.tokenizer, self.metrics = job, tokenizer, metrics
        self.decoder = StreamDecoder(tokenizer)
        self.logprobs = None if job.logprobs is None else RequestLogprobs(
            target, job.ids, max_new_tokens=job.max_tokens, top=job.logprobs, stream=job.stream,
            prefill_chunk=prefill_chunk)
        self.stops = StopMatcher(job.stops)
        self.last: float | None = None
        self.done = False

    @property
    def produced(self) -> list[int]:
        return self.decoder.ids

    def push(self, tokens: list[int], logits: torch.Tensor | None = None) -> bool:
        """Emit `tokens`' text; False once the job must end (a stop string, or its client left). `logits`:
        (len(tokens), V) the target's raw logits each token was picked from (a row that keeps them)."""
        now = time.perf_counter()
        if self.last is None:
            self.metrics.ttft.observe(now - self.job.arrival)
        else:
            for _ in tokens:
                self.metrics.itl.observe((now - self.last) / len(tokens))
        self.last = now
        self.metrics.generated_tokens.inc(len(tokens))
        scored = None if self.logprobs is None else self.logprobs.step(tokens, logits)
        if not _emit(self.job, Delta(self.stops.push(self.decoder.push(tokens)), len(tokens), scored)):
            self.job.cancel()
        return not (self.stops.stopped or self.job.cancelled.is_set())

    def finish(self, eos: bool) -> None:
        """End the job: its held-back text, then `Finished` (or nothing more if it was cancelled)."""
        self.done = True
        logprobs, self.logprobs = self.logprobs, None  # frees a scorer's cache
        if self.job.cancelled.is_set():
            self.metrics.finished.labels("cancelled").inc()
            return
        scored = None if logprobs is None else logprobs.end(self.decoder.ids)
        if not self.stops.stopped:
            rest = self.tokenizer.decode(self.decoder.ids)[len(self.decoder.emitted):]  # a character cut at the end
            text = self.stops.push(rest) + self.stops.flush()
            if text:
                _emit(self.job, Delta(text, 0))
        reason: Literal["stop", "length"] = "stop" if eos or self.stops.stopped else "length"
        self.metrics.finished.labels(reason).inc()
        _emit(self.job, Finished(reason, Usage(len(self.job.ids), len(self.decoder.ids)), scored))


class Scheduler:
    def __init__(self, target: Backbone, tokenizer: Tokenizer, *, metrics: ServerMetrics, max_queue: int = 64,
                 drafter_options: dict[str, dict] | None = None, max_num_seqs: int = 8,
                 max_model_len: int | None = None, chunked_prefill_size: int | None = None) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        self.target = target
        self.tokenizer = tokenizer
        self.metrics = metrics
        self.max_queue = max_queue
        self.max_num_seqs = max_num_seqs if target.supports_continuous_batching else 1
        self.max_model_len = min(max_model_len or target.config.max_seq_len, target.config.max_seq_len)
        """Longest request (prompt + max_tokens); the batch's cache holds `max_num_seqs` of them."""
        self.chunked_prefill_size = chunked_prefill_size
        """Prefill a longer prompt this many tokens per step, between the batch's steps (None: at once)."""
        self.drafter_options = drafter_options or {}
        self.stop_ids = stop_token_ids(target, tokenizer)
        self._jobs: deque[Job] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._methods: OrderedDict[tuple[str, bool], Method] = OrderedDict()
        self._batch: ContinuousBatch | None = None  # made on first use (its cache is the big allocation)
        self._rows: dict[Row, tuple[Job, _Output]] = {}
        self._solo: Job | None = None
        self.budget = DraftBudget()
        """Whether a batched step drafts, from the step times measured at each batch size."""

    @property
    def running(self) -> Job | None:
        """A job being decoded now (None when none is)."""
        return self._solo or next((job for job, _ in self._rows.values()), None)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="warpdecode-scheduler", daemon=True)
        self._thread.start()

    def submit(self, *jobs: Job) -> None:
        """Queue `jobs` (all or none), or raise `ApiError` 429 (queue full) / 503 (closing): never accept what
        cannot be held."""
        with self._cond:
            if self._closing:
                raise ApiError(503, "the server is shutting down", type="unavailable_error",
                               headers={"Retry-After": "5"})
            if len(self._jobs) + len(jobs) > self.max_queue:
                raise ApiError(429, f"the server's queue is full ({self.max_queue} requests waiting, "
                               f"{len(self._jobs)} now; this request needs {len(jobs)}); retry later",
                               type="rate_limit_error", code="queue_full", headers={"Retry-After": "1"})
            self._jobs.extend(jobs)
            self.metrics.queue_depth.set(len(self._jobs))
            self._cond.notify()

    def close(self, timeout: float | None = None) -> None:
        """Refuse new jobs, decode the queued ones, and stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def method(self, spec: MethodSpec, do_sample: bool) -> Method:
        """The built method of `spec` (built once, then reused: components reset per request in `start`)."""
        key = (spec.label, do_sample)
        if key not in self._methods:
            self._methods[key] = spec.with_defaults(self.drafter_options).build(do_sample=do_sample)
            if len(self._methods) > MAX_BUILT_METHODS:
                self._methods.popitem(last=False)
        self._methods.move_to_end(key)
        return self._methods[key]

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._rows and not self._closing:
                    self._cond.wait()
                if not self._jobs and not self._rows:
                    return
                admitted: list[Job] = []
                while self._jobs and len(self._rows) + len(admitted) < self.max_num_seqs:
                    admitted.append(self._jobs.popleft())
                self.metrics.queue_depth.set(len(self._jobs))
            for job in admitted:
                self._guarded(job, partial(self._admit, job))
            if self._rows:
                self._step()

    def _guarded(self, job: Job, work: Callable[[], None]) -> None:
        """Run `work` for `job`; a failure ends that job with a 500 and never the thread serving the others."""
        try:
            work()
        except Exception as error:  # noqa: BLE001
            for row, (other, _) in list(self._rows.items()):
                if other is job:
                    self._leave(row)
            _emit(job, _failed(error))

    def _admit(self, job: Job) -> None:
        if job.cancelled.is_set():
            self.metrics.finished.labels("cancelled").inc()
            return
        constraint = None if job.grammar is None else ConstrainedDecoding(job.grammar.state(), closing=self._budget_closing(job))
        batched = self.max_num_seqs > 1
        try:
            method = self.method(job.spec, job.sampling.do_sample)
            sampler = Sampler(job.sampling, device=self.target.embed.weight.device)
            in_batch = batched and method.drafter.supports_batch and (method.drafter.drafts or constraint is not None)
            if in_batch:  # components of its own: a drafter keeps per-request state
                method = job.spec.with_defaults(self.drafter_options).build(do_sample=job.sampling.do_sample)
        except WarpdecodeError as error:
            _emit(job, Failed(bad_request(f"speculation {job.spec.label!r}: {one_line(error)}", "speculation")))
            return
        self.metrics.prompt_tokens.inc(len(job.ids))
        output = _Output(job, self.tokenizer, self.metrics, self.target, self.chunked_prefill_size)
        if in_batch:
            self._join(job, sampler, output, method, constraint)
            return
        if (method.drafter.drafts or constraint is not None) and not self._rows and self._alone():
            self._solo = job
            self.metrics.batch_size.set(1)
            try:
                if self._run_alone(job, method, sampler, output, constraint):
                    return
            finally:
                self._solo = None
        if constraint is not None:  # it stopped to join the batch: go on plainly, in its grammar
            method = build_method("none", do_sample=job.sampling.do_sample)
        self._join(job, sampler, output, method if constraint is not None else None, constraint)

    def _budget_closing(self, job: Job) -> BudgetClosing | None:
        """The budget-aware closing of `job`'s constrained output (None: it is cut at `max_tokens`)."""
        if job.grammar is None or not job.close_at_budget:
            return None
        return BudgetClosing.of(self.tokenizer, job.grammar, job.max_tokens)

    def _alone(self) -> bool:
        with self._cond:
            return not self._jobs

    def _run_alone(self, job: Job, method: Method, sampler: Sampler, output: _Output,
                   constraint: ConstrainedDecoding | None) -> bool:
        """Decode `job` with its speculative method while no other request waits; True when it ended,
        False when it stopped to join the batch (another request arrived)."""
        yielded = False

        def on_tokens(tokens: list[int]) -> None:
            nonlocal yielded
            if not output.push(tokens):
                raise _Stop
            if self.max_num_seqs > 1 and not self._alone():
                yielded = True
                raise _Stop

        try:
            _, finish, stats = run(self.target, job.ids, method, sampler, max_new_tokens=job.max_tokens,
                                   stop_ids=self.stop_ids, on_tokens=on_tokens, constraint=constraint)
        except _Stop:
            if not yielded:
                output.finish(eos=False)
                return True
            produced = output.produced
            if produced[-1] in self.stop_ids or len(produced) >= job.max_tokens:  # a closed output: length
                output.finish(eos=produced[-1] in self.stop_ids and not (constraint and constraint.closing_tokens))
                return True
            return False
        self.metrics.tau.observe(stats.tau)
        self.metrics.tokens_per_second.set(stats.tokens_per_second)
        output.finish(eos=finish == "eos")
        return True

    def _join(self, job: Job, sampler: Sampler, output: _Output, method: Method | None = None,
              constraint: ConstrainedDecoding | None = None) -> None:
        """Add `job` to the batch (drafting with `method`, or plainly); a job that decoded alone first
        carries its tokens (re-read by one prefill)."""
        if self._batch is None:
            self._batch = ContinuousBatch(self.target, max_rows=self.max_num_seqs, max_len=self.max_model_len,
                                          stop_ids=self.stop_ids, prefill_chunk=self.chunked_prefill_size)
        done = output.produced
        self.metrics.batch_size.set(len(self._rows) + 1)  # its prefill counts
        # a job with logprobs takes them from its row's own logits (no scoring forward), unless it decoded
        # alone first: then the row's first logits come from a prefill of its tokens so far, not from a step
        # as the scorer's, and its scorer goes on
        keep = job.logprobs is not None and not done and (constraint is None or constraint.closing is None)
        row = self._batch.add(job.ids + done, max_new_tokens=job.max_tokens - len(done), sampler=sampler,
                              prompt_len=len(job.ids), method=method, constraint=constraint, keep_logits=keep)
        self._rows[row] = (job, output)
        self.metrics.batch_size.set(len(self._rows))
        self._emit_token(row)

    def _step(self) -> None:
        assert self._batch is not None
        batch = self._batch
        for row, (job, output) in list(self._rows.items()):
            if job.cancelled.is_set():
                output.finish(eos=False)
                self._leave(row)
        if not self._rows:
            return
        rows = len(self._rows)
        self.metrics.step_rows.observe(rows)
        drafters = {row.method.drafter.name for row in self._rows if row.method is not None}
        drafting = self.budget.choose(rows, bool(drafters), cut=not drafters & self.budget.uncut)
        try:
            start = time.perf_counter()
            batch.step(None if drafting else 0, partial(self.budget.keep, rows) if drafting else None)
            self.budget.observe(rows, drafting, sum(len(row.last) for row in self._rows), time.perf_counter() - start,
                                width=batch.width)
            for row in self._rows:
                self.budget.learn(row)
        except Exception as error:  # noqa: BLE001 -- a failed step ends its rows' requests, not the server
            for row, (job, output) in list(self._rows.items()):
                self._leave(row)
                if not output.done:
                    _emit(job, _failed(error))
            return
        for row, (job, _) in list(self._rows.items()):
            self._guarded(job, partial(self._emit_token, row))  # scoring its tokens may fail

    def _emit_token(self, row: Row) -> None:
        """Hand `row`'s newest token to its job; end the job when the row or its output is done."""
        _, output = self._rows[row]
        if not row.last:  # its prompt is still being prefilled
            return
        going = output.push(row.last, row.last_logits)
        if row.finish is not None or not going:
            output.finish(eos=row.finish == "eos")
            if row.finish is not None:
                self.metrics.tokens_per_second.set(row.stats.tokens_per_second)
                if row.method is not None:
                    self.metrics.tau.observe(row.stats.tau)
            self._leave(row)

    def _leave(self, row: Row) -> None:
        assert self._batch is not None
        if row in self._rows:
            del self._rows[row]
            self._batch.remove(row)
        self.metrics.batch_size.set(len(self._rows))


def _failed(error: Exception) -> Failed:
    """The event that ends a request whose decoding raised `error` (a 500; the server goes on)."""
    return Failed(ApiError(500, f"decoding failed: {one_line(error)}", type="server_error"))


def _emit(job: Job, event: Event) -> bool:
    """Hand `event` to the job's reader; False when the reader is gone (its event loop closed)."""
    try:
        job.emit(event)
    except RuntimeError:
        return False
    return True

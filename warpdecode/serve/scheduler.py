"""The scheduler: one thread that owns the model and decodes accepted requests in arrival order.

The HTTP side never touches the model. It `submit`s a `Job` (refused at once with 429 when the
bounded queue is full, 503 once the server is closing) and reads the job's events — text
increments, then one `Finished` or `Failed` — through the job's `emit` callback, which the app points
at its own event loop. A job whose client went away is `cancel`led: skipped if still queued, stopped
at its next token if decoding. Every request is decoded by the engine's one loop (`decoding/engine.run`)
with the request's own method and sampler, so a request's output is the one `generate()` gives for
the same prompt, method and sampling parameters; nothing a request holds is shared with another.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from warpdecode.decoding.engine import Method, run
from warpdecode.decoding.generate import stop_token_ids
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.decoding.specs import MethodSpec
from warpdecode.decoding.stop_strings import StopMatcher
from warpdecode.errors import WarpdecodeError, one_line
from warpdecode.models.backbone import Backbone
from warpdecode.models.tokenizer import StreamDecoder, Tokenizer
from warpdecode.serve.metrics import ServerMetrics
from warpdecode.serve.protocol import ApiError, Usage, bad_request

MAX_BUILT_METHODS = 8
"""Built methods kept for reuse (a drafter loads its weights once, in `prepare`)."""


@dataclass(frozen=True)
class Delta:
    text: str
    tokens: int


@dataclass(frozen=True)
class Finished:
    reason: Literal["stop", "length"]
    usage: Usage


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
    arrival: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        self.cancelled.set()


class _Stop(Exception):
    """Raised from the engine's token callback to end a request early (stop sequence or cancel)."""


class Scheduler:
    def __init__(self, target: Backbone, tokenizer: Tokenizer, *, metrics: ServerMetrics, max_queue: int = 64,
                 drafter_options: dict[str, dict] | None = None) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        self.target = target
        self.tokenizer = tokenizer
        self.metrics = metrics
        self.max_queue = max_queue
        self.drafter_options = drafter_options or {}
        self.stop_ids = stop_token_ids(target, tokenizer)
        self._jobs: deque[Job] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._methods: OrderedDict[tuple[str, bool], Method] = OrderedDict()
        self.running: Job | None = None
        """The job being decoded now (None between jobs)."""

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="warpdecode-scheduler", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue `job`, or raise `ApiError` 429 (queue full) / 503 (closing): never accept what cannot be held."""
        with self._cond:
            if self._closing:
                raise ApiError(503, "the server is shutting down", type="unavailable_error",
                               headers={"Retry-After": "5"})
            if len(self._jobs) >= self.max_queue:
                raise ApiError(429, f"the server's queue is full ({self.max_queue} requests waiting); retry later",
                               type="rate_limit_error", code="queue_full", headers={"Retry-After": "1"})
            self._jobs.append(job)
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

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closing:
                    self._cond.wait()
                if not self._jobs:
                    return
                job = self._jobs.popleft()
                self.metrics.queue_depth.set(len(self._jobs))
            if job.cancelled.is_set():
                self.metrics.finished.labels("cancelled").inc()
                continue
            self.running = job
            self.metrics.batch_size.set(1)
            try:
                self._decode(job)
            except Exception as error:  # noqa: BLE001 -- one request never ends the thread that serves the others
                _emit(job, Failed(ApiError(500, f"decoding failed: {one_line(error)}", type="server_error")))
            finally:
                self.running = None
                self.metrics.batch_size.set(0)

    def method(self, spec: MethodSpec, do_sample: bool) -> Method:
        """The built method of `spec` (built once, then reused: components reset per request in `start`)."""
        key = (spec.label, do_sample)
        if key not in self._methods:
            self._methods[key] = spec.with_defaults(self.drafter_options).build(do_sample=do_sample)
            if len(self._methods) > MAX_BUILT_METHODS:
                self._methods.popitem(last=False)
        self._methods.move_to_end(key)
        return self._methods[key]

    def _decode(self, job: Job) -> None:
        try:
            method = self.method(job.spec, job.sampling.do_sample)
            sampler = Sampler(job.sampling, device=self.target.embed.weight.device)
        except WarpdecodeError as error:
            _emit(job, Failed(bad_request(f"speculation {job.spec.label!r}: {one_line(error)}", "speculation")))
            return
        decoder = StreamDecoder(self.tokenizer)
        stops = StopMatcher(job.stops)
        metrics = self.metrics
        produced = 0
        last: float | None = None

        def on_tokens(tokens: list[int]) -> None:
            nonlocal produced, last
            if job.cancelled.is_set():
                raise _Stop
            now = time.perf_counter()
            if last is None:
                metrics.ttft.observe(now - job.arrival)
            else:
                for _ in tokens:
                    metrics.itl.observe((now - last) / len(tokens))
            last = now
            produced += len(tokens)
            metrics.generated_tokens.inc(len(tokens))
            if not _emit(job, Delta(stops.push(decoder.push(tokens)), len(tokens))):
                job.cancel()
            if stops.stopped or job.cancelled.is_set():
                raise _Stop

        metrics.prompt_tokens.inc(len(job.ids))
        reason: Literal["stop", "length"] = "stop"
        try:
            _, finish, stats = run(self.target, job.ids, method, sampler, max_new_tokens=job.max_tokens,
                                   stop_ids=self.stop_ids, on_tokens=on_tokens)
        except _Stop:
            if job.cancelled.is_set():
                metrics.finished.labels("cancelled").inc()
                return
        else:
            rest = self.tokenizer.decode(decoder.ids)[len(decoder.emitted):]  # a character cut at the end
            text = stops.push(rest)
            text += stops.flush()
            if text:
                _emit(job, Delta(text, 0))
            reason = "stop" if finish == "eos" or stops.stopped else "length"
            metrics.tau.observe(stats.tau)
            metrics.tokens_per_second.set(stats.tokens_per_second)
        metrics.finished.labels(reason).inc()
        _emit(job, Finished(reason, Usage(len(job.ids), produced)))


def _emit(job: Job, event: Event) -> bool:
    """Hand `event` to the job's reader; False when the reader is gone (its event loop closed)."""
    try:
        job.emit(event)
    except RuntimeError:
        return False
    return True

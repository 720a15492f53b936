"""The ASGI application: OpenAI's completions, chat completions and models endpoints, health and metrics.

A request is read and checked here (body size, JSON, fields, model name, prompt length against the
context, the `speculation` spec) and becomes a `Job` for the scheduler; every refusal is a 4xx in
OpenAI's error shape before any decoding starts. Streamed answers are server-sent events in OpenAI's
chunk shapes, ending with `data: [DONE]`.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any, Literal, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from warpdecode.decoding.constraints.formats import compile_response_format
from warpdecode.decoding.constraints.llguidance_matcher import Grammar
from warpdecode.decoding.generate import prompt_ids
from warpdecode.decoding.sampler import SamplingConfig
from warpdecode.decoding.specs import MethodSpec, parse_method
from warpdecode.errors import WarpdecodeError, one_line
from warpdecode.serve.echo import Echo
from warpdecode.serve.logprobs import HeldLogprobs, LogprobsFormat, TokenStrings
from warpdecode.serve.metrics import ServerMetrics
from warpdecode.serve.protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    Usage,
    bad_request,
    parse_body,
)
from warpdecode.serve.scheduler import Delta, Event, Failed, Finished, Job, Scheduler

MAX_BODY_BYTES = 1 << 20
"""Largest request body read (413 beyond): a prompt longer than any context fits well within it."""
DISCONNECT_POLL_SECONDS = 0.25
"""How often a non-streamed request checks that its client is still there while it waits."""

Kind = Literal["completion", "chat"]
Req = TypeVar("Req", CompletionRequest, ChatCompletionRequest)


class _ClientGone(Exception):
    pass


def _error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


class _CountRequests:
    """ASGI middleware counting answered requests by endpoint and status (streams counted at their start)."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics, endpoints: set[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.endpoints = endpoints

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"] if scope["path"] in self.endpoints else "other"

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(path, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)


def create_app(scheduler: Scheduler, *, model_name: str, default_method: str = "none",
               max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    """The server's app around a (not yet started) `scheduler`; its lifespan starts the scheduler and,
    at shutdown, lets it finish the requests it holds."""
    target, tokenizer, metrics = scheduler.target, scheduler.tokenizer, scheduler.metrics
    strings = TokenStrings(tokenizer, target.config.vocab_size, scheduler.stop_ids)
    context = scheduler.max_model_len
    created = int(time.time())
    _spec(default_method, scheduler)  # a bad --method is refused before the server listens

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if not scheduler.alive:
            scheduler.start()
        try:
            yield
        finally:
            await run_in_threadpool(scheduler.close)

    app = FastAPI(title="warpdecode", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    endpoints = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"}
    app.add_middleware(_CountRequests, metrics=metrics, endpoints=endpoints)

    @app.exception_handler(ApiError)
    async def api_error(_: Request, error: ApiError) -> JSONResponse:
        return _error_response(error)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, error: HTTPException) -> JSONResponse:
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        return _error_response(ApiError(error.status_code, str(error.detail), type=kind,  # type: ignore[arg-type]
                                        headers=dict(error.headers or {})))

    @app.exception_handler(_ClientGone)
    async def client_gone(_: Request, error: _ClientGone) -> Response:
        return Response(status_code=499)  # nobody reads it: "client closed request", as nginx logs it

    @app.exception_handler(Exception)
    async def internal_error(_: Request, error: Exception) -> JSONResponse:
        return _error_response(ApiError(500, f"internal error: {one_line(error)}", type="server_error"))

    def model_card() -> dict[str, Any]:
        return {"id": model_name, "object": "model", "created": created, "owned_by": "warpdecode",
                "max_model_len": context}

    @app.get("/health")
    async def health() -> JSONResponse:
        if not scheduler.alive:
            return _error_response(ApiError(503, "the model's scheduler is not running", type="unavailable_error"))
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.text(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [model_card()]})

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> JSONResponse:
        _check_model(name, model_name)
        return JSONResponse(model_card())

    async def _parsed(request: Request, cls: type[Req]) -> Req:
        """The request's body as `cls`, checked, for the served model (4xx otherwise)."""
        req = parse_body(cls, await _read_body(request, max_body_bytes))
        req.check()
        _check_model(req.model, model_name)
        return req

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req = await _parsed(request, CompletionRequest)
        prompt = req.single_prompt()
        if isinstance(prompt, list) and any(not 0 <= t < target.config.vocab_size for t in prompt):
            raise bad_request(f"prompt token ids must be in [0, {target.config.vocab_size})", "prompt")
        ids = await run_in_threadpool(_prompt_ids, lambda: prompt_ids(target, tokenizer, prompt, chat=False),
                                      "prompt")
        echo = None
        if req.echo:
            text = prompt if isinstance(prompt, str) else tokenizer.decode(prompt, skip_special_tokens=False)
            if req.logprobs is not None:
                await run_in_threadpool(strings.ready)
            echo = await run_in_threadpool(Echo.of, target, text, ids, req.logprobs)
            if req.max_tokens == 0:  # the prompt scored alone
                fmt = None if req.logprobs is None else LogprobsFormat("completion", strings)
                answer = echo.choice("", None, fmt)
                choices = [{"index": i, "text": answer[0], "logprobs": answer[1], "finish_reason": "length"}
                           for i in range(req.n)]
                return JSONResponse({**_meta("completion", model_name), "object": "text_completion", "choices": choices,
                                     "usage": Usage(len(ids), 0).to_dict()})
        return await _answer(request, req, ids, req.max_tokens, "completion", echo)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        req = await _parsed(request, ChatCompletionRequest)
        if tokenizer.chat_template is None:
            raise bad_request(f"model {model_name!r} has no chat template; use /v1/completions", "messages")
        messages = req.template_messages()

        def encode() -> list[int]:
            text = tokenizer.apply_chat_template(messages)
            return prompt_ids(target, tokenizer, tokenizer.encode(text, add_special_tokens=False), chat=False)

        ids = await run_in_threadpool(_prompt_ids, encode, "messages")
        return await _answer(request, req, ids, req.token_limit, "chat")

    async def _answer(request: Request, req: CompletionRequest | ChatCompletionRequest, ids: list[int],
                      max_tokens: int | None, kind: Kind, echo: Echo | None = None) -> Response:
        room = context - len(ids)
        if max_tokens is None:
            max_tokens = room
        elif max_tokens > room:
            field = "max_completion_tokens" if isinstance(req, ChatCompletionRequest) and req.max_completion_tokens \
                else "max_tokens"
            raise bad_request(f"this model's maximum context length is {context} tokens; the prompt has {len(ids)} "
                              f"tokens, so {field} can be at most {room}, got {max_tokens}", field,
                              "context_length_exceeded")
        temperature = 1.0 if req.temperature is None else req.temperature
        try:
            sampling = SamplingConfig(do_sample=temperature > 0, temperature=temperature if temperature > 0 else 1.0,
                                      top_k=req.top_k, top_p=req.top_p, seed=req.seed,
                                      frequency_penalty=req.frequency_penalty, presence_penalty=req.presence_penalty)
        except WarpdecodeError as error:
            raise bad_request(one_line(error)) from None
        spec = _spec(req.speculation or default_method, scheduler)
        grammar = None
        if req.response_format is not None and req.response_format.type != "text":
            grammar = await run_in_threadpool(_grammar, req.response_format.as_dict(), scheduler)
        top = req.top_count
        fmt = None if top is None else LogprobsFormat(kind, strings)
        if fmt is not None:
            await run_in_threadpool(strings.ready)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()

        def emitter(i: int) -> Callable[[Event], None]:
            def emit(event: Event) -> None:  # called from the scheduler's thread
                loop.call_soon_threadsafe(events.put_nowait, (i, event))
            return emit

        # n choices: n jobs when sampling (job i seeded seed + i), one job copied into every choice when
        # greedy (the n answers are the same tokens)
        jobs = [Job(ids, max_tokens, replace(sampling, seed=None if req.seed is None else req.seed + i), spec,
                    req.stops(), emitter(i), grammar=grammar, close_at_budget=req.close_at_budget,
                    logprobs=top, stream=req.stream)
                for i in range(req.n if sampling.do_sample else 1)]
        copies = 1 if sampling.do_sample else req.n
        scheduler.submit(*jobs)
        choices = _Choices(jobs, copies, events, request)
        meta = _meta(kind, model_name)
        try:
            first = await choices.next()
        except BaseException:
            choices.cancel()
            raise
        if isinstance(first[1], Failed):
            choices.cancel()
            raise first[1].error
        if req.stream:
            return StreamingResponse(_stream(choices, first, kind, meta, req.include_usage, fmt, echo),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        parts: list[list[str]] = [[] for _ in jobs]
        done: dict[int, Finished] = {}
        event = first
        try:
            while True:
                i, what = event
                if isinstance(what, Failed):
                    raise what.error
                if isinstance(what, Finished):
                    done[i] = what
                    if len(done) == len(jobs):
                        break
                else:
                    parts[i].append(what.text)
                event = await choices.next()
        except BaseException:
            choices.cancel()
            raise
        answers = [("".join(parts[i]), done[i]) for i in range(len(jobs)) for _ in range(copies)]
        if fmt is None and echo is None:
            return JSONResponse(_full(kind, meta, answers))
        return JSONResponse(await run_in_threadpool(_full, kind, meta, answers, fmt, echo))  # many token strings

    return app


def _check_model(name: str | None, served: str) -> None:
    if name is not None and name != served:
        raise ApiError(404, f"the model {name!r} does not exist; this server serves {served!r}",
                       type="not_found_error", param="model", code="model_not_found")


def _prompt_ids(encode: Callable[[], list[int]], param: str) -> list[int]:
    try:
        return encode()
    except WarpdecodeError as error:
        code = "context_length_exceeded" if "context" in str(error) else None
        raise bad_request(one_line(error), param, code) from None


def _grammar(response_format: dict[str, Any], scheduler: Scheduler) -> Grammar | None:
    """The compiled grammar of a request's `response_format` (400 naming the field when it is bad)."""
    try:
        return compile_response_format(response_format, scheduler.tokenizer,  # type: ignore[arg-type]
                                       vocab_size=scheduler.target.config.vocab_size, stop_ids=scheduler.stop_ids)
    except WarpdecodeError as error:
        raise bad_request(f"response_format: {one_line(error)}", "response_format") from None


def _spec(text: str, scheduler: Scheduler) -> MethodSpec:
    """The checked method spec of `speculation` (or the server's default)."""
    try:
        spec = parse_method(text).with_defaults(scheduler.drafter_options)
        spec.validate(complete=False)
    except WarpdecodeError as error:
        raise bad_request(f"speculation: {one_line(error)}", "speculation") from None
    return spec


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, or 413 past `limit` bytes (read no further than that)."""
    declared = request.headers.get("content-length", "")
    too_large = ApiError(413, f"the request body is larger than {limit} bytes", code="body_too_large")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


class _Choices:
    """The n choices of one request: its jobs' events, tagged with the job's index, in arrival order;
    job i's events go to choices i·copies ... (i+1)·copies - 1."""

    def __init__(self, jobs: list[Job], copies: int, events: asyncio.Queue[tuple[int, Event]], request: Request) -> None:
        self.jobs, self.copies, self.events, self.request = jobs, copies, events, request

    async def next(self) -> tuple[int, Event]:
        """The next event of any job; `_ClientGone` when the client disconnected while waiting."""
        while True:
            try:
                return await asyncio.wait_for(self.events.get(), DISCONNECT_POLL_SECONDS)
            except asyncio.TimeoutError:
                if await self.request.is_disconnected():
                    raise _ClientGone from None

    def indices(self, job: int) -> range:
        return range(job * self.copies, (job + 1) * self.copies)

    def cancel(self) -> None:
        for job in self.jobs:
            job.cancel()


def _meta(kind: Kind, model_name: str) -> dict[str, Any]:
    """An answer's id, creation time and model."""
    return {"id": f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}", "created": int(time.time()),
            "model": model_name}


def _usage(finished: list[Finished]) -> Usage:
    """The usage of n choices: the prompt once, every choice's tokens."""
    return Usage(finished[0].usage.prompt_tokens, sum(f.usage.completion_tokens for f in finished))


def _full(kind: Kind, meta: dict[str, Any], answers: list[tuple[str, Finished]],
          fmt: LogprobsFormat | None = None, echo: Echo | None = None) -> dict[str, Any]:
    usage = _usage([done for _, done in answers]).to_dict()
    if echo is not None:  # a completion's prompt before each choice
        echoed = [echo.choice(text, done.logprobs, fmt) for text, done in answers]
        answers = [(text, done) for (text, _), (_, done) in zip(echoed, answers, strict=True)]
        logprobs = [lp for _, lp in echoed]
    else:
        logprobs = [None if fmt is None or done.logprobs is None else fmt(done.logprobs) for _, done in answers]
    choices: list[dict[str, Any]]
    if kind == "chat":
        choices = [{"index": i, "message": {"role": "assistant", "content": text}, "logprobs": logprobs[i],
                    "finish_reason": done.reason} for i, (text, done) in enumerate(answers)]
        return {**meta, "object": "chat.completion", "choices": choices, "usage": usage}
    choices = [{"index": i, "text": text, "logprobs": logprobs[i], "finish_reason": done.reason}
               for i, (text, done) in enumerate(answers)]
    return {**meta, "object": "text_completion", "choices": choices, "usage": usage}


def _chunk(kind: Kind, meta: dict[str, Any], index: int, text: str | None, finish: str | None, *,
           role: bool = False, logprobs: dict[str, Any] | None = None) -> bytes:
    if kind == "chat":
        delta: dict[str, Any] = {"role": "assistant", "content": text or ""} if role else \
            ({} if text is None else {"content": text})
        choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        body = {**meta, "object": "chat.completion.chunk", "choices": [choice]}
    else:
        body = {**meta, "object": "text_completion",
                "choices": [{"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}]}
    return _sse(body)


def _sse(body: dict[str, Any] | str) -> bytes:
    return f"data: {body if isinstance(body, str) else json.dumps(body)}\n\n".encode()


async def _stream(choices: _Choices, first: tuple[int, Event], kind: Kind, meta: dict[str, Any],
                  include_usage: bool, fmt: LogprobsFormat | None = None, echo: Echo | None = None) -> AsyncIterator[bytes]:
    """The jobs' events as OpenAI's stream chunks, one choice per chunk (`index`), in the order they come;
    the jobs are cancelled if the stream ends early (the client went away and the response was cancelled).
    With `fmt`, a chunk carries the logprobs of the tokens that came since the last chunk; with `echo`, each
    choice's first chunk is the prompt (and its logprobs)."""
    finished: dict[int, Finished] = {}
    failed = False
    held = HeldLogprobs(fmt)
    try:
        if kind == "chat":
            for index in range(len(choices.jobs) * choices.copies):
                yield _chunk(kind, meta, index, "", None, role=True)
        if echo is not None:
            text, lp = echo.choice("", None, fmt)
            for job in range(len(choices.jobs)):
                held.offsets[job] = len(echo.text)  # the completion's offsets follow the prompt's text
                for index in choices.indices(job):
                    yield _chunk(kind, meta, index, text, None, logprobs=lp)
        job, event = first
        while True:
            if isinstance(event, Delta):
                held.add(job, event.logprobs)
                if event.text:
                    lp = held.take(job)
                    for index in choices.indices(job):
                        yield _chunk(kind, meta, index, event.text, None, logprobs=lp)
            elif isinstance(event, Failed):
                failed = True
                yield _sse(event.error.body())
                break
            else:
                finished[job] = event
                lp = held.take(job)
                for index in choices.indices(job):
                    yield _chunk(kind, meta, index, None, event.reason, logprobs=lp)
                if len(finished) == len(choices.jobs):
                    if include_usage:
                        usage = _usage([finished[j] for j in sorted(finished) for _ in range(choices.copies)])
                        yield _sse({**meta, "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
                                    "choices": [], "usage": usage.to_dict()})
                    break
            job, event = await choices.events.get()
        yield _sse("[DONE]")
    finally:
        if failed or len(finished) < len(choices.jobs):
            choices.cancel()

"""`warpdecode serve`: the OpenAI-compatible server."""

from __future__ import annotations

from pathlib import Path

import torch

from warpdecode.commands.common import _check_one, _check_threads, _load_target
from warpdecode.models.named import DEFAULT_MODEL


def serve(
    *,
    model: str | None = None,
    package: Path | None = None,
    backend: str = "torch",
    device: str = "cpu",
    dtype: str = "fp32",
    method: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    served_model_name: str | None = None,
    max_queue: int = 64,
    max_num_seqs: int = 16,
    max_model_len: int | None = None,
    chunked_prefill_size: int | None = None,
    threads: int | None = None,
) -> None:
    """Serve a model over HTTP with OpenAI's API: /v1/completions, /v1/chat/completions, /v1/models,
    /health and Prometheus /metrics (docs/serve.md).

    Runs until SIGINT or SIGTERM, then finishes the requests in flight before it exits. Example:
    `warpdecode serve --method prompt_lookup --port 8000`, then point an OpenAI client at
    http://127.0.0.1:8000/v1. A request may pick its own method with the `speculation` field.

    Args:
        model: model directory, .gguf file, or model name (default: smollm2-135m-instruct).
        package: an inference package (`warpdecode export`) to serve instead of --model.
        backend: the backend to run on (see `warpdecode generate --help`).
        device: cpu, or cuda (a CUDA device such as cuda:1).
        dtype: precision of --model's weights: fp32, bf16 or fp16, or q8 / q4 (weight-only quantised).
        method: the default decoding method NAME[:KEY=VALUE...] (as `generate --method`); none = plain
            decoding (the default, or the method a package was exported with).
        host: address to listen on (127.0.0.1: this machine only).
        port: TCP port to listen on.
        served_model_name: the model id clients name in requests (default: --model, the package's
            folder name, or the default model's name).
        max_queue: requests accepted beyond those decoding; more are answered 429 with Retry-After.
        max_num_seqs: requests decoded together in one batch (continuous batching; the PyTorch backend,
            others decode one at a time).
        max_model_len: longest request, prompt plus max_tokens (default: the model's context); the
            batch's KV cache holds --max-num-seqs of them, taken as they fill.
        chunked_prefill_size: prefill a longer prompt this many tokens per step, between the batch's
            decoding steps, so that it does not hold the other requests (default: at once).
        threads: CPU threads for torch (default: torch's choice).
    """
    from warpdecode.serve.server import build_server

    _check_one(backend, "--backend", "backend", "--backends")
    _check_threads(threads)
    if method is not None:
        _check_one(method, "--method", "method", "--methods")
    if threads is not None:
        torch.set_num_threads(threads)
    target, tokenizer, drafter_options, default_method = _load_target(model, package, backend, device, threads, dtype)
    name = served_model_name or (package.name if package is not None else model or DEFAULT_MODEL)
    server = build_server(target, tokenizer, model_name=name, method=method or default_method,
                          drafter_options=drafter_options, host=host, port=port, max_queue=max_queue,
                          max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                          chunked_prefill_size=chunked_prefill_size)
    server.run()

"""Load test of OpenAI-compatible servers on this machine: throughput and latency under concurrency.

Starts each server on a loopback port (warpdecode's own, with or without speculation, at any
precision; llama.cpp's `llama_cpp.server` from a separate environment, never a warpdecode
dependency), then for every concurrency level sends the same Spec-Bench first-turn prompts, streamed,
at temperature 0, to each server in turn (interleaved: level by level, server by server). Reports
per server and level: completion tokens/s over the level's wall time, time to first token and
inter-token latency p50/p99, errors, and how many answers equal the server's own answer at
concurrency 1 (the same request served alone). Writes JSON, a markdown table and a plot.

    python scripts/serve_load.py --servers none,prompt_lookup,llama.cpp --concurrency 1,4,16 \\
        --requests 32 --max-tokens 64 --threads 2 --out results/serve_load

A server is `NAME` or `NAME@DTYPE`: `none` / any warpdecode method spec (`prompt_lookup`,
`int4_self:layers=20`; its `--method`), at `--dtype DTYPE` (default fp32); or `llama.cpp` (the
default model's own Q4_1 GGUF; `--llama-python` names the environment that has llama-cpp-python
with its server extras). A warpdecode server name may end with `~sdpa`: that server runs the exact
attention's definition (one SDPA per query, `WARPDECODE_NATIVE=0`) instead of the native kernel,
and with `+lpN` (`none+lp5`) its requests ask for `logprobs: N` (the server is the same: what the
log-probabilities cost). `--no-stream` sends plain requests (then no TTFT or inter-token latency).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Answer:
    text: str = ""
    finish: str | None = None
    tokens: int = 0
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)  # per-token inter-token latencies
    error: str | None = None


@dataclass
class Level:
    server: str
    concurrency: int
    requests: int
    seconds: float
    tokens: int
    errors: int
    same_as_alone: int
    ttft_p50: float
    ttft_p99: float
    itl_p50: float
    itl_p99: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_gguf() -> Path:
    sys.path.insert(0, str(ROOT))
    from warpdecode.models.named import DEFAULT_MODEL, named_model_gguf

    return named_model_gguf(DEFAULT_MODEL)


def start_server(name: str, args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = open(Path(args.out).with_suffix(f".{name.replace(':', '_')}.log"), "w")  # noqa: SIM115
    name = name.partition("+lp")[0]  # the same server; its requests ask for logprobs
    name, _, variant = name.partition("~")
    if variant == "sdpa":  # the exact attention's definition (one SDPA per query) instead of the native kernel
        env["WARPDECODE_NATIVE"] = "0"
    elif variant:
        raise SystemExit(f"unknown server variant ~{variant} (known: ~sdpa)")
    if name == "llama.cpp":
        command = [args.llama_python, "-m", "llama_cpp.server", "--model", str(default_gguf()), "--port", str(port),
                   "--host", "127.0.0.1", "--n_threads", str(args.threads), "--n_threads_batch", str(args.threads),
                   "--n_ctx", "2048", "--interrupt_requests", "False"]  # queue concurrent requests, not cancel them
    else:
        method, _, dtype = name.partition("@")
        command = [sys.executable, "-m", "warpdecode.cli", "serve", "--port", str(port), "--threads", str(args.threads),
                   "--method", method, "--dtype", dtype or "fp32", "--max-num-seqs", str(args.max_num_seqs),
                   "--max-model-len", "2048", "--max-queue", str(max(args.concurrency) + 8),
                   "--served-model-name", "model"]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"server {name} exited with status {process.returncode}; see {log.name}")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    process.kill()
    raise SystemExit(f"server {name} did not answer within 300 s; see {log.name}")


async def one_request(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int, logprobs: int | None = None,
                      stream: bool = True) -> Answer:
    answer = Answer()
    body = {"model": "model", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if logprobs is not None:
        body["logprobs"] = logprobs
    start = last = time.perf_counter()
    chunks = 0
    try:
        if not stream:
            response = await client.post(url + "/v1/completions", json=body)
            if response.status_code != 200:
                answer.error = f"HTTP {response.status_code}: {response.text[:200]!r}"
                return answer
            data = response.json()
            answer.text, answer.finish = data["choices"][0]["text"], data["choices"][0]["finish_reason"]
            answer.tokens = data["usage"]["completion_tokens"]
            return answer
        async with client.stream("POST", url + "/v1/completions", json=body) as response:
            if response.status_code != 200:
                answer.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return answer
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                if data.get("usage"):
                    answer.tokens = data["usage"]["completion_tokens"]
                for choice in data.get("choices") or []:
                    now = time.perf_counter()
                    if choice.get("text"):
                        chunks += 1
                        if answer.ttft is None:
                            answer.ttft = now - start
                        else:
                            answer.gaps.append(now - last)
                        last = now
                        answer.text += choice["text"]
                    answer.finish = choice.get("finish_reason") or answer.finish
    except httpx.HTTPError as error:
        answer.error = f"{type(error).__name__}: {error}"
    answer.tokens = answer.tokens or chunks  # a server without usage in streams: one token per chunk
    return answer


async def run_level(url: str, prompts: list[str], concurrency: int, max_tokens: int, logprobs: int | None = None,
                    stream: bool = True) -> tuple[list[Answer], float]:
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0),
                                 limits=httpx.Limits(max_connections=concurrency + 4)) as client:

        async def bounded(prompt: str) -> Answer:
            async with limit:
                return await one_request(client, url, prompt, max_tokens, logprobs, stream)

        start = time.perf_counter()
        answers = await asyncio.gather(*(bounded(p) for p in prompts))
        return list(answers), time.perf_counter() - start


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def load_prompts(limit: int) -> list[str]:
    sys.path.insert(0, str(ROOT))
    from warpdecode.bench.prompts import load_prompts as bench_prompts
    from warpdecode.models.checkpoint import load_pretrained

    _, tokenizer = load_pretrained("smollm2-135m-instruct")
    assert tokenizer is not None
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p.text}]) for p in bench_prompts("spec_bench")]
    return [texts[i % len(texts)] for i in range(limit)]


def table(levels: list[Level]) -> str:
    rows = ["| server | concurrency | tok/s | vs c=1 | TTFT p50 / p99 (s) | ITL p50 / p99 (ms) | errors | same as alone |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    base = {lv.server: lv.tokens_per_second for lv in levels if lv.concurrency == 1}
    for lv in levels:
        scale = f"{lv.tokens_per_second / base[lv.server]:.2f}x" if base.get(lv.server) else "-"
        rows.append(f"| `{lv.server}` | {lv.concurrency} | {lv.tokens_per_second:.1f} | {scale} | "
                    f"{lv.ttft_p50:.2f} / {lv.ttft_p99:.2f} | {lv.itl_p50 * 1e3:.0f} / {lv.itl_p99 * 1e3:.0f} | "
                    f"{lv.errors} | {lv.same_as_alone}/{lv.requests} |")
    return "\n".join(rows)


def plot(levels: list[Level], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for server in dict.fromkeys(lv.server for lv in levels):
        mine = [lv for lv in levels if lv.server == server]
        ax.plot([lv.concurrency for lv in mine], [lv.tokens_per_second for lv in mine], marker="o", label=server)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("completion tokens/s")
    ax.set_title("Throughput under load (loopback, temperature 0)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", default="none,llama.cpp")
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--requests", type=int, default=32, help="requests per level")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--no-stream", dest="stream", action="store_false", help="plain requests, not streamed")
    parser.add_argument("--llama-python", default="/tmp/llamacpp-venv/bin/python")
    parser.add_argument("--out", default="results/serve_load")
    args = parser.parse_args()
    args.concurrency = sorted(int(c) for c in args.concurrency.split(","))
    if args.concurrency[0] != 1:
        raise SystemExit("--concurrency must include 1: it gives each request's answer alone")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    prompts = load_prompts(args.requests)
    servers = [s for s in args.servers.split(",") if s]
    started = {name: start_server(name, args) for name in servers}
    alone: dict[str, list[Answer]] = {}
    levels: list[Level] = []
    try:
        for name in servers:  # warm-up: one request each
            asyncio.run(run_level(started[name][1], prompts[:1], 1, 8))
        for concurrency in args.concurrency:
            for name in servers:
                logprobs = name.partition("+lp")[2]
                answers, seconds = asyncio.run(run_level(started[name][1], prompts, concurrency, args.max_tokens,
                                                         int(logprobs) if logprobs else None, args.stream))
                alone.setdefault(name, answers)
                ttfts = [a.ttft for a in answers if a.ttft is not None]
                gaps = [g for a in answers for g in a.gaps]
                level = Level(name, concurrency, len(answers), seconds, sum(a.tokens for a in answers),
                              sum(a.error is not None for a in answers),
                              sum(a.text == b.text and a.error is None for a, b in zip(answers, alone[name], strict=True)),
                              percentile(ttfts, 0.5), percentile(ttfts, 0.99), percentile(gaps, 0.5),
                              percentile(gaps, 0.99))
                levels.append(level)
                print(f"{name} c={concurrency}: {level.tokens_per_second:.1f} tok/s, {level.errors} errors, "
                      f"{level.same_as_alone}/{level.requests} same as alone", file=sys.stderr, flush=True)
    finally:
        for process, _ in started.values():
            process.terminate()
            process.wait(60)
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps({"args": {k: v for k, v in vars(args).items()},
                                                    "levels": [asdict(lv) | {"tokens_per_second": lv.tokens_per_second}
                                                               for lv in levels]}, indent=1))
    out.with_suffix(".md").write_text(table(levels) + "\n")
    plot(levels, out.with_suffix(".png"))
    print(table(levels))
    print(f"\nwrote {out.with_suffix('.json')}, {out.with_suffix('.md')}, {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()

"""`warpdecode serve` as a process: it serves the OpenAI API, and SIGTERM lets a stream in flight finish
before the process ends."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import httpx


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_sigterm_drains_the_stream_in_flight_then_exits(tiny_model_dir):
    port = _free_port()
    command = [sys.executable, "-m", "warpdecode.cli", "serve", "--model", str(tiny_model_dir), "--port", str(port),
               "--threads", "1", "--method", "prompt_lookup"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert process.stderr is not None
        log = []
        for line in process.stderr:  # uvicorn says when it listens
            log.append(line)
            if "Uvicorn running on" in line:
                break
        else:
            raise AssertionError("".join(log))
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == str(tiny_model_dir)
        body = {"prompt": "print(", "max_tokens": 200, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
            lines = (line for line in response.iter_lines() if line.startswith("data: "))
            chunks = [next(lines)]
            process.send_signal(signal.SIGTERM)
            chunks += list(lines)
        assert chunks[-1] == "data: [DONE]"
        assert json.loads(chunks[-2][6:])["choices"][0]["finish_reason"] in ("stop", "length")
        rest = process.stderr.read()  # to the end: the process has exited
        assert "Waiting for application shutdown" in rest and "Application shutdown complete" in rest
        assert process.wait(60) == -signal.SIGTERM  # uvicorn re-raises the signal once it has drained
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

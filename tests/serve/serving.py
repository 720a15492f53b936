"""Servers for the serve tests: the tiny model behind uvicorn on a loopback port, in a thread.

The listening socket is bound and listening before the server thread starts, so a client can connect
at once (the kernel queues the connection until uvicorn accepts it): no test waits for a start-up.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import uvicorn

from warpdecode.serve.app import create_app
from warpdecode.serve.metrics import ServerMetrics
from warpdecode.serve.scheduler import Scheduler

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
MODEL_NAME = "tiny"


@dataclass
class Served:
    url: str
    scheduler: Scheduler
    metrics: ServerMetrics


class Gate:
    """A backbone wrapper whose forwards wait for permits: a test decides how far decoding gets."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.permits = threading.Semaphore(0)
        self.waiting = threading.Event()
        self.passed = 0
        """Forwards that got a permit."""

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __call__(self, *args, **kwargs):
        self.waiting.set()
        self.permits.acquire()
        self.waiting.clear()
        self.passed += 1
        return self.inner(*args, **kwargs)

    def release(self, n: int = 1) -> None:
        self.permits.release(n)

    def hold_after(self, n: int, timeout: float = 30) -> None:
        """Wait until `n` forwards have passed and the next one waits for a permit."""
        deadline = time.monotonic() + timeout
        while not (self.passed >= n and self.waiting.is_set()):
            assert time.monotonic() < deadline, f"{self.passed} forwards passed, waiting for {n}"
            time.sleep(0.001)


def serve_in_thread(target, tokenizer, **options) -> Iterator[Served]:
    metrics = ServerMetrics()
    scheduler = Scheduler(target, tokenizer, metrics=metrics, max_queue=options.pop("max_queue", 8),
                          max_num_seqs=options.pop("max_num_seqs", 8), max_model_len=options.pop("max_model_len", None),
                          chunked_prefill_size=options.pop("chunked_prefill_size", None))
    app = create_app(scheduler, model_name=MODEL_NAME, **options)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    # accepted sockets inherit it; without it a socket handed to uvicorn keeps Nagle's algorithm, and a
    # keep-alive answer (headers and body written apart) waits for a delayed ACK: 42 ms vs 1.3 ms measured
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.listen(16)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield Served(f"http://127.0.0.1:{sock.getsockname()[1]}", scheduler, metrics)
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()

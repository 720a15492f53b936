"""Continuous batching in the server: requests decode together and each answer is the one it gets alone."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch
from serving import Gate, serve_in_thread

from warpdecode.decoding.generate import build_method, generate

COMPLETIONS = "/v1/completions"
PROMPTS = ["print('hello", "for i in range(", "Write a story about", "def f(x):", "a b a b a b", "import os\n"]


def rows_histogram(url: str) -> dict[str, float]:
    """`warpdecode_step_rows`' buckets (le → count), from /metrics."""
    text = httpx.get(url + "/metrics").text
    return {m[1]: float(m[2]) for m in re.finditer(r'warpdecode_step_rows_bucket\{le="([^"]+)"\} (\S+)', text)} | {
        "count": float(re.search(r"warpdecode_step_rows_count (\S+)", text)[1])}


def complete(url: str, prompt: str, *, max_tokens: int = 20, **extra) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    response = httpx.post(url + COMPLETIONS, json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]


def queued(served, n: int, timeout: float = 30) -> None:
    """Wait until `n` requests wait in the scheduler's queue."""
    deadline = time.monotonic() + timeout
    while served.metrics.queue_depth._value.get() < n:
        assert time.monotonic() < deadline
        time.sleep(0.001)


@pytest.fixture(scope="module")
def single_thread_torch():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_concurrent_answers_equal_the_answers_alone(tiny, single_thread_torch):
    """Batch invariance through HTTP: 12 requests at once (plain and speculative, 4 rows at a time)
    answer exactly what each answers alone."""
    for served in serve_in_thread(*tiny, max_num_seqs=4, max_queue=16):
        requests = [(p, {"speculation": "prompt_lookup:num_tokens=3"} if i % 3 == 0 else {})
                    for i, p in enumerate(PROMPTS * 2)]
        alone = [complete(served.url, p, **extra) for p, extra in requests]
        with ThreadPoolExecutor(len(requests)) as pool:
            together = list(pool.map(lambda r, url=served.url: complete(url, r[0], **r[1]), requests))
        assert [(c["text"], c["finish_reason"]) for c in together] == [(c["text"], c["finish_reason"]) for c in alone]


def test_requests_that_arrive_together_share_steps(tiny):
    gate = Gate(tiny[0])
    for served in serve_in_thread(gate, tiny[1], max_num_seqs=4):
        with ThreadPoolExecutor(3) as pool:
            first = pool.submit(complete, served.url, PROMPTS[0], max_tokens=12)
            assert gate.waiting.wait(30)  # the first request's prefill holds the model
            others = [pool.submit(complete, served.url, p, max_tokens=12) for p in PROMPTS[1:3]]
            queued(served, 2)  # both wait behind it
            gate.release(10_000)
            answers = [f.result() for f in [first, *others]]
        target, tokenizer = tiny
        for prompt, answer in zip(PROMPTS[:3], answers, strict=True):
            assert answer["text"] == generate(target, tokenizer, prompt, max_new_tokens=12, chat=False).text
        rows = rows_histogram(served.url)
        assert rows["count"] > rows["2.0"]  # some steps decoded all three requests in one forward


def test_a_speculative_request_alone_joins_the_batch_when_another_arrives(tiny):
    """A drafter that cannot draft in a batch (a draft model) speculates while its request is alone,
    then the request decodes in the batch from its tokens so far: same answer."""
    gate = Gate(tiny[0])
    spec = {"speculation": "draft_model:layers=1:num_tokens=3"}
    for served in serve_in_thread(gate, tiny[1], max_num_seqs=4):
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(complete, served.url, PROMPTS[4], max_tokens=30, **spec)
            gate.release(3)
            gate.hold_after(3)  # its prefill and two speculative steps, alone
            second = pool.submit(complete, served.url, PROMPTS[1], max_tokens=10)
            queued(served, 1)
            gate.release(10_000)
            answers = [first.result(), second.result()]
        target, tokenizer = tiny
        assert answers[0]["text"] == generate(target, tokenizer, PROMPTS[4], max_new_tokens=30, chat=False,
                                              method=build_method("draft_model", options={"layers": 1})).text
        assert answers[1]["text"] == generate(target, tokenizer, PROMPTS[1], max_new_tokens=10, chat=False).text
        rows = rows_histogram(served.url)
        assert rows["count"] > rows["1.0"]  # the first one went on beside the second in the batch


def test_max_model_len_bounds_a_request(tiny):
    for served in serve_in_thread(*tiny, max_model_len=24):
        response = httpx.post(served.url + COMPLETIONS, json={"prompt": "x", "max_tokens": 40})
        assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"
        assert "24 tokens" in response.json()["error"]["message"]
        assert httpx.get(served.url + "/v1/models").json()["data"][0]["max_model_len"] == 24


def test_chunked_prefill_answers_equal_the_answers_alone(tiny, single_thread_torch):
    long = "Write a story about " * 12
    for served in serve_in_thread(*tiny, max_num_seqs=3, chunked_prefill_size=8):
        requests = [long, PROMPTS[0], long + "cats", PROMPTS[1]]
        alone = [complete(served.url, p) for p in requests]
        with ThreadPoolExecutor(len(requests)) as pool:
            together = list(pool.map(lambda p, url=served.url: complete(url, p), requests))
        assert [c["text"] for c in together] == [c["text"] for c in alone]

"""Raw HTTP against the server: every malformed request is a clean 4xx in OpenAI's error shape, a full
queue is a 429 with Retry-After, and a client that goes away mid-stream cancels its request."""

from __future__ import annotations

import json

import httpx
import pytest
from serving import Gate, serve_in_thread

from warpdecode.decoding.sampler import SamplingConfig
from warpdecode.decoding.specs import parse_method
from warpdecode.serve.scheduler import Job

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"

MALFORMED = [
    (COMPLETIONS, b"{not json", 400, None),
    (COMPLETIONS, b"", 400, None),
    (COMPLETIONS, b"[1, 2]", 400, None),
    (COMPLETIONS, b'"a string"', 400, None),
    (COMPLETIONS, b'{"max_tokens": 4}', 400, "prompt"),
    (COMPLETIONS, b'{"prompt": "x", "max_tokens": "4"}', 400, "max_tokens"),
    (COMPLETIONS, b'{"prompt": "x", "max_tokens": 4.5}', 400, "max_tokens"),
    (COMPLETIONS, b'{"prompt": "x", "max_tokens": 0}', 400, "max_tokens"),
    (COMPLETIONS, b'{"prompt": "x", "max_tokens": 99999999999999999999999}', 400, "max_tokens"),
    (COMPLETIONS, b'{"prompt": "x", "temperature": -1}', 400, "temperature"),
    (COMPLETIONS, b'{"prompt": "x", "temperature": "hot"}', 400, "temperature"),
    (COMPLETIONS, b'{"prompt": "x", "stream": "yes"}', 400, "stream"),
    (COMPLETIONS, b'{"prompt": "x", "seed": -3}', 400, "seed"),
    (COMPLETIONS, b'{"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}', 400, "stop"),
    (COMPLETIONS, b'{"prompt": "x", "unknown_field": true}', 400, "unknown_field"),
    (COMPLETIONS, b'{"prompt": 42}', 400, "prompt"),
    (COMPLETIONS, b'{"prompt": [1, 99999]}', 400, "prompt"),
    (COMPLETIONS, b'{"prompt": ["a", "b"]}', 400, "prompt"),
    (COMPLETIONS, b'{"prompt": "x", "speculation": 3}', 400, "speculation"),
    (COMPLETIONS, b'{"prompt": "x", "speculation": ":::"}', 400, "speculation"),
    (COMPLETIONS, b'{"prompt": "x", "logprobs": 6}', 400, "logprobs"),
    (COMPLETIONS, b'{"prompt": "x", "logprobs": -1}', 400, "logprobs"),
    (COMPLETIONS, b'{"prompt": "x", "logprobs": true}', 400, "logprobs"),
    (COMPLETIONS, b'{"prompt": "x", "max_tokens": 0}', 400, "max_tokens"),
    (COMPLETIONS, b'{"prompt": "x", "stream_options": {"include_usage": true}}', 400, "stream_options"),
    (COMPLETIONS, b'{"prompt": "x", "model": "other"}', 404, "model"),
    (CHAT, b'{"messages": []}', 400, "messages"),
    (CHAT, b'{"messages": [{"role": "wizard", "content": "x"}]}', 400, "messages.0.role"),
    (CHAT, b'{"messages": [{"role": "user", "content": 5}]}', 400, "messages.0.content"),
    (CHAT, b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}', 400, "tools"),
    (CHAT, b'{"messages": [{"role": "user", "content": "x"}], "n": 0}', 400, "n"),
    (CHAT, b'{"messages": [{"role": "user", "content": "x"}], "n": "3"}', 400, "n"),
    (CHAT, b'{"messages": "hello"}', 400, "messages"),
    (CHAT, b'{"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}', 400, "top_logprobs"),
    (CHAT, b'{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}', 400, "top_logprobs"),
    (CHAT, b'{"messages": [{"role": "user", "content": "x"}], "logprobs": false, "top_logprobs": 2}', 400, "top_logprobs"),
    (CHAT, b'{"messages": [{"role": "user", "content": "x"}], "logprobs": 3}', 400, "logprobs"),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), MALFORMED)
def test_a_malformed_request_is_a_clean_4xx(served, path, body, status, param):
    response = httpx.post(served.url + path, content=body, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param


def test_oversized_bodies_and_wrong_routes(served):
    big = httpx.post(served.url + COMPLETIONS, content=b'{"prompt": "' + b"a" * (2 << 20) + b'"}')
    assert big.status_code == 413 and big.json()["error"]["code"] == "body_too_large"
    for method, path, status in (("GET", "/v1/nothing", 404), ("GET", COMPLETIONS, 405), ("DELETE", "/health", 405)):
        response = httpx.request(method, served.url + path)
        assert response.status_code == status and "message" in response.json()["error"]
    # and the server still answers
    ok = httpx.post(served.url + COMPLETIONS, json={"prompt": "x", "max_tokens": 2, "temperature": 0})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] <= 2


def test_a_model_without_chat_template_refuses_chat(tiny):
    target, tokenizer = tiny
    template, tokenizer.chat_template = tokenizer.chat_template, None
    try:
        for served in serve_in_thread(target, tokenizer):
            response = httpx.post(served.url + CHAT, json={"messages": [{"role": "user", "content": "x"}]})
            assert response.status_code == 400 and "chat template" in response.json()["error"]["message"]
    finally:
        tokenizer.chat_template = template


def _job(tiny, max_tokens: int = 4) -> Job:
    return Job(tiny[1].encode("x"), max_tokens, SamplingConfig(), parse_method("none"), (), emit=lambda event: None)


def test_a_full_queue_answers_429_with_retry_after(tiny):
    gate = Gate(tiny[0])
    for served in serve_in_thread(gate, tiny[1], max_queue=1):
        running = _job(tiny)
        served.scheduler.submit(running)
        assert gate.waiting.wait(30)  # the first job holds the model, in its prefill
        served.scheduler.submit(_job(tiny))  # and one waits: the queue is full
        response = httpx.post(served.url + COMPLETIONS, json={"prompt": "x", "max_tokens": 2})
        assert response.status_code == 429 and response.headers["retry-after"] == "1"
        assert response.json()["error"]["type"] == "rate_limit_error"
        metrics = httpx.get(served.url + "/metrics").text
        assert "warpdecode_queue_depth 1.0" in metrics and "warpdecode_batch_size 1.0" in metrics
        gate.release(1000)


def test_a_client_leaving_mid_stream_cancels_its_request(tiny):
    gate = Gate(tiny[0])
    for served in serve_in_thread(gate, tiny[1]):
        gate.release(3)  # the prefill and two steps: three tokens
        body = {"prompt": "x", "max_tokens": 200, "temperature": 0, "stream": True}
        with httpx.stream("POST", served.url + COMPLETIONS, json=body) as response:
            lines = response.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert json.loads(first[6:])["choices"][0]["finish_reason"] is None
            job = served.scheduler.running
            assert job is not None
        assert job.cancelled.wait(30)  # the response closed: the server saw the client go
        gate.release(1000)
        after = httpx.post(served.url + COMPLETIONS, json={"prompt": "x", "max_tokens": 3, "temperature": 0})
        assert after.status_code == 200  # served after the cancelled one ended
        metrics = httpx.get(served.url + "/metrics").text
        assert 'warpdecode_finished_requests_total{reason="cancelled"} 1.0' in metrics

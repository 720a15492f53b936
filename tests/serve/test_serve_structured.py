"""`response_format` through the server: outputs keep to the format, alone and in a batch."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from serving import MODEL_NAME

SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "n": {"type": "integer", "maximum": 9,
                                                                                     "minimum": 0}},
          "required": ["answer", "n"], "additionalProperties": False}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "reply", "schema": SCHEMA}}


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_json_schema_chat_answer_is_valid_json(client):
    out = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Is it?"}],
                                         max_tokens=40, temperature=0, response_format=JSON_FORMAT)
    choice = out.choices[0]
    data = json.loads(choice.message.content)
    assert choice.finish_reason == "stop" and data["answer"] in ("yes", "no") and 0 <= data["n"] <= 9
    assert set(data) == {"answer", "n"}


@pytest.mark.parametrize("speculation", [None, "prompt_lookup"])
def test_regex_and_choice_completions_keep_to_the_format(served, speculation):
    extra = {"speculation": speculation} if speculation else {}
    formats = [({"type": "regex", "regex": "[a-c]{2,4}-[0-9]{1,3}"}, r"[a-c]{2,4}-[0-9]{1,3}"),
               ({"type": "choice", "choices": ["alpha", "beta"]}, r"alpha|beta")]
    for response_format, pattern in formats:
        body = {"prompt": "x", "max_tokens": 20, "temperature": 0, "response_format": response_format, **extra}
        choice = httpx.post(served.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
        assert re.fullmatch(pattern, choice["text"]) and choice["finish_reason"] == "stop"


def test_formats_in_a_batch_equal_the_formats_alone(served):
    bodies = [{"prompt": p, "max_tokens": 24, "temperature": 0, **extra}
              for p in ("print(", "Write a", "for i in")
              for extra in ({}, {"response_format": JSON_FORMAT}, {"response_format": JSON_FORMAT,
                                                                    "speculation": "prompt_lookup"})]

    def post(body):
        return httpx.post(served.url + "/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]

    alone = [post(b) for b in bodies]
    with ThreadPoolExecutor(len(bodies)) as pool:
        together = list(pool.map(post, bodies))
    assert together == alone
    assert all(json.loads(text)["answer"] in ("yes", "no") for text, b in zip(alone, bodies, strict=True)
               if "response_format" in b)


@pytest.mark.parametrize(("response_format", "message"), [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}, "response_format"),
    ({"type": "regex", "regex": "(unclosed"}, "response_format"),
    ({"type": "xml"}, "response_format"),
])
def test_a_bad_format_is_a_400_naming_the_field(served, response_format, message):
    response = httpx.post(served.url + "/v1/completions", json={"prompt": "x", "response_format": response_format})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"].startswith(message) and "\n" not in error["message"]


def test_close_at_budget_closes_alone_and_in_a_batch(served):
    """A free string the budget cuts: closed within `max_tokens` (valid JSON, finish_reason length), the
    same alone, with prompt lookup and in a batch; refused without a response_format."""
    schema = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"], "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    bodies = [{"prompt": p, "max_tokens": 12, "temperature": 0, "response_format": rf, "close_at_budget": True, **extra}
              for p in ("print(", "Write a") for extra in ({}, {"speculation": "prompt_lookup"})]

    def post(body):
        choice = httpx.post(served.url + "/v1/completions", json=body, timeout=120).json()["choices"][0]
        return choice["text"], choice["finish_reason"]

    alone = [post(b) for b in bodies]
    with ThreadPoolExecutor(len(bodies)) as pool:
        together = list(pool.map(post, bodies))
    assert together == alone
    for text, finish in alone:
        assert finish == "length" and set(json.loads(text)) == {"s"}
    cut = post({**bodies[0], "close_at_budget": False})
    assert cut[1] == "length" and cut[0] != alone[0][0]
    response = httpx.post(served.url + "/v1/completions", json={"prompt": "x", "close_at_budget": True})
    assert response.status_code == 400 and response.json()["error"]["param"] == "close_at_budget"

"""`response_format` on the chat endpoint: the answer `generate()` gives with the same constraint."""

from __future__ import annotations

import json

import openai
import pytest
from serving import MODEL_NAME

from warpdecode.decoding.generate import generate

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
                                                                            "maximum": 9}},
          "required": ["ok", "n"], "additionalProperties": False}
FORMATS = [
    {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}},
    {"type": "choice", "choices": ["yes", "no"]},
    {"type": "regex", "regex": "[a-c]{3}"},
]


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.mark.parametrize("response_format", FORMATS, ids=lambda f: f["type"])
@pytest.mark.parametrize("speculation", [None, "prompt_lookup"])
def test_chat_response_format_equals_generate(client, tiny, response_format, speculation):
    target, tokenizer = tiny
    messages = [{"role": "user", "content": "Answer"}]
    extra = {"speculation": speculation} if speculation else None
    out = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=24, temperature=0,
                                         response_format=response_format, extra_body=extra)
    reference = generate(target, tokenizer, "Answer", max_new_tokens=24, chat=True, response_format=response_format)
    assert reference.finish_reason == "eos"
    assert (out.choices[0].message.content, out.choices[0].finish_reason) == (reference.text, "stop")
    if response_format["type"] == "json_schema":
        assert set(json.loads(reference.text)) == {"ok", "n"}


def test_a_bad_response_format_is_a_400_naming_it(client):
    for response_format in ({"type": "regex", "regex": "a(b"}, {"type": "xml"},
                            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "x"}], max_tokens=4,
                                           response_format=response_format)
        assert caught.value.body["param"] == "response_format"

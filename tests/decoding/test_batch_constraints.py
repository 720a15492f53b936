"""`generate_batch` with a response format per row: each row decodes exactly as `generate()` alone."""

import pytest
from tiny_models import json_char_pair

from warpdecode.decoding.generate import generate, generate_batch
from warpdecode.errors import ConfigError

pytestmark = pytest.mark.usefixtures("single_thread")

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}, "ok": {"type": "boolean"}},
          "required": ["n", "ok"], "additionalProperties": False}
JSON = {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}}
REGEX = {"type": "regex", "regex": "[a-c]{2,4}-[0-9]{1,3}"}
CHOICE = {"type": "choice", "choices": ["alpha", "beta", "be"]}
PROMPTS = ['{"n":1,"ok":true} {"n":', "abc-12 ab", "x,yz,x,3", "alpha be"]


@pytest.fixture(scope="module")
def pair():
    return json_char_pair()


@pytest.fixture(scope="module")
def tokenizer(pair):
    return pair[1]


@pytest.fixture(scope="module")
def target(pair):
    return pair[0]


def alone(target, tokenizer, prompt: str, fmt, **options):
    return generate(target, tokenizer, tokenizer.encode(prompt), max_new_tokens=24, response_format=fmt, **options)


@pytest.mark.parametrize("stop_at_eos", [True, False])
def test_rows_with_their_own_formats_equal_generate_alone(target, tokenizer, stop_at_eos):
    formats = [JSON, REGEX, None, CHOICE]
    batch = generate_batch(target, tokenizer, [tokenizer.encode(p) for p in PROMPTS], max_new_tokens=24,
                           response_format=formats, stop_at_eos=stop_at_eos)
    for prompt, fmt, out in zip(PROMPTS, formats, batch, strict=True):
        single = alone(target, tokenizer, prompt, fmt, stop_at_eos=stop_at_eos)
        assert (out.token_ids, out.text, out.finish_reason) == (single.token_ids, single.text, single.finish_reason)
    assert [o.finish_reason for o in batch[:2]] + [batch[3].finish_reason] == ["eos"] * 3  # the grammars ended them


def test_one_format_serves_every_row_and_seeded_sampling_matches_alone(target, tokenizer):
    prompts = [tokenizer.encode(p) for p in PROMPTS[:3]]
    batch = generate_batch(target, tokenizer, prompts, max_new_tokens=24, response_format=REGEX)
    assert [o.token_ids for o in batch] == [alone(target, tokenizer, p, REGEX).token_ids for p in PROMPTS[:3]]
    sampled = generate_batch(target, tokenizer, prompts, max_new_tokens=24, response_format=REGEX, do_sample=True,
                             temperature=1.5, seed=4)
    assert [o.token_ids for o in sampled] == [alone(target, tokenizer, p, REGEX, do_sample=True, temperature=1.5,
                                                    seed=4).token_ids for p in PROMPTS[:3]]


@pytest.mark.parametrize(("response_format", "message"), [
    ([REGEX], "lists 1 formats for 2 prompts"),
    ("[0-9]", "must be an object or a list"),
    ([REGEX, {"type": "regex"}], "needs a non-empty string 'regex'"),
])
def test_bad_row_formats_are_config_errors(target, tokenizer, response_format, message):
    with pytest.raises(ConfigError, match=message):
        generate_batch(target, tokenizer, [[5], [6]], max_new_tokens=4, response_format=response_format)

"""Budget-aware closing (`close_at_budget`): a constrained output the budget would cut ends with a closing
that completes its grammar within the budget; before the closing the tokens are constrained decoding's,
every method gives the same closed output, a grammar that cannot close keeps `length`."""

import json
import re

import jsonschema
import pytest
from tiny_models import json_char_pair

from warpdecode.decoding.constraints.closing import OUTSIDE, STRING, ClosingTables, closing
from warpdecode.decoding.constraints.formats import compile_response_format
from warpdecode.decoding.generate import build_method, generate, generate_batch
from warpdecode.errors import ConfigError

pytestmark = pytest.mark.usefixtures("single_thread")

SCHEMA = {"type": "object",
          "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}, "tag": {"enum": ["ab", "c"]},
                         "items": {"type": "array", "items": {"type": "string"}}, "s": {"type": "string"}},
          "required": ["n", "tag", "items"], "additionalProperties": False}
JSON = {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}}
ARRAY = {"type": "json_schema", "json_schema": {"name": "a", "schema": {
    "type": "object", "properties": {"a": {"type": "array", "items": {"type": "string"}}}, "required": ["a"]}}}
PROMPT = '{"n":1,"tag":"ab","items":["x","yy"],"s":"ab"} {"n":1,'


@pytest.fixture(scope="module")
def pair():
    return json_char_pair()


def _closed_prefix(out) -> list[int]:
    """The model's tokens of an output: all but the closing's."""
    return out.token_ids[: len(out.token_ids) - out.stats.closing_tokens]


@pytest.mark.parametrize("rf", [JSON, ARRAY], ids=["schema", "array"])
def test_closed_outputs_validate_and_follow_constrained_decoding(pair, rf):
    """Every budget: within it, finished or closed and valid (or not closable at all); the model's part
    is constrained decoding's."""
    model, tokenizer = pair
    schema = rf["json_schema"]["schema"]
    prompt = tokenizer.encode(PROMPT)
    full = generate(model, tokenizer, prompt, max_new_tokens=80, response_format=rf)
    closed = 0
    for budget in range(4, 64, 3):
        out = generate(model, tokenizer, prompt, max_new_tokens=budget, response_format=rf, close_at_budget=True)
        assert len(out.token_ids) <= budget
        model_part = _closed_prefix(out)
        assert model_part == full.token_ids[: len(model_part)]
        if out.stats.closing_tokens:
            closed += 1
            assert out.finish_reason == "length" and out.token_ids[-1] == tokenizer.eos_token_id
            jsonschema.validate(json.loads(out.text), schema)
        elif out.finish_reason == "length":  # nothing fits: as without closing
            assert out.token_ids == full.token_ids[:budget]
        else:
            assert out.finish_reason == "eos" and out.token_ids == full.token_ids
    assert closed >= 8


@pytest.mark.parametrize(("name", "jump_forward", "sampling"), [
    ("prompt_lookup", True, "mask"), ("prompt_lookup", False, "mask"), ("draft_model", True, "mask"),
    ("none", True, "awrs"), ("none", False, "mask")])
def test_every_method_closes_at_the_same_token(pair, name, jump_forward, sampling):
    """The decision is per committed token: speculation, forced tokens and adaptive rejection give the
    plain loop's closed output."""
    model, tokenizer = pair
    prompt = tokenizer.encode(PROMPT)
    options = {"layers": 1, "num_tokens": 3} if name == "draft_model" else {}
    for budget in (33, 47):
        plain = generate(model, tokenizer, prompt, max_new_tokens=budget, response_format=JSON, close_at_budget=True)
        fast = generate(model, tokenizer, prompt, max_new_tokens=budget, response_format=JSON, close_at_budget=True,
                        method=build_method(name, options=options), jump_forward=jump_forward,
                        constrained_sampling=sampling)
        assert plain.stats.closing_tokens > 0
        assert fast.token_ids == plain.token_ids and fast.stats.closing_tokens == plain.stats.closing_tokens


def test_sampled_outputs_are_closed_and_valid(pair):
    model, tokenizer = pair
    closed = 0
    for seed in range(4):
        out = generate(model, tokenizer, tokenizer.encode(PROMPT), max_new_tokens=40, response_format=JSON,
                       close_at_budget=True, do_sample=True, temperature=2.0, seed=seed, method="prompt_lookup")
        assert out.finish_reason == ("length" if out.stats.closing_tokens else "eos")
        closed += out.stats.closing_tokens > 0
        jsonschema.validate(json.loads(out.text), SCHEMA)
    assert closed >= 2


def test_a_grammar_that_cannot_close_in_the_budget_keeps_length(pair):
    model, tokenizer = pair
    rf = {"type": "regex", "regex": "a{20}"}
    out = generate(model, tokenizer, [5, 6], max_new_tokens=8, response_format=rf, close_at_budget=True)
    assert out.finish_reason == "length" and out.text == "a" * 8 and out.stats.closing_tokens == 0
    fits = generate(model, tokenizer, [5, 6], max_new_tokens=21, response_format=rf, close_at_budget=True)
    assert fits.text == "a" * 20 and fits.finish_reason == "eos"  # forced all the way: nothing to close


def test_other_grammars_close(pair):
    model, tokenizer = pair
    rf = {"type": "regex", "regex": "[a-c]{2,40}-[0-9]{1,3}"}
    out = generate(model, tokenizer, tokenizer.encode("abc-12 ab"), max_new_tokens=9, response_format=rf,
                   close_at_budget=True)
    assert re.fullmatch(rf["regex"], out.text) and len(out.token_ids) <= 9


def test_batch_rows_close_as_generate_does(pair):
    """generate_batch (the server's continuous rows) closes each constrained row as generate() alone does."""
    model, tokenizer = pair
    prompts = [tokenizer.encode(PROMPT), tokenizer.encode("abc"), tokenizer.encode('{"a":["x"]}')]
    formats = [JSON, None, ARRAY]
    outs = generate_batch(model, tokenizer, prompts, max_new_tokens=36, response_format=formats, close_at_budget=True)
    for prompt, rf, out in zip(prompts, formats, outs, strict=True):
        alone = generate(model, tokenizer, prompt, max_new_tokens=36, response_format=rf, close_at_budget=rf is not None)
        assert out.token_ids == alone.token_ids and out.finish_reason == alone.finish_reason
        assert out.stats.closing_tokens == alone.stats.closing_tokens
    assert outs[0].stats.closing_tokens > 0 and outs[1].stats.closing_tokens == 0


def test_closing_rollout_by_hand(pair):
    """Inside a string of an array: close the string, the array and the object, then stop."""
    _, tokenizer = pair
    stops = frozenset({tokenizer.eos_token_id})
    grammar = compile_response_format(ARRAY, tokenizer, vocab_size=64, stop_ids=set(stops))
    tables = ClosingTables.of(tokenizer, 64, stops)
    state, text = grammar.state(), '{"a":["xy'
    assert state.advance(tokenizer.encode(text)) == len(text)
    lex = tables.after(OUTSIDE, tokenizer.encode(text))
    assert lex == STRING
    tokens = closing(state, tables, lex, limit=10)
    assert tokens == tokenizer.encode('"]}') + [tokenizer.eos_token_id]
    assert closing(state, tables, lex, limit=3) is None  # needs 4
    assert state.advance(tokenizer.encode('"]}')) == 3  # the rollouts left the state where it was


def test_preference_reads_json_text():
    tables = ClosingTables.build([b"", b'"', b"}", b"ab", b'ab"}', b'"}', b"{", b"\\"])
    assert tables.orders[OUTSIDE, :2].tolist() == [2, 3]  # `}`, then `ab`: `ab"}` opens a string
    assert tables.orders[STRING, :3].tolist() == [5, 4, 1]  # `"}`, then `ab"}` (content first), `"`
    assert tables.ends[STRING].tolist() == [STRING, OUTSIDE, STRING, STRING, OUTSIDE, OUTSIDE, STRING, 2]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"close_at_budget": "yes", "response_format": ARRAY}, "close_at_budget must be true or false"),
    ({"close_at_budget": True}, "close_at_budget closes a constrained output"),
    ({"close_at_budget": True, "response_format": {"type": "text"}}, "close_at_budget closes a constrained output"),
])
def test_bad_values_are_one_line_config_errors(pair, kwargs, message):
    model, tokenizer = pair
    for call in (lambda: generate(model, tokenizer, [5, 6], max_new_tokens=4, **kwargs),
                 lambda: generate_batch(model, tokenizer, [[5, 6]], max_new_tokens=4, **kwargs)):
        with pytest.raises(ConfigError, match=message) as error:
            call()
        assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="needs a response_format"):  # a list of free rows only
        generate_batch(model, tokenizer, [[5, 6], [7]], max_new_tokens=4, response_format=[None, {"type": "text"}],
                       close_at_budget=True)


def test_off_by_default(pair):
    model, tokenizer = pair
    out = generate(model, tokenizer, tokenizer.encode(PROMPT), max_new_tokens=12, response_format=JSON)
    assert out.finish_reason == "length" and out.stats.closing_tokens == 0
    with pytest.raises(json.JSONDecodeError):
        json.loads(out.text)


@pytest.mark.slow
def test_real_model_closes_a_looping_string(smollm2):
    """On the default model's 49k byte-level vocabulary: the model's tokens, then a closing, valid."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array",
              "items": {"type": "string"}}}, "required": ["name", "tags"], "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
    prompt = "Write a JSON object with a long name and many tags."
    cut = generate(smollm2.model, smollm2.tokenizer, prompt, max_new_tokens=14, response_format=rf)
    closed = generate(smollm2.model, smollm2.tokenizer, prompt, max_new_tokens=14, response_format=rf,
                      close_at_budget=True, method="prompt_lookup")
    assert cut.finish_reason == closed.finish_reason == "length" and closed.stats.closing_tokens > 0
    assert _closed_prefix(closed) == cut.token_ids[: len(_closed_prefix(closed))]
    jsonschema.validate(json.loads(closed.text), schema)


def test_cli_close_at_budget(tiny_model_dir, capsys):
    from warpdecode.cli import main

    main(["generate", "--model", str(tiny_model_dir), "--prompt", "hi", "--regex", "a{2,60}b", "--max_new_tokens", "6",
          "--close_at_budget", "true", "--json", "--threads", "1"])
    out = json.loads(capsys.readouterr().out)
    assert re.fullmatch("a{2,60}b", out["text"]) and len(out["token_ids"]) <= 6
    assert out["finish_reason"] == "length" and out["stats"]["closing_tokens"] == 2  # "b" and EOS

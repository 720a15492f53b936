"""Schema-checked closing (`schema_closing.py`): on a leniently compiled schema, whose grammar is looser
than the schema, a closed output validates against the schema itself, within the budget."""

import json
import sys
import warnings

import jsonschema
import pytest
from tiny_models import json_char_pair

from warpdecode.decoding.constraints.closing import OUTSIDE, BudgetClosing, ClosingTables, closing
from warpdecode.decoding.constraints.formats import compile_response_format, lenient_schema
from warpdecode.decoding.constraints.json_prefix import Cursor
from warpdecode.decoding.constraints.schema_closing import SchemaCheck
from warpdecode.decoding.generate import generate

pytestmark = pytest.mark.usefixtures("single_thread")

LENIENT = {"lenient": True, "whitespace_flexible": False}
IF_THEN = {"type": "object", "properties": {"kind": {"enum": ["a", "b"]}, "n": {"type": "integer", "minimum": 3},
                                           "s": {"type": "string"}},
           "required": ["kind"], "if": {"properties": {"kind": {"const": "a"}}}, "then": {"required": ["n"]}}
"""`if`/`then` (which llguidance skips when lenient): kind "a" needs an `n`, and `n` comes before `s`."""
UNIQUE = {"type": "object", "properties": {"t": {"type": "array", "items": {"enum": ["x", "y", "z"]},
                                                 "uniqueItems": True}}, "required": ["t"]}


def _format(schema):
    return {"type": "json_schema", "json_schema": {"name": "t", "schema": {**schema, "x-guidance": LENIENT}}}


@pytest.fixture(scope="module")
def pair():
    return json_char_pair()


def _grammar(tokenizer, schema):
    return compile_response_format(_format(schema), tokenizer, vocab_size=64, stop_ids={tokenizer.eos_token_id})


def _take(tokenizer, schema, text, budget):
    """The text `BudgetClosing` emits for the model tokens of `text` within `budget` (closing included)."""
    grammar = _grammar(tokenizer, schema)
    closer = BudgetClosing.of(tokenizer, grammar, budget)
    tokens = closer.take(grammar.state(), tokenizer.encode(text)[:budget])
    assert len(tokens) <= budget
    return tokenizer.decode(tokens), closer.closing_tokens


def test_the_grammar_closing_fails_the_schema_and_the_checked_one_passes(pair):
    _, tokenizer = pair
    grammar = _grammar(tokenizer, IF_THEN)
    assert grammar.schema == IF_THEN  # lenient: checked against the schema, without its x-guidance
    state, text = grammar.state(), '{"kind":"a"'
    state.advance(tokenizer.encode(text))
    tables = ClosingTables.of(tokenizer, 64, grammar.stop_ids)
    loose = closing(state, tables, tables.after(OUTSIDE, tokenizer.encode(text)), 20)
    with pytest.raises(jsonschema.ValidationError, match="'n' is a required property"):
        jsonschema.validate(json.loads(text + tokenizer.decode(loose)), IF_THEN)
    closer = BudgetClosing.of(tokenizer, grammar, 40)
    checked = closer.find(state, tables.after(OUTSIDE, tokenizer.encode(text)), 20, text.encode())
    assert tokenizer.decode(checked) == ',"n":3}' and checked[-1] == tokenizer.eos_token_id
    assert closer.find(state, OUTSIDE, 6, text.encode()) is None  # needs 7 tokens with the stop


@pytest.mark.parametrize(("text", "budget", "closed"), [
    ('{"kind":"a","s":"xyzxyzxyz"}', 22, '{"kind":"a","n":3}'),  # `n` can't follow `s`: closed before it
    ('{"kind":"b","s":"xyzxyzxyz"}', 22, '{"kind":"b","s":"xy"}'),  # no `n` needed: the budget closes it
    ('{"t":["x","y","y","z"]}', 40, '{"t":["x","y","z"]}'),  # the duplicate "y" is never written
    ('{"t":["x","y","y","z"]}', 9, '{"t":[]}'),
])
def test_closings_validate_within_the_budget(pair, text, budget, closed):
    _, tokenizer = pair
    schema = IF_THEN if "kind" in text else UNIQUE
    out, closing_tokens = _take(tokenizer, schema, text, budget)
    assert out == closed and closing_tokens > 0
    jsonschema.validate(json.loads(out), schema)
    assert text.startswith(out[: len(out) - closing_tokens + 1])  # the model's part, then the closing


def test_generate_closes_every_budget_validly(pair):
    """On the tiny model: every closed output validates against the schema, within its budget."""
    model, tokenizer = pair
    rf = _format(IF_THEN)
    prompt = tokenizer.encode('{"kind":"a","n":5,"s":"ab"} {"kind":"a",')
    closed = 0
    for budget in range(3, 40, 4):
        out = generate(model, tokenizer, prompt, max_new_tokens=budget, response_format=rf, close_at_budget=True)
        assert len(out.token_ids) <= budget
        if out.stats.closing_tokens:
            closed += 1
            jsonschema.validate(json.loads(out.text), IF_THEN)
    assert closed >= 5


def test_cursor_reads_where_a_prefix_stands():
    cursor = Cursor.read('{"a":[1,{"b":"x')
    assert cursor is not None and cursor.mode == "string" and cursor.text == "x"
    assert [(o.kind, o.path) for o in cursor.stack] == [("{", ()), ("[", ("a",)), ("{", ("a", 1))]
    assert cursor.value_path() == ("a", 1, "b")
    assert Cursor.read('{"a":1,"').mode == "key string"
    assert Cursor.read('{"a":tr').mode == "scalar"
    assert Cursor.read("{]") is None


def test_completions_repair_from_the_errors():
    check = SchemaCheck(IF_THEN)
    assert check.completion('{"kind":"a') == '","n":3}'
    assert check.completion('{"kind":"') == 'a","n":3}'  # the enum member the string starts
    # valid text, though out of the property order llguidance keeps: the grammar refuses it (test above)
    assert check.completion('{"kind":"a","s":"q"') == ',"n":3}' and not check.valid('{"kind":"a","s":"q"}')
    assert SchemaCheck(UNIQUE).completion('{"t":["x","x"') is None  # the model's duplicate: nothing repairs it


def test_a_schema_the_validator_cannot_use_leaves_the_grammar_closing(pair):
    """A reference jsonschema cannot resolve: the check is `broken`, and closings follow the grammar."""
    check = SchemaCheck({"type": "object", "properties": {"a": {"$ref": "https://example.invalid/s.json"}}})
    assert not check.valid('{"a":1}') and check.broken and check.completion('{"a":') is None


def test_strict_and_other_formats_are_not_checked():
    assert lenient_schema({"type": "json_schema", "json_schema": {"schema": IF_THEN}}) is None
    assert lenient_schema({"type": "regex", "regex": "a"}) is None


def test_without_jsonschema_the_closing_follows_the_grammar(pair, monkeypatch):
    _, tokenizer = pair
    grammar = _grammar(tokenizer, IF_THEN)
    monkeypatch.setitem(sys.modules, "jsonschema", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        closer = BudgetClosing.of(tokenizer, grammar, 10)
    assert closer.check is None and "warpdecode[structured]" in str(caught[0].message)


@pytest.mark.slow
def test_real_model_closes_into_the_schema(smollm2):
    """On the default model's byte-level vocabulary: each budget's closed output validates against the
    lenient schema (whose grammar drops the `if`/`then`), and the model's part is constrained decoding's."""
    schema = {**IF_THEN, "properties": {**IF_THEN["properties"], "s": {"type": "string"}}}
    prompt = 'Write a JSON object with "kind" set to "a" and a long sentence in "s".'
    full = generate(smollm2.model, smollm2.tokenizer, prompt, max_new_tokens=24, response_format=_format(schema))
    closed = 0
    for budget in (6, 10, 16):
        out = generate(smollm2.model, smollm2.tokenizer, prompt, max_new_tokens=budget, response_format=_format(schema),
                       close_at_budget=True)
        assert len(out.token_ids) <= budget
        model_part = out.token_ids[: len(out.token_ids) - out.stats.closing_tokens]
        assert model_part == full.token_ids[: len(model_part)]
        if out.stats.closing_tokens:
            closed += 1
            jsonschema.validate(json.loads(out.text), schema)
    assert closed >= 2

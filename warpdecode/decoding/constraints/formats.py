"""Response formats in OpenAI's shape (plus regex, grammar and choice) → compiled grammars.

    {"type": "text"}                                           no constraint
    {"type": "json_object"}                                    any JSON object
    {"type": "json_schema", "json_schema": {"name": "...", "schema": {...}, "strict": true}}
    {"type": "regex", "regex": "[0-9]{3}-[0-9]{4}"}            warpdecode extensions from here on
    {"type": "grammar", "grammar": "start: ..."}               Lark syntax (llguidance's dialect); GBNF too
    {"type": "choice", "choices": ["yes", "no"]}

JSON is generated compactly (no whitespace between tokens, properties in the schema's order) unless
the schema says otherwise in llguidance's `x-guidance` options (`{"whitespace_flexible": true}`): free
whitespace lets a model pad forever, and forced separators are tokens jump-forward drafts for free.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from warpdecode.decoding.constraints.llguidance_matcher import Grammar
from warpdecode.errors import ConfigError
from warpdecode.models.tokenizer import Tokenizer

ResponseFormat = Mapping[str, Any]
TYPES = ("text", "json_object", "json_schema", "regex", "grammar", "choice")
JSON_DEFAULTS: Any = {"whitespace_flexible": False}  # llguidance.JsonCompileOptions
"""llguidance's JSON options unless the schema's `x-guidance` sets them: compact JSON."""


def grammar_text(response_format: ResponseFormat) -> str | None:
    """llguidance's grammar for `response_format` (None for plain text); a malformed one is a ConfigError."""
    import llguidance

    if not isinstance(response_format, Mapping):
        raise ConfigError(f"response_format must be an object with a 'type', got {type(response_format).__name__}")
    kind = response_format.get("type")
    m = llguidance.LLMatcher
    if kind == "text":
        return None
    if kind == "json_object":
        return m.grammar_from_json_schema({"type": "object"}, defaults=JSON_DEFAULTS)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema", {}) if isinstance(spec, Mapping) else None
        if not isinstance(schema, Mapping):
            raise ConfigError("response_format json_schema must be {\"name\": ..., \"schema\": {...}}")
        try:
            return m.grammar_from_json_schema(json.dumps(dict(schema)), defaults=JSON_DEFAULTS)
        except (TypeError, ValueError) as error:
            raise ConfigError(f"response_format json_schema: {error}") from None
    if kind == "regex":
        return m.grammar_from_regex(_text(response_format, "regex"))
    if kind == "grammar":
        text = _text(response_format, "grammar")
        if "::=" in text:  # GBNF (llama.cpp's EBNF): llguidance translates it to Lark
            from llguidance.gbnf_to_lark import gbnf_to_lark

            try:
                text = gbnf_to_lark(text)
            except Exception as error:  # noqa: BLE001 - the translator raises bare exceptions on bad input
                raise ConfigError(f"cannot read the GBNF grammar: {' '.join(str(error).split())[:300]}") from None
        return m.grammar_from_lark(text)
    if kind == "choice":
        choices = response_format.get("choices")
        if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
            raise ConfigError(f"response_format choice needs a non-empty list of non-empty strings, got {choices!r}")
        return m.grammar_from_regex("|".join(re.escape(c) for c in choices))
    raise ConfigError(f"response_format type must be one of {', '.join(TYPES)}; got {kind!r}")


def _text(response_format: ResponseFormat, key: str) -> str:
    value = response_format.get(key)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"response_format {response_format.get('type')} needs a non-empty string {key!r}")
    return value


def compile_response_format(response_format: ResponseFormat | None, tokenizer: Tokenizer | None, *,
                            vocab_size: int, stop_ids: set[int]) -> Grammar | None:
    """The compiled grammar of `response_format` for `tokenizer` (None: unconstrained)."""
    text = None if response_format is None else grammar_text(response_format)
    if text is None:
        return None
    if tokenizer is None:
        raise ConfigError("response_format needs the model's tokenizer")
    return Grammar.compile(text, tokenizer, vocab_size=vocab_size, stop_ids=frozenset(stop_ids),
                           schema=lenient_schema(response_format))


def lenient_schema(response_format: ResponseFormat | None) -> dict[str, Any] | None:
    """The JSON schema of a `json_schema` format compiled leniently (`x-guidance: {"lenient": true}`:
    llguidance drops the keywords it does not implement, so its grammar allows more than the schema),
    without its `x-guidance`; None for any other format."""
    if response_format is None or response_format.get("type") != "json_schema":
        return None
    schema = response_format["json_schema"]["schema"]
    options = schema.get("x-guidance")
    if not isinstance(options, Mapping) or not options.get("lenient"):
        return None
    return {k: v for k, v in schema.items() if k != "x-guidance"}


def compile_row_formats(response_format: ResponseFormat | Sequence[ResponseFormat | None] | None,
                        tokenizer: Tokenizer | None, *, rows: int, vocab_size: int,
                        stop_ids: set[int]) -> list[Grammar | None]:
    """One compiled grammar per row (None: a free row) from one format for every row or a list of one
    per row (None: free); equal formats compile once."""
    if response_format is None or isinstance(response_format, Mapping):
        formats: list[ResponseFormat | None] = [response_format] * rows
    elif isinstance(response_format, Sequence) and not isinstance(response_format, str):
        formats = list(response_format)
        if len(formats) != rows:
            raise ConfigError(f"response_format lists {len(formats)} formats for {rows} prompts; give one per prompt")
    else:
        raise ConfigError(f"response_format must be an object or a list of them (one per prompt), got "
                          f"{type(response_format).__name__}")
    compiled: dict[str, Grammar | None] = {}
    out = []
    for fmt in formats:
        key = json.dumps(fmt, sort_keys=True, default=repr) if fmt is not None else ""
        if key not in compiled:
            compiled[key] = compile_response_format(fmt, tokenizer, vocab_size=vocab_size, stop_ids=stop_ids)
        out.append(compiled[key])
    return out

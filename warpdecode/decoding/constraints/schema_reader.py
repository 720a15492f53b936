"""A JSON schema read structurally, for building values: the schemas an instance path may follow
(`SchemaReader.at`: `$ref`s, `allOf` / `anyOf` / `oneOf`, `if`/`then`/`else`, properties, pattern
properties, items) and a small value each describes (`SchemaReader.minimal`). Approximate by design:
a value it builds is checked with the schema's `jsonschema` validator before it is used."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from warpdecode.decoding.constraints.json_prefix import Path

_DEPTH = 8
"""Nesting depth `minimal` writes at most (recursive schemas)."""
STRINGS = ("", "a", "_", "0", "a/a.yml", "${{ a }}")
"""Strings `minimal` tries, in order, where a schema has a `pattern` or a minimum length (and the key
names it tries for `patternProperties`)."""


class SchemaReader:
    """A JSON schema (`schema`) with its `jsonschema` validator (`validator`)."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        import jsonschema

        self.schema = dict(schema)
        cls = jsonschema.validators.validator_for(self.schema)
        self.validator = cls(self.schema)

    def resolve(self, schema: Any) -> dict[str, Any]:
        """`schema` with local `$ref`s followed (JSON pointers into the root); {} for anything else."""
        for _ in range(_DEPTH):
            if not isinstance(schema, dict) or "$ref" not in schema:
                break
            ref = schema["$ref"]
            target: Any = self.schema
            if not isinstance(ref, str) or not ref.startswith("#"):
                return {}
            for part in filter(None, ref[1:].split("/")):
                part = part.replace("~1", "/").replace("~0", "~")
                target = target.get(part) if isinstance(target, dict) else None
            schema = {**{k: v for k, v in schema.items() if k != "$ref"}, **target} if isinstance(target, dict) else {}
        return schema if isinstance(schema, dict) else {}

    def branches(self, schema: Any) -> list[dict[str, Any]]:
        """The schemas an instance of `schema` may follow: itself, its `allOf` parts, and its `anyOf` /
        `oneOf` / `then` / `else` branches, references followed."""
        out: list[dict[str, Any]] = []
        todo = [schema]
        while todo and len(out) < 64:
            item = self.resolve(todo.pop(0))
            out.append(item)
            for key in ("allOf", "anyOf", "oneOf"):
                todo += item.get(key, []) if isinstance(item.get(key), list) else []
            todo += [item[key] for key in ("then", "else") if isinstance(item.get(key), dict)]
        return out

    def at(self, path: Path) -> list[dict[str, Any]]:
        """The schemas an instance at `path` may follow."""
        found = self.branches(self.schema)
        for step in path:
            nxt: list[Any] = []
            for item in found:
                if isinstance(step, str):
                    props = item.get("properties", {})
                    if isinstance(props, dict) and step in props:
                        nxt.append(props[step])
                    for pattern, sub in (item.get("patternProperties") or {}).items():
                        if _matches(pattern, step):
                            nxt.append(sub)
                    if isinstance(item.get("additionalProperties"), dict):
                        nxt.append(item["additionalProperties"])
                else:
                    prefix = item.get("prefixItems")
                    items = item.get("items")
                    if isinstance(prefix, list) and step < len(prefix):
                        nxt.append(prefix[step])
                    elif isinstance(items, list):
                        nxt += items[step:step + 1]
                    elif isinstance(items, dict):
                        nxt.append(items)
            found = [b for sub in nxt for b in self.branches(sub)]
        return found

    def fits(self, value: Any, schema: Any) -> bool:
        """`value` validates against `schema`, a part of the root schema."""
        try:
            return next(iter(self.validator.descend(value, schema)), None) is None
        except Exception:  # noqa: BLE001 - a part jsonschema cannot check on its own (an unresolvable reference)
            return False

    def minimal(self, schema: Any, depth: int = 0) -> Any:
        """A small value `schema` describes (checked where it has branches; a best guess elsewhere)."""
        item = self.resolve(schema)
        if "const" in item:
            return item["const"]
        if isinstance(item.get("enum"), list) and item["enum"]:
            return min(item["enum"], key=lambda v: len(json.dumps(v)))
        for key in ("allOf",):
            if isinstance(item.get(key), list):
                merged = dict(item)
                for part in item[key]:
                    part = self.resolve(part)
                    merged = {**part, **merged, "required": [*merged.get("required", []), *part.get("required", [])],
                              "properties": {**part.get("properties", {}), **merged.get("properties", {})}}
                merged.pop(key)
                item = merged
        for key in ("anyOf", "oneOf"):
            if isinstance(item.get(key), list) and depth < _DEPTH:
                rest = {k: v for k, v in item.items() if k != key}
                options = [self.minimal({**rest, **self.resolve(b)}, depth + 1) for b in item[key]]
                good = [v for v in options if self.fits(v, item)]
                return min(good or options, key=lambda v: len(json.dumps(v)))
        kinds = item.get("type")
        kinds = [kinds] if isinstance(kinds, str) else kinds if isinstance(kinds, list) else [_guess(item)]
        options = [_of_type(self, item, kind, depth) for kind in kinds]
        return min(options, key=lambda v: len(json.dumps(v))) if options else None



def _guess(item: dict[str, Any]) -> str:
    if "properties" in item or "required" in item or "additionalProperties" in item:
        return "object"
    if "items" in item or "minItems" in item:
        return "array"
    return "string" if "pattern" in item or "minLength" in item else "null"


def _matches(pattern: Any, text: str) -> bool:
    """`text` matches the schema's `pattern` (False for one Python's `re` does not read)."""
    try:
        return isinstance(pattern, str) and re.search(pattern, text) is not None
    except re.error:
        return False


def listed(item: dict[str, Any]) -> list[Any]:
    """The values `item` lists (its `enum`, or its `const`)."""
    if "const" in item:
        return [item["const"]]
    return list(item["enum"]) if isinstance(item.get("enum"), list) else []


def another_key(item: dict[str, Any], taken: Any) -> tuple[str, Any] | None:
    """A key an object of `item` may have beside `taken` (a property, else a short name one of its
    `patternProperties` matches), with its schema."""
    for name, sub in (item.get("properties") or {}).items():
        if name not in taken:
            return name, sub
    for pattern, sub in (item.get("patternProperties") or {}).items():
        for name in STRINGS:
            if name and name not in taken and _matches(pattern, name):
                return name, sub
    return None


def _of_type(check: SchemaReader, item: dict[str, Any], kind: str, depth: int) -> Any:
    if kind == "object":
        if depth >= _DEPTH:
            return {}
        props = item.get("properties") or {}
        required = [k for k in item.get("required", []) if isinstance(k, str)]
        order = [k for k in props if k in required] + [k for k in required if k not in props]
        out = {k: check.minimal(props.get(k, {}), depth + 1) for k in order}
        least = item.get("minProperties", 0)
        while isinstance(least, int) and len(out) < min(least, 4) and (more := another_key(item, out)) is not None:
            out[more[0]] = check.minimal(more[1], depth + 1)
        return out
    if kind == "array":
        count = item.get("minItems", 0) if isinstance(item.get("minItems"), int) else 0
        sub = item.get("items") if isinstance(item.get("items"), dict) else {}
        return [check.minimal(sub, depth + 1) for _ in range(min(count, 4))] if depth < _DEPTH else []
    if kind == "string":
        pattern, least = item.get("pattern"), item.get("minLength", 0)
        for text in STRINGS:
            if len(text) >= least and (not isinstance(pattern, str) or _matches(pattern, text)):
                return text
        return "a" * least if isinstance(least, int) else ""
    if kind in ("integer", "number"):
        low, above = item.get("minimum", 0), item.get("exclusiveMinimum")
        if isinstance(above, int | float) and not isinstance(above, bool):
            low = above + 1
        return low if isinstance(low, int | float) and not isinstance(low, bool) else 0
    return False if kind == "boolean" else None


"""Schema-checked closing: closings of a JSON output that validate against its schema, not only its grammar.

A schema llguidance compiles *leniently* (`x-guidance: {"lenient": true}`) gives a grammar looser than
the schema: `if`/`then`, `not`, `uniqueItems`, ... are dropped and `oneOf` is read as `anyOf`, so the
grammar's closing (`closing.closing`) may complete the text into an instance the schema refuses (a
required key an `if`/`then` adds, a value of a type a `oneOf` branch excludes). `SchemaCheck` holds the
schema and a `jsonschema` validator: `valid` checks a closed text, and `completion` builds a closing
text from the schema for an output prefix and repairs it from the validation errors:

* the prefix is read as far as it goes (`Cursor`): the containers still open, with their instance
  paths, and the token in progress (a string, key, number or literal, or a value still to write);
* the closing finishes that token (a key is completed to a property name of its object where one
  fits), writes the smallest value the schema describes where one is due (`minimal`), and closes
  every open container;
* each validation error whose instance lies in the text the closing writes, or is an open container,
  is repaired: a missing required key is added with its smallest value (in the schema's property
  order, which llguidance's grammar keeps), too few properties or items get more, a value of the
  wrong type, enum or const is replaced by the smallest one of its schema, a string still open is
  completed to the enum member it starts (or a short tail its pattern takes), a duplicate item the
  closing writes becomes another listed value; `anyOf` / `oneOf` failures follow the branch with the
  fewest errors left. An error in the model's part (a duplicate item it wrote, a string where an
  object is due) cannot be repaired: no closing from here validates.

The text is then written in tokens the grammar allows (`closing.text_tokens`); where the grammar
refuses it (a property order it enforces, say) it is no candidate. This is a heuristic for the
JSON Schema keywords real schemas use most (`type`, `required`, `enum`, `const`, `properties`,
`patternProperties`, `items`, `minItems`, `minProperties`, `uniqueItems`, `$ref`, `allOf` / `anyOf` /
`oneOf`, `if`/`then`); where it finds no closing, the grammar's rollout is the only candidate.

`jsonschema` is the optional extra `warpdecode[structured]` (it is also in `dev`); `SchemaCheck.of`
returns None without it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from warpdecode.decoding.constraints.json_prefix import Cursor, Open, Path
from warpdecode.decoding.constraints.schema_reader import STRINGS, SchemaReader, another_key, listed

_ROUNDS = 12
"""Validate-and-repair rounds per closing text."""


class SchemaCheck(SchemaReader):
    """A JSON schema to check closings against, with its validator. `broken` turns True once the
    validator fails on the schema itself (a reference it cannot resolve offline, a malformed keyword):
    the closing then follows the grammar only."""

    broken = False

    @classmethod
    def of(cls, schema: Mapping[str, Any]) -> SchemaCheck | None:
        """The check of `schema`; None where `jsonschema` is not installed."""
        try:
            return cls(schema)
        except ImportError:
            return None

    def valid(self, text: str) -> bool:
        """`text` parses as JSON and validates."""
        try:
            instance = json.loads(text)
        except ValueError:
            return False
        return not self._errors(instance)

    def _errors(self, instance: Any) -> list[Any]:
        """The validation errors of `instance` (one stand-in error where the schema cannot be used)."""
        try:
            return list(self.validator.iter_errors(instance))
        except Exception as error:  # noqa: BLE001 - jsonschema and referencing raise many types for a bad schema
            self.broken = True
            return [error]

    def completion(self, prefix: str) -> str | None:
        """A closing text for `prefix` (the output so far) after which the whole text validates; None
        where none is found."""
        cursor = Cursor.read(prefix)
        if cursor is None or cursor.mode == "done":
            return None
        try:
            plan = _Plan(self, cursor)
            for _ in range(_ROUNDS):
                text = plan.text()
                errors = self._errors(json.loads(prefix + text))
                if self.broken or not errors:
                    return None if self.broken else text
                plan.touched.clear()
                errors.sort(key=lambda e: e.validator in ("anyOf", "oneOf"))  # branches after what they may share
                if not plan.repair_all(errors):
                    return None
        except (ValueError, TypeError, LookupError, AttributeError, RecursionError):
            return None  # a schema shape the heuristic does not read (the validator still judges every text)
        return None


class _Plan:
    """The closing text of one prefix: how the token in progress ends, the value due, and the members
    added to each open container; `repair` edits it from a validation error."""

    def __init__(self, check: SchemaCheck, cursor: Cursor) -> None:
        self.check = check
        self.cursor = cursor
        self.values: dict[Path, Any] = {}  # instance path → value the closing writes there
        self.extra: list[list[str | int]] = [[] for _ in cursor.stack]  # per open container: keys / indices added
        self.lead = ""  # text that ends the token in progress
        self.due: Path | None = None  # where the closing writes a value after `lead`
        self.touched: set[Path] = set()  # instance paths edited this round (their other errors are gone too)
        mode, top = cursor.mode, cursor.stack[-1] if cursor.stack else None
        if mode == "string":
            self.lead = '"'
        elif mode == "scalar":
            self.lead = _finish_scalar(cursor.text)
        elif mode == "colon":
            self.lead, self.due = ":", cursor.value_path()
        elif mode == "value" and (top is None or top.kind == "{" or cursor.after_comma):
            self.due = cursor.value_path()
            if top is not None and top.kind == "[":
                top.count += 1
        elif mode in ("key string", "key") and top is not None and (mode == "key string" or cursor.after_comma):
            key = self._key(top, cursor.text if mode == "key string" else "")
            self.lead = (key[len(cursor.text):] if mode == "key string" else '"' + key) + '":'
            top.keys.append(key)
            self.due = (*top.path, key)
        if self.due is not None:
            self.values[self.due] = self._smallest(self.due)

    def _key(self, top: Open, start: str) -> str:
        """A property name of the object at `top` that starts with `start` (a missing required one
        first), or `start` itself."""
        schemas = self.check.at(top.path)
        required = {k for s in schemas for k in s.get("required", []) if isinstance(k, str)}
        order = self._order(top.path)  # llguidance writes properties in this order: only later ones are left
        last = max((order.get(k, -1) for k in top.keys), default=-1)
        names = [k for k in order if order[k] > last]
        names = [k for k in names if k in required] + names + sorted(required - set(order))
        return next((k for k in names if k.startswith(start) and k not in top.keys and '"' not in k
                     and "\\" not in k), start)

    def _smallest(self, path: Path) -> Any:
        schemas = self.check.at(path)
        return self.check.minimal(schemas[0]) if schemas else None

    def text(self) -> str:
        out = [self.lead]
        if self.due is not None:
            out.append(_dump(self.values[self.due]))
        for depth in range(len(self.cursor.stack) - 1, -1, -1):
            top = self.cursor.stack[depth]
            empty = not (top.keys if top.kind == "{" else top.count)
            extra = self.extra[depth]
            if top.kind == "{" and len(extra) > 1:  # in the schema's property order, which llguidance keeps
                order = self._order(top.path)
                extra = sorted(extra, key=lambda k: order.get(str(k), len(order)))
            for i, step in enumerate(extra):
                comma = "" if empty and i == 0 else ","
                value = _dump(self.values[(*top.path, step)])
                out.append(f"{comma}{_dump(step)}:{value}" if top.kind == "{" else comma + value)
            out.append("}" if top.kind == "{" else "]")
        return "".join(out)

    def repair_all(self, errors: list[Any]) -> bool:
        """Repair each of `errors` (every one, not stopping at the first that fails); whether all went."""
        done = [self.repair(error) for error in errors]
        return all(done)

    def repair(self, error: Any) -> bool:
        """Edit the plan so that `error` (a jsonschema ValidationError) goes; False where it cannot."""
        path: Path = tuple(error.absolute_path)
        kind = error.validator
        if any(path[:len(done)] == done for done in self.touched):
            return True
        if kind in ("anyOf", "oneOf") and error.context and not self._mine(path):
            groups: dict[Any, list[Any]] = {}
            for sub in error.context:
                groups.setdefault(sub.relative_schema_path[0], []).append(sub)
            return any(self.repair_all(group) for group in sorted(groups.values(), key=self._left))
        if kind == "uniqueItems" and isinstance(error.instance, list):
            return self._unique(path, error.instance)
        root = self._mine(path)
        if root is not None:
            replacement = self.check.minimal(error.schema)
            if kind == "required":
                current = _get(self.values[root], path[len(root):])
                if not isinstance(current, dict):
                    return False
                replacement = {**current, **{k: v for k, v in replacement.items() if k not in current}} \
                    if isinstance(replacement, dict) else current
                props = error.schema.get("properties") or {}
                for name in error.schema.get("required", []):
                    if name not in replacement:
                        replacement[name] = self.check.minimal(props.get(name, {}))
                order = self._order(path)
                replacement = dict(sorted(replacement.items(), key=lambda kv: order.get(kv[0], len(order))))
            if _get(self.values[root], path[len(root):]) == replacement:
                return False
            self.values[root] = _set(self.values[root], path[len(root):], replacement)
            self.touched.add(path)
            return True
        depth = next((i for i, top in enumerate(self.cursor.stack) if top.path == path), None)
        if depth is not None and kind == "required":
            top = self.cursor.stack[depth]
            props = error.schema.get("properties") or {}
            missing = [k for k in error.schema.get("required", []) if isinstance(k, str) and k not in top.keys
                       and k not in self.extra[depth]]
            for name in missing:
                self.extra[depth].append(name)
                self.values[(*top.path, name)] = self.check.minimal(props.get(name, {}))
                self.touched.add((*top.path, name))
            return True
        if depth is not None and kind == "minProperties" and self.cursor.stack[depth].kind == "{":
            top = self.cursor.stack[depth]
            more = another_key(self.check.resolve(error.schema), [*top.keys, *self.extra[depth]])
            if more is None:
                return False
            self.extra[depth].append(more[0])
            self.values[(*top.path, more[0])] = self.check.minimal(more[1])
            return True
        if depth is not None and kind == "minItems" and self.cursor.stack[depth].kind == "[":
            top = self.cursor.stack[depth]
            index = top.count + len(self.extra[depth])
            self.extra[depth].append(index)
            self.values[(*top.path, index)] = self._smallest((*top.path, index))
            return True
        if self.cursor.mode == "string" and path == self.cursor.value_path():
            return self._finish_string(error)
        return False

    def _unique(self, path: Path, items: list[Any]) -> bool:
        """Make the closing's item of the array at `path` (a value it writes, or the string in progress)
        differ from the others: another of the values its schema lists."""
        seen = [_dump(v) for v in items]
        for index, item in enumerate(items):
            if seen.count(_dump(item)) < 2:
                continue
            where, taken = (*path, index), seen[:index] + seen[index + 1:]
            choices = [v for s in self.check.at(where) for v in listed(s) if _dump(v) not in taken]
            if where in self.values and choices:
                self.values[where] = choices[0]
                self.touched.add(where)
                return True
            if self.cursor.mode == "string" and where == self.cursor.value_path():
                start = json.loads(f'"{self.cursor.text}"')
                tails = [v[len(start):] for v in choices if isinstance(v, str) and v.startswith(start)]
                if tails:
                    self.lead = _dump(tails[0])[1:]
                    self.touched.add(where)
                    return True
        return False

    def _finish_string(self, error: Any) -> bool:
        """End the string in progress so that it passes `error`'s schema: the rest of an enum member it
        starts, or a short tail (`STRINGS`) after which it validates."""
        try:
            start = json.loads(f'"{self.cursor.text}"')
        except ValueError:  # an escape cut short
            return False
        kind = error.validator
        if kind in ("enum", "const"):
            members = error.validator_value if kind == "enum" else [error.validator_value]
            tails = [m[len(start):] for m in members if isinstance(m, str) and m.startswith(start)]
        else:
            tails = [t for t in STRINGS if self.check.fits(start + t, error.schema)]
        lead = _dump(tails[0])[1:] if tails else None
        if lead is None or lead == self.lead:
            return False
        self.lead = lead
        self.touched.add(tuple(error.absolute_path))
        return True

    def _left(self, errors: list[Any]) -> int:
        """How many of `errors` no edit of this round has handled yet."""
        return sum(not any(tuple(e.absolute_path)[:len(d)] == d for d in self.touched) for e in errors)

    def _order(self, path: Path) -> dict[str, int]:
        """The properties of the object at `path`, in its schemas' order (llguidance writes them so)."""
        order: dict[str, int] = {}
        for name in (k for s in self.check.at(path) for k in s.get("properties") or {}):
            order.setdefault(name, len(order))
        return order

    def _mine(self, path: Path) -> Path | None:
        """The root of the value the closing writes that holds `path`, if any."""
        return next((root for root in self.values if path[:len(root)] == root), None)


def _finish_scalar(text: str) -> str:
    for word in ("true", "false", "null"):
        if word.startswith(text):
            return word[len(text):]
    return "" if text[-1:].isdigit() else "0"


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _get(value: Any, path: Path) -> Any:
    for step in path:
        value = value[step]
    return value


def _set(value: Any, path: Path, new: Any) -> Any:
    if not path:
        return new
    value[path[0]] = _set(value[path[0]], path[1:], new)
    return value

"""Schema-checked closing: closings of a JSON output that validate against its schema, not only its grammar.

A schema llguidance compiles *leniently* (`x-guidance: {"lenient": true}`) gives a grammar looser than
the schema: `if`/`then`, `not`, `uniqueItems`, ... are dropped and `oneOf` is read as `anyOf`, so the
grammar's closing (`closing.closing`) may complete the text into an instance the schema refuses (a
required key an `if`/`then` adds, a value of a type a `oneOf` branch excludes). `SchemaCheck` holds the
schema and a `jsonschema` validator: `valid` checks a closed text, and `completions` builds a closing
text from the schema for an output prefix and repairs it from the validation errors:

* the prefix is read as far as it goes (`Cursor`): the containers still open, with their instance
  paths, and the token in progress (a string, key, number or literal, or a value still to write);
* the closing finishes that token (a key is completed to a property name of its object where one
  fits), writes the smallest value the schema describes where one is due (`minimal`), and closes
  every open container;
* each validation error whose instance lies in the text the closing writes, or is an open container,
  is repaired: a missing required key is added (with its smallest value), a value of the wrong type,
  enum or const is replaced by the smallest one of its schema, a string still open is completed to
  the enum member it starts; `anyOf` / `oneOf` failures follow the branch with the fewest errors.
  An error in the model's part (a duplicate item, a string where an object is due) cannot be
  repaired: no closing from here validates.

The text is then written in tokens the grammar allows (`closing.text_tokens`); where the grammar
refuses it (a property order it enforces, say) it is no candidate. This is a heuristic for the
JSON Schema keywords real schemas use most (`type`, `required`, `enum`, `const`, `properties`,
`items`, `minItems`, `$ref`, `allOf`/`anyOf`/`oneOf`); a schema it cannot satisfy gets no closing
from it, and the output then ends as without the check.

`jsonschema` is the optional extra `warpdecode[structured]` (it is also in `dev`); `SchemaCheck.of`
returns None without it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

Path = tuple[str | int, ...]

_ROUNDS = 12
"""Validate-and-repair rounds per closing text."""
_DEPTH = 8
"""Nesting depth `minimal` writes at most (recursive schemas)."""
_STRINGS = ("", "a", "_", "0", "a/a.yml", "${{ a }}")
"""Strings `minimal` tries, in order, where a schema has a `pattern` or a minimum length."""


@dataclass
class Open:
    """A container the prefix opened and has not closed."""

    kind: str  # "{" or "["
    path: Path  # its instance path
    keys: list[str] = field(default_factory=list)  # object: the keys written (the one in progress included)
    count: int = 0  # array: items started


@dataclass
class Cursor:
    """Where a compact JSON prefix stands: `mode` is "value" (a value is due), "key" (a key or "}" is due;
    `after_comma`: a key is), "colon", "after" (a value just ended), "string" / "key string" (inside
    one, `text` read so far), "scalar" (a number or literal in progress, `text`) or "done"."""

    stack: list[Open]
    mode: str
    text: str = ""
    after_comma: bool = False

    @classmethod
    def read(cls, prefix: str) -> Cursor | None:
        """The cursor after `prefix` (compact JSON: no whitespace between tokens); None where it is not a
        JSON prefix this reader follows."""
        cur = cls([], "value")
        escape = False
        for char in prefix:
            if cur.mode in ("string", "key string"):
                if escape:
                    escape = False
                    cur.text += "\\" + char
                elif char == "\\":
                    escape = True
                elif char == '"':
                    if cur.mode == "key string":
                        cur.stack[-1].keys.append(json.loads(f'"{cur.text}"'))
                        cur.mode = "colon"
                    else:
                        cur.mode = "after"
                    cur.text = ""
                else:
                    cur.text += char
                continue
            if cur.mode == "scalar":
                if char.isalnum() or char in "+-.":
                    cur.text += char
                    continue
                cur.mode, cur.text = "after", ""
            if not cur._step(char):
                return None
        return None if escape else cur

    def _step(self, char: str) -> bool:
        top = self.stack[-1] if self.stack else None
        if self.mode == "value":
            if char in "{[":
                path = self.value_path()
                if top is not None and top.kind == "[":
                    top.count += 1
                self.stack.append(Open(char, path))
                self.mode, self.after_comma = ("key" if char == "{" else "value"), False
                return True
            if char == "]" and top is not None and top.kind == "[" and top.count == 0:
                return self._close()
            if top is not None and top.kind == "[":
                top.count += 1
            self.mode = "string" if char == '"' else "scalar"
            self.text = "" if char == '"' else char
            return char == '"' or char.isalnum() or char == "-"
        if self.mode == "key":
            if char == '"':
                self.mode, self.text = "key string", ""
                return True
            return char == "}" and not self.after_comma and self._close()
        if self.mode == "colon":
            self.mode = "value"
            return char == ":"
        if self.mode == "after" and top is not None:
            if char == ",":
                self.mode, self.after_comma = ("key" if top.kind == "{" else "value"), True
                return True
            return char == "}]"[top.kind == "["] and self._close()
        return False

    def _close(self) -> bool:
        self.stack.pop()
        self.mode = "after" if self.stack else "done"
        return True

    def value_path(self) -> Path:
        """The instance path of the value in progress or due."""
        if not self.stack:
            return ()
        top = self.stack[-1]
        if top.kind == "{":
            return (*top.path, top.keys[-1]) if top.keys else top.path
        return (*top.path, top.count - (self.mode != "value"))


class SchemaCheck:
    """A JSON schema to check closings against, with its validator."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        import jsonschema

        self.schema = dict(schema)
        cls = jsonschema.validators.validator_for(self.schema)
        self.validator = cls(self.schema)

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
        return bool(self.validator.is_valid(instance))

    def completions(self, prefix: str) -> Iterator[str]:
        """Closing texts for `prefix` (the output so far) after which the whole text validates."""
        cursor = Cursor.read(prefix)
        if cursor is None or cursor.mode == "done":
            return
        plan = _Plan(self, cursor)
        for _ in range(_ROUNDS):
            text = plan.text()
            try:
                instance = json.loads(prefix + text)
            except ValueError:
                return
            errors = list(self.validator.iter_errors(instance))
            if not errors:
                yield text
                return
            plan.touched.clear()
            errors.sort(key=lambda e: e.validator in ("anyOf", "oneOf"))  # branches after what they may share
            if not plan.repair_all(errors):
                return

    # -- the schema, read structurally --------------------------------------------------------------

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
                        if re.search(pattern, step):
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


def _listed(item: dict[str, Any]) -> list[Any]:
    """The values `item` lists (its `enum`, or its `const`)."""
    if "const" in item:
        return [item["const"]]
    return list(item["enum"]) if isinstance(item.get("enum"), list) else []


def _another_key(item: dict[str, Any], taken: Any) -> tuple[str, Any] | None:
    """A key an object of `item` may have beside `taken` (a property, else a short name one of its
    `patternProperties` matches), with its schema."""
    for name, sub in (item.get("properties") or {}).items():
        if name not in taken:
            return name, sub
    for pattern, sub in (item.get("patternProperties") or {}).items():
        for name in _STRINGS:
            if name and name not in taken and re.search(pattern, name):
                return name, sub
    return None


def _of_type(check: SchemaCheck, item: dict[str, Any], kind: str, depth: int) -> Any:
    if kind == "object":
        if depth >= _DEPTH:
            return {}
        props = item.get("properties") or {}
        required = [k for k in item.get("required", []) if isinstance(k, str)]
        order = [k for k in props if k in required] + [k for k in required if k not in props]
        out = {k: check.minimal(props.get(k, {}), depth + 1) for k in order}
        least = item.get("minProperties", 0)
        while isinstance(least, int) and len(out) < min(least, 4) and (more := _another_key(item, out)) is not None:
            out[more[0]] = check.minimal(more[1], depth + 1)
        return out
    if kind == "array":
        count = item.get("minItems", 0) if isinstance(item.get("minItems"), int) else 0
        sub = item.get("items") if isinstance(item.get("items"), dict) else {}
        return [check.minimal(sub, depth + 1) for _ in range(min(count, 4))] if depth < _DEPTH else []
    if kind == "string":
        pattern, least = item.get("pattern"), item.get("minLength", 0)
        for text in _STRINGS:
            if len(text) >= least and (not isinstance(pattern, str) or re.search(pattern, text)):
                return text
        return "a" * least if isinstance(least, int) else ""
    if kind in ("integer", "number"):
        low, above = item.get("minimum", 0), item.get("exclusiveMinimum")
        if isinstance(above, int | float) and not isinstance(above, bool):
            low = above + 1
        return low if isinstance(low, int | float) and not isinstance(low, bool) else 0
    return False if kind == "boolean" else None


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
            more = _another_key(self.check.resolve(error.schema), [*top.keys, *self.extra[depth]])
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
            choices = [v for s in self.check.at(where) for v in _listed(s) if _dump(v) not in taken]
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
        starts, or a short tail (`_STRINGS`) after which it validates."""
        try:
            start = json.loads(f'"{self.cursor.text}"')
        except ValueError:  # an escape cut short
            return False
        kind = error.validator
        if kind in ("enum", "const"):
            members = error.validator_value if kind == "enum" else [error.validator_value]
            tails = [m[len(start):] for m in members if isinstance(m, str) and m.startswith(start)]
        else:
            tails = [t for t in _STRINGS if self.check.fits(start + t, error.schema)]
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

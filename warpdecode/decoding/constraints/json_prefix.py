"""Where a compact JSON prefix stands: the containers still open, with their instance paths, and the
token in progress (`Cursor.read`); `schema_closing.py` builds closings from it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

Path = tuple[str | int, ...]
"""An instance path: object keys and array indices from the root."""


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

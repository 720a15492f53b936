"""Typed configurations of the trained networks a drafter package holds (`drafter.json`'s `config`).

Training writes `Config(...).to_dict()` into the package, export and the runtime read it back with
`Config.from_dict` and build the network with `Net.from_config(target, config)`: one dataclass per
network instead of a dict written in one folder and read by key in another. The JSON is the dict the
packages have always held (keys in field order, optional fields left out when unset), so packages
written before these classes existed load unchanged.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, Self, Union, get_args, get_origin

from warpdecode.errors import CheckpointError


def _accepts(hint: Any, value: Any) -> bool:
    """Whether the JSON `value` fits the field annotation `hint` (int, float, bool, str, dict, a list or
    tuple of ints, Optional of those)."""
    origin = get_origin(hint)
    if hint is type(None):
        return value is None
    if origin in (Union, types.UnionType):
        return any(_accepts(arg, value) for arg in get_args(hint))
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin in (tuple, list):
        return isinstance(value, list) and all(_accepts(get_args(hint)[0], v) for v in value)
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    raise TypeError(f"unsupported config field type {hint!r}")


def _is_tuple(hint: Any) -> bool:
    """`tuple[int, ...]`, alone or in an Optional: the JSON list is stored as a tuple."""
    return get_origin(hint) is tuple or any(get_origin(arg) is tuple for arg in get_args(hint))


def _describe(hint: Any) -> str:
    """`int` → "an integer", `tuple[int, ...] | None` → "a list of integers or null"."""
    origin = get_origin(hint)
    if hint is type(None):
        return "null"
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(arg) for arg in get_args(hint))
    if origin in (tuple, list):
        return "a list of integers"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(hint, "an object")


@dataclasses.dataclass(frozen=True, kw_only=True)
class NetConfig:
    """Base of the networks' configurations: `to_dict` / `from_dict` for `drafter.json`."""

    kind: ClassVar[str] = "network"
    """What the configuration describes, for messages."""
    writes_null: ClassVar[bool] = False
    """`to_dict` writes unset (None) fields as null instead of leaving them out (as the package always did)."""

    def hidden_layers(self, n_layer: int) -> tuple[int, ...]:
        """The target hidden states (0..`n_layer`) the network reads: its final one by default."""
        return (n_layer,)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of `drafter.json`'s `config`: fields in order, tuples as lists, unset
        (None) optional fields left out (null with `writes_null`)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None or self.writes_null:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "drafter.json") -> Self:
        """The configuration of a `drafter.json` `config` object, checked field by field: a missing
        required field or a value of the wrong type is a one-line `CheckpointError` naming the field
        (`where`: the file, for the message). Keys this version does not know are ignored."""
        hints = typing.get_type_hints(cls)
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name not in data:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise CheckpointError(f"{where}: field config.{f.name} of the {cls.kind} is missing")
                continue
            value, hint = data[f.name], hints[f.name]
            if not _accepts(hint, value):
                raise CheckpointError(f"{where}: field config.{f.name} of the {cls.kind} must be {_describe(hint)}, "
                                      f"got {repr(value)[:60]}")
            values[f.name] = tuple(value) if _is_tuple(hint) and value is not None else value
        return cls(**values)

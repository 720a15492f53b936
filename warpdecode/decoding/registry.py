"""The one registry of decoding components: `@register("drafter", "prompt_lookup")` on the class.

It is the single source for `warpdecode methods`, the CLI's choices and the exactness suite; nothing
dispatches on method names anywhere else. What a component needs and promises it declares as class
attributes of its protocol (`protocols.py`), which `get` and `build` return typed.
"""

from __future__ import annotations

import importlib
import inspect
import os
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union, cast, get_args, get_origin, overload

from warpdecode.errors import ConfigError

if TYPE_CHECKING:
    from warpdecode.decoding.diffusion.protocols import CommitPolicy
    from warpdecode.decoding.protocols import Controller, Drafter, Verifier
    from warpdecode.decoding.rules.protocols import DecodingRule
    from warpdecode.decoding.search.protocols import SearchStrategy

    Component = Drafter | Verifier | Controller | CommitPolicy | SearchStrategy | DecodingRule

Kind = Literal["drafter", "verifier", "controller", "commit_policy", "search", "rule"]
KINDS: tuple[Kind, ...] = ("drafter", "verifier", "controller", "commit_policy", "search", "rule")
_PACKAGES = {"drafter": "warpdecode.decoding.drafters", "verifier": "warpdecode.decoding.verifiers",
             "controller": "warpdecode.decoding.controllers",
             "commit_policy": "warpdecode.decoding.diffusion.policies", "search": "warpdecode.decoding.search",
             "rule": "warpdecode.decoding.rules"}
_REGISTRY: dict[str, dict[str, type]] = {kind: {} for kind in KINDS}

T = TypeVar("T", bound=type)


def register(kind: Kind, name: str):  # type: ignore[no-untyped-def]
    """Class decorator adding a component under `name` (also its `name` attribute); the name must be
    unique per kind."""

    def wrap(cls: T) -> T:
        if name in _REGISTRY[kind]:
            raise ValueError(f"{kind} {name!r} is registered twice")
        _REGISTRY[kind][name] = cls
        cls.name = name  # type: ignore[attr-defined]  # the one place a component's name is written
        return cls

    return wrap


def _load(kind: Kind) -> dict[str, type]:
    importlib.import_module(_PACKAGES[kind])  # the package imports every component module
    return _REGISTRY[kind]


def names(kind: Kind) -> list[str]:
    return sorted(_load(kind))


@overload
def get(kind: Literal["drafter"], name: str) -> type[Drafter]: ...
@overload
def get(kind: Literal["verifier"], name: str) -> type[Verifier]: ...
@overload
def get(kind: Literal["controller"], name: str) -> type[Controller]: ...
@overload
def get(kind: Literal["commit_policy"], name: str) -> type[CommitPolicy]: ...
@overload
def get(kind: Literal["search"], name: str) -> type[SearchStrategy]: ...
@overload
def get(kind: Literal["rule"], name: str) -> type[DecodingRule]: ...
@overload
def get(kind: Kind, name: str) -> type[Component]: ...
def get(kind: Kind, name: str) -> type[Component]:
    """The class registered as `name`; ConfigError listing the registered names otherwise."""
    table = _load(kind)
    if name not in table:
        raise ConfigError(f"unknown {kind} {name!r}; choose one of: {', '.join(sorted(table))}")
    return cast("type[Component]", table[name])


def package_options(directories: Mapping[str, Path]) -> dict[str, dict[str, Any]]:
    """Component name → the options that run an inference package's trained parts, from its drafter
    directories (package kind → directory, `InferencePackage.drafter_directories`).

    A package kind that drafters read as a small learned control (their `controls`: a SpecDec++
    acceptance head, FiRST layer routers) goes to each of them under the option they name; any other
    kind is the package of the component of its name, as `path` (`--method eagle` needs no path, nor
    does `verifier=judge` with a packaged judge).
    """
    readers = {name: get("drafter", name).controls for name in names("drafter")}
    options: dict[str, dict[str, Any]] = {}
    for kind, directory in directories.items():
        read = {name: controls[kind] for name, controls in readers.items() if kind in controls}
        for name, option in (read or {kind: "path"}).items():
            options.setdefault(name, {})[option] = str(directory)
    return options


def _parameters(cls: type) -> list[inspect.Parameter]:
    """Named constructor parameters (a component subclassing its protocol without an `__init__`
    inherits a catch-all `(*args, **kwargs)`: it takes no options)."""
    return [p for p in inspect.signature(cls).parameters.values()
            if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]


def options(cls: type) -> dict[str, dict[str, Any]]:
    """Constructor options of a component: name → {"type", "default"}."""
    out = {}
    for p in _parameters(cls):
        default = None if p.default is inspect.Parameter.empty else p.default
        out[p.name] = {"type": str(p.annotation), "default": default}
    return out


def _hints(cls: type) -> dict[str, Any]:
    """The constructor's resolved annotations (they are strings under `from __future__ import
    annotations`); an annotation that does not resolve leaves its option unchecked."""
    try:
        return typing.get_type_hints(cls.__init__)  # type: ignore[misc]
    except (NameError, TypeError):
        return {}


def _accepts(hint: Any, value: Any) -> bool:
    """Whether `value` fits the annotation `hint`: bool, int, float (an int too), str (a path too), None,
    Literal, unions and Optional, tuple/list/Sequence of those; any other annotation is not checked."""
    origin = get_origin(hint)
    if hint is Any or hint is inspect.Parameter.empty:
        return True
    if hint is None or hint is type(None):
        return value is None
    if origin is Literal:
        return any(type(value) is type(choice) and value == choice for choice in get_args(hint))
    if origin in (Union, types.UnionType):
        return any(_accepts(arg, value) for arg in get_args(hint))
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, (str, os.PathLike))
    if origin in (tuple, list, Sequence):
        if not isinstance(value, (tuple, list)):
            return False
        args = get_args(hint)
        if origin is tuple and args and args[-1] is not Ellipsis:  # tuple[int, str]: a fixed length
            return len(value) == len(args) and all(_accepts(a, v) for a, v in zip(args, value, strict=True))
        return not args or all(_accepts(args[0], v) for v in value)
    return not isinstance(hint, type) or isinstance(value, hint)


def _describe(hint: Any) -> str:
    """`int` → "an int", `int | None` → "an int or null", `Literal["a", "b"]` → "one of 'a', 'b'"."""
    origin = get_origin(hint)
    if hint is None or hint is type(None):
        return "null"
    if origin is Literal:
        return "one of " + ", ".join(repr(choice) for choice in get_args(hint))
    if origin in (Union, types.UnionType):
        parts = [_describe(arg) for arg in get_args(hint)]
        return ", ".join(parts[:-1]) + " or " + parts[-1]
    if origin in (tuple, list, Sequence):
        args = get_args(hint)
        if origin is tuple and args and args[-1] is not Ellipsis:
            return f"a list of {len(args)} ({', '.join(_describe(a) for a in args)})"
        plural = {bool: "true/false values", int: "ints", float: "numbers", str: "strings"}
        return "a list" + (f" of {plural[args[0]]}" if args and args[0] in plural else "")
    simple = {bool: "true or false", int: "an int", float: "a number", str: "a string"}
    return simple.get(hint, getattr(hint, "__name__", str(hint)))


_LABELS = {"drafter": "method", "commit_policy": "method"}


def check_options(kind: Kind, name: str, cls: type, kwargs: dict[str, Any]) -> None:
    """Raise a one-line ConfigError naming the first option whose value does not fit its annotation."""
    hints = _hints(cls)
    for option, value in kwargs.items():
        if option in hints and not _accepts(hints[option], value):
            raise ConfigError(f"{_LABELS.get(kind, kind)} option {name}.{option} must be "
                              f"{_describe(hints[option])}, got {value!r}")


@overload
def build(kind: Literal["drafter"], name: str, **kwargs: Any) -> Drafter: ...
@overload
def build(kind: Literal["verifier"], name: str, **kwargs: Any) -> Verifier: ...
@overload
def build(kind: Literal["controller"], name: str, **kwargs: Any) -> Controller: ...
@overload
def build(kind: Literal["commit_policy"], name: str, **kwargs: Any) -> CommitPolicy: ...
@overload
def build(kind: Literal["search"], name: str, **kwargs: Any) -> SearchStrategy: ...
@overload
def build(kind: Literal["rule"], name: str, **kwargs: Any) -> DecodingRule: ...
@overload
def build(kind: Kind, name: str, **kwargs: Any) -> Component: ...
def build(kind: Kind, name: str, **kwargs: Any) -> Component:
    """Instantiate a component, turning a wrong option into a ConfigError that lists the valid ones,
    and a value of the wrong type into one that names the option and the type it needs."""
    cls = get(kind, name)
    valid = options(cls)
    unknown = set(kwargs) - set(valid)
    if unknown:
        raise ConfigError(f"{kind} {name!r} has no option(s) {sorted(unknown)}; options: {sorted(valid) or 'none'}")
    missing = [p.name for p in _parameters(cls) if p.default is inspect.Parameter.empty and p.name not in kwargs]
    if missing:
        raise ConfigError(f"{kind} {name!r} needs option(s) {missing}, e.g. {name}:{missing[0]}=...")
    check_options(kind, name, cls, kwargs)
    return cls(**kwargs)

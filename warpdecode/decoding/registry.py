"""The one registry of decoding components: `@register("drafter", "prompt_lookup")` on the class.

It is the single source for `warpdecode methods`, the CLI's choices and the exactness suite; nothing
dispatches on method names anywhere else.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Literal, TypeVar

from warpdecode.errors import ConfigError

Kind = Literal["drafter", "verifier", "controller", "commit_policy"]
KINDS: tuple[Kind, ...] = ("drafter", "verifier", "controller", "commit_policy")
_PACKAGES = {"drafter": "warpdecode.decoding.drafters", "verifier": "warpdecode.decoding.verifiers",
             "controller": "warpdecode.decoding.controllers",
             "commit_policy": "warpdecode.decoding.diffusion.policies"}
_REGISTRY: dict[str, dict[str, type]] = {kind: {} for kind in KINDS}

T = TypeVar("T", bound=type)


def register(kind: Kind, name: str):  # type: ignore[no-untyped-def]
    """Class decorator adding a component under `name`; the name must be unique per kind."""

    def wrap(cls: T) -> T:
        if name in _REGISTRY[kind]:
            raise ValueError(f"{kind} {name!r} is registered twice")
        _REGISTRY[kind][name] = cls
        cls.registry_name = name  # type: ignore[attr-defined]
        return cls

    return wrap


def _load(kind: Kind) -> dict[str, type]:
    importlib.import_module(_PACKAGES[kind])  # the package imports every component module
    return _REGISTRY[kind]


def names(kind: Kind) -> list[str]:
    return sorted(_load(kind))


def get(kind: Kind, name: str) -> type:
    table = _load(kind)
    if name not in table:
        raise ConfigError(f"unknown {kind} {name!r}; choose one of: {', '.join(sorted(table))}")
    return table[name]


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


def build(kind: Kind, name: str, **kwargs: Any) -> Any:
    """Instantiate a component, turning a wrong option into a ConfigError that lists the valid ones."""
    cls = get(kind, name)
    valid = options(cls)
    unknown = set(kwargs) - set(valid)
    if unknown:
        raise ConfigError(f"{kind} {name!r} has no option(s) {sorted(unknown)}; options: {sorted(valid) or 'none'}")
    missing = [p.name for p in _parameters(cls) if p.default is inspect.Parameter.empty and p.name not in kwargs]
    if missing:
        raise ConfigError(f"{kind} {name!r} needs option(s) {missing}, e.g. {name}:{missing[0]}=...")
    return cls(**kwargs)

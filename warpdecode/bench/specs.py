"""Method specs: which decoding methods a benchmark runs, written `NAME[:KEY=VALUE...]`.

    none                                     plain decoding (the baseline, always run)
    prompt_lookup                            a drafter with its default options
    draft_model:layers=10:num_tokens=4       options are the drafter's constructor arguments
    prompt_lookup:num_tokens=4,none          several methods: separate them with commas
    prompt_lookup:controller=adaptive        `controller=` / `verifier=` pick those components
    int4_self:verifier=judge:verifier.path=DIR    `verifier.KEY=` / `controller.KEY=` set their options

Values are read as int, float, `true`/`false`, `null`, or else kept as text (`model=models/draft`).
In a YAML/JSON config a method may also be a mapping: `{name: draft_model, layers: 10}`.
Names and options are checked against the registry (`warpdecode methods`) before any model loads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from warpdecode.decoding import registry
from warpdecode.decoding.engine import Method
from warpdecode.decoding.generate import build_method
from warpdecode.errors import ConfigError

BASELINE = "none"
COMPONENT_KEYS = ("controller", "verifier")
"""Spec keys that name the method's controller or verifier (with default options) instead of
setting a drafter option: `prompt_lookup:controller=adaptive`."""
SYNTAX = "NAME[:KEY=VALUE...] separated by commas, e.g. prompt_lookup,draft_model:layers=10:num_tokens=4"

OptionValue = int | float | bool | str | None


def parse_value(text: str) -> OptionValue:
    """`10` → 10, `0.5` → 0.5, `true`/`false` → bool, `null`/`none` → None, anything else → the text."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "none"):
        return None
    for number in (int, float):
        try:
            return number(text)
        except ValueError:
            pass
    return text


def format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


@dataclass(frozen=True)
class MethodSpec:
    """One benchmarked method: a registered drafter and its options (the default lossless verifier)."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict, compare=False)
    """Drafter options supplied by the run rather than the spec (an inference package's drafter
    `path`); the spec's own options override them, and they are not part of the label."""
    verifier_defaults: dict[str, Any] = field(default_factory=dict, compare=False)
    """The same for the spec's verifier (an inference package's judge)."""

    @property
    def label(self) -> str:
        """The canonical spec text, which names the method's row in every report."""
        return ":".join([self.name] + [f"{k}={format_value(v)}" for k, v in self.options.items()])

    def _split(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, dict[str, Any]]]:
        """(drafter options, build_method's `controller` / `verifier` names, their options)."""
        components = {k: v for k, v in self.options.items() if k in COMPONENT_KEYS}
        component_options: dict[str, dict[str, Any]] = {"controller": {}, "verifier": dict(self.verifier_defaults)}
        drafter = dict(self.defaults)
        for key, value in self.options.items():
            kind, dot, option = key.partition(".")
            if dot and kind in COMPONENT_KEYS:
                if kind not in components:
                    raise ConfigError(f"method spec {self.label!r} sets {key!r} but names no {kind} ({kind}=NAME)")
                component_options[kind][option] = value
            elif key not in COMPONENT_KEYS:
                drafter[key] = value
        return drafter, components, component_options

    def build(self, *, do_sample: bool) -> Method:
        options, components, component_options = self._split()
        return build_method(self.name, do_sample=do_sample, options=options, **components,
                            verifier_options=component_options["verifier"],
                            controller_options=component_options["controller"])

    def validate(self) -> None:
        """Raise `ConfigError` for an unknown drafter, controller or verifier, unknown options or
        invalid option values."""
        options, components, component_options = self._split()
        registry.build("drafter", self.name, **options)
        for kind, name in components.items():
            if not isinstance(name, str):
                raise ConfigError(f"method spec {self.label!r}: {kind} must be a name, got {name!r}")
            registry.build(cast(registry.Kind, kind), name, **component_options[kind])


def parse_method(text: str) -> MethodSpec:
    """Parse one `NAME[:KEY=VALUE...]` spec (not yet checked against the registry)."""
    name, *pairs = text.strip().split(":")
    if not name:
        raise ConfigError(f"method spec {text!r} has no name; expected {SYNTAX}")
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key or not value.strip():
            raise ConfigError(f"method spec {text!r}: {pair!r} is not KEY=VALUE; expected {SYNTAX}")
        if key in options:
            raise ConfigError(f"method spec {text!r} sets {key!r} twice")
        options[key] = parse_value(value.strip())
    return MethodSpec(name.strip(), options)


def _from_mapping(entry: Mapping[str, Any]) -> MethodSpec:
    if not isinstance(entry.get("name"), str) or not entry["name"]:
        raise ConfigError(f"method mapping {dict(entry)} needs a 'name' (a drafter from `warpdecode methods`)")
    return MethodSpec(entry["name"], {k: v for k, v in entry.items() if k != "name"})


def parse_methods(value: str | Sequence[str | Mapping[str, Any]],
                  defaults: Mapping[str, dict[str, Any]] | None = None) -> list[MethodSpec]:
    """Parse and validate a method list; the baseline `none` comes first, added if missing.

    Accepts the CLI form (`"prompt_lookup,draft_model:layers=10"`) or a config list whose entries are
    spec strings or mappings with a `name` key. Two entries with the same label are an error.
    `defaults`: drafter or verifier name → options the run supplies (see `MethodSpec.defaults`).
    """
    entries: list[str | Mapping[str, Any]] = [value] if isinstance(value, str) else list(value)
    specs: list[MethodSpec] = []
    for entry in entries:
        if isinstance(entry, Mapping):
            specs.append(_from_mapping(entry))
            continue
        for part in entry.split(","):
            if not part.strip():
                raise ConfigError(f"empty method in {entry!r}; expected {SYNTAX}")
            specs.append(parse_method(part))
    labels = [s.label for s in specs]
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        raise ConfigError(f"method(s) listed twice: {', '.join(duplicates)}")
    defaults = defaults or {}
    specs = [dataclasses.replace(s, defaults=dict(defaults.get(s.name, {})),
                                 verifier_defaults=dict(defaults.get(s.options["verifier"], {}))
                                 if "verifier" in s.options else {})
             for s in specs]
    for spec in specs:
        spec.validate()
    baseline = [s for s in specs if s.label == BASELINE] or [MethodSpec(BASELINE)]
    return baseline + [s for s in specs if s.label != BASELINE]

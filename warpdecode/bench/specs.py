"""Method lists of `warpdecode bench`: comma-separated method specs (`warpdecode.decoding.specs`).

    none                                     plain decoding (the baseline, always run)
    prompt_lookup                            a drafter with its default options
    draft_model:layers=10:num_tokens=4       options are the drafter's constructor arguments
    prompt_lookup:num_tokens=4,none          several methods: separate them with commas
    prompt_lookup:controller=adaptive        `controller=` / `verifier=` pick those components
    int4_self:verifier=judge:verifier.path=DIR    `verifier.KEY=` / `controller.KEY=` set their options

In a YAML/JSON config a method may also be a mapping: `{name: draft_model, layers: 10}`.
Names and options are checked against the registry (`warpdecode methods`) before any model loads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from warpdecode.decoding.specs import (
    COMPONENT_KEYS,
    MethodSpec,
    OptionValue,
    format_value,
    parse_method,
    parse_value,
)
from warpdecode.errors import ConfigError

__all__ = ["BASELINE", "COMPONENT_KEYS", "SYNTAX", "MethodSpec", "OptionValue", "format_value", "parse_method",
           "parse_methods", "parse_value"]

BASELINE = "none"
SYNTAX = "NAME[:KEY=VALUE...] separated by commas, e.g. prompt_lookup,draft_model:layers=10:num_tokens=4"


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
    specs = [s.with_defaults(defaults or {}) for s in specs]
    for spec in specs:
        spec.validate()
    baseline = [s for s in specs if s.label == BASELINE] or [MethodSpec(BASELINE)]
    return baseline + [s for s in specs if s.label != BASELINE]

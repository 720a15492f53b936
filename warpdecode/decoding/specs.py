r"""Method specs `NAME[:KEY=VALUE...]`: the one way a decoding component and its options are written.

Every command that names a method takes this form: `generate --method`, `--verifier`, `--controller`,
`bench --methods` and `regress --methods` (comma-separated lists of specs), `export --method`.

    prompt_lookup                            a drafter with its default options
    draft_model:layers=10:num_tokens=4       options are the component's constructor arguments
    prompt_lookup:controller=adaptive        `controller=` / `verifier=` pick those components
    int4_self:verifier=judge:verifier.path=DIR    `verifier.KEY=` / `controller.KEY=` set their options
    token_recycling:step=device              run in the device-resident step (`decoding/device_step`)
    threshold:threshold=0.8:kv_cache=dual    on a diffusion LM: a commit policy and the decoder's options

Values are read as int, float, `true`/`false`, `null`, or else kept as text (`model=models/draft`;
`\:` writes a colon inside one, `cad:context=Note\: the sky is green.`);
the registry then checks each against the option's annotation, so `max_ngram=abc` is refused with the
type it needs. Names and options are checked before any model loads (`warpdecode methods` lists them).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, cast

from warpdecode.decoding import registry
from warpdecode.decoding.engine import Method
from warpdecode.decoding.generate import build_method
from warpdecode.errors import ConfigError

COMPONENT_KEYS = ("controller", "verifier")
"""Spec keys that name the method's controller or verifier (with default options) instead of
setting a drafter option: `prompt_lookup:controller=adaptive`."""
STEP_KEY = "step"
"""Spec key that picks where the method's steps run: `engine` (the default: the host loop of
`decoding/engine.py`) or `device` (the device-resident step, for drafters with a device form)."""
STEPS = ("engine", "device")
SPEC_SYNTAX = "NAME[:KEY=VALUE...], e.g. draft_model:layers=10:num_tokens=4"

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
    """The spec text of an option value (`parse_value` reads it back for scalars)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


def spec_text(name: str, options: Mapping[str, Any]) -> str:
    """`draft_model`, {"layers": 10} → `draft_model:layers=10`."""
    return ":".join([name] + [f"{k}={format_value(v)}" for k, v in options.items()])


def parse_spec(text: str) -> tuple[str, dict[str, OptionValue]]:
    """One `NAME[:KEY=VALUE...]` spec → (name, options), not yet checked against the registry."""
    name, *pairs = re.split(r"(?<!\\):", text.strip())  # `\:` is a colon inside a value
    if not name.strip():
        raise ConfigError(f"method spec {text!r} has no name; expected {SPEC_SYNTAX}")
    options: dict[str, OptionValue] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key or not value.strip():
            raise ConfigError(f"method spec {text!r}: {pair!r} is not KEY=VALUE; expected {SPEC_SYNTAX} "
                              "(a colon inside a value is written \\:)")
        if key in options:
            raise ConfigError(f"method spec {text!r} sets {key!r} twice")
        options[key] = parse_value(value.strip().replace("\\:", ":"))
    return name.strip(), options


@dataclass(frozen=True)
class MethodSpec:
    """A drafter and its options; `verifier=` / `controller=` keys pick the other two components (the
    default lossless verifier and the fixed controller otherwise)."""

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
        return spec_text(self.name, self.options)

    def with_defaults(self, defaults: Mapping[str, dict[str, Any]]) -> MethodSpec:
        """This spec with the run's options for its drafter and verifier (component name → options)."""
        verifier = self.options.get("verifier")
        return replace(self, defaults=dict(defaults.get(self.name, {})),
                       verifier_defaults=dict(defaults.get(verifier, {})) if isinstance(verifier, str) else {})

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
            elif key not in COMPONENT_KEYS and key != STEP_KEY:
                drafter[key] = value
        return drafter, components, component_options

    @property
    def device_step(self) -> bool:
        """Whether the spec asks for the device-resident step (`step=device`)."""
        step = self.options.get(STEP_KEY, "engine")
        if step not in STEPS:
            raise ConfigError(f"method spec {self.label!r}: step must be one of {', '.join(STEPS)}, got {step!r}")
        return step == "device"

    def build(self, *, do_sample: bool) -> Method:
        options, components, component_options = self._split()
        return build_method(self.name, do_sample=do_sample, options=options, **components,
                            verifier_options=component_options["verifier"],
                            controller_options=component_options["controller"], device_step=self.device_step)

    def validate(self, *, complete: bool = True) -> None:
        """Raise `ConfigError` for an unknown drafter, controller or verifier, unknown options or
        invalid option values. `complete=False` checks names and the options given without building,
        for a spec whose required options are supplied later (an inference package's drafter path)."""
        options, components, component_options = self._split()
        if self.device_step and registry.get("drafter", self.name).device_drafter is None:
            raise ConfigError(f"method spec {self.label!r}: {self.name} has no device form; step=device runs "
                              f"{', '.join(device_step_drafters())}")
        checks: list[tuple[registry.Kind, Any, dict[str, Any]]] = [("drafter", self.name, options)]
        for kind, name in components.items():
            if not isinstance(name, str):
                raise ConfigError(f"method spec {self.label!r}: {kind} must be a name, got {name!r}")
            checks.append((cast(registry.Kind, kind), name, component_options[kind]))
        for kind, name, given in checks:
            if complete:
                registry.build(kind, name, **given)
                continue
            cls = registry.get(kind, name)
            unknown = sorted(set(given) - set(registry.options(cls)))
            if unknown:
                raise ConfigError(f"{kind} {name!r} has no option(s) {unknown}; "
                                  f"options: {sorted(registry.options(cls)) or 'none'}")
            registry.check_options(kind, name, cls, given)


def device_step_drafters() -> list[str]:
    """The drafters with a device form (`Drafter.device_drafter`), which `step=device` can run."""
    return [name for name in registry.names("drafter") if registry.get("drafter", name).device_drafter is not None]


def parse_method(text: str) -> MethodSpec:
    """Parse one `NAME[:KEY=VALUE...]` drafter spec (not yet checked against the registry)."""
    name, options = parse_spec(text)
    return MethodSpec(name, options)

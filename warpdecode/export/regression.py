"""Model-regression checks for an inference package, to run in a deployment's own CI.

`record` runs a fixed prompt set with each decoding method on a package and stores, per method and
prompt, the greedy tokens and the acceptance length τ; `check` reruns the same and reports every
difference: a changed token (the output is no longer what was approved) or a τ below the recorded
one by more than the tolerance (the drafter lost acceptance, so the speedup is gone). The package
identity is part of the record: checking another model's package fails at once.

    warpdecode regress packages/smollm2 --record regression/smollm2.json --methods none,hydra,prompt_lookup:num_tokens=4
    warpdecode regress packages/smollm2 --check regression/smollm2.json      # exit 1 on a regression

or from pytest (copy `docs/examples/test_package_regression.py`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from warpdecode.decoding import registry
from warpdecode.decoding.generate import generate
from warpdecode.decoding.specs import parse_method
from warpdecode.errors import ConfigError
from warpdecode.runtime.package import InferencePackage

FORMAT = "warpdecode-regression"
Prompt = str | list[int]


@dataclass
class Record:
    fingerprint: str
    backend: str
    max_new_tokens: int
    prompts: list[Prompt]
    methods: list[str]
    results: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """method → one {"token_ids", "tau"} per prompt."""

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps({"format": FORMAT} | asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Record:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8 text
            raise ConfigError(f"cannot read the regression record {path}: {e}") from e
        if not isinstance(data, dict) or data.pop("format", None) != FORMAT:
            raise ConfigError(f"{path} is not a {FORMAT} record (make one with `warpdecode regress --record`)")
        expected = {"fingerprint": str, "backend": str, "max_new_tokens": int, "prompts": list, "methods": list,
                    "results": dict}
        if set(data) != set(expected):
            raise ConfigError(f"{path}: a {FORMAT} record has the fields {', '.join(expected)}, this one "
                              f"{', '.join(data) or 'none'}")
        for name, kind in expected.items():
            if not isinstance(data[name], kind) or isinstance(data[name], bool):
                raise ConfigError(f"{path}: field {name} must be a {kind.__name__}, got {data[name]!r:.60}")
        if not all(isinstance(p, str) or (isinstance(p, list) and all(type(i) is int for i in p)) for p in data["prompts"]):
            raise ConfigError(f"{path}: field prompts must hold texts or lists of token ids")
        if not all(isinstance(m, str) for m in data["methods"]):
            raise ConfigError(f"{path}: field methods must hold method names")
        for method, runs in data["results"].items():
            if method not in data["methods"] or not isinstance(runs, list) or len(runs) != len(data["prompts"]) or not all(
                    isinstance(r, dict) and isinstance(r.get("token_ids"), list)
                    and isinstance(r.get("tau"), int | float) for r in runs):
                raise ConfigError(f"{path}: results[{method!r}] must hold one {{token_ids, tau}} per prompt "
                                  f"for a method of the record")
        return cls(**data)


def run(package: InferencePackage, prompts: list[Prompt], methods: list[str], *, backend: str = "onnxruntime",
        max_new_tokens: int = 32) -> Record:
    """Greedy-decode every prompt with every method, a spec `NAME[:KEY=VALUE...]` (the package's drafters
    need no options)."""
    if not prompts or not methods:
        raise ConfigError("a regression record needs at least one prompt and one method")
    backbone = package.backbone(backend)
    tokenizer = package.tokenizer()
    if tokenizer is None and any(isinstance(p, str) for p in prompts):
        raise ConfigError("text prompts need a package with a tokenizer; give token id lists instead")
    options = registry.package_options(package.drafter_directories())
    record = Record(package.fingerprint, backend, max_new_tokens, prompts, methods)
    built_methods = [parse_method(method).with_defaults(options).build(do_sample=False) for method in methods]
    for method, built in zip(methods, built_methods, strict=True):  # every spec checked before the first run
        record.results[method] = []
        for prompt in prompts:
            out = generate(backbone, tokenizer, prompt, max_new_tokens=max_new_tokens, stop_at_eos=False, method=built)
            record.results[method].append({"token_ids": out.token_ids, "tau": round(out.stats.tau, 4)})
    return record


def _compare(recorded: Record, current: Record, tau_tolerance: float) -> list[str]:
    """Every regression of `current` against `recorded`, one line each (empty: none)."""
    failures = []
    for method, runs in recorded.results.items():
        for i, (old, new) in enumerate(zip(runs, current.results[method], strict=True)):
            if new["token_ids"] != old["token_ids"]:
                at = next(j for j, (a, b) in enumerate(zip(old["token_ids"] + [None], new["token_ids"] + [None])) if a != b)
                failures.append(f"{method}, prompt {i}: output differs from token {at} on")
            if new["tau"] < old["tau"] * (1 - tau_tolerance):
                failures.append(f"{method}, prompt {i}: tau {new['tau']:.2f} < recorded {old['tau']:.2f} "
                                f"(tolerance {tau_tolerance:.0%})")
    return failures


def check(package: InferencePackage, recorded: Record, *, tau_tolerance: float = 0.05) -> list[str]:
    """Rerun `recorded`'s prompts and methods on `package`; every regression, one line each (empty: none)."""
    if package.fingerprint != recorded.fingerprint:
        return [f"the package holds model {package.fingerprint}, the record was made for {recorded.fingerprint}"]
    current = run(package, recorded.prompts, recorded.methods, backend=recorded.backend,
                  max_new_tokens=recorded.max_new_tokens)
    return _compare(recorded, current, tau_tolerance)

"""Option values are checked against the component's constructor annotations before it is built."""

from __future__ import annotations

import inspect
import typing
from pathlib import Path
from typing import Any, Literal

import pytest

from warpdecode.bench.specs import parse_methods
from warpdecode.decoding import registry
from warpdecode.decoding.generate import build_method
from warpdecode.errors import ConfigError

PLACEHOLDERS: tuple[Any, ...] = ("x", 1, 0.5, True, None)


def _components() -> list[tuple[registry.Kind, str, type]]:
    return [(kind, name, registry.get(kind, name)) for kind in registry.KINDS for name in registry.names(kind)]


def _fits(kind: registry.Kind, name: str, cls: type, option: str, value: Any) -> bool:
    try:
        registry.check_options(kind, name, cls, {option: value})
    except ConfigError:
        return False
    return True


def _required(kind: registry.Kind, name: str, cls: type) -> dict[str, Any]:
    """A value that fits each option without a default (e.g. a drafter's `path`)."""
    required = {}
    for p in inspect.signature(cls).parameters.values():
        if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            required[p.name] = next(v for v in PLACEHOLDERS if _fits(kind, name, cls, p.name, v))
    return required


def _numeric_options() -> list[tuple[registry.Kind, str, str]]:
    """Every registered option annotated with an int or float that takes no text (int, float | None, ...)."""
    out = []
    for kind, name, cls in _components():
        for option, hint in typing.get_type_hints(cls.__init__).items():
            types = set(typing.get_args(hint) or (hint,))
            if option != "return" and types & {int, float} and str not in types:
                out.append((kind, name, option))
    return out


NUMERIC = _numeric_options()


def test_the_registry_has_numeric_options_to_check():
    assert len(NUMERIC) > 50 and {kind for kind, _, _ in NUMERIC} == set(registry.KINDS)


@pytest.mark.parametrize(("kind", "name", "option"), NUMERIC, ids=[f"{k}-{n}-{o}" for k, n, o in NUMERIC])
def test_a_non_numeric_string_for_a_numeric_option_names_the_option(kind, name, option):
    cls = registry.get(kind, name)
    with pytest.raises(ConfigError, match=rf"option {name}\.{option} must be .*, got 'abc'$") as error:
        registry.build(kind, name, **_required(kind, name, cls) | {option: "abc"})
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(("kind", "name", "cls"), _components(), ids=[f"{k}-{n}" for k, n, _ in _components()])
def test_every_default_fits_its_own_annotation(kind, name, cls):
    defaults = {p.name: p.default for p in inspect.signature(cls).parameters.values()
                if p.default is not inspect.Parameter.empty}
    registry.check_options(kind, name, cls, defaults)


@pytest.mark.parametrize(("spec", "got"), [("max_ngram=abc", "'abc'"), ("max_ngram=1.5", "1.5"),
                                           ("max_ngram=true", "True"), ("scale=1", "1")])
def test_a_method_spec_value_of_the_wrong_type_says_which_option_and_type(spec, got):
    option, _, _ = spec.partition("=")
    kind = "true or false" if option == "scale" else "an int"
    with pytest.raises(ConfigError, match=rf"^method option prompt_lookup\.{option} must be {kind}, got {got}$"):
        parse_methods(f"prompt_lookup:{spec}")


@pytest.mark.parametrize("value", ["abc", "3", 1.5, True, None])
def test_method_options_of_the_wrong_type_never_reach_the_constructor(value):
    with pytest.raises(ConfigError, match=rf"^method option prompt_lookup\.max_ngram must be an int, got {value!r}$"):
        build_method("prompt_lookup", options={"max_ngram": value})


def test_wrong_typed_verifier_and_controller_options_are_config_errors():
    with pytest.raises(ConfigError, match=r"^verifier option typical\.epsilon must be a number, got 'small'$"):
        build_method("prompt_lookup", do_sample=True, verifier="typical", verifier_options={"epsilon": "small"})
    with pytest.raises(ConfigError, match=r"^controller option adaptive\.initial must be an int, got 2\.5$"):
        build_method("prompt_lookup", controller="adaptive", controller_options={"initial": 2.5})
    with pytest.raises(ConfigError, match=r"^method option threshold\.threshold must be a number, got 'high'$"):
        registry.build("commit_policy", "threshold", threshold="high")


def test_values_that_fit_are_accepted():
    build_method("prompt_lookup", options={"max_ngram": 4, "scale": False})
    registry.build("commit_policy", "credit", power=1)  # an int is a number
    parse_methods("prompt_lookup:num_tokens=4,copy_input:near=2")


def test_unknown_options_are_still_refused():
    with pytest.raises(ConfigError, match=r"has no option\(s\) \['max_gram'\]"):
        build_method("prompt_lookup", options={"max_gram": 3})


class _Annotated:
    def __init__(self, mode: Literal["a", "b"] = "a", sizes: tuple[int, ...] = (1,), pair: tuple[int, str] = (1, "x"),
                 maybe: float | None = None, path: str = ".") -> None:
        pass


@pytest.mark.parametrize(("option", "value", "message"), [
    ("mode", "c", "one of 'a', 'b', got 'c'"),
    ("sizes", (1, "2"), "a list of ints, got (1, '2')"),
    ("sizes", 3, "a list of ints, got 3"),
    ("pair", (1, 2), "a list of 2 (an int, a string), got (1, 2)"),
    ("maybe", "x", "a number or null, got 'x'"),
])
def test_literal_tuple_and_optional_annotations(option, value, message):
    with pytest.raises(ConfigError) as error:
        registry.check_options("drafter", "annotated", _Annotated, {option: value})
    assert str(error.value) == f"method option annotated.{option} must be {message}"


@pytest.mark.parametrize(("option", "value"), [("mode", "b"), ("sizes", [2, 3]), ("pair", (2, "y")), ("maybe", None),
                                               ("maybe", 2), ("path", Path("/tmp"))])
def test_literal_tuple_optional_and_path_values_that_fit(option, value):
    registry.check_options("drafter", "annotated", _Annotated, {option: value})

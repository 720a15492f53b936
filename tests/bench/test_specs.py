"""Method specs `NAME[:KEY=VALUE...]`: parsing, validation against the registry, CLI errors."""

import pytest

from warpdecode.bench.specs import MethodSpec, parse_method, parse_methods, parse_value
from warpdecode.cli import main
from warpdecode.errors import ConfigError


@pytest.mark.parametrize("text, value", [("10", 10), ("-2", -2), ("0.5", 0.5), ("true", True), ("False", False),
                                         ("null", None), ("models/draft", "models/draft"), ("1e3", 1000.0)])
def test_parse_value(text, value):
    parsed = parse_value(text)
    assert parsed == value and type(parsed) is type(value)


def test_parse_methods_cli_form_puts_baseline_first():
    specs = parse_methods("prompt_lookup,draft_model:layers=10:num_tokens=4")
    assert specs == [MethodSpec("none"), MethodSpec("prompt_lookup"),
                     MethodSpec("draft_model", {"layers": 10, "num_tokens": 4})]
    assert [s.label for s in specs] == ["none", "prompt_lookup", "draft_model:layers=10:num_tokens=4"]


def test_parse_methods_keeps_one_listed_baseline_and_order():
    specs = parse_methods(["prompt_lookup:num_tokens=4", " none ", {"name": "draft_model", "model": "models/d"}])
    assert [s.label for s in specs] == ["none", "prompt_lookup:num_tokens=4", "draft_model:model=models/d"]
    assert specs[2].options == {"model": "models/d"}


def test_controller_and_verifier_keys_pick_components():
    spec = parse_methods("prompt_lookup:num_tokens=6:controller=adaptive")[1]
    assert spec.label == "prompt_lookup:num_tokens=6:controller=adaptive"
    method = spec.build(do_sample=False)
    assert type(method.controller).__name__ == "AdaptiveLength" and method.drafter.num_tokens == 6
    assert type(parse_methods("prompt_lookup:verifier=typical")[1].build(do_sample=False).verifier).__name__ == (
        "TypicalAcceptance")


def test_parse_method_strips_spaces():
    assert parse_method(" draft_model : layers = 3 ") == MethodSpec("draft_model", {"layers": 3})


@pytest.mark.parametrize(
    "value, message",
    [
        ("nope", "unknown drafter 'nope'"),
        ("draft_model:layer=1", "no option(s) ['layer']"),
        ("draft_model:layers", "'layers' is not KEY=VALUE"),
        ("draft_model:layers=", "'layers=' is not KEY=VALUE"),
        ("draft_model:layers=1:layers=2", "sets 'layers' twice"),
        ("prompt_lookup,,none", "empty method"),
        (":layers=1", "has no name"),
        ("prompt_lookup,prompt_lookup", "listed twice: prompt_lookup"),
        ("prompt_lookup:num_tokens=0", "num_tokens >= 1"),
        ("draft_model", "exactly one of model="),
        ([{"layers": 1}], "needs a 'name'"),
        ("prompt_lookup:controller=psychic", "unknown controller 'psychic'"),
        ("prompt_lookup:controller=3", "controller must be a name"),
    ],
)
def test_bad_specs_raise_config_error(value, message):
    with pytest.raises(ConfigError) as info:
        parse_methods(value)
    assert message in str(info.value)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--methods", "prompt_lookup:max_ngram"], "'max_ngram' is not KEY=VALUE"),
        (["--methods", "no_such_drafter"], "unknown drafter 'no_such_drafter'"),
        (["--methods", "medusa"], "drafter 'medusa' needs option(s) ['path'], e.g. medusa:path=..."),
        (["--prompts", "no_such_set"], "unknown prompt set 'no_such_set'"),
        (["--limit", "0"], "--limit must be >= 1"),
        (["--peers", "vllm"], "--peers must be one of auto, transformers, llama.cpp, none"),
        (["--method", "no_such_drafter"], "unknown drafter 'no_such_drafter'"),  # --method is read as --methods
        (["--backend", "bogus"], "--backends must list some of torch"),  # --backend is read as --backends
    ],
)
def test_cli_bad_input_is_one_line_exit_2(argv, message, tiny_model_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--model", str(tiny_model_dir), "--out", str(tmp_path), *argv])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2
    assert err.startswith("error:") and message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "results.json").exists()


@pytest.mark.parametrize(("argv", "normalised"), [
    (["bench", "--backend", "torch", "--method=none"], ["bench", "--backends", "torch", "--methods=none"]),
    (["generate", "--backends", "torch", "--methods", "x"], ["generate", "--backend", "torch", "--method", "x"]),
    (["regress", "p", "--backends=torch", "--method", "x"], ["regress", "p", "--backend=torch", "--methods", "x"]),
    (["export", "out", "--method", "hydra"], ["export", "out", "--method", "hydra"]),
])
def test_singular_and_plural_flags_are_read_as_the_commands_own(argv, normalised):
    from warpdecode.cli import _normalise_flags

    assert _normalise_flags(argv) == normalised

"""The command line refuses bad values with one `error:` line on stderr and exit status 2."""

from __future__ import annotations

import inspect
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from warpdecode.cli import main
from warpdecode.decoding.generate import generate
from warpdecode.models.checkpoint import load_pretrained


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int | str | None, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def assert_one_line_error(code: int | str | None, err: str, message: str) -> None:
    assert code == 2 and "Traceback" not in err
    assert err.startswith("error:") and len(err.strip().splitlines()) == 1
    assert message in err, err


@pytest.mark.parametrize(("method", "message"), [
    ("prompt_lookup:max_ngram=abc", "method option prompt_lookup.max_ngram must be an int, got 'abc'"),
    ("prompt_lookup:max_ngram=1.5", "method option prompt_lookup.max_ngram must be an int, got 1.5"),
])
def test_generate_method_options_of_the_wrong_type(method, message, tiny_model_dir, capsys):
    code, _, err = run(["generate", "--model", str(tiny_model_dir), "--prompt", "x", "--method", method], capsys)
    assert_one_line_error(code, err, message)


@pytest.mark.parametrize("flags", [["--controller", "adaptive:initial=four"],
                                   ["--controller", "adaptive", "--controller-options", '{"initial": "four"}']])
def test_generate_controller_options_of_the_wrong_type(flags, tiny_model_dir, capsys):
    code, _, err = run(["generate", "--model", str(tiny_model_dir), "--prompt", "x", "--method", "prompt_lookup",
                        *flags], capsys)
    assert_one_line_error(code, err, "controller option adaptive.initial must be an int, got 'four'")


def test_bench_method_spec_of_the_wrong_type(tiny_model_dir, tmp_path, capsys):
    code, _, err = run(["bench", "--model", str(tiny_model_dir), "--methods", "prompt_lookup:max_ngram=abc",
                        "--out", str(tmp_path / "bench")], capsys)
    assert_one_line_error(code, err, "method option prompt_lookup.max_ngram must be an int, got 'abc'")


def _commands_with_threads() -> list[str]:
    """Every subcommand (`cli.command_functions`) that takes `--threads`."""
    from warpdecode.cli import command_functions

    return sorted(f.__name__ for f in command_functions() if "threads" in inspect.signature(f).parameters)


def test_the_thread_commands_are_found():
    assert {"generate", "bench", "self_chat"} <= set(_commands_with_threads())


@pytest.mark.parametrize("threads", ["0", "-2", "99999999999999999999"])
@pytest.mark.parametrize("command", _commands_with_threads())
def test_threads_out_of_range_is_a_one_line_error(command, threads, tiny_model_dir, tmp_path, capsys):
    from warpdecode import commands

    argv = [command]
    for p in inspect.signature(getattr(commands, command)).parameters.values():
        if p.default is inspect.Parameter.empty:  # the required arguments, with harmless values
            argv += [str(tmp_path / "out")] if p.kind is p.POSITIONAL_OR_KEYWORD else [f"--{p.name}", "x"]
    argv += ["--model", str(tiny_model_dir), "--threads", threads]
    code, _, err = run(argv, capsys)
    assert_one_line_error(code, err, f"--threads must be between 1 and 4096 (or left out for torch's choice), got {threads}")
    assert not (tmp_path / "out").exists()


def _model_copy(tiny_model_dir: Path, out: Path, *, config: dict[str, Any] | None = None,
                tokenizer_config: dict[str, Any] | None = None) -> Path:
    """A copy of the tiny model directory with some config.json / tokenizer_config.json keys replaced."""
    shutil.copytree(tiny_model_dir, out)
    for name, changes in (("config.json", config), ("tokenizer_config.json", tokenizer_config)):
        path = out / name
        path.write_text(json.dumps(json.loads(path.read_text()) | (changes or {})))
    return out


def test_an_empty_prompt_without_bos_or_chat_template_is_a_one_line_error(tiny_model_dir, capsys):
    code, _, err = run(["generate", "--model", str(tiny_model_dir), "--prompt", "", "--chat", "false"], capsys)
    assert_one_line_error(code, err, "the prompt is empty: it gives no tokens and this model has no BOS token")


@pytest.mark.parametrize("change", ["bos_token_id", "chat_template"])
def test_an_empty_prompt_generates_from_the_bos_token_or_the_chat_template(change, tiny_model_dir, tmp_path, capsys):
    if change == "bos_token_id":
        model = _model_copy(tiny_model_dir, tmp_path / "model", config={"bos_token_id": 5})
        expected: list[int] = [5]
    else:
        model = _model_copy(tiny_model_dir, tmp_path / "model", tokenizer_config={
            "chat_template": "{% for m in messages %}user: {{ m['content'] }}\n{% endfor %}assistant:"})
        expected = load_pretrained(model)[1].encode("user: \nassistant:")
    main(["generate", "--model", str(model), "--prompt", "", "--max-new-tokens", "3", "--json"])
    out = json.loads(capsys.readouterr().out)
    target, _ = load_pretrained(model)
    assert out["token_ids"] == generate(target, None, expected, max_new_tokens=3).token_ids


def test_generate_in_half_precision(tiny_model_dir, capsys):
    """--dtype bf16 loads the model in bf16 (keeping its checkpoint's fingerprint); on the tiny model its
    greedy tokens are fp32's."""
    import torch

    from warpdecode.commands.common import _load_target

    fp32, _, _, _ = _load_target(str(tiny_model_dir), None, "torch", "cpu", None, "fp32")
    bf16, _, _, _ = _load_target(str(tiny_model_dir), None, "torch", "cpu", None, "bf16")
    assert bf16.embed.weight.dtype == torch.bfloat16 and bf16.fingerprint() == fp32.fingerprint()
    outputs = {}
    for dtype in ("fp32", "bf16"):
        main(["generate", "--model", str(tiny_model_dir), "--prompt", "for i in", "--max-new-tokens", "6",
              "--dtype", dtype, "--json"])
        outputs[dtype] = json.loads(capsys.readouterr().out)["token_ids"]
    assert len(outputs["bf16"]) == 6 and outputs["bf16"] == outputs["fp32"]


@pytest.mark.parametrize("dtype", ["q8", "q4"])
def test_generate_from_quantized_weights(tiny_model_dir, capsys, dtype):
    """--dtype q8|q4 decodes from the weight-only quantised copy alone (no dense linear weights), keeping the
    checkpoint's fingerprint; prompt lookup on it reproduces its plain decoding."""
    from warpdecode.commands.common import _load_target

    fp32, _, _, _ = _load_target(str(tiny_model_dir), None, "torch", "cpu", None, "fp32")
    target, _, _, _ = _load_target(str(tiny_model_dir), None, "torch", "cpu", None, dtype)
    assert target.weight_bits == int(dtype[1:]) and target.fingerprint() == fp32.fingerprint()
    assert target.blocks[0].mlp.down_proj.weight.numel() == 0
    outputs = {}
    for method in ("none", "prompt_lookup"):
        main(["generate", "--model", str(tiny_model_dir), "--prompt", "for i in", "--max-new-tokens", "6",
              "--dtype", dtype, "--method", method, "--json"])
        outputs[method] = json.loads(capsys.readouterr().out)["token_ids"]
    assert len(outputs["none"]) == 6 and outputs["prompt_lookup"] == outputs["none"]


def test_native_dtype_needs_a_gguf(tiny_model_dir, capsys):
    code, _, err = run(["generate", "--model", str(tiny_model_dir), "--prompt", "x", "--dtype", "native"], capsys)
    assert_one_line_error(code, err, "--dtype native reads a GGUF file or a named model")


@pytest.mark.parametrize(("extra", "message"), [
    (["--dtype", "fp8"], "--dtype must be one of fp32, bf16, fp16, q8, q4, native, got 'fp8'"),
])
def test_bad_dtype_is_one_line(extra, message, tiny_model_dir, capsys):
    code, _, err = run(["generate", "--model", str(tiny_model_dir), "--prompt", "x", *extra], capsys)
    assert_one_line_error(code, err, message)

"""The `warpdecode` command line: convert, generate, and one-line errors for bad input."""

import json
import subprocess
import sys

import pytest
import torch

from warpdecode.cli import main
from warpdecode.datamodules.prompt_sources import jsonl_prompts, load_prompts
from warpdecode.models.checkpoint import load_pretrained


def run(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def test_generate_json(tiny_model_dir, capsys):
    main(["generate", "--model", str(tiny_model_dir), "--prompt", "print(", "--max-new-tokens", "6", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["stats"]["new_tokens"] == len(out["token_ids"]) <= 6
    _model, tokenizer = load_pretrained(tiny_model_dir)
    assert out["text"] == tokenizer.decode(out["token_ids"])
    assert set(out["stats"]) >= {"new_tokens", "target_forwards", "seconds", "tokens_per_second"}


def test_generate_stop_bad_words_and_eos_token_id(tiny_model_dir, capsys):
    """Prompt "hello": the tiny model answers "bobobobobobobo" then a newline and d's (tests/decoding/test_hooks.py)."""
    base = ["generate", "--model", str(tiny_model_dir), "--prompt", "hello", "--chat", "false", "--max-new-tokens", "12",
            "--json"]
    main([*base, "--stop", '["obob", "\\n"]'])
    out = json.loads(capsys.readouterr().out)
    assert out["text"] == "b" and out["finish_reason"] == "stop"
    main([*base, "--bad-words", "bo,x"])
    assert "bo" not in json.loads(capsys.readouterr().out)["text"]
    main([*base, "--eos-token-id", "[269]"])
    out = json.loads(capsys.readouterr().out)
    assert out["token_ids"] == [269] and out["finish_reason"] == "eos"


def test_generate_streams_text(tiny_model_dir, capsys):
    main(["generate", "--model", str(tiny_model_dir), "--prompt", "for i", "--max_new_tokens", "5", "--json", "false"])
    captured = capsys.readouterr()
    assert "tok/s" in captured.err and captured.out.endswith("\n")


def test_convert_hf_directory_roundtrip(tiny_model_dir, tmp_path, capsys):
    main(["convert", str(tiny_model_dir), str(tmp_path / "out")])
    a, _ = load_pretrained(tiny_model_dir)
    b, _ = load_pretrained(tmp_path / "out")
    tokens = torch.tensor([[1, 2, 3, 4]])
    assert torch.equal(a(tokens).logits, b(tokens).logits)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "--model", "no-such-model", "--prompt", "x"], "not found"),
        (["generate", "--prompt", "x", "--temperature", "0.5", "--top-p", "2"], "--top-p"),
        (["generate", "--prompt", "x", "--temperature", "-1"], "--temperature"),
        (["generate", "--prompt", "x", "--max-new-tokens", "0"], "--max-new-tokens"),
        (["convert", "/nonexistent/ckpt", "/tmp/out"], "not a model directory"),
        (["generate", "--prompt", "x", "--backend", "cudagraphs"], "needs the model on a CUDA device"),
    ],
)
def test_bad_input_is_one_line_error(argv, message, tiny_model_dir, capsys):
    if argv[0] == "generate" and "--model" not in argv:
        argv = argv[:1] + ["--model", str(tiny_model_dir)] + argv[1:]
    code, _, err = run(argv, capsys)
    assert code == 2
    assert message in err and "Traceback" not in err
    assert err.strip().startswith("error:") and len(err.strip().splitlines()) == 1


def test_prompt_longer_than_context(tiny_model_dir, capsys):
    code, _, err = run(["generate", "--model", str(tiny_model_dir), "--prompt", "hello world " * 300], capsys)
    assert code == 2 and "context is 256 tokens" in err


def test_corrupt_checkpoint(tiny_model_dir, tmp_path, capsys):
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in tiny_model_dir.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    code, _, err = run(["generate", "--model", str(broken), "--prompt", "x"], capsys)
    assert code == 2 and "corrupt" in err and "Traceback" not in err


def test_console_script_reports_errors_without_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "warpdecode.cli", "generate", "--model", str(tmp_path),
                           "--prompt", "x"], check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "no config.json" in proc.stderr and "Traceback" not in proc.stderr


def test_methods_lists_registry_with_flags(capsys):
    main(["methods", "--json"])
    rows = json.loads(capsys.readouterr().out)
    by_name = {(r["kind"], r["name"]): r for r in rows}
    assert by_name[("verifier", "greedy")]["lossless"] is True
    assert by_name[("verifier", "typical")]["lossless"] is False
    assert by_name[("drafter", "prompt_lookup")]["options"]["num_tokens"]["default"] == 10
    assert {("drafter", "none"), ("drafter", "draft_model"), ("controller", "fixed")} <= set(by_name)


def test_generate_with_method_matches_plain_greedy(tiny_model_dir, capsys):
    base = ["generate", "--model", str(tiny_model_dir), "--prompt", "for i in range(10): for i in", "--chat", "false",
            "--max-new-tokens", "12", "--json"]
    main(base)
    plain = json.loads(capsys.readouterr().out)
    main(base + ["--method", "draft_model:layers=1:num_tokens=3"])
    captured = capsys.readouterr()
    drafted = json.loads(captured.out)
    assert captured.err == ""  # the spec form is not deprecated
    assert drafted["token_ids"] == plain["token_ids"]
    steps = drafted["stats"]["accepted_per_step"]
    assert drafted["stats"]["target_forwards"] == len(steps)
    assert drafted["stats"]["tau"] == pytest.approx((sum(steps) + len(steps)) / len(steps))


@pytest.mark.parametrize(
    "extra, message",
    [(["--method", "nope"], "unknown drafter 'nope'"),
     (["--method", "draft_model:layer=1"], "no option(s) ['layer']"),
     (["--method", "draft_model:layers"], ("method spec 'draft_model:layers': 'layers' is not KEY=VALUE; "
                                           "expected NAME[:KEY=VALUE...]")),
     (["--method", "prompt_lookup,none"], ("--method names one method, got 'prompt_lookup,none'; "
                                           "`warpdecode bench --methods` compares several")),
     (["--method", "prompt_lookup:verifier=typical", "--verifier", "greedy"], "the verifier is named twice"),
     (["--verifier", "typical:bogus=1"], "verifier 'typical' has no option(s) ['bogus']; options: "),
     (["--controller", "adaptive:initial=four"], "controller option adaptive.initial must be an int, got 'four'"),
     (["--backend", "torch,onnxruntime"], "--backend names one backend, got 'torch,onnxruntime'"),
     (["--verifier", "speculative_sampling"], "needs sampling")],
)
def test_bad_method_is_one_line_error(extra, message, tiny_model_dir, capsys):
    code, _, err = run(["generate", "--model", str(tiny_model_dir), "--prompt", "x", *extra], capsys)
    assert code == 2 and message in err and "Traceback" not in err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "old, new, warning",
    [(["--method", "draft_model", "--method-options", '{"layers": 1, "num_tokens": 3}'],
      ["--method", "draft_model:layers=1:num_tokens=3"],
      "warning: --method-options is deprecated; write --method draft_model:layers=1:num_tokens=3"),
     (["--method", "prompt_lookup", "--controller", "adaptive", "--controller-options", '{"initial": 2}'],
      ["--method", "prompt_lookup", "--controller", "adaptive:initial=2"],
      "warning: --controller-options is deprecated; write --controller adaptive:initial=2"),
     (["--method", "prompt_lookup", "--controller-options", '{"max_nodes": 3}'],
      ["--method", "prompt_lookup:controller=fixed:controller.max_nodes=3"],
      "warning: --controller-options is deprecated; write --controller fixed:max_nodes=3"),
     (["--method", "prompt_lookup:num_tokens=2", "--temperature", "0.5", "--seed", "1", "--verifier", "typical",
       "--verifier-options", '{"epsilon": 0.2}'],
      ["--method", "prompt_lookup:num_tokens=2", "--temperature", "0.5", "--seed", "1",
       "--verifier", "typical:epsilon=0.2"],
      "warning: --verifier-options is deprecated; write --verifier typical:epsilon=0.2"),
     (["--backends", "torch"], ["--backend", "torch"], None),
     (["--methods", "prompt_lookup"], ["--method", "prompt_lookup"], None)],
)
def test_old_method_forms_still_work_with_one_warning_line(old, new, warning, tiny_model_dir, capsys):
    base = ["generate", "--model", str(tiny_model_dir), "--prompt", "for i in range(10): for i in", "--chat", "false",
            "--max-new-tokens", "8", "--json"]
    main(base + new)
    expected = capsys.readouterr()
    main(base + old)
    got = capsys.readouterr()
    assert json.loads(got.out)["token_ids"] == json.loads(expected.out)["token_ids"]
    assert expected.err == "" and got.err == ("" if warning is None else warning + "\n")


def test_old_method_options_with_a_bad_option_is_still_one_line(tiny_model_dir, capsys):
    code, _, err = run(["generate", "--model", str(tiny_model_dir), "--prompt", "x", "--method", "draft_model",
                        "--method-options", '{"layer": 1}'], capsys)
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert "no option(s) ['layer']" in err


def test_generate_decodes_a_diffusion_lm_under_a_commit_policy(dlm_dir, capsys):
    main(["generate", "--model", str(dlm_dir), "--prompt", "copy:ab=", "--max-new-tokens", "14", "--method",
          "threshold:threshold=0.5:block_length=7", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["stats"]["steps"] == len(out["stats"]["committed_per_step"]) <= 14
    assert sum(out["stats"]["committed_per_step"]) == 14  # every position of the answer region decoded once
    main(["generate", "--model", str(dlm_dir), "--prompt", "copy:ab=", "--max-new-tokens", "14", "--method",
          "fixed:block_length=7:kv_cache=dual", "--json"])
    cached = json.loads(capsys.readouterr().out)
    assert cached["stats"]["steps"] == 14 and sum(cached["stats"]["committed_per_step"]) == 14
    main(["generate", "--model", str(dlm_dir), "--prompt", "copy:ab=", "--max-new-tokens", "14", "--method", "fixed",
          "--method-options", '{"block_length": 7, "kv_cache": "dual"}', "--json"])
    old = capsys.readouterr()
    assert json.loads(old.out)["token_ids"] == cached["token_ids"]
    assert old.err == "warning: --method-options is deprecated; write --method fixed:block_length=7:kv_cache=dual\n"
    code, _, err = run(["generate", "--model", str(dlm_dir), "--prompt", "x", "--method", "fixed:kv_cache=all"], capsys)
    assert code == 2 and "kv_cache must be one of" in err
    sampled = []
    for _ in range(2):
        main(["generate", "--model", str(dlm_dir), "--prompt", "copy:ab=", "--max-new-tokens", "14", "--temperature",
              "1.5", "--seed", "3", "--json"])
        sampled.append(json.loads(capsys.readouterr().out))
    assert sampled[0]["token_ids"] == sampled[1]["token_ids"] and sampled[0]["stats"]["steps"] == 14  # seeded
    code, _, err = run(["generate", "--model", str(dlm_dir), "--prompt", "x", "--temperature", "0.5", "--top-p", "0.9"],
                       capsys)
    assert code == 2 and "temperature only" in err


def test_generate_constrains_a_diffusion_lm(dlm_dir, tmp_path, capsys):
    import re

    for flags, valid in ((["--regex", "[0-9]{2,4}"], lambda t: re.fullmatch("[0-9]{2,4}", t)),
                         (["--choice", "yes,no"], lambda t: t in ("yes", "no"))):
        main(["generate", "--model", str(dlm_dir), "--prompt", "copy:ab=", "--max-new-tokens", "14", "--method",
              "threshold:threshold=0.5", *flags, "--json"])
        out = json.loads(capsys.readouterr().out)
        assert valid(out["text"]) and out["finish_reason"] == "eos", out
    grammar = tmp_path / "brackets.lark"
    grammar.write_text('start: "(" x* ")"\nx: "(" x* ")" | "[" x* "]"')
    main(["generate", "--model", str(dlm_dir), "--prompt", "close:([=", "--max-new-tokens", "14", "--grammar",
          str(grammar), "--json"])
    text = json.loads(capsys.readouterr().out)["text"]
    assert text.startswith("(") and set(text) <= set("()[]")
    code, _, err = run(["generate", "--model", str(dlm_dir), "--prompt", "x", "--regex", "[0-9]",
                        "--max-new-tokens", "8", "--method", "free_draft"], capsys)
    assert code == 2 and "takes no constraint" in err
    schema = tmp_path / "keyed.json"  # a key needs '"', which the task alphabet lacks
    schema.write_text('{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}')
    code, _, err = run(["generate", "--model", str(dlm_dir), "--prompt", "x", "--max-new-tokens", "8",
                        "--json-schema", str(schema)], capsys)
    assert code == 2 and "vocabulary cannot write" in err


def test_prompts_writes_a_prompt_set_the_recipes_read(tmp_path, capsys):
    out = tmp_path / "prompts.jsonl"
    main(["prompts", str(out), "--sources", "gsm8k_train,writing", "--max-prompts", "5"])
    assert capsys.readouterr().out.strip() == f"wrote 5 prompts to {out}"
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == 5 and all(line["messages"][-1]["role"] == "user" for line in lines)
    assert [p.messages for p in jsonl_prompts(out)] == [p.messages for p in load_prompts(["gsm8k_train", "writing"], 5, 0)]

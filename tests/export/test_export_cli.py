"""`warpdecode export`, `generate --package`, `regress` and `bench --package` end to end on the tiny model."""

import json
import shutil

import pytest
from tiny_models import ppd_package

from warpdecode.bench.harness import run_bench
from warpdecode.bench.prompts import BenchPrompt
from warpdecode.bench.results import BenchConfig
from warpdecode.cli import main
from warpdecode.models.checkpoint import load_pretrained

pytestmark = pytest.mark.usefixtures("single_thread")


def run(argv, capsys):
    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def package(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "pkg"
    main(["export", str(out), "--model", str(tiny_model_dir), "--quantize", "int4"])
    return out


def generate_json(capsys, *args):
    code, out, err = run(["generate", "--prompt", "print(", "--max-new-tokens", "8", "--json", *args], capsys)
    assert code == 0, err
    return json.loads(out)


def test_package_generates_what_the_model_generates(package, tiny_model_dir, capsys):
    reference = generate_json(capsys, "--model", str(tiny_model_dir))["token_ids"]
    for backend in ("onnxruntime", "onnxruntime-portable", "torch"):
        assert generate_json(capsys, "--package", str(package), "--backend", backend)["token_ids"] == reference
    lookup = generate_json(capsys, "--package", str(package), "--backend", "onnxruntime", "--method", "prompt_lookup")
    assert lookup["token_ids"] == reference
    assert len(generate_json(capsys, "--package", str(package), "--backend", "onnxruntime-int4")["token_ids"]) == 8


@pytest.mark.parametrize(("extra", "message"), [
    (["--model", "x"], "give --model or --package, not both"),
    (["--backend", "onnxruntime-int8"], "has no int8 graph; export it with --quantize int8"),
    (["--backend", "tensorrt"], "TensorRT: use --backend onnxruntime --device tensorrt"),
])
def test_bad_package_requests_are_one_line_errors(package, capsys, extra, message):
    code, _, err = run(["generate", "--package", str(package), "--prompt", "x", *extra], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_onnxruntime_without_package_is_refused(tiny_model_dir, capsys):
    code, _, err = run(["generate", "--model", str(tiny_model_dir), "--prompt", "x", "--backend", "onnxruntime"], capsys)
    assert code == 2 and "add --package DIR" in err


def test_tampered_package_is_a_one_line_error(package, tmp_path, capsys):
    copy = shutil.copytree(package, tmp_path / "copy")
    (copy / "tokenizer.json").write_text((copy / "tokenizer.json").read_text().replace('"', "'", 1))
    code, _, err = run(["generate", "--package", str(copy), "--prompt", "x"], capsys)
    assert code == 2 and "tokenizer.json does not match its sha256" in err


def test_regress_records_then_checks(package, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "print("}\n{"prompt": "for i in"}\n')
    record = tmp_path / "record.json"
    code, out, err = run(["regress", str(package), "--record", str(record), "--prompts", str(prompts),
                          "--methods", "none,prompt_lookup:num_tokens=3", "--max-new-tokens", "8"], capsys)
    assert code == 0, err
    assert "prompt_lookup:num_tokens=3" in out and record.is_file()
    code, out, _ = run(["regress", str(package), "--check", str(record)], capsys)
    assert code == 0 and "0 regression(s)" in out
    data = json.loads(record.read_text())
    data["results"]["none"][1]["token_ids"][0] += 1
    record.write_text(json.dumps(data))
    code, out, _ = run(["regress", str(package), "--check", str(record)], capsys)
    assert code == 1 and "REGRESSION none, prompt 1: output differs from token 0 on" in out


def test_bench_runs_every_method_on_every_backend(package):
    config = BenchConfig(package=str(package), backends="onnxruntime,onnxruntime-int4", peers="none",
                         max_new_tokens=6, warmup_tokens=0)
    result = run_bench(config, methods="none,prompt_lookup", prompts=[BenchPrompt("p", "code", "print(", None)],
                       progress=False)
    rows = {r.label: r for r in result.rows}
    assert set(rows) == {"none", "none@onnxruntime", "prompt_lookup@onnxruntime", "none@onnxruntime-int4",
                         "prompt_lookup@onnxruntime-int4"}
    assert not rows["none@onnxruntime-int4"].lossless and rows["prompt_lookup@onnxruntime"].lossless
    identical = {m.row: m.identical for m in result.measurements}
    assert identical["none@onnxruntime"] and identical["prompt_lookup@onnxruntime"]
    assert "--package" in config.command() and "--backends onnxruntime,onnxruntime-int4" in config.command()


def test_bench_lists_what_a_backend_cannot_run_as_not_run(package, tiny_model_dir, tmp_path):
    """PPD's prompt rows are input embeddings: its row runs on torch and on the full-precision graph
    (its embeds variant, shared with the other rows of that backend), and is listed, with the
    reason, for a quantised graph."""
    model, _ = load_pretrained(tiny_model_dir)
    ppd = ppd_package(model, tmp_path / "ppd")
    config = BenchConfig(package=str(package), backends="torch,onnxruntime,onnxruntime-int4", peers="none",
                         max_new_tokens=6, warmup_tokens=0)
    result = run_bench(config, methods=f"none,ppd:path={ppd}", prompts=[BenchPrompt("p", "code", "print(", None)],
                       progress=False)
    labels = [r.label for r in result.rows]
    ppd_label = labels[1]
    assert labels == ["none", ppd_label, "none@onnxruntime", f"{ppd_label}@onnxruntime", "none@onnxruntime-int4"]
    (skipped, reason), = result.skipped_rows.items()
    assert skipped == f"{ppd_label}@onnxruntime-int4" and "use the torch backend" in reason
    assert all(m.identical for m in result.measurements if not m.row.endswith("int4"))


def test_a_packaged_judge_needs_no_path(tiny_model_dir, tmp_path, capsys):
    from tiny_models import judge_package

    from warpdecode.models.checkpoint import load_pretrained

    model, _ = load_pretrained(tiny_model_dir)
    judge = judge_package(model, tmp_path / "judge", bias=-10.0)  # approves nothing: greedy's output
    main(["export", str(tmp_path / "pkg"), "--model", str(tiny_model_dir), "--drafters", judge,
          "--method", "prompt_lookup:num_tokens=3"])
    capsys.readouterr()
    reference = generate_json(capsys, "--model", str(tiny_model_dir))["token_ids"]
    judged = generate_json(capsys, "--package", str(tmp_path / "pkg"), "--method", "int4_self", "--verifier", "judge")
    assert judged["token_ids"] == reference
    default = generate_json(capsys, "--package", str(tmp_path / "pkg"))  # the exported default method spec
    assert default["token_ids"] == reference and default["stats"]["target_forwards"] < len(reference)


@pytest.mark.parametrize(("method", "message"), [
    ("bogus:num_tokens=3", "unknown drafter 'bogus'"),
    ("eagle:bogus=1", "drafter 'eagle' has no option(s) ['bogus']; options: "),
    ("prompt_lookup:num_tokens=many", "method option prompt_lookup.num_tokens must be an int, got 'many'"),
    ("prompt_lookup,none", "--method names one method"),
])
def test_export_refuses_a_bad_default_method_before_exporting(method, message, tiny_model_dir, tmp_path, capsys):
    code, _, err = run(["export", str(tmp_path / "pkg"), "--model", str(tiny_model_dir), "--method", method], capsys)
    assert code == 2 and err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "pkg").exists()

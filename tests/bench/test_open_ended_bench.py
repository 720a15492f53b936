"""Open-ended generation evaluation: documents, run specs, scoring on the tiny model."""

from __future__ import annotations

import json

import pytest

from warpdecode.bench import open_ended
from warpdecode.bench.open_ended import RunSpec, window
from warpdecode.errors import ConfigError

pytestmark = pytest.mark.usefixtures("single_thread")


def test_window_starts_at_a_line_after_a_third_and_keeps_the_true_continuation():
    text = "".join(f"line {i:03d} of the document\n" for i in range(200))
    doc = window("d", text, prefix_chars=100, reference_chars=300)
    assert doc is not None and text.index(doc.prefix + doc.reference) >= len(text) // 3
    assert doc.prefix.endswith("\n") and doc.prefix.startswith("line ") and len(doc.prefix) <= 100
    assert len(doc.reference) == 300
    assert window("short", "a\nb\n" * 10, prefix_chars=100, reference_chars=300) is None


@pytest.mark.parametrize("spec, message", [
    ("greedy", "MODEL:DECODING"), ("m:beam", "expected greedy"), ("m:top_p=1.5", "top_p=P"),
    ("m:temperature=0", "temperature=T"), ("m:top_p=x", "top_p=P"),
])
def test_bad_run_specs_are_config_errors(spec, message):
    with pytest.raises(ConfigError, match=message):
        RunSpec.parse(spec)


def test_specs_parse_paths_with_colons_and_decodings():
    spec = RunSpec.parse("C:/models/x:top_p=0.9")
    assert (spec.model, spec.decoding) == ("C:/models/x", "top_p=0.9")
    assert spec.sampling(spec.decoding, seed=3).top_p == 0.9 and spec.sampling("greedy", 0).do_sample is False


def test_runs_score_continuations_and_write_results(tiny_model_dir, tmp_path):
    docs_path = tmp_path / "docs.jsonl"
    text = "".join("print('hello world')\nfor i in range(10):\n    pass\n" for _ in range(40))
    docs_path.write_text("".join(json.dumps({"text": text.replace("hello", f"hello{i}")}) + "\n" for i in range(4)))
    specs = [RunSpec.parse(f"{tiny_model_dir}:greedy"), RunSpec.parse(f"{tiny_model_dir}:top_p=0.9")]
    rows = open_ended.run(specs, documents_path=str(docs_path), limit=3, max_new_tokens=40, seed=0,
                          batch_size=2, out=tmp_path / "out")
    greedy, sampled = rows
    for row in rows:
        assert row["new_tokens"] == 3 * 40 and len(row["samples"]) == 3
        assert 0 < row["distinct_1"] <= 1 and 0 <= row["rep_4"] <= 1 and 0 < row["ttr"] <= 1
        assert row["entropy"] >= 0 and 0 < row["top1_prob"] <= 1 and row["held_out_ppl"] > 1
        scorable = sum(len(s["continuation"].split()) >= 4 for s in row["samples"])
        assert (row["self_bleu_4"] is None) == (scorable < 2)
    assert greedy["held_out_ppl"] == sampled["held_out_ppl"]  # same model, same references
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["run"] for r in saved["runs"]] == [s.name for s in specs]
    report = (tmp_path / "out" / "results.md").read_text()
    assert report.startswith("Open-ended continuations: 3 documents") and report.count("\n") == 6  # header, blank, table of 2 runs
    again = open_ended.run(specs[:1], documents_path=str(docs_path), limit=3, max_new_tokens=40, seed=0,
                           batch_size=3, out=None)
    assert again[0]["samples"] == greedy["samples"]  # greedy is deterministic and batch-independent


def test_too_few_documents_is_a_config_error(tmp_path):
    docs_path = tmp_path / "docs.jsonl"
    docs_path.write_text(json.dumps({"text": "too short"}) + "\n")
    with pytest.raises(ConfigError, match="long enough"):
        open_ended.documents(str(docs_path), limit=1)
    docs_path.write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(ConfigError, match="expected"):
        open_ended.documents(str(docs_path), limit=1)
    with pytest.raises(ConfigError, match="not found"):
        open_ended.documents(str(tmp_path / "missing.jsonl"), limit=1)

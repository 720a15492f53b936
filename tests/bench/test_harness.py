"""End to end: `warpdecode bench` on a tiny random model writes results.json, results.md and a PNG."""

import json
import struct
from dataclasses import asdict

import pytest
import yaml

from warpdecode.bench.harness import run_bench
from warpdecode.bench.prompts import BenchPrompt, load_prompts
from warpdecode.bench.report import load, markdown, overall_table
from warpdecode.bench.results import BenchConfig
from warpdecode.cli import main
from warpdecode.decoding.generate import encode_prompt
from warpdecode.models.checkpoint import load_pretrained

pytestmark = pytest.mark.usefixtures("single_thread")

METHODS = ["none", "prompt_lookup:num_tokens=4", "draft_model:layers=1:num_tokens=3"]
PEERS = ["transformers", "transformers/prompt_lookup:num_tokens=4", "transformers/draft_model:layers=1:num_tokens=3"]
MAX_NEW = 8


@pytest.fixture(scope="module")
def bench_out(tiny_model_dir, tmp_path_factory):
    """One CLI run; the methods come from a YAML config (a spec string and a mapping)."""
    out = tmp_path_factory.mktemp("bench")
    config = out / "bench.yaml"
    config.write_text(yaml.safe_dump({"methods": ["prompt_lookup:num_tokens=4",
                                                  {"name": "draft_model", "layers": 1, "num_tokens": 3}]}))
    main(["bench", "--config", str(config), "--model", str(tiny_model_dir), "--prompts", "spec_bench", "--limit", "1",
          "--max-new-tokens", str(MAX_NEW), "--threads", "1", "--warmup-tokens", "2", "--out", str(out / "run")])
    return out / "run"


def test_results_json_rows_and_numbers(bench_out, tiny_model_dir):
    data = json.loads((bench_out / "results.json").read_text())
    assert [r["label"] for r in data["rows"]] == METHODS + PEERS
    assert set(data["machine"]) >= {"cpu", "torch", "torch_threads", "date", "transformers"}
    assert data["machine"]["torch_threads"] == 1
    # prompts that do not fit the context with the generation budget are skipped and listed
    model, tokenizer = load_pretrained(tiny_model_dir)
    prompts = load_prompts("spec_bench", limit=1)
    too_long = [p.id for p in prompts if len(encode_prompt(tokenizer, p.text, chat=p.chat)) + MAX_NEW > model.config.max_seq_len]
    assert data["skipped_too_long"] == too_long and len(too_long) > 0
    measured = [m for m in data["measurements"] if m["row"] == "none"]
    assert len(data["measurements"]) == 6 * len(measured) == 6 * (13 - len(too_long))
    # aggregates are ratios of totals; tau and alpha sum over verify forwards
    for agg in (a for a in data["aggregates"] if a["category"] == "all"):
        ms = [m for m in data["measurements"] if m["row"] == agg["row"]]
        assert agg["tokens_per_second"] == pytest.approx(sum(m["new_tokens"] for m in ms) / sum(m["seconds"] for m in ms))
        if agg["row"] in METHODS:
            steps = sum(m["target_forwards"] for m in ms)
            assert agg["tau"] == pytest.approx((sum(m["accepted"] for m in ms) + steps) / steps)
            assert agg["identical"] == agg["prompts"] == len(measured)  # lossless at temperature 0
        else:
            assert agg["tau"] is None and agg["time_to_first_token"] is None
    assert all(m["new_tokens"] == len(m["token_ids"]) <= MAX_NEW for m in data["measurements"])
    assert all(0 < m["draft_seconds"] < m["seconds"] for m in data["measurements"] if m["row"] in METHODS[1:])
    assert all(m["draft_seconds"] is None for m in data["measurements"] if m["row"] not in METHODS)


def test_baseline_speedup_is_exactly_one(bench_out):
    data = json.loads((bench_out / "results.json").read_text())
    baseline = [a for a in data["aggregates"] if a["row"] == "none"]
    assert len(baseline) == len(data["categories"]) + 1
    assert all(a["speedup"] == a["median_speedup"] == 1.0 for a in baseline)
    assert all(a["tau"] == 1.0 and a["acceptance_rate"] is None for a in baseline)
    peers = [a for a in data["aggregates"] if a["row"] == "transformers"]
    assert all(a["speedup_vs_transformers"] == 1.0 for a in peers)
    assert all(a["speedup_vs_transformers"] is None for a in data["aggregates"] if a["row"] in METHODS)


def test_results_markdown_table(bench_out):
    text = (bench_out / "results.md").read_text()
    lines = text.splitlines()
    header = ("| method | tok/s | decode tok/s | speedup | median speedup | τ | τ w/o bonus | α | TTFT ms | peak MiB "
              "| identical | agreement | vs transformers |")
    assert lines.count(header) == 1
    rows = {line.split(" | ")[0]: line.split(" | ") for line in lines[lines.index(header) + 2:] if line.startswith("| `")}
    assert list(rows) == [f"| `{label}`" for label in METHODS + PEERS]
    assert rows["| `none`"][3:6] == ["1.00x", "1.00x", "1.00"] and rows["| `none`"][7] == "–"
    assert all(rows[f"| `{label}`"][10] == "yes" and rows[f"| `{label}`"][11] == "–" for label in METHODS)
    assert all(float(rows[f"| `{label}`"][2]) > 0 for label in METHODS)  # decode tok/s: ours know their first token
    assert rows["| `transformers`"][2] == "–"
    assert rows["| `transformers`"][-1] == "1.00x |"
    assert "--methods none,prompt_lookup:num_tokens=4,draft_model:layers=1:num_tokens=3" in text
    assert "| **all** | 10 |" in text and "prompt(s) skipped" in text


def test_median_speedup_and_report_reload(bench_out):
    data = json.loads((bench_out / "results.json").read_text())
    rate = {(m["row"], m["prompt_id"]): m["new_tokens"] / m["seconds"] for m in data["measurements"]}
    prompts = [m["prompt_id"] for m in data["measurements"] if m["row"] == "none"]
    for agg in (a for a in data["aggregates"] if a["category"] == "all"):
        ratios = sorted(rate[agg["row"], p] / rate["none", p] for p in prompts)
        assert agg["median_speedup"] == pytest.approx((ratios[4] + ratios[5]) / 2)  # 10 prompts
    reloaded = load(bench_out / "results.json")
    assert [asdict(a) for a in reloaded.aggregates] == data["aggregates"]
    assert markdown(reloaded, bench_out) == (bench_out / "results.md").read_text()


def test_plot_is_a_png(bench_out):
    data = (bench_out / "speedup.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (int(min(16.0, 3.0 + 1.1 * 11) * 120), 600)  # 10 categories + all, 120 dpi


def test_run_bench_sampling_has_no_identity(tiny_model_dir):
    prompts = [BenchPrompt("a", "x", "for i in range(10): for i in", False),
               BenchPrompt("b", "y", "print('hello world') print(", False)]
    config = BenchConfig(model=str(tiny_model_dir), max_new_tokens=6, temperature=0.9, seed=3, peers="none",
                         warmup_tokens=0)
    result = run_bench(config, methods="prompt_lookup", prompts=prompts, progress=False)
    assert [r.label for r in result.rows] == ["none", "prompt_lookup"]
    assert result.categories == ["x", "y"] and result.skipped_too_long == [] and result.skipped_rows == {}
    assert all(m.identical is None for m in result.measurements)
    assert result.aggregate("prompt_lookup").identical is None
    assert result.aggregate("none", "y").speedup == 1.0 and result.aggregate("none").prompts == 2
    assert "| `prompt_lookup` |" in overall_table(result) and "| n/a |" in overall_table(result)
    again = run_bench(config, methods="prompt_lookup", prompts=prompts, progress=False)
    assert [m.token_ids for m in again.measurements] == [m.token_ids for m in result.measurements]  # seeded


def test_missing_peer_is_skipped_with_a_reason_or_refused(tiny_model_dir, monkeypatch):
    from warpdecode.bench import peers
    from warpdecode.errors import CapabilityError

    def missing(*args, **kwargs):
        raise CapabilityError("the transformers peer needs the [hf] extra")

    prompts = [BenchPrompt("a", "x", "print('hello world')", False)]
    config = BenchConfig(model=str(tiny_model_dir), max_new_tokens=3, warmup_tokens=0)
    monkeypatch.setitem(peers.TRANSFORMERS_EQUIVALENTS, "prompt_lookup", missing)
    result = run_bench(config, methods="prompt_lookup", prompts=prompts, progress=False)
    assert [r.label for r in result.rows] == ["none", "prompt_lookup", "transformers"]
    assert result.skipped_rows == {"transformers/prompt_lookup": "CapabilityError: the transformers peer needs the [hf] extra"}
    assert "- `transformers/prompt_lookup` not run: CapabilityError" in markdown(result)

    monkeypatch.setattr(peers, "load_transformers_model", missing)
    result = run_bench(config, methods="none", prompts=prompts, progress=False)
    assert [r.label for r in result.rows] == ["none"] and set(result.skipped_rows) == {"transformers"}
    config.peers = "transformers"
    with pytest.raises(CapabilityError, match=r"\[hf\] extra"):
        run_bench(config, methods="none", prompts=prompts, progress=False)


def test_assisted_peer_uses_the_same_draft_and_length(bench_out):
    rows = {r["label"]: r for r in json.loads((bench_out / "results.json").read_text())["rows"]}
    assistant = rows["transformers/draft_model:layers=1:num_tokens=3"]["settings"]["assistant_model"]
    assert assistant["num_hidden_layers"] == 1 and assistant["num_assistant_tokens"] == 3
    assert assistant["num_assistant_tokens_schedule"] == "constant"
    assert rows["transformers/prompt_lookup:num_tokens=4"]["settings"] == {"prompt_lookup_num_tokens": 4,
                                                                          "max_matching_ngram_size": 3}


def test_no_assisted_peer_for_a_draft_tree(tmp_path):
    from warpdecode.bench import peers
    from warpdecode.errors import CapabilityError

    with pytest.raises(CapabilityError, match="chains only"):
        peers._assisted({"model": None, "layers": 1, "num_tokens": 3, "top_k": 2}, tmp_path)


@pytest.mark.parametrize("drafter, options, message", [
    ("_prompt_lookup", {"num_tokens": 4, "max_ngram": 3, "controller": "adaptive"}, "'adaptive' controller"),
    ("_prompt_lookup", {"num_tokens": 4, "max_ngram": 3, "verifier": "typical"}, "'typical' verifier"),
    ("_assisted", {"model": None, "layers": 1, "num_tokens": 3, "top_k": 1, "verifier": "typical"}, "'typical' verifier"),
])
def test_no_peer_for_components_transformers_lacks(tmp_path, drafter, options, message):
    from warpdecode.bench import peers
    from warpdecode.errors import CapabilityError

    with pytest.raises(CapabilityError, match=message):
        getattr(peers, drafter)(options, tmp_path)


def test_the_tree_size_auto_chose_is_reported_beside_its_row(tiny_model_dir, tmp_path, monkeypatch):
    from tiny_models import heads_package

    from warpdecode.bench.report import write
    from warpdecode.decoding.drafters import learned

    model, _ = load_pretrained(tiny_model_dir)
    path = heads_package(model, tmp_path / "hydra", "hydra", training={"val_tau_by_nodes": [1.4, 1.7, 1.9, 2.0]})
    monkeypatch.setattr(learned, "verify_seconds", lambda target, rows: [1.0] * 3 + [2.0] * (rows - 3))
    config = BenchConfig(model=str(tiny_model_dir), max_new_tokens=4, peers="none", warmup_tokens=0)
    prompts = [BenchPrompt("a", "x", "for i in range(10): for i in", False)]
    result = run_bench(config, methods=f"hydra:path={path}:num_nodes=auto", prompts=prompts, progress=False)
    none, hydra = result.rows
    assert none.resolved == {} and hydra.resolved == {"num_nodes": 2}  # latency doubles past 3 rows: 2 nodes
    assert f"- `{hydra.label}` chose num_nodes=2" in markdown(result)
    write(result, tmp_path / "out")
    assert load(tmp_path / "out" / "results.json").rows[1].resolved == {"num_nodes": 2}


def test_cudagraphs_rows_run_beside_torch(tiny_model_dir, monkeypatch):
    """`--backends torch,cudagraphs` adds METHOD@cudagraphs rows, checked for identity with plain greedy
    (the static step runs eagerly here: capture needs a GPU, tests/decoding/test_cuda.py)."""
    from warpdecode.runtime import load
    from warpdecode.runtime.cudagraphs import CudaGraphBackbone

    monkeypatch.setattr(load, "CudaGraphBackbone", lambda model: CudaGraphBackbone(model, graphs=False))
    config = BenchConfig(model=str(tiny_model_dir), backends="torch,cudagraphs", max_new_tokens=6, peers="none",
                         warmup_tokens=0)
    prompts = [BenchPrompt("a", "x", "for i in range(10): for i in", False)]
    result = run_bench(config, methods="none,prompt_lookup", prompts=prompts, progress=False)
    assert [r.label for r in result.rows] == ["none", "prompt_lookup", "none@cudagraphs", "prompt_lookup@cudagraphs"]
    assert all(m.identical for m in result.measurements)
    assert "--backends torch,cudagraphs" in config.command()


def test_cudagraphs_need_a_cuda_model(tiny_model_dir):
    from warpdecode.errors import CapabilityError

    config = BenchConfig(model=str(tiny_model_dir), backends="torch,cudagraphs", peers="none")
    with pytest.raises(CapabilityError, match="--device cuda"):
        run_bench(config, methods="none", prompts=[BenchPrompt("a", "x", "hello", False)], progress=False)


@pytest.mark.parametrize(("tokens", "reference", "index"), [
    ([1, 2, 3], [1, 2, 3], None), ([1, 2, 3], [1, 2, 4], 2), ([9, 2], [1, 2], 0), ([1, 2], [1, 2, 3], 2),
    ([1, 2, 3], [1, 2], 2), ([], [5], 0),
])
def test_first_difference(tokens, reference, index):
    from warpdecode.bench.results import first_difference

    assert first_difference(tokens, reference) == index


def test_half_precision_bench_runs_the_model_and_peers_in_that_precision(tiny_model_dir):
    """--dtype bf16: the model and the transformers peer load in bf16, the command line repeats it, and
    identity is judged against plain greedy decoding in the same precision."""
    prompts = [BenchPrompt("a", "x", "for i in range(10): for i in", False)]
    config = BenchConfig(model=str(tiny_model_dir), max_new_tokens=6, peers="transformers", warmup_tokens=0, dtype="bf16")
    result = run_bench(config, methods="prompt_lookup", prompts=prompts, progress=False)
    assert "--dtype bf16" in config.command()
    assert result.aggregate("prompt_lookup").identical == 1 and result.aggregate("prompt_lookup").first_difference is None
    assert all(m.first_difference is None for m in result.measurements if m.row == "prompt_lookup")
    peer = next(m for m in result.measurements if m.row == "transformers")
    assert len(peer.token_ids) == 6


def test_several_precisions_run_interleaved_against_their_own_plain_decoding(tiny_model_dir):
    """--dtype fp32,q8,q4: every method runs in each precision (METHOD@q4); `identical` compares with plain
    decoding of the same quantised target, `vs ref` with fp32's; int4_self on the int4 target needs layers=."""
    prompts = [BenchPrompt("a", "x", "for i in range(10): for i in", False)]
    config = BenchConfig(model=str(tiny_model_dir), max_new_tokens=6, peers="none", warmup_tokens=0, dtype="fp32,q8,q4")
    result = run_bench(config, methods="prompt_lookup,int4_self", prompts=prompts, progress=False)
    labels = [r.label for r in result.rows]
    assert labels == ["none", "prompt_lookup", "int4_self", "none@q8", "prompt_lookup@q8", "int4_self@q8",
                      "none@q4", "prompt_lookup@q4"]
    assert "layers=N" in result.skipped_rows["int4_self@q4"]
    assert "--dtype fp32,q8,q4" in config.command()
    for label in labels:
        assert result.aggregate(label).identical == 1, label
        assert result.aggregate(label).reference_identical is not None
    assert result.aggregate("prompt_lookup@q4").reference_identical == result.aggregate("none@q4").reference_identical
    assert result.aggregate("none").reference_identical == 1
    table = overall_table(result)
    assert "vs ref" in table.splitlines()[0] and table.count("|") == 14 * (len(labels) + 2) + len(labels) + 2


def test_several_precisions_need_the_torch_backend(tmp_path):
    from warpdecode.errors import ConfigError

    with pytest.raises(ConfigError, match="torch backend only"):
        run_bench(BenchConfig(model=str(tmp_path), dtype="fp32,q4", backends="cudagraphs", peers="none"),
                  methods="none", progress=False)


def test_the_identity_cell_names_the_earliest_difference():
    from warpdecode.bench.report import identical_cell
    from warpdecode.bench.results import Aggregate

    row = Aggregate(row="x", category="all", prompts=13, new_tokens=1, seconds=1.0, tokens_per_second=1.0, speedup=1.0,
                    median_speedup=1.0, speedup_vs_transformers=None, tau=None, tau_without_bonus=None,
                    acceptance_rate=None, time_to_first_token=None, peak_rss_mib=None, identical=11, first_difference=41)
    assert identical_cell(row) == "no (11/13, from token 41)"


def test_the_report_reads_results_without_the_harness():
    """report -> results only: a results.json is reloaded and rendered without importing the running."""
    import subprocess
    import sys

    code = "import sys, warpdecode.bench.report; print('warpdecode.bench.harness' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_llama_cpp_peer_is_a_one_line_note_when_not_installed(monkeypatch):
    import sys

    from tiny_models import greedy_target

    from warpdecode.bench.harness import _llama_cpp_row

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if not installed
    built, skipped = _llama_cpp_row(BenchConfig(model="model.gguf", peers="auto"), [], greedy_target(), None)
    assert built == {} and "llama-cpp-python is not installed" in skipped["llama.cpp"]
    assert "\n" not in skipped["llama.cpp"]
    assert _llama_cpp_row(BenchConfig(model="a/directory", peers="auto"), [], greedy_target(), None) == ({}, {})


def test_llama_cpp_peer_drafts_with_its_own_prompt_lookup(monkeypatch):
    """A listed `prompt_lookup` adds llama-cpp-python's prompt-lookup drafting at the same sizes, one row
    per (n-gram, draft size): a controller is warpdecode's own."""
    import sys
    import types

    from tiny_models import greedy_target

    from warpdecode.bench.harness import _llama_cpp_row
    from warpdecode.bench.specs import parse_methods

    made = []

    class Llama:
        def __init__(self, **kwargs):
            made.append(kwargs)

    class LlamaPromptLookupDecoding:
        def __init__(self, max_ngram_size, num_pred_tokens):
            self.sizes = (max_ngram_size, num_pred_tokens)

    fake = types.ModuleType("llama_cpp")
    fake.Llama = Llama
    speculative = types.ModuleType("llama_cpp.llama_speculative")
    speculative.LlamaPromptLookupDecoding = LlamaPromptLookupDecoding
    monkeypatch.setitem(sys.modules, "llama_cpp", fake)
    monkeypatch.setitem(sys.modules, "llama_cpp.llama_speculative", speculative)
    specs = parse_methods("none,prompt_lookup,prompt_lookup:controller=cost,prompt_lookup:num_tokens=4")
    built, skipped = _llama_cpp_row(BenchConfig(model="model.gguf", peers="llama.cpp", threads=2), specs,
                                    greedy_target(), None)
    assert skipped == {} and list(built) == ["llama.cpp", "llama.cpp/prompt_lookup", "llama.cpp/prompt_lookup:num_tokens=4"]
    assert made[0]["draft_model"] is None and not made[0]["logits_all"]
    assert [m["draft_model"].sizes for m in made[1:]] == [(3, 10), (3, 4)] and all(m["logits_all"] for m in made[1:])
    assert built["llama.cpp/prompt_lookup"].generate_kwargs["num_pred_tokens"] == 10

"""Inference packages: what the manifest records, and refusing tampered, truncated or foreign packages."""

import json
import shutil

import pytest
from tiny_models import eagle_package, greedy_target, random_model

from warpdecode.decoding import registry
from warpdecode.decoding.generate import build_method, generate
from warpdecode.errors import CheckpointError, ConfigError, PackageIntegrityError
from warpdecode.export.package import export_package
from warpdecode.io import sha256_file
from warpdecode.runtime.manifest import FORMAT_VERSION
from warpdecode.runtime.package import InferencePackage

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture
def copy(tiny_package, tmp_path):
    """A private copy of the shared package that a test may damage."""
    return shutil.copytree(tiny_package, tmp_path / "copy")


def test_manifest_describes_the_package(tiny_package):
    manifest = InferencePackage.load(tiny_package).manifest
    assert manifest["format_version"] == FORMAT_VERSION
    assert manifest["target"]["fingerprint"] == greedy_target().fingerprint()
    assert manifest["backbone"]["hidden_layers"] == [1, 3]
    assert manifest["backbone"]["opset"] == 18
    assert manifest["drafters"] == {"eagle": "drafters/eagle", "medusa": "drafters/medusa", "hydra": "drafters/hydra",
                                    "distilled": "drafters/distilled", "clover": "drafters/clover"}
    listed = set(manifest["files"])
    on_disk = {p.relative_to(tiny_package).as_posix() for p in tiny_package.rglob("*") if p.is_file()}
    assert listed == on_disk - {"manifest.json"}
    assert {"backbone.onnx", "backbone.onnx.data", "drafters/eagle/drafter.safetensors"} <= listed
    for name, entry in manifest["files"].items():
        assert entry["sha256"] == sha256_file(tiny_package / name)


def test_included_drafters_run_without_a_path(tiny_package):
    package = InferencePackage.load(tiny_package)
    backbone = package.backbone("onnxruntime", threads=1)
    options = registry.package_options(package.drafter_directories())
    assert set(options) == {"eagle", "medusa", "hydra", "distilled", "clover"} and package.generation == {"method": "hydra"}
    plain = generate(backbone, None, [1, 2, 3], max_new_tokens=12, stop_at_eos=False)
    for kind in options:
        out = generate(backbone, None, [1, 2, 3], max_new_tokens=12, stop_at_eos=False,
                       method=build_method(kind, options=options[kind]))
        assert out.token_ids == plain.token_ids


def test_modified_weights_are_refused(copy):
    data = copy / "backbone.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(PackageIntegrityError, match="backbone.onnx.data does not match its sha256"):
        InferencePackage.load(copy)


def test_truncated_file_is_refused(copy):
    graph = copy / "backbone.onnx"
    graph.write_bytes(graph.read_bytes()[:-10])
    with pytest.raises(PackageIntegrityError, match="backbone.onnx has .* bytes, the manifest says"):
        InferencePackage.load(copy)


def test_missing_file_is_refused(copy):
    (copy / "drafters" / "eagle" / "drafter.json").unlink()
    with pytest.raises(PackageIntegrityError, match="drafters/eagle/drafter.json is missing"):
        InferencePackage.load(copy)


def test_newer_format_asks_for_an_upgrade(copy):
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["format_version"] = FORMAT_VERSION + 1
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PackageIntegrityError, match="upgrade warpdecode"):
        InferencePackage.load(copy)


def test_not_a_package_is_refused(tmp_path, copy):
    with pytest.raises(PackageIntegrityError, match="manifest.json is missing"):
        InferencePackage.load(tmp_path / "nothing")
    (copy / "manifest.json").write_text("{not json")
    with pytest.raises(PackageIntegrityError, match="not valid JSON"):
        InferencePackage.load(copy)


def test_weights_swapped_consistently_are_caught_by_the_fingerprint(copy):
    """Someone who edits the weights and re-hashes the manifest still fails the identity check."""
    data = copy / "backbone.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[:4] = b"\x00\x00\x80\x3f"  # the first weight value becomes 1.0
    data.write_bytes(bytes(raw))
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"]["backbone.onnx.data"] = {"sha256": sha256_file(data), "bytes": data.stat().st_size}
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PackageIntegrityError, match="not the exported model's"):
        InferencePackage.load(copy).backbone("torch")


def test_drafter_of_another_target_is_refused_at_export(tmp_path):
    other = random_model(seed=9, std=0.3, vocab_size=64, n_layer=3, n_head=4, n_kv_head=2, d_model=32, d_ff=64,
                         max_seq_len=256)
    drafter = eagle_package(other, tmp_path / "eagle")
    with pytest.raises(CheckpointError, match="trained for 'tiny'"):
        export_package(greedy_target(), None, tmp_path / "pkg", source="x", drafters=[drafter])
    assert not (tmp_path / "pkg").exists()


@pytest.mark.parametrize("layers", [(1,), (3,)])
def test_drafters_need_the_hidden_states_they_read(tmp_path, drafter_options, layers):
    """The shared EAGLE drafter fuses hidden states 1 and 3; left to itself the export adds them (the
    `tiny_package` manifest above lists both)."""
    with pytest.raises(ConfigError, match=r"read hidden states \[1, 3\]"):
        export_package(greedy_target(), None, tmp_path / "pkg", source="x", hidden_layers=layers,
                       drafters=[drafter_options["eagle"]["path"]])
    assert not (tmp_path / "pkg").exists()



def test_learned_controls_travel_with_the_package_and_reach_their_drafters(tmp_path):
    from tiny_models import acceptance_head_package, judge_package, layer_router_package, naive_greedy

    from warpdecode.bench.specs import parse_methods

    model = greedy_target()
    head = acceptance_head_package(model, tmp_path / "head", bias=8.0)
    router = layer_router_package(model, tmp_path / "router", skip=(1,))
    judge = judge_package(model, tmp_path / "judge", bias=-10.0)  # approves nothing: greedy-identical
    package = InferencePackage.load(export_package(model, None, tmp_path / "package", source="tiny",
                                                   drafters=[head, router, judge]))
    assert package.manifest["drafters"] == {"acceptance_head": "drafters/acceptance_head", "judge": "drafters/judge",
                                            "layer_router": "drafters/layer_router"}
    options = registry.package_options(package.drafter_directories())
    assert options == {"int4_self": {"acceptance_head": str(tmp_path / "package/drafters/acceptance_head")},
                       "int8_self": {"acceptance_head": str(tmp_path / "package/drafters/acceptance_head")},
                       "first": {"router": str(tmp_path / "package/drafters/layer_router")},
                       "judge": {"path": str(tmp_path / "package/drafters/judge")}}
    judged = parse_methods("int4_self:num_tokens=3:verifier=judge", defaults=options)[1].build(do_sample=False)
    assert judged.verifier.path == str(tmp_path / "package/drafters/judge")
    out = generate(package.backbone("onnxruntime", threads=1), None, [1, 2, 3], max_new_tokens=16, stop_at_eos=False,
                   method=judged)
    assert out.token_ids == naive_greedy(model, [1, 2, 3], 16)
    backbone = package.backbone("onnxruntime", threads=1)
    for name in ("int4_self", "first"):
        method = build_method(name, options=options[name] | {"num_tokens": 3})
        out = generate(backbone, None, [1, 2, 3], max_new_tokens=16, stop_at_eos=False, method=method)
        assert out.token_ids == naive_greedy(model, [1, 2, 3], 16)
        assert max(out.stats.proposed_per_step) == 3
    assert method.drafter.skip == [1]

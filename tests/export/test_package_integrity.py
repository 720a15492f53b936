"""Inference packages refuse manifests that reach outside the package or name unverified files, and malformed
manifests and drafter packages, each with one line naming the field or file (never a traceback)."""

import json
import re
import shutil
from pathlib import Path

import onnx
import pytest
import torch
from tiny_models import greedy_target

from warpdecode.cli import main
from warpdecode.decoding import registry
from warpdecode.errors import CheckpointError, PackageIntegrityError
from warpdecode.io import sha256_file
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.runtime.onnx_drafters import OnnxHeads
from warpdecode.runtime.onnxruntime import OnnxRuntimeBackbone
from warpdecode.runtime.package import InferencePackage

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture
def copy(tiny_package, tmp_path):
    """A private copy of the shared package that a test may damage (`tmp_path` itself lies outside it)."""
    return shutil.copytree(tiny_package, tmp_path / "copy")


def edit(package: Path, change) -> None:
    """Rewrite the manifest of `package` with `change(manifest)` applied."""
    manifest = json.loads((package / "manifest.json").read_text())
    change(manifest)
    (package / "manifest.json").write_text(json.dumps(manifest))


def entry(path: Path) -> dict:
    """A `files` entry that matches `path` (so only the check under test can refuse it)."""
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


def refused(package: Path, message: str) -> None:
    with pytest.raises(PackageIntegrityError, match=message) as caught:
        InferencePackage.load(package)
    assert "\n" not in str(caught.value)


def test_the_exported_package_passes_every_check(tiny_package):
    package = InferencePackage.load(tiny_package)
    assert package.verified == set(package.manifest["files"])
    assert package.file("backbone.onnx") == tiny_package / "backbone.onnx"
    assert set(registry.package_options(package.drafter_directories())) == {"eagle", "medusa", "hydra", "distilled", "clover"}


@pytest.mark.parametrize("outside", ["relative", "absolute"])
def test_file_entries_outside_the_package_are_refused(copy, tmp_path, outside):
    secret = tmp_path / "x"
    secret.write_text("not the package's")
    name = "../x" if outside == "relative" else str(secret)
    edit(copy, lambda m: m["files"].update({name: entry(secret)}))
    refused(copy, rf"files\[{name!r}\] names a path outside the package")


def test_the_runtime_reaches_only_verified_files(copy):
    package = InferencePackage.load(copy)
    for name in ("../x", "/etc/hostname", "manifest.json", "drafters/eagle"):
        with pytest.raises(PackageIntegrityError, match="not a verified file of the package"):
            package.file(name)


@pytest.mark.parametrize(("field", "change"), [
    (r"backbone.graph", lambda m: m["backbone"].update(graph="../copy/backbone.onnx")),
    (r"backbone.fused_graph", lambda m: m["backbone"].update(fused_graph="unlisted.onnx")),
    (r"backbone.variants\['int8'\].graph", lambda m: m["backbone"]["variants"]["int8"].update(graph="unlisted.onnx")),
    (r"backbone.embeds_graphs\['backbone.fused.onnx'\]",
     lambda m: m["backbone"]["embeds_graphs"].update({"backbone.fused.onnx": "/abs/unlisted.onnx"})),
])
def test_graphs_the_runtime_opens_must_be_listed_files(copy, field, change):
    """An unlisted graph (here present in the package, so ONNX Runtime would have run it) is refused at load."""
    shutil.copy(copy / "backbone.fused.onnx", copy / "unlisted.onnx")
    edit(copy, change)
    refused(copy, rf"manifest field {field} names .*, which is not a verified file of the package")


def test_a_missing_graph_is_an_integrity_error_not_an_onnxruntime_traceback(copy):
    edit(copy, lambda m: m["backbone"]["variants"]["int4"].update(graph="backbone.int2.onnx"))
    refused(copy, r"backbone.variants\['int4'\].graph names 'backbone.int2.onnx'")
    (copy / "backbone.fused.onnx").unlink()
    refused(copy, "backbone.fused.onnx is missing")
    config = greedy_target().config
    with pytest.raises(PackageIntegrityError, match="nothing.onnx is missing"):
        OnnxRuntimeBackbone(copy / "nothing.onnx", config, "f", [], torch.zeros(config.vocab_size, config.d_model))


def test_a_listed_file_that_is_not_a_graph_is_refused(copy):
    garbage = copy / "backbone.int8.onnx"
    garbage.write_bytes(b"\xff" * 64)
    edit(copy, lambda m: m["files"].update({"backbone.int8.onnx": entry(garbage)}))
    refused(copy, "backbone.int8.onnx is not a readable ONNX graph")


@pytest.mark.parametrize(("kind", "relative", "message"), [
    ("eagle", "../elsewhere", r"drafters\['eagle'\] must be a relative path inside the package"),
    ("eagle", "/tmp", r"drafters\['eagle'\] must be a relative path inside the package"),
    ("medusa", "unlisted", r"manifest field drafters\['medusa'\] names 'unlisted/drafter.json', which is not a verified"),
])
def test_drafter_directories_must_hold_listed_files(copy, kind, relative, message):
    shutil.copytree(copy / "drafters" / kind, copy / "unlisted")
    edit(copy, lambda m: m["drafters"].update({kind: relative}))
    refused(copy, message)


def test_an_unlisted_file_in_a_drafter_directory_is_refused(copy):
    """A drafter reads every graph it finds in its directory: an extra one must be listed too."""
    shutil.copy(copy / "drafters" / "hydra" / "head_1.onnx", copy / "drafters" / "medusa" / "head_1.onnx")
    refused(copy, r"drafters/medusa/head_1.onnx lies in the drafter directory of manifest field drafters\['medusa'\]")


@pytest.mark.parametrize(("change", "message"), [
    (lambda m: m["files"]["backbone.onnx"].pop("sha256"), r"files\['backbone.onnx'\].sha256 is missing"),
    (lambda m: m["files"].update({"backbone.onnx": "0" * 64}), r"files\['backbone.onnx'\] must be an object"),
    (lambda m: m["files"]["backbone.onnx"].update(sha256="ab"), r"files\['backbone.onnx'\].sha256 must be a 64-digit"),
    (lambda m: m["files"]["backbone.onnx"].update(bytes=-1), r"files\['backbone.onnx'\].bytes must be a non-negative"),
    (lambda m: m["files"]["backbone.onnx"].update(bytes="12"), r"files\['backbone.onnx'\].bytes must be"),
    (lambda m: m.update(files=["backbone.onnx"]), r"manifest field files must be an object"),
    (lambda m: m.update(format_version="1"), r"manifest field format_version must be an integer, got '1'"),
    (lambda m: m.update(format_version=True), r"manifest field format_version must be an integer, got True"),
    (lambda m: m.pop("target"), r"manifest field target is missing"),
    (lambda m: m["target"].update(fingerprint=7), r"manifest field target.fingerprint must be a string"),
    (lambda m: m["target"]["config"].update(colour="blue"), r"manifest field target.config is not a model configuration"),
    (lambda m: m["backbone"].pop("graph"), r"manifest field backbone.graph is missing"),
    (lambda m: m["backbone"].update(hidden_layers=["3"]), r"manifest field backbone.hidden_layers must be a list of non"),
    (lambda m: m["backbone"].update(fused_graph=3), r"manifest field backbone.fused_graph must be a file name or null"),
    (lambda m: m["backbone"].update(variants={"int8": "x.onnx"}), r"backbone.variants\['int8'\] must be an object"),
    (lambda m: m["backbone"]["variants"]["int8"].pop("graph"), r"backbone.variants\['int8'\].graph is missing"),
    (lambda m: m["backbone"].update(weight_aliases={"a": 1}), r"backbone.weight_aliases\['a'\] must be a string"),
    (lambda m: m.update(drafters=["eagle"]), r"manifest field drafters must be an object"),
    (lambda m: m.update(generation="greedy"), r"manifest field generation must be an object"),
])
def test_malformed_manifests_are_one_line_errors_naming_the_field(copy, change, message):
    edit(copy, change)
    refused(copy, message)


def test_a_symlink_out_of_the_package_is_refused(copy, tmp_path):
    """Same bytes, so the hashes pass: only the containment check refuses it."""
    weights = copy / "drafters" / "eagle" / "drafter.safetensors"
    outside = shutil.copy(weights, tmp_path / "drafter.safetensors")
    weights.unlink()
    weights.symlink_to(outside)
    refused(copy, "drafters/eagle/drafter.safetensors resolves to .*, outside the package")


def test_a_symlinked_directory_out_of_the_package_is_refused(copy, tmp_path):
    medusa = copy / "drafters" / "medusa"
    shutil.move(medusa, tmp_path / "medusa")
    medusa.symlink_to(tmp_path / "medusa", target_is_directory=True)
    refused(copy, "drafters/medusa/.* resolves to .*, outside the package")


def test_a_symlink_inside_the_package_is_followed(copy):
    data = copy / "backbone.onnx.data"
    shutil.move(data, copy / "weights.bin")
    data.symlink_to("weights.bin")
    edit(copy, lambda m: m["files"].update({"weights.bin": entry(copy / "weights.bin")}))
    InferencePackage.load(copy).backbone("onnxruntime-portable", threads=1)


def point_external_data(graph: Path, location: str) -> None:
    model = onnx.load(str(graph), load_external_data=False)
    for tensor in model.graph.initializer:
        for item in tensor.external_data:
            if item.key == "location":
                item.value = location
    graph.write_bytes(model.SerializeToString())


@pytest.mark.parametrize("where", ["outside", "unlisted"])
def test_external_data_a_graph_names_must_be_a_listed_file(copy, tmp_path, where):
    """A verified graph must not point ONNX Runtime at weights the manifest does not vouch for."""
    location = "../stray.data" if where == "outside" else "stray.data"
    shutil.copy(copy / "backbone.onnx.data", (copy / location).resolve())
    graph = copy / "backbone.fused.onnx"
    point_external_data(graph, location)
    edit(copy, lambda m: m["files"].update({"backbone.fused.onnx": entry(graph)}))
    refused(copy, rf"backbone.fused.onnx reads external data from {location!r}, which is not a verified file")


def test_an_unlisted_tokenizer_config_is_refused(copy):
    (copy / "tokenizer.json").write_text("{}")
    (copy / "tokenizer_config.json").write_text("{}")
    edit(copy, lambda m: m["files"].update({"tokenizer.json": entry(copy / "tokenizer.json")}))
    refused(copy, "tokenizer_config.json is read with tokenizer.json but is not a verified file")


@pytest.mark.parametrize(("change", "message"), [
    (lambda m: m["files"].update({"../x": {"sha256": "0" * 64, "bytes": 1}}), r"files\['../x'\] names a path outside"),
    (lambda m: m["files"]["backbone.onnx"].pop("sha256"), r"files\['backbone.onnx'\].sha256 is missing"),
    (lambda m: m["backbone"].update(fused_graph="unlisted.onnx"), r"backbone.fused_graph names 'unlisted.onnx'"),
])
def test_the_cli_reports_a_tampered_manifest_in_one_line(copy, capsys, change, message):
    edit(copy, change)
    try:
        main(["generate", "--package", str(copy), "--prompt", "x"])
        code = 0
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and re.search(message, err)


# drafter packages on their own (`warpdecode fit` output, or `path=` given by hand)


@pytest.fixture
def drafter(copy) -> Path:
    return copy / "drafters" / "medusa"


def edit_meta(drafter: Path, change) -> None:
    meta = json.loads((drafter / "drafter.json").read_text())
    change(meta)
    (drafter / "drafter.json").write_text(json.dumps(meta))


@pytest.mark.parametrize(("change", "message"), [
    (lambda m: m.update(version="1"), "expected format 'warpdecode-drafter' version 1"),
    (lambda m: m.pop("kind"), "field kind is missing"),
    (lambda m: m.update(kind=3), "field kind must be a string, got 3"),
    (lambda m: m.update(target="tiny"), "field target must be an object"),
    (lambda m: m["target"].pop("fingerprint"), "field target.fingerprint is missing"),
    (lambda m: m["target"].update(n_layer="3"), "field target.n_layer must be an integer"),
    (lambda m: m.update(config=[]), "field config must be an object"),
    (lambda m: m.update(tree={"rank_paths": [["a"]]}), "field tree.rank_paths must be a list of non-empty lists"),
    (lambda m: m.update(training=None), "field training must be an object"),
])
def test_malformed_drafter_json_is_a_one_line_error(drafter, change, message):
    edit_meta(drafter, change)
    with pytest.raises(CheckpointError, match=message) as caught:
        DrafterPackage.load(drafter)
    assert "\n" not in str(caught.value)


def test_a_drafter_package_does_not_follow_a_symlink_out_of_it(drafter, tmp_path):
    weights = drafter / "drafter.safetensors"
    outside = shutil.copy(weights, tmp_path / "weights.safetensors")
    weights.unlink()
    weights.symlink_to(outside)
    with pytest.raises(CheckpointError, match="drafter.safetensors resolves to .*, outside its drafter package"):
        DrafterPackage.load(drafter)


def test_drafter_graphs_stay_inside_their_directory(drafter, tmp_path):
    net = type("Net", (), {"graph_files": lambda self: ["heads.onnx"]})()  # Medusa's one graph
    graph = drafter / "heads.onnx"
    assert OnnxHeads.find(drafter, net) is not None
    outside = shutil.copy(graph, tmp_path / "heads.onnx")
    graph.unlink()
    graph.symlink_to(outside)
    with pytest.raises(CheckpointError, match="heads.onnx resolves to .*, outside its drafter package"):
        OnnxHeads.find(drafter, net)
    graph.unlink()
    shutil.copy(outside, graph)
    model = onnx.load(str(graph))
    onnx.save_model(model, str(tmp_path / "heads.onnx"), save_as_external_data=True, location="heads.onnx.data",
                    size_threshold=0)
    shutil.copy(tmp_path / "heads.onnx", graph)
    point_external_data(graph, "../../weights.data")
    with pytest.raises(CheckpointError, match="names external data '../../weights.data' outside its drafter package"):
        OnnxHeads.find(drafter, net)


@pytest.mark.parametrize("field", ["vocab_size", "d_model"])
def test_a_config_that_is_not_the_weights_own_is_refused_before_any_buffer_is_sized(copy, field):
    """The logits and cache buffers are sized from target.config: a config larger than the weights is refused on
    every backend, not allocated."""
    edit(copy, lambda m: m["target"]["config"].update({field: m["target"]["config"][field] * 64}))
    package = InferencePackage.load(copy)
    for backend in ("onnxruntime", "torch"):
        with pytest.raises(PackageIntegrityError, match="target.config") as caught:
            package.backbone(backend)
        assert "\n" not in str(caught.value)

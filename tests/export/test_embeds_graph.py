"""The input-embeddings variants of the backbone graphs (`export.embeds_graph`) and PPD on ONNX Runtime."""

import json

import onnx
import pytest
import torch
from tiny_models import greedy_target, naive_greedy, random_model

from warpdecode.decoding.generate import build_method, generate
from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.export.embeds_graph import write_embeds_graph
from warpdecode.export.package import export_package
from warpdecode.models.cache import KVCache
from warpdecode.runtime.package import InferencePackage

pytestmark = pytest.mark.usefixtures("single_thread")

TOL = {"atol": 1e-4, "rtol": 1e-4}
GRAPHS = {"onnxruntime": "backbone.fused.onnx", "onnxruntime-portable": "backbone.onnx"}


def test_each_graph_has_a_weightless_embeds_variant(tiny_package):
    manifest = json.loads((tiny_package / "manifest.json").read_text())
    variants = manifest["backbone"]["embeds_graphs"]
    assert variants == {"backbone.onnx": "backbone.embeds.onnx", "backbone.fused.onnx": "backbone.fused.embeds.onnx"}
    for graph, embeds in variants.items():
        assert embeds in manifest["files"]  # hashed like every file
        model = onnx.load(str(tiny_package / embeds), load_external_data=False)
        assert model.graph.input[0].name == "inputs_embeds"
        assert "input_ids" not in {i.name for i in model.graph.input}
        locations = {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
        original = onnx.load(str(tiny_package / graph), load_external_data=False)
        assert locations == {e.value for t in original.graph.initializer for e in t.external_data if e.key == "location"}
    assert not list(tiny_package.glob("*.embeds.onnx.data"))  # no weight written twice


@pytest.mark.parametrize("backend", GRAPHS)
def test_embeds_forward_equals_the_ids_forward(tiny_package, backend):
    package = InferencePackage.load(tiny_package)
    ort, reference = package.backbone(backend, threads=1), package.backbone("torch")
    assert ort.accepts_inputs_embeds() and not ort.takes_embeds
    tokens = torch.randint(0, 64, (1, 7))
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)[None]
    steps = torch.randint(0, 64, (1, 3))
    embeds = torch.randn(1, 3, reference.config.d_model)  # rows that are no vocabulary token
    outs = []
    with torch.inference_mode():
        for model in (reference, ort):
            cache = KVCache.for_model(reference.config, 1, 32)
            first = model(tokens, cache=cache, logits_slice=slice(-1, None))  # ids (ort: the ids graph still)
            second = model(steps, cache=cache, attention_mask=tree, inputs_embeds=embeds, hidden_layers=(3,))
            third = model(steps, cache=cache)  # ids again (ort: embedded here, run on the embeds graph)
            outs.append((first, second, third))
    assert ort.takes_embeds
    for ours, theirs in zip(outs[1], outs[0], strict=True):
        torch.testing.assert_close(ours.logits, theirs.logits, **TOL)
    torch.testing.assert_close(outs[1][1].hidden_states[3], outs[0][1].hidden_states[3], **TOL)


@pytest.mark.parametrize("backend", GRAPHS)
def test_ppd_is_greedy_identical_on_onnxruntime(tiny_package, backend, drafter_options):
    package = InferencePackage.load(tiny_package)
    ort = package.backbone(backend, threads=1)
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    for options in ({}, {"lookup": 4}):
        out = generate(ort, None, prompt, max_new_tokens=20, stop_at_eos=False,
                       method=build_method("ppd", options=drafter_options["ppd"] | options))
        assert out.token_ids == naive_greedy(package.backbone("torch"), prompt, 20)


def test_quantised_graphs_refuse_ppd_with_the_reason(tiny_package, drafter_options):
    ort = InferencePackage.load(tiny_package).backbone("onnxruntime-int8", threads=1)
    assert not ort.accepts_inputs_embeds()
    with pytest.raises(CapabilityError, match="input embeddings"):
        generate(ort, None, [1, 2, 3], max_new_tokens=4, method=build_method("ppd", options=drafter_options["ppd"]))
    with pytest.raises(CapabilityError, match="no embeds variant"):
        ort(torch.tensor([[1, 2]]), inputs_embeds=torch.zeros(1, 2, ort.config.d_model))


def test_untied_head_keeps_its_weight_and_drops_the_unused_table(tmp_path):
    model = random_model(seed=4, std=0.3, vocab_size=64, n_layer=2, n_head=2, d_model=16, d_ff=32, max_seq_len=64,
                         tie_embeddings=False)
    package = InferencePackage.load(export_package(model, None, tmp_path / "pkg", source="untied"))
    graph = onnx.load(str(package.directory / "backbone.embeds.onnx"), load_external_data=False).graph
    assert "model.embed.weight" not in {t.name for t in graph.initializer}
    ort = package.backbone("onnxruntime-portable", threads=1)
    tokens = torch.randint(0, 64, (1, 5))
    with torch.inference_mode():
        got = ort(tokens, inputs_embeds=model.embed(tokens)).logits
        torch.testing.assert_close(got, model(tokens).logits, **TOL)


def test_surgery_refuses_a_graph_whose_ids_feed_more_than_the_lookup(tmp_path):
    helper = onnx.helper
    table = helper.make_tensor("table", onnx.TensorProto.FLOAT, [4, 2], [0.0] * 8)
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["x"]),
             helper.make_node("Cast", ["input_ids"], ["ids_float"], to=onnx.TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("input_ids", onnx.TensorProto.INT64, ["b", "t"])],
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("ids_float", onnx.TensorProto.FLOAT, None)], [table])
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph), str(path))
    with pytest.raises(ConfigError, match="not one embedding Gather"):
        write_embeds_graph(path, 2)
    assert greedy_target().accepts_inputs_embeds()

"""The optional quantised graphs: really quantised, their accuracy cost recorded; int4 (weight-only)
keeps speculative decoding exact with respect to itself, int8 (dynamic) does not."""

import json
import shutil

import onnx
import pytest
import torch

from warpdecode.decoding import registry
from warpdecode.decoding.generate import build_method, generate
from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.export.package import export_package
from warpdecode.models.cache import KVCache
from warpdecode.runtime.package import InferencePackage

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.mark.parametrize(("kind", "ops", "agreement"), [("int8", {"DynamicQuantizeLinear", "MatMulInteger"}, 0.8),
                                                       ("int4", {"MatMulNBits"}, 0.3)])
def test_quantised_graph_quantises_the_matmuls_and_records_its_accuracy(tiny_package, kind, ops, agreement):
    """The tiny random model's Gaussian weights lose much to int4 (the real model's numbers are in
    test_real_model_export.py); its agreement must still be far above chance (1/64)."""
    graph = onnx.load(str(tiny_package / f"backbone.{kind}.onnx"), load_external_data=False).graph
    quantised = [n for n in graph.node if n.op_type in ops - {"DynamicQuantizeLinear"}]
    # quantised from the fused graph: q|k|v, o, gate|up and down per layer (+ the head for int8)
    assert len(quantised) == 4 * 3 + (kind == "int8")
    assert {n.op_type for n in graph.node} >= {"GroupQueryAttention"}
    accuracy = InferencePackage.load(tiny_package).manifest["backbone"]["variants"][kind]["accuracy"]
    assert accuracy["positions"] == 3 * 48
    assert accuracy["max_logit_diff"] > 0  # really a different model
    assert accuracy["top1_agreement"] >= agreement  # but a close one


def logits_alone_and_together(backbone):
    """Logits of 4 tokens after a 10-token prefix: one forward of 4 rows, and 4 one-row forwards."""
    cache = KVCache.for_model(backbone.config, 1, 32)
    tokens = torch.tensor([[9, 4, 33, 17]])
    with torch.inference_mode():
        backbone(torch.arange(1, 11)[None], cache=cache)
        together = backbone(tokens, cache=cache).logits[0]
        cache.truncate(10)
        alone = torch.cat([backbone(tokens[:, i:i + 1], cache=cache).logits[0] for i in range(4)])
    return together, alone


def test_int4_is_batch_invariant_so_speculation_follows_its_greedy(tiny_package):
    package = InferencePackage.load(tiny_package)
    int4 = package.backbone("onnxruntime-int4", threads=1)
    together, alone = logits_alone_and_together(int4)
    torch.testing.assert_close(together, alone, atol=1e-4, rtol=1e-4)
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    plain = generate(int4, None, prompt, max_new_tokens=20, stop_at_eos=False).token_ids
    for name in ("prompt_lookup", "hydra"):
        method = build_method(name, options=registry.package_options(package.drafter_directories()).get(name, {}))
        assert generate(int4, None, prompt, max_new_tokens=20, stop_at_eos=False, method=method).token_ids == plain


def test_int8_activation_scales_depend_on_the_other_rows(tiny_package):
    """Dynamic quantisation scales activations per tensor: a verify forward of several rows is not the
    one-token step, which is why int8 rows are never marked lossless, not even against int8 greedy."""
    together, alone = logits_alone_and_together(InferencePackage.load(tiny_package).backbone("onnxruntime-int8", threads=1))
    assert (together - alone).abs().max() > 1e-3


def test_missing_or_unknown_quantisation_is_refused(tiny_package, tmp_path):
    copy = shutil.copytree(tiny_package, tmp_path / "plain")
    manifest = json.loads((copy / "manifest.json").read_text())
    del manifest["backbone"]["variants"]["int4"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CapabilityError, match="export it with --quantize int4"):
        InferencePackage.load(copy).backbone("onnxruntime-int4")
    from tiny_models import greedy_target

    with pytest.raises(ConfigError, match="quantization must be among int8, int4"):
        export_package(greedy_target(), None, tmp_path / "bad", source="x", quantize=("int3",))

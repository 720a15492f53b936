"""Medusa and Hydra heads exported as ONNX graphs: same logits as the PyTorch heads, and used by the
drafters when the target runs in ONNX Runtime."""

from pathlib import Path

import pytest
import torch
from tiny_models import greedy_target

from warpdecode.decoding import registry
from warpdecode.decoding.generate import build_method, generate
from warpdecode.export.drafter_graphs import MEDUSA_GRAPH, OnnxHeads, hydra_graph
from warpdecode.export.package import InferencePackage

pytestmark = pytest.mark.usefixtures("single_thread")


def test_graphs_are_in_the_package(tiny_package):
    files = InferencePackage.load(tiny_package).manifest["files"]
    assert "drafters/medusa/" + MEDUSA_GRAPH in files
    assert {f"drafters/hydra/{hydra_graph(k)}" for k in range(1, 5)} <= set(files)
    assert not any(name.startswith("drafters/eagle/") and name.endswith(".onnx") for name in files)


@pytest.mark.parametrize("kind", ["medusa", "hydra"])
def test_graph_logits_equal_the_pytorch_heads(tiny_package, kind):
    directory = Path(tiny_package) / "drafters" / kind
    net = registry.build("drafter", kind, path=str(directory)).load_net(greedy_target())
    graphs = OnnxHeads.find(directory, net, threads=1)
    assert graphs is not None
    features = torch.randn(3, 32)
    with torch.inference_mode():
        if kind == "medusa":
            torch.testing.assert_close(graphs(features), net(features), atol=1e-5, rtol=1e-5)
        for k in range(1, net.num_heads + 1) if kind == "hydra" else ():
            embeds = torch.randn(3, k, 32)
            torch.testing.assert_close(graphs.step(k, features, embeds), net.step(k, features, embeds),
                                       atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["medusa", "hydra"])
def test_drafters_run_their_graphs_on_onnxruntime(tiny_package, kind):
    package = InferencePackage.load(tiny_package)
    ort = package.backbone("onnxruntime", threads=1)
    method = build_method(kind, options=package.drafter_options()[kind])
    out = generate(ort, None, [1, 2, 3], max_new_tokens=16, stop_at_eos=False, method=method)
    assert method.drafter.graphs is not None  # type: ignore[attr-defined]
    assert out.token_ids == generate(ort, None, [1, 2, 3], max_new_tokens=16, stop_at_eos=False).token_ids
    # the PyTorch target keeps the PyTorch heads
    method = build_method(kind, options=package.drafter_options()[kind])
    generate(package.backbone("torch"), None, [1, 2, 3], max_new_tokens=4, stop_at_eos=False, method=method)
    assert method.drafter.graphs is None  # type: ignore[attr-defined]

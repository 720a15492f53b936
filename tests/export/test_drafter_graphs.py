"""Medusa and Hydra heads, the EAGLE network, the distilled draft model and the Clover network exported
as ONNX graphs: same outputs as the PyTorch networks, and used by the drafters when the target runs in
ONNX Runtime."""

from pathlib import Path

import pytest
import torch
from tiny_models import greedy_target

from warpdecode.decoding import registry
from warpdecode.decoding.generate import build_method, generate
from warpdecode.models.cache import KVCache
from warpdecode.runtime.onnx_drafters import OnnxClover, OnnxDistilled, OnnxEagle, OnnxHeads
from warpdecode.runtime.package import InferencePackage

pytestmark = pytest.mark.usefixtures("single_thread")


def packaged_net(tiny_package, kind: str):
    """(the drafter's folder in the package, the target, its PyTorch network)."""
    directory = Path(tiny_package) / "drafters" / kind
    target = greedy_target()
    return directory, target, registry.build("drafter", kind, path=str(directory)).load_net(target)


def test_graphs_are_in_the_package(tiny_package):
    files = InferencePackage.load(tiny_package).manifest["files"]
    graphs = {kind: packaged_net(tiny_package, kind)[2].graph_files()
              for kind in ("medusa", "hydra", "eagle", "distilled", "clover")}
    assert graphs == {"medusa": ["heads.onnx"], "hydra": [f"head_{k}.onnx" for k in range(1, 5)],
                      "eagle": ["eagle_layer.onnx", "eagle_head.onnx"], "distilled": ["distilled_step.onnx"],
                      "clover": ["clover_augment.onnx", "clover_step.onnx"]}
    assert {f"drafters/{kind}/{name}" for kind, names in graphs.items() for name in names} <= set(files)


def test_only_drafters_declaring_onnx_graphs_carry_them(tiny_package, drafter_options):
    """PPD declares no graphs (its prompt tokens run through the target's own graph): none are written."""
    from warpdecode.export.package import drafter_net

    assert {kind: drafter_net(kind)[1] for kind in ("medusa", "hydra", "eagle", "distilled", "clover", "ppd")} == {
        "medusa": True, "hydra": True, "eagle": True, "distilled": True, "clover": True, "ppd": False}
    assert drafter_net("acceptance_head") == (None, False)


def test_clover_graphs_equal_the_pytorch_network_with_a_cache(tiny_package):
    directory, target, net = packaged_net(tiny_package, "clover")
    graphs = OnnxClover.find(directory, net, threads=1)
    assert graphs is not None
    caches = [KVCache.for_model(net.config, 1, 32) for _ in range(2)]
    C = target.config.d_model
    with torch.inference_mode():
        start = 0
        for T in (6, 1, 2):  # the prompt's features, then one and two committed positions
            features, positions = torch.randn(1, T, C), torch.arange(start, start + T)[None]
            expected_states = net.augmented(features, positions, caches[0])
            expected_keys, expected_values = net.context_kv(expected_states, positions)
            states, keys, values = graphs.augmented(features, positions, caches[1])
            for got, expected in ((states, expected_states), (keys, expected_keys), (values, expected_values)):
                torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
            start += T
        assert caches[0].lengths.tolist() == caches[1].lengths.tolist() == [9]
        h, tokens = torch.randn(3, C), torch.tensor([4, 7, 9])
        positions = torch.full((3,), 9)
        context_keys, context_values = torch.randn(2, net.config.kv_head_count, 9, net.config.head_width).unbind(0)
        expected = net.step(h[None], target.embed(tokens)[None], positions[None], context_keys[None], context_values[None])[0]
        got, logits = graphs.step(h, target.embed(tokens), positions, context_keys, context_values)
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(logits, net.logits(expected), atol=1e-4, rtol=1e-4)


def test_distilled_graph_equals_the_pytorch_network_with_a_cache(tiny_package):
    directory, target, net = packaged_net(tiny_package, "distilled")
    graph = OnnxDistilled.find(directory, net, threads=1)
    assert graph is not None
    caches = [KVCache.for_model(net.config, 1, 32) for _ in range(2)]
    with torch.inference_mode():
        for tokens, logits_slice in [(torch.randint(0, 64, (1, 6)), slice(-1, None)),  # a prompt
                                     (torch.randint(0, 64, (1, 1)), None), (torch.randint(0, 64, (1, 2)), None)]:
            expected = net(tokens, target.embed, caches[0], logits_slice)
            got = graph(tokens, target.embed, caches[1], logits_slice)
            assert got.shape == expected.shape
            torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(caches[1].k[:, :, :, :9], caches[0].k[:, :, :, :9], atol=1e-5, rtol=1e-5)
    assert caches[0].lengths.tolist() == caches[1].lengths.tolist() == [9]


@pytest.mark.parametrize("layout", [None, "eagle", "eagle3"])
def test_eagle_graphs_equal_the_pytorch_network_with_a_cache_and_a_tree_mask(tiny_package, layout, tmp_path):
    directory, target, net = packaged_net(tiny_package, "eagle")
    if layout is not None:  # EAGLE-1's / EAGLE-3's shape: their graphs written on their own
        from tiny_models import eagle_package

        from warpdecode.export.drafter_graphs import export_drafter_graphs

        directory = Path(eagle_package(target, tmp_path / "eagle", layout=layout))
        net = registry.build("drafter", "eagle", path=str(directory)).load_net(target)
        export_drafter_graphs(net, directory)
    graphs = OnnxEagle.find(directory, net, threads=1)
    assert graphs is not None
    caches = [KVCache.for_model(net.config, 1, 32) for _ in range(2)]
    tree = torch.tensor([[[True, False, False], [True, True, False], [True, False, True]]])
    steps = [(torch.randn(1, 5, 32), torch.randint(0, 64, (1, 5)), torch.arange(1, 6)[None], None),  # prompt pairs
             (torch.randn(1, 3, 32), torch.randint(0, 64, (1, 3)), torch.tensor([[6, 7, 7]]), tree)]  # a tree
    with torch.inference_mode():
        for features, tokens, positions, mask in steps:
            expected, _ = net(features, tokens, target.embed, positions, caches[0], mask)
            got, _ = graphs(features, tokens, target.embed, positions, caches[1], mask)
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(graphs.head(got), net.head(expected), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(caches[1].k[:, :, :, :8], caches[0].k[:, :, :, :8], atol=1e-5, rtol=1e-5)
    assert caches[0].lengths.tolist() == caches[1].lengths.tolist() == [8]


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


@pytest.mark.parametrize("kind", ["medusa", "hydra", "eagle", "distilled", "clover"])
def test_drafters_run_their_graphs_on_onnxruntime(tiny_package, kind):
    package = InferencePackage.load(tiny_package)
    ort = package.backbone("onnxruntime", threads=1)
    method = build_method(kind, options=registry.package_options(package.drafter_directories())[kind])
    out = generate(ort, None, [1, 2, 3], max_new_tokens=16, stop_at_eos=False, method=method)
    assert method.drafter.graphs is not None  # type: ignore[attr-defined]
    assert out.token_ids == generate(ort, None, [1, 2, 3], max_new_tokens=16, stop_at_eos=False).token_ids
    # the PyTorch target keeps the PyTorch heads
    method = build_method(kind, options=registry.package_options(package.drafter_directories())[kind])
    generate(package.backbone("torch"), None, [1, 2, 3], max_new_tokens=4, stop_at_eos=False, method=method)
    assert method.drafter.graphs is None  # type: ignore[attr-defined]

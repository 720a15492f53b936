"""The fused decoder graph: its attention inputs, what it supports, and that it is the exported model
(the ONNX Runtime backend tests run every forward and drafter on it beside the portable graph)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tiny_models import greedy_target

from warpdecode.errors import ConfigError
from warpdecode.export.fused_graph import FUSED_GRAPH, fused_graph_supported, rotary_tables, write_fused_graph
from warpdecode.runtime.onnxruntime import attention_bias
from warpdecode.runtime.package import GRAPH, InferencePackage


def naive_attention_bias(start: list[int], T: int, new_mask: torch.Tensor) -> torch.Tensor:
    total = max(start) + T
    bias = torch.full((len(start), 1, T, total), float("-inf"))
    for b, s in enumerate(start):
        mask = new_mask[b if new_mask.shape[0] > 1 else 0]
        for t in range(T):
            bias[b, 0, t, :s] = 0
            for u in range(T):
                if mask[t, u]:
                    bias[b, 0, t, s + u] = 0
    return bias


@pytest.mark.parametrize("start", [[0], [7], [5, 9], [9, 5, 0]])
def test_attention_bias_matches_a_naive_construction(start: list[int]) -> None:
    T = 4
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    for mask in (tree[None], torch.stack([tree] + [torch.ones(T, T, dtype=torch.bool).tril()] * (len(start) - 1))):
        bias, seqlens, total = attention_bias(torch.tensor(start), T, mask)
        assert torch.equal(bias, naive_attention_bias(start, T, mask))
        assert seqlens.dtype == total.dtype == torch.int32
        assert seqlens.tolist() == [s + T - 1 for s in start] and int(total) == max(start) + T


def test_unsupported_models_say_why() -> None:
    config = greedy_target().config
    assert fused_graph_supported(config) is None
    assert fused_graph_supported(dataclasses.replace(config, causal=False, mlp="gelu_tanh")) == \
        "bidirectional attention, gelu_tanh MLPs"
    assert fused_graph_supported(config, torch.float16) == "float16 weights"
    with pytest.raises(ConfigError, match="does not support learned positions"):
        write_fused_graph(None, None, dataclasses.replace(config, position="learned"), (), {}, "")  # type: ignore[arg-type]


def test_rotary_tables_are_the_reference_angles() -> None:
    model = greedy_target()
    cos, sin = rotary_tables(model.config)
    positions = torch.tensor([[0, 3, 3, 17]])
    ref_cos, ref_sin = model.rope_tables(positions, torch.float32)  # (1, 1, 4, D): the half repeated
    half = cos.shape[1]
    assert torch.equal(cos[positions[0]], ref_cos[0, 0, :, :half])
    assert torch.equal(sin[positions[0]], ref_sin[0, 0, :, half:])


def test_the_fused_graph_reads_the_portable_graphs_weights(tiny_package) -> None:
    import onnx

    package = InferencePackage.load(tiny_package)
    assert package.manifest["backbone"]["fused_graph"] == FUSED_GRAPH and FUSED_GRAPH in package.manifest["files"]
    assert package.manifest["target"]["source"] == "greedy_target"  # the quantised copies did not rename it
    assert all(variant["fused"] for variant in package.manifest["backbone"]["variants"].values())
    fused = onnx.load(str(tiny_package / FUSED_GRAPH), load_external_data=False)
    external = [i for i in fused.graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL]
    assert external and {e.value for i in external for e in i.external_data if e.key == "location"} == {GRAPH + ".data"}
    ops = {n.op_type for n in fused.graph.node}
    assert {"GroupQueryAttention", "RotaryEmbedding", "SkipSimplifiedLayerNormalization"} <= ops


def test_an_onnxruntime_without_the_fused_operators_falls_back_to_the_step_graph(tiny_package, monkeypatch) -> None:
    import onnxruntime as ort
    from onnxruntime.capi.onnxruntime_pybind11_state import InvalidGraph

    real = ort.InferenceSession

    def older_runtime(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(path).endswith(FUSED_GRAPH):
            raise InvalidGraph("This is an invalid model. No Op registered for GroupQueryAttention")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", older_runtime)
    with pytest.warns(RuntimeWarning, match="could not load backbone.fused.onnx .*No Op registered"):
        backbone = InferencePackage.load(tiny_package).backbone("onnxruntime", threads=1)
    assert not backbone.fused

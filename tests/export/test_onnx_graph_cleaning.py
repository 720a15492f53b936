"""Cleaning exported graphs: the chosen onnxscript rewrite rules, and the fallback to onnxscript's default
optimizer where those rules are missing."""

import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from warpdecode.export import onnx_graph


def graph_with_no_ops() -> ir.Model:
    """y = transpose(w) @ ((x + 0) * 1): the add and the multiply are no-ops; the weight's transpose must stay."""
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    weight = helper.make_tensor("w", TensorProto.FLOAT, [2, 2], [1.0, 2.0, 3.0, 4.0])
    nodes = [helper.make_node("Add", ["x", "zero"], ["a"]), helper.make_node("Mul", ["a", "one"], ["m"]),
             helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]), helper.make_node("MatMul", ["m", "wt"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])], [zero, one, weight])
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


def operators(model: ir.Model) -> list[str]:
    proto = ir.to_proto(model)
    onnx.checker.check_model(proto)
    return [node.op_type for node in proto.graph.node]


def test_no_ops_go_and_weight_transposes_stay():
    model = graph_with_no_ops()
    onnx_graph.clean_graph(model)
    assert operators(model) == ["Transpose", "MatMul"]
    assert "w" in {init.name for init in ir.to_proto(model).graph.initializer}  # the weight keeps its name


def test_an_onnxscript_without_the_chosen_rules_falls_back_to_its_default_optimizer(monkeypatch):
    def missing():
        raise AttributeError("module 'onnxscript.rewriter.rules.common' has no attribute 'collapse_slice2_rule'")

    monkeypatch.setattr(onnx_graph, "rewrite_rules", missing)
    model = graph_with_no_ops()
    with pytest.warns(RuntimeWarning, match="default optimizer"):
        onnx_graph.clean_graph(model)
    assert operators(model) == ["Transpose", "MatMul"]

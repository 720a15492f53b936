"""Export the backbone's step graph (`step_graph.StepGraph`) to ONNX (`runtime.onnx_weights` reads weights back
out of it).

The graph is exported with `torch.onnx.export(dynamo=True)` at opset 18 with dynamic batch, new
tokens, cache length and logit count, weights in one external data file beside it
(`backbone.onnx.data`). Constant folding leaves the weights alone: they keep their state-dict names
(`model.blocks.0.attn.q_proj.weight`), so the PyTorch backend and the drafters read them from the
same file (ONNX Runtime folds their transposes itself when it loads the graph).
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from warpdecode.errors import ConfigError
from warpdecode.export.step_graph import StepGraph
from warpdecode.models.transformer import Transformer
from warpdecode.runtime.onnx_weights import WEIGHT_PREFIX
from warpdecode.runtime.package import QUANTIZATIONS

OPSET = 18


def _example_inputs(model: Transformer) -> tuple[torch.Tensor, ...]:
    """Inputs that trace every path: batch 2, 3 new tokens, 5 cache slots, 2 logits (all distinct and
    > 1, so the exporter keeps every dimension dynamic)."""
    config = model.config
    B, T, S, K = 2, 3, 5, 2
    device = model.embed.weight.device
    tokens = torch.zeros(B, T, dtype=torch.int64, device=device)
    positions = (S + torch.arange(T, device=device)).expand(B, T).contiguous()
    mask = torch.ones(B, 1, T, S + T, dtype=torch.bool, device=device)
    logit_index = torch.arange(T - K, T, device=device)
    past = [torch.zeros(B, config.kv_head_count, S, config.head_width, dtype=model.embed.weight.dtype, device=device)
            for _ in range(2 * config.n_layer)]
    return (tokens, positions, mask, logit_index, *past)


def export_step_graph(model: Transformer, path: Path,
                      hidden_layers: tuple[int, ...]) -> tuple[StepGraph, dict[str, str]]:
    """Write `path` (and `path`.data) for `model`, check it with `onnx.checker`; return the wrapper
    and the weight aliases (`_weight_aliases`) that `read_weights` needs to find every weight.

    `hidden_layers`: the hidden states (0..L, see `BackboneOutput`) the graph returns beside the
    logits; drafters can only read these on an exported backbone.
    """
    from torch.export import Dim

    graph = StepGraph(model, hidden_layers).eval()
    model.unpack()  # the export traces the dense weights (packed copies are a CPU runtime detail)
    batch, new = Dim("batch"), Dim("new_tokens")
    shapes = {"input_ids": {0: batch, 1: new}, "position_ids": {0: batch, 1: new},
              "attention_mask": {0: batch, 2: new, 3: Dim.AUTO}, "logit_index": {0: Dim("logits")},
              "past": cache_shapes(model.config.n_layer, batch)}
    program = export_optimized(graph, _example_inputs(model), shapes, path, external_data=True)
    return graph, _weight_aliases(model, set(program.model.graph.initializers))


def cache_shapes(n_layer: int, batch: Any) -> tuple[dict[int, Any], ...]:
    """Dynamic shapes of a step graph's per-layer cache inputs (B, Hkv, S, D): batch and cache length."""
    from torch.export import Dim

    cache_len = Dim("cache_len")
    return tuple({0: batch, 2: cache_len} for _ in range(2 * n_layer))


def export_optimized(graph: torch.nn.Module, inputs: tuple[torch.Tensor, ...], shapes: dict[str, Any], path: Path,
                     *, external_data: bool) -> Any:
    """torch.onnx.export (dynamo, opset 18) of `graph`'s forward over `inputs`, names from its
    `input_names()` / `output_names()`, cleaned by onnxscript's optimizer, saved at `path` and checked
    with `onnx.checker`; returns the ONNX program."""
    import onnx

    quiet = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(quiet), quiet_exporter():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(graph, inputs, None, dynamo=True, dynamic_shapes=shapes,
                                    input_names=graph.input_names(), output_names=graph.output_names(),  # type: ignore[operator]
                                    opset_version=OPSET, optimize=False, verbose=False)
        assert program is not None
        clean_graph(program.model)
        program.save(str(path), external_data=external_data)
    onnx.checker.check_model(str(path))
    return program


def rewrite_rules() -> tuple[Any, ...]:
    """The onnxscript rewrite rules a transformer step graph can use: no-op removal, cast / reshape /
    transpose / unsqueeze chains, slice collapsing, reshape-shape materialisation and scatter no-ops.

    onnxscript's default set also holds convolution, batch-norm, pad, clip and ReLU rules that never
    match a transformer, and `slice_split_rule`, which costs ~50 s on the 30-layer default model for no
    change after the slices collapse: without them the optimised graph is the same (2,251 nodes, the
    same operators) and cleaning it takes 8 s instead of 47 s.
    """
    from onnxscript.rewriter.rules import common as rules

    return (rules.add_0_rule, rules.sub_0_rule, rules.mul_by_1_rule, rules.div_by_1_rule,
            rules.dropout_inference_rule, rules.dropout_zero_rule, rules.no_op_cast_rule, rules.no_op_expand_rule,
            rules.no_op_transpose_rule, rules.no_op_static_scatter_nd_rule, rules.no_op_dynamic_scatter_nd_rule,
            rules.cast_cast_rule, rules.cast_constant_of_shape_rule, rules.cast_constant_of_shape_without_value_rule,
            rules.reshape_reshape_rule, rules.squeeze_reshape_1d_rule, rules.flatten_to_reshape_rule,
            rules.transpose_transpose_rule, rules.unsqueeze_unsqueeze_rule, rules.collapse_slice_rule,
            rules.collapse_slice2_rule, rules.materialize_reshape_shape_rule, rules.one_reshape_matmul_reshape_rule,
            rules.two_reshapes_matmul_reshape_rule)


def keep_weight_transposes(node: Any) -> bool | None:
    """Constant folding leaves transposes alone, so the weights keep their state-dict names (ONNX
    Runtime folds their transposes itself when it loads the graph); other nodes: onnxscript decides."""
    return False if node.op_type == "Transpose" else None


def clean_graph(model: Any, iterations: int = 2) -> None:
    """Fold constants and apply `rewrite_rules()` to an exported ONNX IR model in place, as
    `onnxscript.optimizer.optimize_ir` does with its default rules (the raw export splits q/k/v through
    sequence ops that cost ONNX Runtime ~25% of a decode step), transposes excepted
    (`keep_weight_transposes`). An onnxscript without these rules or passes (they are tested on the
    version constraints.txt pins) gets `optimize_ir` with its default rules, with a warning: the same
    graph, ~40 s slower on the default model."""
    import onnx_ir as ir
    from onnx_ir.passes import common

    try:
        from onnxscript.optimizer import _constant_folding
        from onnxscript.rewriter import RewritePass

        rules = rewrite_rules()
    except (ImportError, AttributeError) as error:
        from onnxscript.optimizer import optimize_ir

        warnings.warn(f"this onnxscript lacks a rewrite rule or pass warpdecode selects ({error}); cleaning the "
                      f"graph with onnxscript's default optimizer instead (slower export, same graph)",
                      RuntimeWarning, stacklevel=2)
        optimize_ir(model, num_iterations=iterations, should_fold=keep_weight_transposes)
        return
    fold = _constant_folding.FoldConstantsPass(
        shape_inference=True, input_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT,
        output_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT,
        should_fold=keep_weight_transposes)
    loop = ir.passes.PassManager([fold, RewritePass(rules), common.RemoveUnusedNodesPass(),
                                  common.RemoveUnusedFunctionsPass(), common.RemoveUnusedOpsetsPass()],
                                 steps=iterations, early_stop=True)
    ir.passes.Sequential(
        common.InlinePass(), loop, common.RemoveUnusedNodesPass(),
        common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common.LiftSubgraphInitializersToMainGraphPass(), common.DeduplicateInitializersPass(),
        common.CommonSubexpressionEliminationPass(), common.OutputFixPass(), common.NameFixPass(),
    )(model)


def _weight_aliases(model: Transformer, kept: set[str]) -> dict[str, str]:
    """State-dict weights the optimizer merged into an identical initializer (untrained norms are all
    ones, for example): graph name of each missing weight → the initializer that holds its values."""
    state = {WEIGHT_PREFIX + k: v for k, v in model.state_dict().items()}
    aliases = {}
    for name, tensor in state.items():
        if name in kept:
            continue
        twin = next((other for other in sorted(kept & state.keys())
                     if state[other].shape == tensor.shape and torch.equal(state[other], tensor)), None)
        if twin is None:
            raise RuntimeError(f"the exported graph lost the weight {name}; the torch backend could not rebuild it")
        aliases[name] = twin
    return aliases


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
    """Silence the exporters and quantisers: they log a line per skipped torchvision op, per export
    stage and per quantised node (some to the root logger). Warnings and below, for the block only."""
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def quantize(graph: Path, out: Path, kind: str) -> None:
    """Write `out`: `graph` with every MatMul weight quantised (`QUANTIZATIONS`). Lossy:
    `export.accuracy` measures what it costs. The weights' transposes are folded first (ONNX
    Runtime's basic optimisation): only MatMuls that read an initializer directly are quantised."""
    import tempfile

    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    if kind not in QUANTIZATIONS:
        raise ConfigError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {kind!r}")
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp, warnings.catch_warnings(), quiet_exporter():
        warnings.simplefilter("ignore")
        folded = Path(tmp) / "folded.onnx"
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(folded)
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", "folded.onnx.data")
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
        if kind == "int8":
            # DefaultTensorType: shape inference gives no types for the fused graph's contrib operators' outputs.
            # Unsigned weights: with signed ones, x86 CPUs without VNNI multiply u8 × s8 pairs with a
            # saturating instruction (VPMADDUBSW), which wrecked the default model's int8 graph on an
            # AVX2-only EPYC (top-1 agreement 0.0); u8 × u8 has no saturation, on every CPU.
            quantize_dynamic(folded, out, op_types_to_quantize=["MatMul"], per_channel=True,
                             weight_type=QuantType.QUInt8, use_external_data_format=True,
                             extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
        else:
            _quantize_int4(folded, out)


def _quantize_int4(folded: Path, out: Path) -> None:
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = onnx.load(str(folded))
    quantizer = MatMulNBitsQuantizer(model, bits=4, block_size=32, is_symmetric=False,
                                     nodes_to_exclude=_lm_head_nodes(model))
    quantizer.process()
    onnx.save_model(quantizer.model.model, str(out), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=out.name + ".data")


def _lm_head_nodes(model: Any) -> list[str]:
    """The LM head's MatMul (the one that writes the `logits` output): kept in fp32 by int4, where
    4 bits over 49k output rows cost the most top-1 agreement (measured on the default model: 0.76
    with the head in int4, 0.82 without)."""
    return [n.name for n in model.graph.node if n.op_type == "MatMul" and "logits" in n.output]

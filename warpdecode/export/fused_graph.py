"""The backbone's step graph written with ONNX Runtime's fused decoder operators.

`step_graph.StepGraph` exported by `torch.onnx` is portable (standard ONNX, any batch, any mask,
bidirectional models) but runs every attention as about seventy small operators and returns the new
keys and values for the runtime to copy into the cache. For causal, rotary, RMS-norm, SwiGLU models
(the Llama family) this module writes the same computation node by node with the operators ONNX
Runtime ships for decoders:

    RMSNormalization / SkipSimplifiedLayerNormalization               (RMS norm, fused residual add)
    MatMul over stacked q|k|v and gate|up weights                      (two matmuls instead of five)
    RotaryEmbedding (com.microsoft)                                    (any position ids: tree nodes)
    GroupQueryAttention (com.microsoft)                                (attends to the cache in place
                                                                        and writes the new keys/values
                                                                        into it: no copies)
    QuickGelu(alpha=1) * up                                            (SiLU-gated MLP)

Its weights are the generic graph's: every initializer points into the same external data file
(`backbone.onnx.data`), so the fused graph adds a couple of megabytes (the rotary tables) to a package.

    inputs:  input_ids (B, T) int64, position_ids (B, T) int64,
             attention_bias (B, 1, T, P) float       (P = cache slots attended + T; 0 = attend, -inf = not),
             seqlens_k (B,) int32                    (each row's last slot after the write: start + T - 1),
             total_sequence_length () int32          (P),
             logit_index (K,) int64,
             past_key_i, past_value_i (B, Hkv, S, D) (the whole preallocated cache buffer of layer i)
    outputs: logits (B, K, V), present_key_i / present_value_i (B, Hkv, S, D): bound to the same
             memory as the past inputs, so GroupQueryAttention writes the T new positions in place
             at slots start .. start + T - 1, exactly where `KVCache.plan_write` puts them;
             hidden_j (B, T, C) per exported hidden layer j.

ONNX Runtime's GroupQueryAttention takes more than one new position against a filled cache only for
one row at a time (B = 1); the runtime (`runtime.onnxruntime`) runs such batches row by row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from warpdecode.errors import ConfigError
from warpdecode.models.config import ModelConfig
from warpdecode.models.transformer import rope_inv_freq

FUSED_GRAPH = "backbone.fused.onnx"
MS_DOMAIN = "com.microsoft"
OPSET = 23
"""For RMSNormalization (the first block's norm; the others are fused with the residual add)."""


def fused_graph_supported(config: ModelConfig, dtype: torch.dtype = torch.float32) -> str | None:
    """None when a model of `config` with `dtype` weights can run as the fused graph; otherwise why not."""
    reasons = [reason for failed, reason in (
        (dtype != torch.float32, f"{str(dtype).removeprefix('torch.')} weights"),
        (not config.causal, "bidirectional attention"),
        (config.position != "rope", f"{config.position} positions"),
        (config.norm != "rmsnorm", f"{config.norm} norms"),
        (config.mlp != "swiglu", f"{config.mlp} MLPs"),
        (config.qkv_bias or config.out_bias or config.mlp_bias, "linear biases"),
    ) if failed]
    return ", ".join(reasons) if reasons else None


def rotary_tables(config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (max_seq_len, D/2) as `Transformer.rope_tables` computes them (the same float32
    products, so the fused graph rotates by exactly the reference's angles)."""
    positions = torch.arange(config.max_seq_len, dtype=torch.float32)
    freqs = positions[:, None] * rope_inv_freq(config)
    return freqs.cos(), freqs.sin()


def write_fused_graph(source: Path, out: Path, config: ModelConfig, hidden_layers: tuple[int, ...],
                      aliases: dict[str, str], weight_prefix: str) -> None:
    """Write the fused graph at `out` (beside `source`, the generic graph whose external weights it
    reads) and check it with `onnx.checker`.

    Args:
        aliases: state-dict weight name → the initializer that holds it (`onnx_graph._weight_aliases`).
        weight_prefix: the generic graph's prefix on state-dict names.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    reason = fused_graph_supported(config)
    if reason is not None:
        raise ConfigError(f"the fused graph does not support {reason}")
    if out.parent != source.parent:
        raise ConfigError("the fused graph must sit beside the graph whose weights it reads")
    generic = onnx.load(str(source), load_external_data=False).graph
    stored = {init.name: init for init in generic.initializer}
    L, H, Hkv, D, C = config.n_layer, config.n_head, config.kv_head_count, config.head_width, config.d_model
    nodes: list[Any] = []
    weights: dict[str, Any] = {}  # the generic graph's initializers this graph reads, by name
    initializers: list[Any] = []  # its own (rotary tables, split sizes)

    def weight(name: str) -> str:
        key = weight_prefix + name
        init = stored[aliases.get(key, key)]
        weights[init.name] = init
        return init.name

    def node(op: str, inputs: list[str], outputs: list[str], domain: str = "", **attrs: Any) -> None:
        nodes.append(helper.make_node(op, inputs, outputs, name=f"{op}_{len(nodes)}", domain=domain, **attrs))

    def matmul(x: str, names: list[str], out_name: str) -> None:
        """x @ stacked(weights).T; ONNX Runtime folds the Concat and Transpose of constants at load."""
        if len(names) == 1:
            stacked = weight(names[0])
        else:
            stacked = f"{out_name}.w"
            node("Concat", [weight(n) for n in names], [stacked], axis=0)
        node("Transpose", [stacked], [f"{out_name}.wt"], perm=[1, 0])
        node("MatMul", [x, f"{out_name}.wt"], [out_name])

    cos, sin = rotary_tables(config)
    initializers += [numpy_helper.from_array(cos.numpy(), "rotary.cos"), numpy_helper.from_array(sin.numpy(), "rotary.sin")]
    eps = float(config.norm_eps)
    node("Gather", [weight("embed.weight"), "input_ids"], ["x.0"], axis=0)
    residual, pending = "x.0", ""  # block input, and the MLP output still to add to it
    hidden = {0: "x.0"}
    for i in range(L):
        p = f"blocks.{i}."
        if pending:  # the previous MLP's output joins the residual stream while this block's norm runs
            node("SkipSimplifiedLayerNormalization", [pending, residual, weight(p + "attn_norm.weight")],
                 [f"n.{i}", "", "", f"x.{i}"], domain=MS_DOMAIN, epsilon=eps)
            residual = hidden[i] = f"x.{i}"
        else:
            node("RMSNormalization", [residual, weight(p + "attn_norm.weight")], [f"n.{i}"], axis=-1, epsilon=eps)
        matmul(f"n.{i}", [p + "attn.q_proj.weight", p + "attn.k_proj.weight", p + "attn.v_proj.weight"], f"qkv.{i}")
        node("Split", [f"qkv.{i}", "qkv_sizes"], [f"q.{i}", f"k.{i}", f"v.{i}"], axis=-1)
        node("RotaryEmbedding", [f"q.{i}", "position_ids", "rotary.cos", "rotary.sin"], [f"qr.{i}"],
             domain=MS_DOMAIN, num_heads=H)
        node("RotaryEmbedding", [f"k.{i}", "position_ids", "rotary.cos", "rotary.sin"], [f"kr.{i}"],
             domain=MS_DOMAIN, num_heads=Hkv)
        node("GroupQueryAttention", [f"qr.{i}", f"kr.{i}", f"v.{i}", f"past_key_{i}", f"past_value_{i}", "seqlens_k",
                                     "total_sequence_length", "", "", "", "attention_bias"],
             [f"attn.{i}", f"present_key_{i}", f"present_value_{i}"], domain=MS_DOMAIN, num_heads=H, kv_num_heads=Hkv)
        matmul(f"attn.{i}", [p + "attn.o_proj.weight"], f"o.{i}")
        node("SkipSimplifiedLayerNormalization", [f"o.{i}", residual, weight(p + "mlp_norm.weight")],
             [f"m.{i}", "", "", f"mid.{i}"], domain=MS_DOMAIN, epsilon=eps)
        matmul(f"m.{i}", [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"], f"gu.{i}")
        node("Split", [f"gu.{i}", "gate_up_sizes"], [f"gate.{i}", f"up.{i}"], axis=-1)
        node("QuickGelu", [f"gate.{i}"], [f"silu.{i}"], domain=MS_DOMAIN, alpha=1.0)
        node("Mul", [f"silu.{i}", f"up.{i}"], [f"act.{i}"])
        matmul(f"act.{i}", [p + "mlp.down_proj.weight"], f"mlp.{i}")
        residual, pending = f"mid.{i}", f"mlp.{i}"
    node("SkipSimplifiedLayerNormalization", [pending, residual, weight("norm.weight")],
         [f"x.{L}"], domain=MS_DOMAIN, epsilon=eps)
    hidden[L] = f"x.{L}"
    node("Gather", [f"x.{L}", "logit_index"], ["x.logits"], axis=1)
    matmul("x.logits", ["embed.weight" if config.tie_embeddings else "lm_head.weight"], "logits")
    initializers += [numpy_helper.from_array(torch.tensor([H * D, Hkv * D, Hkv * D]).numpy(), "qkv_sizes"),
                     numpy_helper.from_array(torch.tensor([config.d_ff, config.d_ff]).numpy(), "gate_up_sizes")]

    def value(name: str, dtype: int, shape: list[Any]) -> Any:
        return helper.make_tensor_value_info(name, dtype, shape)

    F32 = TensorProto.FLOAT
    cache = ["batch", Hkv, "cache_len", D]
    inputs = [value("input_ids", TensorProto.INT64, ["batch", "new_tokens"]),
              value("position_ids", TensorProto.INT64, ["batch", "new_tokens"]),
              value("attention_bias", F32, ["batch", 1, "new_tokens", "total_sequence_length"]),
              value("seqlens_k", TensorProto.INT32, ["batch"]),
              value("total_sequence_length", TensorProto.INT32, []),
              value("logit_index", TensorProto.INT64, ["logits"])]
    inputs += [value(f"past_{kind}_{i}", F32, cache) for i in range(L) for kind in ("key", "value")]
    outputs = [value("logits", F32, ["batch", "logits", config.vocab_size])]
    outputs += [value(f"present_{kind}_{i}", F32, cache) for i in range(L) for kind in ("key", "value")]
    for j in sorted(set(hidden_layers)):
        node("Identity", [hidden[j]], [f"hidden_{j}"])
        outputs.append(value(f"hidden_{j}", F32, ["batch", "new_tokens", C]))
    graph = helper.make_graph(nodes, "warpdecode_fused_step", inputs, outputs, [*weights.values(), *initializers])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)],
                              producer_name="warpdecode")
    onnx.save_model(model, str(out))
    onnx.checker.check_model(str(out))


"""Hugging Face checkpoint layout ⇄ warpdecode layout (config fields and weight names).

A converted warpdecode model directory *is* a Hugging Face checkpoint (config.json,
model.safetensors, tokenizer.json), so `transformers` can load it as well.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import Tensor

from warpdecode.errors import CheckpointError
from warpdecode.models.config import ModelConfig

_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "gpt2": "GPT2LMHeadModel"}


def _eos_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """Read a Hugging Face `config.json` dict into a `ModelConfig`.

    A masked diffusion LM is marked by `is_causal: false` and its `mask_token_id` (LLaDA's names).
    """
    config = _architecture_from_hf(hf)
    config.causal = bool(hf.get("is_causal", True))
    config.mask_token_id = hf.get("mask_token_id")
    return config


def _architecture_from_hf(hf: dict[str, Any]) -> ModelConfig:
    model_type = hf.get("model_type")
    try:
        if model_type in ("llama", "qwen2", "mistral"):
            n_head = hf["num_attention_heads"]
            return ModelConfig(
                vocab_size=hf["vocab_size"],
                n_layer=hf["num_hidden_layers"],
                n_head=n_head,
                n_kv_head=hf.get("num_key_value_heads") or n_head,
                d_model=hf["hidden_size"],
                d_ff=hf["intermediate_size"],
                head_dim=hf.get("head_dim") or hf["hidden_size"] // n_head,
                max_seq_len=hf.get("max_position_embeddings", 2048),
                norm="rmsnorm",
                norm_eps=hf.get("rms_norm_eps", 1e-6),
                mlp="swiglu",
                position="rope",
                rope_theta=float(hf.get("rope_theta", (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0))),
                rope_scaling=_rope_scaling(hf),
                qkv_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
                out_bias=bool(hf.get("attention_bias", False)),
                mlp_bias=bool(hf.get("mlp_bias", False)),
                tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
                bos_token_id=hf.get("bos_token_id"),
                eos_token_ids=_eos_list(hf.get("eos_token_id")),
                family="qwen2" if model_type == "qwen2" else "llama",
            )
        if model_type == "gpt2":
            d = hf["n_embd"]
            return ModelConfig(
                vocab_size=hf["vocab_size"],
                n_layer=hf["n_layer"],
                n_head=hf["n_head"],
                d_model=d,
                d_ff=hf.get("n_inner") or 4 * d,
                max_seq_len=hf["n_positions"],
                norm="layernorm",
                norm_eps=hf.get("layer_norm_epsilon", 1e-5),
                mlp="gelu_tanh",
                position="learned",
                qkv_bias=True,
                out_bias=True,
                mlp_bias=True,
                tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
                bos_token_id=hf.get("bos_token_id"),
                eos_token_ids=_eos_list(hf.get("eos_token_id")),
                family="gpt2",
            )
    except KeyError as e:
        raise CheckpointError(f"config.json of model_type {model_type!r} lacks field {e}") from e
    raise CheckpointError(f"unsupported model_type {model_type!r} (supported: llama, qwen2, mistral, gpt2)")


def _rope_scaling(hf: dict[str, Any]) -> dict[str, Any] | None:
    scaling = hf.get("rope_scaling") or hf.get("rope_parameters")
    if not scaling:
        return None
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return None
    return {k: v for k, v in scaling.items() if k != "rope_theta"}


def config_to_hf(config: ModelConfig) -> dict[str, Any]:
    """The Hugging Face `config.json` dict for `config` (loadable by `transformers`)."""
    eos: int | list[int] | None = config.eos_token_ids[0] if len(config.eos_token_ids) == 1 else config.eos_token_ids or None
    common = {
        "architectures": [_ARCHITECTURES[config.family]],
        "model_type": config.family,
        "vocab_size": config.vocab_size,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": eos,
        "tie_word_embeddings": config.tie_embeddings,
        "torch_dtype": "float32",
    }
    if not config.causal:
        common |= {"is_causal": False, "mask_token_id": config.mask_token_id}
    if config.family == "gpt2":
        return common | {
            "n_layer": config.n_layer,
            "n_head": config.n_head,
            "n_embd": config.d_model,
            "n_inner": config.d_ff,
            "n_positions": config.max_seq_len,
            "layer_norm_epsilon": config.norm_eps,
            "activation_function": "gelu_new",
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
        }
    out = common | {
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.kv_head_count,
        "hidden_size": config.d_model,
        "intermediate_size": config.d_ff,
        "head_dim": config.head_width,
        "max_position_embeddings": config.max_seq_len,
        "rms_norm_eps": config.norm_eps,
        "hidden_act": "silu",
        "rope_theta": config.rope_theta,
        "rope_scaling": config.rope_scaling,
        "mlp_bias": config.mlp_bias,
    }
    if config.family == "llama":
        out["attention_bias"] = config.qkv_bias
    return out


_LLAMA_RULES = [
    (r"model\.embed_tokens\.weight", "embed.weight"),
    (r"model\.norm\.weight", "norm.weight"),
    (r"lm_head\.weight", "lm_head.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.([qkvo])_proj\.(weight|bias)", r"blocks.\1.attn.\2_proj.\3"),
    (r"model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.(weight|bias)", r"blocks.\1.mlp.\2_proj.\3"),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", r"blocks.\1.attn_norm.weight"),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", r"blocks.\1.mlp_norm.weight"),
]
_GPT2_RULES = [
    (r"wte\.weight", "embed.weight"),
    (r"wpe\.weight", "pos_embed.weight"),
    (r"ln_f\.(weight|bias)", r"norm.\1"),
    (r"lm_head\.weight", "lm_head.weight"),
    (r"h\.(\d+)\.ln_1\.(weight|bias)", r"blocks.\1.attn_norm.\2"),
    (r"h\.(\d+)\.ln_2\.(weight|bias)", r"blocks.\1.mlp_norm.\2"),
    (r"h\.(\d+)\.attn\.c_proj\.(weight|bias)", r"blocks.\1.attn.o_proj.\2"),
    (r"h\.(\d+)\.mlp\.c_fc\.(weight|bias)", r"blocks.\1.mlp.up_proj.\2"),
    (r"h\.(\d+)\.mlp\.c_proj\.(weight|bias)", r"blocks.\1.mlp.down_proj.\2"),
]
_GPT2_CONV1D = re.compile(r"h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight")
_GPT2_QKV = re.compile(r"h\.(\d+)\.attn\.c_attn\.(weight|bias)")
_GPT2_SKIP = re.compile(r"h\.\d+\.attn\.(masked_)?bias")  # causal-mask buffers of old checkpoints


def _rename(name: str, rules: list[tuple[str, str]]) -> str | None:
    for pattern, repl in rules:
        if re.fullmatch(pattern, name):
            return re.sub(pattern, repl, name)
    return None


def state_dict_from_hf(hf: dict[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
    """Rename (and for GPT-2, transpose and split) Hugging Face weights into warpdecode names."""
    out: dict[str, Tensor] = {}
    for name, tensor in hf.items():
        if config.family == "gpt2":
            name = name.removeprefix("transformer.")
            if _GPT2_SKIP.fullmatch(name):
                continue
            if _GPT2_CONV1D.fullmatch(name):
                tensor = tensor.t()  # Conv1D stores (in, out)
            qkv = _GPT2_QKV.fullmatch(name)
            if qkv:
                layer, kind = qkv.groups()
                for part, chunk in zip("qkv", tensor.chunk(3, dim=0)):
                    out[f"blocks.{layer}.attn.{part}_proj.{kind}"] = chunk.contiguous()
                continue
            new = _rename(name, _GPT2_RULES)
        else:
            new = _rename(name, _LLAMA_RULES)
            if new is None and name.endswith("rotary_emb.inv_freq"):
                continue
        if new is None:
            raise CheckpointError(f"unexpected weight {name!r} in a {config.family} checkpoint")
        out[new] = tensor.contiguous()
    if config.tie_embeddings:
        out.pop("lm_head.weight", None)
    return out


def state_dict_to_hf(state: dict[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
    """The inverse of `state_dict_from_hf`: warpdecode weights in Hugging Face names."""
    out: dict[str, Tensor] = {}
    if config.family != "gpt2":
        inverse = [(_to_regex(repl), _to_template(pattern)) for pattern, repl in _LLAMA_RULES]
        for name, tensor in state.items():
            new = _rename(name, inverse)
            if new is None:
                raise CheckpointError(f"cannot map weight {name!r} to a Hugging Face name")
            out[new] = tensor.contiguous()
        return out
    inverse = [(_to_regex(repl), _to_template(pattern)) for pattern, repl in _GPT2_RULES]
    for name, tensor in state.items():
        m = re.fullmatch(r"blocks\.(\d+)\.attn\.q_proj\.(weight|bias)", name)
        if m:
            layer, kind = m.groups()
            parts = [state[f"blocks.{layer}.attn.{p}_proj.{kind}"] for p in "qkv"]
            fused = torch.cat(parts, dim=0)
            out[f"transformer.h.{layer}.attn.c_attn.{kind}"] = (fused.t() if kind == "weight" else fused).contiguous()
            continue
        if re.fullmatch(r"blocks\.\d+\.attn\.[kv]_proj\.(weight|bias)", name):
            continue
        new = _rename(name, inverse)
        if new is None:
            raise CheckpointError(f"cannot map weight {name!r} to a Hugging Face name")
        if _GPT2_CONV1D.fullmatch(new):
            tensor = tensor.t()
        out[new if new == "lm_head.weight" else "transformer." + new] = tensor.contiguous()
    return out


def _to_regex(template: str) -> str:
    """`blocks.\\1.attn.\\2_proj.\\3` → a regex capturing each group (inverse direction)."""
    escaped = re.escape(template)
    return re.sub(r"\\\\(\d)", lambda m: "(" + r"[^.]+" + ")", escaped)


def _to_template(pattern: str) -> str:
    """`model\\.layers\\.(\\d+)\\.mlp\\.(gate|up|down)_proj` → `model.layers.\\1.mlp.\\2_proj`."""
    counter = iter(range(1, 10))
    template = re.sub(r"\([^)]*\)", lambda m: f"\\{next(counter)}", pattern)
    return template.replace("\\.", ".")

"""Hugging Face checkpoint layout ⇄ warpdecode layout (config fields and weight names).

A converted warpdecode model directory *is* a Hugging Face checkpoint (config.json,
model.safetensors, tokenizer.json), so `transformers` can load it as well.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from warpdecode.errors import CheckpointError, ConfigError
from warpdecode.models.config import ModelConfig

_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "gpt2": "GPT2LMHeadModel"}


_MISSING: Any = object()


def _int(hf: dict[str, Any], key: str, default: Any = _MISSING) -> Any:
    """`hf[key]` as an int (or `default` where absent or null); a wrong type names the field."""
    value = hf.get(key)
    if value is None:
        if default is _MISSING:
            raise KeyError(key)
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckpointError(f"config.json field {key!r} must be an integer, got {value!r}")
    return value


def _flag(hf: dict[str, Any], key: str, default: bool) -> bool:
    value = hf.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise CheckpointError(f"config.json field {key!r} must be true or false, got {value!r}")
    return value


def _number(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CheckpointError(f"config.json field {key!r} must be a number, got {value!r}")
    return float(value)


def _eos_list(value: Any) -> list[int]:
    if value is None:
        return []
    ids = value if isinstance(value, list) else [value]
    if any(isinstance(v, bool) or not isinstance(v, int) for v in ids):
        raise CheckpointError(f"config.json field 'eos_token_id' must be an integer or a list of them, got {value!r}")
    return list(ids)


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """Read a Hugging Face `config.json` dict into a `ModelConfig`.

    A masked diffusion LM is marked by `is_causal: false` and its `mask_token_id` (LLaDA's names).
    A field of the wrong type is a `CheckpointError` naming it; sizes the model cannot have (zero,
    negative, beyond `SIZE_LIMITS`, heads not dividing the width) are the `ConfigError`s of
    `ModelConfig`.
    """
    if not isinstance(hf, dict):
        raise CheckpointError(f"config.json must hold a JSON object, got {type(hf).__name__}")
    config = _architecture_from_hf(hf)
    config.causal = _flag(hf, "is_causal", True)
    config.mask_token_id = _int(hf, "mask_token_id", None)
    if config.mask_token_id is not None and not 0 <= config.mask_token_id < config.vocab_size:
        raise CheckpointError(f"config.json mask_token_id={config.mask_token_id} is not a token id "
                              f"(vocab_size={config.vocab_size})")
    return config


def _architecture_from_hf(hf: dict[str, Any]) -> ModelConfig:
    try:
        return _build_from_hf(hf)
    except ConfigError as e:  # ModelConfig's own checks: name the fields as config.json does
        names = _HF_FIELDS["gpt2" if hf.get("model_type") == "gpt2" else "llama"]
        raise ConfigError(re.sub(r"\b(\w+)\b", lambda m: names.get(m.group(1), m.group(1)), str(e))) from e


def _build_from_hf(hf: dict[str, Any]) -> ModelConfig:
    model_type = hf.get("model_type")
    try:
        if model_type in ("llama", "qwen2", "mistral"):
            n_head = _int(hf, "num_attention_heads")
            return ModelConfig(
                vocab_size=_int(hf, "vocab_size"),
                n_layer=_int(hf, "num_hidden_layers"),
                n_head=n_head,
                n_kv_head=_int(hf, "num_key_value_heads", None) or n_head,
                d_model=_int(hf, "hidden_size"),
                d_ff=_int(hf, "intermediate_size"),
                head_dim=_int(hf, "head_dim", None) or None,
                max_seq_len=_int(hf, "max_position_embeddings", 2048),
                norm="rmsnorm",
                norm_eps=_number(hf.get("rms_norm_eps", 1e-6), "rms_norm_eps"),
                mlp="swiglu",
                position="rope",
                rope_theta=_rope_theta(hf),
                rope_scaling=_rope_scaling(hf),
                qkv_bias=model_type == "qwen2" or _flag(hf, "attention_bias", False),
                out_bias=_flag(hf, "attention_bias", False),
                mlp_bias=_flag(hf, "mlp_bias", False),
                tie_embeddings=_flag(hf, "tie_word_embeddings", False),
                bos_token_id=_int(hf, "bos_token_id", None),
                eos_token_ids=_eos_list(hf.get("eos_token_id")),
                family="qwen2" if model_type == "qwen2" else "llama",
            )
        if model_type == "gpt2":
            d = _int(hf, "n_embd")
            return ModelConfig(
                vocab_size=_int(hf, "vocab_size"),
                n_layer=_int(hf, "n_layer"),
                n_head=_int(hf, "n_head"),
                d_model=d,
                d_ff=_int(hf, "n_inner", None) or 4 * d,
                max_seq_len=_int(hf, "n_positions"),
                norm="layernorm",
                norm_eps=_number(hf.get("layer_norm_epsilon", 1e-5), "layer_norm_epsilon"),
                mlp="gelu_tanh",
                position="learned",
                qkv_bias=True,
                out_bias=True,
                mlp_bias=True,
                tie_embeddings=_flag(hf, "tie_word_embeddings", True),
                bos_token_id=_int(hf, "bos_token_id", None),
                eos_token_ids=_eos_list(hf.get("eos_token_id")),
                family="gpt2",
            )
    except KeyError as e:
        raise CheckpointError(f"config.json of model_type {model_type!r} lacks field {e}") from e
    raise CheckpointError(f"unsupported model_type {model_type!r} (supported: llama, qwen2, mistral, gpt2)")


def _rope_theta(hf: dict[str, Any]) -> float:
    if "rope_theta" in hf:
        return _number(hf["rope_theta"], "rope_theta")
    parameters = hf.get("rope_parameters") or {}
    if not isinstance(parameters, dict):
        raise CheckpointError(f"config.json field 'rope_parameters' must be an object, got {parameters!r}")
    return _number(parameters.get("rope_theta", 10000.0), "rope_parameters.rope_theta")


def _rope_scaling(hf: dict[str, Any]) -> dict[str, Any] | None:
    scaling = hf.get("rope_scaling") or hf.get("rope_parameters")
    if not scaling:
        return None
    if not isinstance(scaling, dict):
        raise CheckpointError(f"config.json field 'rope_scaling' must be an object, got {scaling!r}")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return None
    return {k: v for k, v in scaling.items() if k != "rope_theta"}


_HF_FIELDS = {
    "llama": {"n_layer": "num_hidden_layers", "d_model": "hidden_size", "d_ff": "intermediate_size",
              "n_head": "num_attention_heads", "n_kv_head": "num_key_value_heads",
              "max_seq_len": "max_position_embeddings", "norm_eps": "rms_norm_eps"},
    "gpt2": {"n_layer": "n_layer", "d_model": "n_embd", "d_ff": "n_inner", "n_head": "n_head",
             "n_kv_head": "n_head", "max_seq_len": "n_positions", "norm_eps": "layer_norm_epsilon"},
}
"""warpdecode's config field → the config.json key it is read from, per layout."""
_LAYER_INDEX = re.compile(r"(?:model\.layers|(?:transformer\.)?h)\.(\d+)\.")


def shape_mismatch(config: ModelConfig, shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    """How the sizes in `config` disagree with the Hugging Face-named tensor `shapes` of its checkpoint
    (the config's field names, both values and the tensor), or None where they agree.

    Checks what makes a model large (vocabulary, width, MLP width, heads, layers, learned positions)
    from the headers alone, before anything is built: a config claiming a million layers or a 40 GB
    vocabulary over a small checkpoint is refused here. A config with fewer layers than the weights
    is left to the load's unexpected-weights check, which names them.
    """
    fields = _HF_FIELDS["gpt2" if config.family == "gpt2" else "llama"]
    layers = {int(m.group(1)) for name in shapes if (m := _LAYER_INDEX.match(name))}
    if config.n_layer > len(layers):
        return f"{fields['n_layer']}={config.n_layer} but the weights hold {len(layers)} layers"

    def find(*names: str) -> tuple[str, tuple[int, ...]] | None:
        for name in names:
            for candidate in (name, "transformer." + name) if config.family == "gpt2" else (name,):
                if candidate in shapes:
                    return candidate, tuple(shapes[candidate])
        return None

    def differs(field: str, value: int, found: tuple[str, tuple[int, ...]] | None, dim: int) -> str | None:
        if found is None:
            return None
        name, shape = found
        if len(shape) <= dim or shape[dim] != value:
            return f"{field}={value} but {name} is {tuple(shape)}"
        return None

    gpt2 = config.family == "gpt2"
    C, D = config.d_model, config.head_width
    embed = find("wte.weight" if gpt2 else "model.embed_tokens.weight")
    if embed is None:
        return f"the token embedding {'wte.weight' if gpt2 else 'model.embed_tokens.weight'} is missing"
    head = find("lm_head.weight")
    layer = "h.0." if gpt2 else "model.layers.0."
    checks = [
        ("vocab_size", config.vocab_size, embed, 0),
        (fields["d_model"], C, embed, 1),
        ("vocab_size", config.vocab_size, head, 0),
        (fields["d_model"], C, head, 1),
    ]
    if gpt2:
        checks += [
            (fields["d_ff"], config.d_ff, find(layer + "mlp.c_fc.weight"), 1),  # Conv1D: (in, out)
            (f"3 × n_head × head_dim (3 × {config.n_head} × {D})", 3 * config.n_head * D,
             find(layer + "attn.c_attn.weight"), 1),
            ("n_positions", config.max_seq_len, find("wpe.weight"), 0),
        ]
    else:
        checks += [
            (fields["d_ff"], config.d_ff, find(layer + "mlp.gate_proj.weight"), 0),
            (fields["d_ff"], config.d_ff, find(layer + "mlp.up_proj.weight"), 0),
            (f"{fields['n_head']} × head_dim ({config.n_head} × {D})", config.n_head * D,
             find(layer + "self_attn.q_proj.weight"), 0),
            (f"{fields['n_kv_head']} × head_dim ({config.kv_head_count} × {D})", config.kv_head_count * D,
             find(layer + "self_attn.k_proj.weight"), 0),
        ]
    for field, value, found, dim in checks:
        problem = differs(field, value, found, dim)
        if problem is not None:
            return problem
    return None


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

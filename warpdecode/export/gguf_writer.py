"""A warpdecode model as a GGUF file that llama.cpp loads (`--model-draft` for a distilled draft model).

The tensor names are the reader's (`models/importers/gguf_quantized.py`: `BLOCK_TENSORS`, `NORMS`,
`unpermute_rows`) run backwards, so one mapping serves both directions. Weights are written in float32
(quantise afterwards with llama.cpp's `llama-quantize` if wanted). The tokenizer comes from the target's
own GGUF file when the target was one (its `tokenizer.*` fields copied as they are, which is what
llama.cpp compares when it checks that a draft and a target share a vocabulary); otherwise it is built
from `tokenizer.json`, a byte-level BPE only.

Metadata keys are those of llama.cpp's `convert_hf_to_gguf.py` (`LlamaModel` / `Qwen2Model`
`set_gguf_parameters`, through the `gguf` package's `GGUFWriter.add_*` helpers); the q/k row order is
its `LlamaModel.permute` (llama only: llama.cpp's qwen2 graph reads them unpermuted).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.models.importers.gguf_quantized import (
    BLOCK_TENSORS,
    NATIVE_ARCHITECTURES,
    NORMS,
    unpermute_rows,
)
from warpdecode.models.tokenizer import Tokenizer
from warpdecode.models.transformer import Transformer

GGUF_EXTRA = "writing GGUF files needs the [hf] extra: pip install 'warpdecode[hf]'"


def _gguf() -> Any:
    try:
        import gguf
    except ImportError as e:
        raise ConfigError(GGUF_EXTRA) from e
    return gguf


def check_gguf_writable(model: Transformer) -> None:
    """CapabilityError unless llama.cpp's llama or qwen2 graph computes what `model` computes."""
    c = model.config
    problems = [f"{name}={value!r}" for name, value, want in (
        ("family", c.family, NATIVE_ARCHITECTURES), ("norm", c.norm, ("rmsnorm",)), ("mlp", c.mlp, ("swiglu",)),
        ("position", c.position, ("rope",)), ("causal", c.causal, (True,)), ("out_bias", c.out_bias, (False,)),
        ("mlp_bias", c.mlp_bias, (False,)), ("rope_scaling", c.rope_scaling, (None,))) if value not in want]
    if c.family == "llama" and c.qkv_bias:
        problems.append("qkv_bias=True on a llama model")
    if problems:
        raise CapabilityError(f"cannot write this model as GGUF: llama.cpp's {'/'.join(NATIVE_ARCHITECTURES)} graphs "
                              f"have no {', '.join(problems)}")


def permute_rows(n_rows: int, heads: int) -> torch.Tensor:
    """The inverse of `unpermute_rows`: row i of the GGUF matrix is row `index[i]` of ours."""
    return torch.argsort(unpermute_rows(n_rows, heads))


def gguf_tensors(model: Transformer) -> dict[str, np.ndarray]:
    """The model's weights under their GGUF names, float32, q/k rows in llama.cpp's rotary order."""
    c = model.config
    state = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    out = {"token_embd.weight": state["embed.weight"], "output_norm.weight": state["norm.weight"]}
    if not c.tie_embeddings:
        out["output.weight"] = state["lm_head.weight"]
    heads = {"attn.q_proj": c.n_head, "attn.k_proj": c.kv_head_count}
    for i in range(c.n_layer):
        for gguf_name, ours in NORMS.items():
            out[f"blk.{i}.{gguf_name}.weight"] = state[f"blocks.{i}.{ours}.weight"]
        for gguf_name, ours in BLOCK_TENSORS.items():
            for part in ("weight", "bias"):
                tensor = state.get(f"blocks.{i}.{ours}.{part}")
                if tensor is None:
                    continue
                if ours in heads and c.family == "llama":
                    tensor = tensor[permute_rows(tensor.shape[0], heads[ours])]
                out[f"blk.{i}.{gguf_name}.{part}"] = tensor
    return {name: t.contiguous().numpy() for name, t in out.items()}


def _copy_tokenizer_fields(writer: Any, source: Path) -> None:
    """Every `tokenizer.*` field of the GGUF file `source`, as it is."""
    gguf = _gguf()
    reader = gguf.GGUFReader(str(source))
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), value_type, sub_type=sub_type)


def _bpe_tokenizer_fields(writer: Any, tokenizer: Tokenizer) -> None:
    """A byte-level BPE `tokenizer.json` as llama.cpp's "gpt2" tokenizer model (vocabulary, merges,
    special tokens as control tokens, the chat template)."""
    gguf = _gguf()
    data = json.loads(tokenizer.backend.to_str())
    model, pre = data.get("model") or {}, data.get("pre_tokenizer") or {}
    if model.get("type") != "BPE" or pre.get("type") != "ByteLevel":
        raise CapabilityError(f"cannot write the tokenizer as GGUF: it is a {model.get('type')} model with a "
                              f"{pre.get('type')} pre-tokenizer, and only byte-level BPE is written (convert from the "
                              "target's .gguf file to copy its tokenizer instead)")
    vocab = tokenizer.backend.get_vocab(with_added_tokens=True)
    tokens = [""] * len(vocab)
    for text, i in vocab.items():
        tokens[i] = text
    special = {t["id"] for t in data.get("added_tokens", []) if t.get("special")}
    types = [gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for i in range(len(tokens))]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2" if pre.get("use_regex", True) else "default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    if tokenizer.eos_token_id is not None:
        writer.add_eos_token_id(tokenizer.eos_token_id)
    if tokenizer.bos_token is not None and (bos := tokenizer.backend.token_to_id(tokenizer.bos_token)) is not None:
        writer.add_bos_token_id(bos)
    writer.add_add_bos_token(False)
    if tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)


def write_gguf(model: Transformer, tokenizer: Tokenizer, path: Path, *, name: str,
               tokenizer_gguf: Path | None = None) -> Path:
    """Write `model` (float32) and its tokenizer as the GGUF file `path`, atomically.

    Args:
        name: `general.name`.
        tokenizer_gguf: a GGUF file whose `tokenizer.*` fields to copy (the target's own), else
            the fields are built from `tokenizer`.
    """
    check_gguf_writable(model)
    gguf = _gguf()
    c = model.config
    tensors = gguf_tensors(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        writer = gguf.GGUFWriter(tmp, c.family)
        writer.add_name(name)
        writer.add_block_count(c.n_layer)
        writer.add_context_length(c.max_seq_len)
        writer.add_embedding_length(c.d_model)
        writer.add_feed_forward_length(c.d_ff)
        writer.add_head_count(c.n_head)
        writer.add_head_count_kv(c.kv_head_count)
        writer.add_key_length(c.head_width)
        writer.add_value_length(c.head_width)
        writer.add_rope_dimension_count(c.head_width)
        writer.add_rope_freq_base(c.rope_theta)
        writer.add_layer_norm_rms_eps(c.norm_eps)
        writer.add_vocab_size(c.vocab_size)
        writer.add_file_type(gguf.LlamaFileType.ALL_F32)
        if tokenizer_gguf is not None:
            _copy_tokenizer_fields(writer, tokenizer_gguf)
        else:
            _bpe_tokenizer_fields(writer, tokenizer)
        for tensor_name, array in tensors.items():
            writer.add_tensor(tensor_name, array)
        try:
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
        os.replace(tmp, path)  # a reader sees no file or the whole one
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path

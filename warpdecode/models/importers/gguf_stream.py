"""GGUF → model directory one tensor at a time: the converted weights are never all in memory.

`read_gguf` builds the whole float32 model in transformers and copies its state dict (peak ~2.2x the
float32 weights: 13.6 GiB for a 1.5B model). This writes the same `model.safetensors` by streaming:
the safetensors header is computed from the GGUF header's shapes, then each tensor is dequantised on
its own (`gguf.quants.dequantize`, the function transformers' reader calls), reordered where llama.cpp
permuted it (llama q/k rows, as transformers' reader undoes) and written, so the peak is one float32
tensor (the largest: the embedding) plus the memory-mapped file. The config and the tokenizer come
from the GGUF metadata through transformers (no weights are read for them). The result is bitwise the
`read_gguf` conversion's (tested on the default model and on tiny llama and qwen2 files).

Architectures: llama and qwen2 (gated blocks, the names in `NAMES`); others go through `read_gguf`.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np

from warpdecode.errors import CheckpointError, ConfigError, one_line
from warpdecode.models.config import ModelConfig
from warpdecode.models.importers.gguf import check_gguf_sizes
from warpdecode.models.importers.gguf_header import read_gguf_header
from warpdecode.models.importers.gguf_quantized import unpermute_rows
from warpdecode.models.importers.hf import config_from_hf, config_to_hf, shape_mismatch
from warpdecode.models.tokenizer import Tokenizer

STREAMED_ARCHITECTURES = ("llama", "qwen2")
NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
         "output.weight": "lm_head.weight"}
BLOCK_NAMES = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
               "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
               "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
               "ffn_down": "mlp.down_proj"}
SKIPPED = ("rope_freqs.weight",)
"""Tensors the config carries instead (llama 3's rope scaling factors)."""
BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


def streams(path: Path) -> bool:
    """Whether `path`'s architecture is converted by streaming."""
    return read_gguf_header(path).metadata.get("general.architecture") in STREAMED_ARCHITECTURES


def hf_name(name: str) -> str | None:
    """The Hugging Face name of GGUF tensor `name` (None: not a weight of the model)."""
    if name in NAMES:
        return NAMES[name]
    if name in SKIPPED:
        return None
    match = BLOCK.match(name)
    if match is None:
        raise CheckpointError(f"unexpected GGUF tensor {name!r}")
    layer, kind, suffix = match.groups()
    if f"{kind}.{suffix}" in BLOCK_NAMES:
        return f"model.layers.{layer}.{BLOCK_NAMES[f'{kind}.{suffix}']}"
    if kind in BLOCK_NAMES:
        return f"model.layers.{layer}.{BLOCK_NAMES[kind]}.{suffix}"
    raise CheckpointError(f"unexpected GGUF tensor {name!r}")


def _metadata(path: Path) -> tuple[ModelConfig, Tokenizer]:
    """The config and tokenizer of a GGUF file, read from its metadata by transformers."""
    try:
        import transformers
    except ImportError as e:
        raise ConfigError("reading GGUF files needs the [hf] extra: pip install 'warpdecode[hf]'") from e
    transformers.logging.set_verbosity_error()
    try:
        hf_config = transformers.AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name).to_dict()
        hf_tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        config = config_from_hf(hf_config)
    except Exception as e:
        raise CheckpointError(f"cannot read GGUF checkpoint {path}: {one_line(e)}") from e
    tokenizer = Tokenizer(hf_tok.backend_tokenizer, eos_token=hf_tok.eos_token, bos_token=hf_tok.bos_token,
                          chat_template=hf_tok.chat_template)
    return config, tokenizer


def write_streamed(path: Path, directory: Path) -> None:
    """Write the model directory (config.json, model.safetensors, tokenizer) of GGUF file `path` into
    `directory` (which must exist), one tensor at a time."""
    import gguf

    check_gguf_sizes(read_gguf_header(path), path)
    config, tokenizer = _metadata(path)
    reader = gguf.GGUFReader(str(path))
    tensors: list[tuple[str, Any]] = []
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is not None and not (name == "lm_head.weight" and config.tie_embeddings):
            tensors.append((name, t))
    shapes = {name: tuple(reversed([int(n) for n in t.shape])) for name, t in tensors}
    problem = shape_mismatch(config, shapes)
    if problem is not None:
        raise CheckpointError(f"weights in {path} do not match its metadata: {problem}")
    heads = {"q_proj": config.n_head, "k_proj": config.kv_head_count}
    arch = reader.fields["general.architecture"]
    llama = bytes(arch.parts[arch.data[0]]).decode() == "llama"
    (directory / "config.json").write_text(json.dumps(config_to_hf(config), indent=2) + "\n")
    with open(directory / "model.safetensors", "wb") as out:
        _write_header(out, shapes)
        for name, t in tensors:
            values = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shapes[name])
            proj = name.rsplit(".", 2)[-2]
            if llama and proj in heads and name.endswith(".weight"):
                values = values[unpermute_rows(values.shape[0], heads[proj]).numpy()]
            out.write(np.ascontiguousarray(values).astype("<f4", copy=False).tobytes())
            del values
    tokenizer.save(directory)


def _write_header(out: Any, shapes: dict[str, tuple[int, ...]]) -> None:
    """The safetensors header of float32 tensors `shapes`, in order, data back to back after it."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes.items():
        size = 4 * int(np.prod(shape, dtype=np.int64))
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    out.write(struct.pack("<Q", len(text)))
    out.write(text)

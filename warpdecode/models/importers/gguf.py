"""GGUF → Hugging Face layout, through `transformers`' GGUF reader (dequantises to fp32).

Needs the `[hf]` extra (transformers, gguf, accelerate). The GGUF file's own tokenizer (vocabulary,
merges, chat template) becomes tokenizer.json / tokenizer_config.json.

The header is read first by `read_gguf_header` (bounded by the file's size) and its sizes checked
against the tensor shapes it lists, so a corrupt or inconsistent file is refused in milliseconds,
before `transformers` builds a model of the sizes the metadata claims.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch
from torch import Tensor

from warpdecode.errors import CheckpointError, ConfigError, one_line
from warpdecode.models.config import SIZE_LIMITS, ModelConfig, physical_memory_bytes
from warpdecode.models.importers.gguf_header import GgufHeader, read_gguf_header
from warpdecode.models.importers.hf import config_from_hf, shape_mismatch
from warpdecode.models.tokenizer import Tokenizer

ARCHITECTURES = ("gpt2", "llama", "qwen2")
"""GGUF `general.architecture` values whose models `config_from_hf` accepts."""


def read_gguf(path: Path) -> tuple[ModelConfig, dict[str, Tensor], Tokenizer]:
    """Dequantise a GGUF checkpoint into (config, Hugging Face-named fp32 weights, tokenizer)."""
    try:
        import transformers
    except ImportError as e:
        raise ConfigError("reading GGUF files needs the [hf] extra: pip install 'warpdecode[hf]'") from e
    if not path.is_file():
        raise CheckpointError(f"GGUF file not found: {path}")
    check_gguf_sizes(read_gguf_header(path), path)
    transformers.logging.set_verbosity_error()
    try:
        hf_tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        hf_model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        )
        hf_config = hf_model.config.to_dict()
        weights = {k: v.detach().clone().contiguous() for k, v in hf_model.state_dict().items()}
        backend = hf_tok.backend_tokenizer
    except Exception as e:  # whatever the reader raises on a file it cannot parse: struct.error, KeyError...
        raise CheckpointError(f"cannot read GGUF checkpoint {path}: {one_line(e)}") from e
    try:
        config = config_from_hf(hf_config)
    except ConfigError as e:
        raise CheckpointError(f"cannot read GGUF checkpoint {path}: {e}") from e
    problem = shape_mismatch(config, {name: tuple(t.shape) for name, t in weights.items()})
    if problem is not None:
        raise CheckpointError(f"weights in {path} do not match its metadata: {problem}")
    tokenizer = Tokenizer(
        backend,
        eos_token=hf_tok.eos_token,
        bos_token=hf_tok.bos_token,
        chat_template=hf_tok.chat_template,
    )
    return config, weights, tokenizer


def check_gguf_sizes(header: GgufHeader, path: Path) -> None:
    """Refuse metadata whose sizes disagree with the tensors the file holds, and a file whose float32
    weights would not fit in memory, before anything of those sizes is built."""
    meta, tensors = header.metadata, header.tensors
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise CheckpointError(f"{path}: unsupported GGUF architecture {arch!r} (supported: {', '.join(ARCHITECTURES)})")

    def size(key: str) -> int | None:
        value = meta.get(f"{arch}.{key}")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise CheckpointError(f"{path}: GGUF metadata {arch}.{key} must be a positive integer, got {value!r}")
        return value

    def check(key: str, value: object, tensor: str, shape: tuple[int, ...], actual: int) -> None:
        if value is not None and value != actual:
            raise CheckpointError(f"{path}: GGUF metadata {key}={value} but tensor {tensor} is {list(shape)}")

    layers = {int(m.group(1)) for name in tensors if (m := re.match(r"blk\.(\d+)\.", name))}
    blocks = size("block_count")
    if blocks is not None and blocks != len(layers):
        raise CheckpointError(f"{path}: GGUF metadata {arch}.block_count={blocks} but the file holds tensors of "
                              f"{len(layers)} blocks")
    embed = tensors.get("token_embd.weight")
    if embed is None or len(embed.shape) != 2:
        raise CheckpointError(f"{path}: no token_embd.weight matrix among the GGUF file's tensors")
    V, C = embed.shape
    for key in (f"{arch}.vocab_size", "tokenizer.ggml.tokens"):
        check(key, meta.get(key), embed.name, embed.shape, V)
    check(f"{arch}.embedding_length", size("embedding_length"), embed.name, embed.shape, C)
    if (output := tensors.get("output.weight")) is not None and output.shape != embed.shape:
        raise CheckpointError(f"{path}: GGUF tensor output.weight is {list(output.shape)} but {embed.name} is "
                              f"{list(embed.shape)}")
    if (up := tensors.get("blk.0.ffn_up.weight")) is not None:
        check(f"{arch}.feed_forward_length", size("feed_forward_length"), up.name, up.shape, up.shape[0])
    heads = size("attention.head_count")
    if heads is not None:
        head_dim = size("attention.key_length")
        if head_dim is None and C % heads:
            raise CheckpointError(f"{path}: GGUF metadata {arch}.embedding_length={C} is not divisible by "
                                  f"{arch}.attention.head_count={heads}")
        head_dim = head_dim or C // heads
        kv_heads = size("attention.head_count_kv") or heads
        for part, count, key in (("q", heads, "head_count"), ("k", kv_heads, "head_count_kv")):
            if (t := tensors.get(f"blk.0.attn_{part}.weight")) is not None:
                check(f"{arch}.attention.{key} × head dim {head_dim}", count * head_dim, t.name, t.shape, t.shape[0])
    context = size("context_length")
    if context is not None and context > SIZE_LIMITS["max_seq_len"]:
        raise CheckpointError(f"{path}: GGUF metadata {arch}.context_length={context} is beyond any real model "
                              f"(at most {SIZE_LIMITS['max_seq_len']})")
    if (positions := tensors.get("position_embd.weight")) is not None:
        check(f"{arch}.context_length", context, positions.name, positions.shape, positions.shape[0])
    memory = physical_memory_bytes()
    need = 4 * sum(math.prod(t.shape) for t in tensors.values())
    if memory is not None and need > memory:
        raise CheckpointError(f"{path} dequantises to {need / 2**30:.1f} GiB of float32 weights, more than this "
                              f"machine's {memory / 2**30:.1f} GiB of memory")

"""A GGUF checkpoint straight into a weight-only quantised model (`--dtype native`): no float32 copy of
the block weights is ever made.

Q4_1 blocks (32 inputs: an fp16 scale `d`, an fp16 minimum `m`, 16 bytes of 4-bit `q`; `w = q * d + m`)
are exactly `Int4Weight`'s groups, so their integers go into the int4 kernel as they are (the scales
and minima round to bf16, as in every `Int4Weight`). A block matrix of another type is dequantised on
its own (one matrix at a time) and re-quantised, to int4 for the 4-bit and smaller types and to int8
otherwise. The token embedding stays in the file's format (Q8_0 in the default model) and the rows a
forward looks up are dequantised when it looks them up (`GgufEmbedding`: the same float32 values a
dequantised table would give, at a quarter of its memory); the LM head is its per-channel int8 copy,
as in `models.quantized`, made a slice of rows at a time so that no float32 table is ever whole.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from warpdecode.errors import CapabilityError, CheckpointError, ConfigError
from warpdecode.kernels.packed_linear import FusedLinear, Linear
from warpdecode.kernels.quantized import INT4_GROUP, Int4Weight, Int8Weight, int4_groups, int8_rows
from warpdecode.models.config import ModelConfig
from warpdecode.models.importers.gguf_header import GGML_BLOCKS, GgufTensor, read_gguf_header
from warpdecode.models.quantized import exact_rows, release_freed_memory
from warpdecode.models.transformer import Block, Transformer, rope_inv_freq

NATIVE_ARCHITECTURES = ("llama", "qwen2")
"""Architectures whose blocks are all gated (q/k/v, o, gate/up, down): gpt2 GGUFs are read with --dtype q8|q4."""
Q4_1_BLOCK_BYTES = 20
"""fp16 d, fp16 m, 16 bytes holding 32 nibbles (element j in the low nibble of byte j, element 16 + j
in its high nibble)."""
FOUR_BITS_OR_FEWER = re.compile(r"^(Q2|Q3|Q4|IQ1|IQ2|IQ3|IQ4)")

BLOCK_TENSORS = {"attn_q": "attn.q_proj", "attn_k": "attn.k_proj", "attn_v": "attn.v_proj",
                 "attn_output": "attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                 "ffn_down": "mlp.down_proj"}
NORMS = {"attn_norm": "attn_norm", "ffn_norm": "mlp_norm"}


def q4_1_groups(raw: np.ndarray) -> tuple[Tensor, Tensor, Tensor]:
    """Q4_1 rows → (q (out, in) int32 in [0, 15], d (out, in/32), m (out, in/32) float32).

    Args:
        raw: (out, in / 32 * 20) uint8, the tensor's bytes row by row.
    """
    blocks = torch.from_numpy(np.ascontiguousarray(raw)).view(raw.shape[0], -1, Q4_1_BLOCK_BYTES)  # (out, G, 20)
    d = blocks[..., 0:2].contiguous().view(torch.float16)[..., 0].float()  # (out, G)
    m = blocks[..., 2:4].contiguous().view(torch.float16)[..., 0].float()  # (out, G)
    packed = blocks[..., 4:].to(torch.int32)  # (out, G, 16)
    q = torch.cat([packed & 0xF, packed >> 4], -1)  # (out, G, 32): elements 0..15, then 16..31
    return q.reshape(raw.shape[0], -1), d, m


HEAD_ROWS_PER_SLICE = 4096
"""Rows of the LM head dequantised at a time while its int8 copy is made."""
DENSE_ROWS_PER_CHUNK = 1024
"""Rows of a quantised matrix dequantised at a time (gguf-py makes several full-size temporaries)."""


class GgufEmbedding(nn.Module):
    """A token embedding kept as the GGUF file's rows (any ggml type) and dequantised per lookup.

    `weight` is an empty (0, C) float32 tensor that only answers `.device` / `.dtype`, as the quantised
    layers' weights do; the table itself is `rows` (V, bytes per row) uint8.
    """

    rows: Tensor  # (V, bytes per row) uint8

    def __init__(self, rows: Tensor, tensor_type: Any, dim: int) -> None:
        super().__init__()
        self.register_buffer("rows", rows, persistent=False)
        self.weight = nn.Parameter(torch.empty(0, dim), requires_grad=False)
        self.tensor_type, self.dim = tensor_type, dim

    @property
    def num_embeddings(self) -> int:
        return int(self.rows.shape[0])

    def dense_rows(self, index: Tensor) -> Tensor:
        """(N,) row indices → (N, C) float32."""
        return dequantised_rows(self.rows.index_select(0, index.reshape(-1).cpu()), self.tensor_type, self.dim)

    def forward(self, tokens: Tensor) -> Tensor:
        """(...) int64 → (..., C) float32."""
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.num_embeddings):
            raise IndexError(f"token id out of range for a vocabulary of {self.num_embeddings}")
        return self.dense_rows(tokens).reshape(*tokens.shape, self.dim).to(self.weight.device)


def dequantised_rows(raw: Tensor, tensor_type: Any, dim: int) -> Tensor:
    """(N, bytes per row) uint8 rows of a `tensor_type` matrix → (N, dim) float32, gguf-py's values:
    Q8_0 in torch (a decode step's embedding row in ~10 µs, not ~100), other types with the type's own
    row dequantiser."""
    if getattr(tensor_type, "name", None) == "Q8_0":
        return q8_0_rows(raw, dim)
    values = _row_dequantiser(tensor_type)(raw.numpy())
    return torch.from_numpy(np.asarray(values, dtype=np.float32).reshape(raw.shape[0], dim))


def q8_0_rows(raw: Tensor, dim: int) -> Tensor:
    """Q8_0 rows ((N, dim / 32 * 34) uint8: per block of 32 an fp16 scale `d`, then 32 int8 `q`) as
    (N, dim) float32 `q * d`: gguf-py's arithmetic (one float32 product per element), the same bits."""
    blocks = raw.view(raw.shape[0], -1, 34)
    d = blocks[..., :2].contiguous().view(torch.float16).float()  # (N, blocks, 1)
    q = blocks[..., 2:].contiguous().view(torch.int8).float()  # (N, blocks, 32)
    return (q * d).reshape(raw.shape[0], dim)


@functools.cache
def _row_dequantiser(tensor_type: Any) -> Callable[[np.ndarray], np.ndarray]:
    """gguf-py's dequantiser of `tensor_type` rows. A decode step looks up one row, for which
    `gguf.quants.dequantize`'s generic path (lazy tensors, rows split in groups of 16) costs ~0.2 ms
    more than the type's own `dequantize_rows` it ends in (the same function, so the same values)."""
    import gguf

    traits = getattr(gguf.quants, "_type_traits", {}).get(tensor_type)
    if traits is None or not hasattr(traits, "dequantize_rows"):  # F32 / F16, or another gguf-py
        return functools.partial(gguf.quants.dequantize, qtype=tensor_type)
    traits.init_grid()
    return cast(Callable[[np.ndarray], np.ndarray], traits.dequantize_rows)


def unpermute_rows(n_rows: int, heads: int) -> Tensor:
    """The row order that undoes llama.cpp's rotary permutation of a llama q/k matrix (as transformers'
    GGUF reader does): row i of the result is row `index[i]` of the GGUF matrix."""
    return torch.arange(n_rows).view(heads, n_rows // heads // 2, 2).transpose(1, 2).reshape(n_rows)


class _Reader:
    """Tensors of a GGUF file by name, each read when asked for: the bounded header reader
    (`gguf_header`) gives the table, so no metadata arrays (the tokenizer's 49k strings) are built."""

    def __init__(self, path: Path, config: ModelConfig) -> None:
        import gguf

        self.gguf = gguf
        header = read_gguf_header(path)
        self.tensors, self.config, self.path = header.tensors, config, path
        self.data_start = header.data_start
        self.arch = str(header.metadata.get("general.architecture"))
        if self.arch not in NATIVE_ARCHITECTURES:
            raise CapabilityError(f"--dtype native reads {', '.join(NATIVE_ARCHITECTURES)} GGUF files, not {self.arch}; "
                                  "use --dtype q8 or q4")

    def tensor(self, name: str) -> GgufTensor:
        if name not in self.tensors:
            raise CheckpointError(f"{self.path}: no tensor {name}")
        return self.tensors[name]

    def tensor_type(self, name: str) -> Any:
        return self.gguf.GGMLQuantizationType(self.tensor(name).ggml_type)

    def raw(self, name: str) -> np.ndarray:
        """(rows, bytes per row) uint8: a tensor's bytes, read into memory of their own (a memory map
        would keep every page read resident until the whole file is unmapped: +1.1 GB of peak RSS for a
        1.5B model)."""
        t = self.tensor(name)
        elements, block_bytes = GGML_BLOCKS[t.ggml_type]
        row_bytes = t.shape[-1] // elements * block_bytes
        rows = int(np.prod(t.shape[:-1], dtype=np.int64))
        out = np.empty((rows, row_bytes), dtype=np.uint8)
        with self.path.open("rb") as f:
            f.seek(self.data_start + t.offset)
            if f.readinto(out.reshape(-1).data) != out.nbytes:
                raise CheckpointError(f"{self.path}: tensor {name} is cut short")
        return out

    def rows(self, name: str) -> Tensor:
        """A (rows, bytes per row) uint8 copy of a 2-D tensor's bytes (any ggml type)."""
        return torch.from_numpy(self.raw(name))

    def dense(self, name: str) -> Tensor:
        """The tensor as float32, dequantised if it is quantised (one tensor at a time, a matrix
        `DENSE_ROWS_PER_CHUNK` rows at a time: gguf-py's temporaries are a chunk's)."""
        raw, shape, kind = self.raw(name), self.tensor(name).shape, self.tensor_type(name)
        if len(shape) != 2:
            return torch.from_numpy(np.array(self.gguf.quants.dequantize(raw, kind), dtype=np.float32)).reshape(shape)
        out = torch.empty(tuple(shape), dtype=torch.float32)
        rows = torch.from_numpy(raw)
        for lo in range(0, shape[0], DENSE_ROWS_PER_CHUNK):
            part = rows[lo : lo + DENSE_ROWS_PER_CHUNK]
            out[lo : lo + part.shape[0]] = dequantised_rows(part, kind, shape[1])
        return out

    def groups(self, name: str, heads: int | None) -> tuple[Tensor, Tensor, Tensor] | Tensor:
        """A block matrix's Q4_1 groups, or its float weight when it is of another type; rows unpermuted
        for a llama q/k matrix (`heads`)."""
        out: tuple[Tensor, Tensor, Tensor] | Tensor
        is_q4_1 = self.tensor_type(name) == self.gguf.GGMLQuantizationType.Q4_1
        out = q4_1_groups(self.raw(name)) if is_q4_1 else self.dense(name)
        if heads is not None and self.arch == "llama":
            order = unpermute_rows(self.tensor(name).shape[0], heads)
            out = (out[0][order], out[1][order], out[2][order]) if isinstance(out, tuple) else out[order]
        return out

    def bits(self, name: str) -> int:
        return 4 if FOUR_BITS_OR_FEWER.match(self.tensor_type(name).name) else 8


def _quantized(parts: Iterable[tuple[Tensor, Tensor, Tensor] | Tensor], biases: list[Tensor | None], bits: int,
               in_features: int) -> Int4Weight | Int8Weight:
    """One weight from row blocks stacked along `out` (`biases`: each part's, or None), each part made
    when the last is quantised (`parts` may be lazy): Q4_1 groups kept as they are, other parts
    quantised alone, which per-row quantisation makes the same as quantising them stacked, without the
    stacked float copy."""
    bias = None if any(b is None for b in biases) else torch.cat(cast(list[Tensor], biases))
    if bits == 4:
        groups = [p if isinstance(p, tuple) else int4_groups(p[:, :in_features]) for p in parts]
        q, d, m = (torch.cat([g[i] for g in groups]) for i in range(3))
        q = nn.functional.pad(q, (0, -q.shape[1] % INT4_GROUP))
        return Int4Weight.of_groups(q, d, m, bias, in_features)
    rows = [int8_rows(p if isinstance(p, Tensor) else (p[0].float().view(p[0].shape[0], -1, INT4_GROUP)
                                                       * p[1][..., None] + p[2][..., None]).flatten(1)[:, :in_features])
            for p in parts]
    return Int8Weight.of_quantized(torch.cat([q for q, _ in rows]), torch.cat([s for _, s in rows]), bias)


def _int8_in_slices(table: GgufEmbedding, rows: int) -> Int8Weight:
    """The per-channel int8 copy of the first `rows` rows of a GGUF (V, C) table, `HEAD_ROWS_PER_SLICE`
    dequantised rows at a time (per-channel quantisation treats every row alone, so the slices give the
    whole's result)."""
    parts = (Int8Weight.of(table.dense_rows(torch.arange(lo, min(lo + HEAD_ROWS_PER_SLICE, rows))))
             for lo in range(0, rows, HEAD_ROWS_PER_SLICE))  # made one at a time, as stacked
    return Int8Weight.stacked(parts, rows)


def read_gguf_quantized(path: Path, config: ModelConfig, head_rows: int | None = None,
                        max_bits: int = 8) -> Transformer:
    """The model of the GGUF file at `path` (of architecture `config`), its block weights in their own
    quantised format (see the module docstring). `head_rows`: keep only the LM head's first rows (the
    logits of the first token ids: a draft model's FR-Spec vocabulary), never making the others (at
    least the vocabulary: the whole head). `max_bits=4`: re-quantise the block matrices of wider types
    (Q5_0, Q6_K, Q8_0...) to int4 too, a lossy copy reading about half their bytes per step (a draft
    model's: verification decides every token)."""
    if head_rows is not None and head_rows < 1:
        raise ConfigError(f"head rows must be >= 1, got {head_rows}")
    if max_bits not in (4, 8):
        raise ConfigError(f"max bits must be 4 or 8, got {max_bits}")
    try:
        reader = _Reader(path, config)
    except ImportError as e:
        raise ConfigError("reading GGUF files needs the [hf] extra: pip install 'warpdecode[hf]'") from e
    with torch.device("meta"):
        model = Transformer(config)
    embed = GgufEmbedding(reader.rows("token_embd.weight"), reader.tensor_type("token_embd.weight"), config.d_model)
    model.embed = embed  # type: ignore[assignment]
    model.norm.weight = nn.Parameter(reader.dense("output_norm.weight"), requires_grad=False)
    rows = config.vocab_size if head_rows is None else min(head_rows, config.vocab_size)
    if model.lm_head is None or rows < config.vocab_size:  # tied (the embedding's int8 copy) or cut: a head of its own
        model.lm_head = Linear(config.d_model, rows, bias=False, device="meta")
    head = embed if config.tie_embeddings else GgufEmbedding(reader.rows("output.weight"),
                                                              reader.tensor_type("output.weight"), config.d_model)
    model.lm_head.quantized = _int8_in_slices(head, rows)
    model.lm_head.weight = nn.Parameter(torch.empty(0, config.d_model), requires_grad=False)
    bits: set[int] = set()
    for i, module in enumerate(model.blocks):
        block = cast(Block, module)
        attn, mlp = block.attn, block.mlp
        for gguf_name, ours in NORMS.items():
            block.get_submodule(ours).weight = nn.Parameter(reader.dense(f"blk.{i}.{gguf_name}.weight"), requires_grad=False)
        names = {id(block.get_submodule(ours)): f"blk.{i}.{g}" for g, ours in BLOCK_TENSORS.items()}
        heads = {id(attn.q_proj): config.n_head, id(attn.k_proj): config.kv_head_count}
        groups: list[tuple[FusedLinear | Linear, tuple[Linear, ...]]] = [
            (attn.qkv, attn.qkv.layers), (mlp.gate_up, mlp.gate_up.layers),
            (attn.o_proj, (attn.o_proj,)), (mlp.down_proj, (mlp.down_proj,))]
        for group, layers in groups:
            tensor_names = [names[id(layer)] for layer in layers]
            layer_bits = min(max_bits, max(reader.bits(f"{n}.weight") for n in tensor_names))
            biases = [reader.dense(f"{n}.bias") if f"{n}.bias" in reader.tensors else None for n in tensor_names]
            parts = (reader.groups(f"{n}.weight", heads.get(id(layer))) for n, layer in zip(tensor_names, layers, strict=True))
            weight = _quantized(parts, biases, layer_bits, layers[0].in_features)
            group.quantized = weight
            if len(layers) == 1:  # a one-layer group runs its layer directly: the same weight
                layers[0].quantized = weight
            for layer, n in zip(layers, tensor_names, strict=True):
                layer.weight = nn.Parameter(torch.empty(0, layer.in_features), requires_grad=False)
                if layer.bias is not None:
                    layer.bias = nn.Parameter(reader.dense(f"{n}.bias"), requires_grad=False)
            bits.add(layer_bits)
        release_freed_memory()  # glibc keeps the freed temporaries of a block mapped: +1 GB of peak for a 1.5B model
    if config.position == "rope":
        model.inv_freq = rope_inv_freq(config)
    model.config = dataclasses.replace(config, tie_embeddings=False)  # the head is a layer of its own now
    missing = [name for name, p in model.named_parameters() if p.is_meta]
    if missing:
        raise CheckpointError(f"{path}: no weights for {missing[:5]}")
    model.weight_bits = max(bits)
    del reader
    release_freed_memory()
    return exact_rows(model).eval()

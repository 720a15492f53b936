"""A compact decoder-only transformer: Llama / SmolLM2, Qwen2 and GPT-2 through config fields.

One forward serves training, prefill, incremental decoding, tree verification and bidirectional
(diffusion-LM) use: `(tokens, positions, cache, attention_mask, hidden_layers)` → logits plus the
requested hidden states.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from warpdecode.errors import ConfigError
from warpdecode.kernels.decoder_stack import DecoderStack, DenseWeight, StackImpl, StackLayer
from warpdecode.kernels.dense_matmul import dense_matmul
from warpdecode.kernels.exact_attention import Visibility, exact_attention, resolve_exact_impl
from warpdecode.kernels.invariance import is_batch_invariant, padding_lengths, ragged_rows
from warpdecode.kernels.packed_linear import FusedLinear, Linear, PackedWeight, linear
from warpdecode.kernels.quantized import Int8Weight
from warpdecode.kernels.ragged_attention import RaggedPlan, plan_ragged, ragged_attention
from warpdecode.models.backbone import BackboneOutput
from warpdecode.models.cache import KVCache, WritePlan
from warpdecode.models.config import ModelConfig
from warpdecode.models.identity import model_fingerprint


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(x, x.shape[-1:], self.weight, self.eps)
        # Normalise in fp32 like the reference implementations, then cast back before the weight.
        return self.weight * F.rms_norm(x.float(), x.shape[-1:], eps=self.eps).to(x.dtype)


@dataclass(frozen=True)
class LayerContext:
    """What every layer of one forward shares."""

    rope: tuple[Tensor, Tensor] | None  # (B, 1, T, D) cos and sin, or None for learned positions
    mask: Tensor | None  # (B, 1, T, S) bool, or None (see is_causal)
    is_causal: bool
    cache: KVCache | None
    plan: WritePlan | None
    slots: Tensor | None = None
    """(T,) int64 cache slots on the device for the new tokens (`Transformer.forward_static`); the
    layers then read the whole cache instead of `plan`'s used prefix."""
    seen: dict[str, Visibility] = field(default_factory=dict)
    """The `Visibility` of the forward's queries, computed by the first layer that needs it and shared."""
    ragged: dict[int, RaggedPlan] = field(default_factory=dict)
    """`plan_ragged` of the forward's visibility per query heads per key head, computed once."""
    keep: Tensor | None = None
    """(n,) int64 flat indices b * T + t of the new positions that are not padding (`padded_rows`), or
    None: all are real."""

    def visible(self, B: int, T: int, used: int) -> Visibility:
        """Which of the `used` cache slots each of the (B, T) new queries sees: the mask's, or every
        used slot when there is none."""
        if "keys" not in self.seen:
            self.seen["keys"] = (Visibility.of_mask(self.mask) if self.mask is not None
                                 else Visibility.of_prefixes(torch.full((B, T), used)))
        return self.seen["keys"]

    def ragged_plan(self, B: int, T: int, groups: int, like: Tensor) -> RaggedPlan:
        """The forward's `RaggedPlan` for (B, T) new queries like `like` (no mask: every query sees every
        used slot)."""
        if groups not in self.ragged:
            assert self.plan is not None
            visible = (self.mask[:, 0] if self.mask is not None
                       else torch.ones(B, T, self.plan.used, dtype=torch.bool, device=like.device))
            self.ragged[groups] = plan_ragged(visible, groups, like.dtype)
        return self.ragged[groups]


@dataclass(frozen=True)
class _BuiltStack:
    """A model's `DecoderStack` (or why none) and what says whether it still describes the model."""

    blocks: nn.ModuleList  # the blocks it was built from
    stack: DecoderStack | str
    read: tuple[Tensor, ...]  # the model's float tensors it reads in place
    addresses: tuple[int, ...]  # their storage when it was built
    hooks: tuple[dict[Any, Any], ...]
    """The forward (pre-)hook tables of the blocks' modules (hooks the stack would skip), torch's own
    dicts, which registering a hook fills in place: a forward checks them without walking the modules."""

    @classmethod
    def of(cls, blocks: nn.ModuleList, stack: DecoderStack | str, read: tuple[Tensor, ...]) -> _BuiltStack:
        hooks = tuple(table for m in blocks.modules() for table in (m._forward_hooks, m._forward_pre_hooks))
        return cls(blocks, stack, read, tuple(map(Tensor.data_ptr, read)), hooks)

    def fresh(self, blocks: nn.ModuleList) -> bool:
        """Built from these blocks, whose float tensors are still where they were."""
        return self.blocks is blocks and tuple(map(Tensor.data_ptr, self.read)) == self.addresses

    def hooked(self) -> bool:
        """A forward hook is registered on one of the blocks' modules, or on every module."""
        from torch.nn.modules import module

        return bool(module._global_forward_hooks or module._global_forward_pre_hooks) or any(self.hooks)


def real_positions(B: int, T: int) -> Tensor | None:
    """(n,) int64 flat indices b * T + t of a cached forward's (B, T) new positions that are not padding
    under `padded_rows`, or None when every position is real (or no padding is declared for B rows)."""
    lengths = padding_lengths()
    if lengths is None or len(lengths) != B or T < 2 or min(lengths) >= T:
        return None
    real = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]  # (B, T)
    return real.reshape(-1).nonzero()[:, 0]


def make_norm(config: ModelConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return RMSNorm(config.d_model, config.norm_eps)
    return nn.LayerNorm(config.d_model, eps=config.norm_eps)


def rope_inv_freq(config: ModelConfig) -> Tensor:
    """Rotary inverse frequencies (D/2,), with the `linear` and `llama3` scaling variants."""
    dim = config.head_width
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv_freq.float()
    if kind == "linear":
        return (inv_freq / float(scaling["factor"])).float()
    if kind == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        low_wavelen, high_wavelen = old_len / low, old_len / high
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, smoothed, scaled).float()
    raise ConfigError(f"unsupported rope scaling type {kind!r} (supported: default, linear, llama3)")


def new_token_mask(attention_mask: Tensor | None, B: int, T: int) -> Tensor | None:
    """Check a forward's `attention_mask` and return it as (1 or B, T, T) bool (None stays None).

    A (T, T) mask would broadcast against the head dimension and a float mask would be added to the
    scores: both run, silently wrong, so only the documented forms pass.
    """
    if attention_mask is None:
        return None
    shape = tuple(attention_mask.shape)
    if attention_mask.dim() == 4 and shape[1] == 1:
        attention_mask = attention_mask[:, 0]
    if attention_mask.dim() != 3 or attention_mask.shape[0] not in (1, B) or shape[-2:] != (T, T):
        raise ValueError(f"attention_mask must be ({B}, {T}, {T}) or ({B}, 1, {T}, {T}), got {shape}")
    if attention_mask.dtype != torch.bool:
        raise ValueError(f"attention_mask must be bool (True = attend), got {attention_mask.dtype}")
    return attention_mask


def default_new_mask(T: int, causal: bool) -> Tensor:
    """(1, T, T) bool: which of T new tokens each new token sees without a mask (causal or all)."""
    ones = torch.ones(1, T, T, dtype=torch.bool)
    return ones.tril() if causal else ones


def cache_attention_mask(start: Tensor, new_mask: Tensor, num_keys: int) -> Tensor:
    """(B, 1, T, S) bool: which of the first `S = num_keys` cache slots each of `T` new tokens sees.

    Slots before a row's `start` are its cached positions (always visible); slots `start .. start+T-1`
    hold the new tokens and follow `new_mask`; later slots (stale or empty) are never visible.

    Args:
        start: (B,) int64, each row's cache length before the new tokens (on the mask's device).
        new_mask: (B or 1, T, T) bool, which new tokens each new token sees.
    """
    B, T = start.shape[0], new_mask.shape[-1]
    rel = torch.arange(num_keys, device=start.device)[None, :] - start[:, None]  # (B, S) slot relative to the first new token
    in_new = (rel >= 0) & (rel < T)
    cols = rel.clamp(0, T - 1)[:, None, :].expand(-1, T, -1)  # (B, T, S)
    visible = torch.where(in_new[:, None, :], new_mask.expand(B, T, T).gather(2, cols), (rel < 0)[:, None, :])
    return visible[:, None]


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


ROW_BY_ROW_MAX = 128
"""Most query rows a `row_by_row` attention runs as `exact_attention` (a decode or verify step);
longer forwards (a prefill, the same in plain and speculative decoding) run as one SDPA."""

DENSE_STEP_ROWS = 2
"""Most rows (all of a forward's tokens) a float32 model runs on the native stack and dense head: one-token
steps, where reading each weight in place beats oneDNN's packed matrix-vector product (measured on the
default model: 11.7 against ~16 ms a step). From ~4 rows on the packed copies are faster (a 5-token
verify: 19.3 against ~15 ms; a 100-token prefill 166 against 73 ms), so longer forwards, and every
forward of a batch-invariant server step, run the PyTorch layers on the packed copies."""


class Attention(nn.Module):
    row_by_row: bool = False
    """Run the attention of a batch-1 decode or verify forward of up to `ROW_BY_ROW_MAX` queries as
    `exact_attention` (kernels/exact_attention.py): every query over exactly the keys its mask lets it
    see, so that a verify forward (a chain or a tree) computes every query exactly as a one-token step
    after the same tokens does. Set on quantised targets: SDPA's result for a query differs in the last
    fp32 bits between a one-query and a many-query call over more (masked) keys (4e-5 in the default
    model's logits), which a bf16-activation matmul downstream rounds into differences of 0.1-0.3 in
    the logits, enough to flip near-tied greedy tokens."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.kv_head_count, config.head_width
        self.q_proj = Linear(config.d_model, self.n_head * self.head_dim, bias=config.qkv_bias)
        self.k_proj = Linear(config.d_model, self.n_kv_head * self.head_dim, bias=config.qkv_bias)
        self.v_proj = Linear(config.d_model, self.n_kv_head * self.head_dim, bias=config.qkv_bias)
        self.o_proj = Linear(self.n_head * self.head_dim, config.d_model, bias=config.out_bias)
        self.qkv = FusedLinear((self.q_proj, self.k_proj, self.v_proj))

    def pack(self) -> int:
        return self.qkv.pack() + self.o_proj.pack()

    def unpack(self) -> None:
        self.qkv.unpack()
        self.o_proj.unpack()

    def forward(self, x: Tensor, ctx: LayerContext, layer: int) -> Tensor:
        B, T, _ = x.shape
        q, k, v = self.qkv(x)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        if ctx.rope is not None:
            cos, sin = ctx.rope  # (B, 1, T, D) each
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        if ctx.cache is not None and ctx.slots is not None:
            k, v = ctx.cache.write_at(layer, k, v, ctx.slots)  # (B, Hkv, S_max, D)
        elif ctx.cache is not None:
            assert ctx.plan is not None
            k, v = ctx.cache.write(layer, k, v, ctx.plan)  # (B, Hkv, S_used, D)
        gqa = self.n_kv_head != self.n_head
        if ctx.plan is not None and ctx.cache is not None and is_batch_invariant():
            y = self._invariant(q, k, v, ctx, layer)  # (B, H, T, D)
        elif self.row_by_row and B == 1 and ctx.plan is not None and T <= ROW_BY_ROW_MAX:
            y = exact_attention(q, k, v, ctx.visible(B, T, k.shape[2]))  # (1, H, T, D)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=ctx.mask, is_causal=ctx.is_causal,
                                               enable_gqa=gqa)  # (B, H, T, D)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim))


    def _invariant(self, q: Tensor, k: Tensor, v: Tensor, ctx: LayerContext, layer: int) -> Tensor:
        """Every query of every row over exactly the keys it sees (`batch_invariant()`): what that
        position computes alone in a one-token step, whatever else the forward holds. With the native
        exact attention, that is one call for every row; otherwise the rows named by `ragged_rows()`
        (rows that verify draft trees) run as one `ragged_attention`, the others as one SDPA per row
        and query. q: (B, H, T, D); k, v: (B, Hkv, S_used, D). Returns (B, H, T, D)."""
        B, _, T, _ = q.shape
        if T > 1 and ctx.mask is None:
            raise ValueError("a batch-invariant forward of several tokens per row needs their tree mask")
        visible = ctx.visible(B, T, k.shape[2])
        ragged = [b for b in ragged_rows() if b < B]
        if not ragged or resolve_exact_impl("auto", q) == "native":
            return exact_attention(q, k, v, visible)
        assert ctx.cache is not None
        plan = ctx.ragged_plan(B, T, self.n_head // self.n_kv_head, q)
        y = ragged_attention(q, ctx.cache.k[layer], ctx.cache.v[layer], plan)  # (B, H, T, D)
        if len(ragged) == B:
            return y
        plain = exact_attention(q, k, v, visible, impl="torch")
        index = torch.tensor(ragged, device=q.device)
        return plain.index_copy_(0, index, y.index_select(0, index))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gated = config.mlp == "swiglu"
        if self.gated:
            self.gate_proj = Linear(config.d_model, config.d_ff, bias=config.mlp_bias)
        self.up_proj = Linear(config.d_model, config.d_ff, bias=config.mlp_bias)
        self.down_proj = Linear(config.d_ff, config.d_model, bias=config.mlp_bias)
        self.gate_up = FusedLinear((self.gate_proj, self.up_proj) if self.gated else (self.up_proj,))

    def pack(self) -> int:
        return self.gate_up.pack() + self.down_proj.pack()

    def unpack(self) -> None:
        self.gate_up.unpack()
        self.down_proj.unpack()

    def forward(self, x: Tensor) -> Tensor:
        if self.gated:
            gate, up = self.gate_up(x)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.gelu(self.up_proj(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = make_norm(config)
        self.attn = Attention(config)
        self.mlp_norm = make_norm(config)
        self.mlp = MLP(config)

    def pack(self) -> int:
        return self.attn.pack() + self.mlp.pack()

    def unpack(self) -> None:
        self.attn.unpack()
        self.mlp.unpack()

    def attn_input(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(residual, attention input) of block inputs x (B, T, C_in): x and its norm here; an EAGLE-3
        layer's 2C-wide inputs split (`models/eagle.py`)."""
        return x, self.attn_norm(x)

    def forward(self, x: Tensor, ctx: LayerContext, layer: int) -> Tensor:
        residual, h = self.attn_input(x)
        x = residual + self.attn(h, ctx, layer)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    supports_continuous_batching: ClassVar[bool] = True
    inv_freq: Tensor  # (D/2,) rotary inverse frequencies, a non-persistent buffer (rope models only)
    _head_packed: PackedWeight | None = None  # packed tied LM head, see `pack_for_cpu_inference`
    stack_impl: StackImpl = "auto"
    """How the decode and verify steps of a CPU float32 or quantised model run its layers: `native`, one
    call of `kernels/decoder_stack.py` per forward; `torch`, the layers below (the reference); `auto`,
    native where it runs. The choice holds for every such step (the two round differently), so set it
    before decoding starts."""
    _stack: _BuiltStack | None = None

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if torch.get_default_device().type != "meta":  # a meta build allocates nothing (checkpoint loading)
            config.check_fits_in_memory(torch.get_default_dtype().itemsize)
        self.config = config
        self.input_width = config.d_model
        """Width of `inputs_embeds` (an EAGLE-3 layer's pairs are 2C wide, `models/eagle.py`)."""
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_embed = nn.Embedding(config.max_seq_len, config.d_model) if config.position == "learned" else None
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm = make_norm(config)
        self.lm_head = None if config.tie_embeddings else Linear(config.d_model, config.vocab_size, bias=False)
        if config.position == "rope":
            self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)

    def init_weights(self, std: float = 0.02) -> None:
        """Random initialisation for training from scratch (GPT-2 style, scaled residual projections)."""
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p) if name.endswith("weight") else nn.init.zeros_(p)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, std=std / math.sqrt(2 * self.config.n_layer))
            else:
                nn.init.normal_(p, std=std)

    def output_embeddings(self) -> Tensor:
        """(V, C) the LM head's matrix; of a quantised copy, its int8 head dequantised (the head as it runs)."""
        if self.lm_head is not None and isinstance(self.lm_head.quantized, Int8Weight):
            return self.lm_head.quantized.dequantized()
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    checkpoint_fingerprint: str | None = None
    """Set by `to_precision` and `models.quantized.quantized_target`: the fingerprint of the float32
    weights this half-precision or quantised copy was made from."""
    weight_bits: int | None = None
    """Set on a weight-only quantised copy (`models.quantized`): the bits of its block weights; its
    linear layers run their `quantized` weights and hold no dense ones."""

    def fingerprint(self) -> str:
        if self.checkpoint_fingerprint is not None and (self.embed.weight.dtype != torch.float32
                                                        or self.weight_bits is not None):
            return self.checkpoint_fingerprint
        return model_fingerprint(self)

    def to_precision(self, dtype: torch.dtype) -> Transformer:
        """Cast the weights to `dtype` in place (as `.to(dtype)`), keeping the identity of the weights cast
        from: a half-precision copy answers `fingerprint()` with its checkpoint's, so drafters trained for the
        checkpoint run on it (compared with plain decoding in the same precision, docs/metrics.md). The
        stamp holds while the weights are not float32; a copy cast back is fingerprinted from its values."""
        if dtype != self.embed.weight.dtype and self.embed.weight.dtype == torch.float32:
            self.checkpoint_fingerprint = model_fingerprint(self)
        return self.to(dtype=dtype)

    def accepts_inputs_embeds(self) -> bool:
        return True

    def torch_model(self) -> Transformer:
        return self

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        weight = self.embed.weight
        return KVCache.for_model(self.config, batch, max_len, dtype=weight.dtype, device=weight.device)

    def pack_for_cpu_inference(self) -> int:
        """Give every linear layer and the LM head a oneDNN-packed weight copy (see
        `packed_linear`; q/k/v and gate/up are stacked into one matrix each); the number of packed
        matrices, 0 off CPU, outside fp32 or in a quantised copy (which has no dense weights). Idempotent:
        only missing or stale copies are made. Training and autograd keep using the dense weights."""
        if self.weight_bits is not None:
            return 0
        count = sum(cast(Block, block).pack() for block in self.blocks)
        if self.lm_head is not None:
            count += self.lm_head.pack()
        else:
            head = self.embed.weight
            if self._head_packed is None or not self._head_packed.fresh_for((head,)):
                self._head_packed = PackedWeight.of((head,))
            count += self._head_packed is not None
        return count

    def unpack(self) -> None:
        """Drop the packed copies (frees their memory); forwards use the dense weights again."""
        for block in self.blocks:
            cast(Block, block).unpack()
        if self.lm_head is not None:
            self.lm_head.unpack()
        self._head_packed = None

    def rope_tables(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        freqs = positions[:, :, None].float() * self.inv_freq  # (B, T, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # (B, 1, T, D)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def _full_mask(self, new_mask: Tensor | None, plan: WritePlan, device: torch.device) -> Tensor | None:
        """Mask over cached + new keys, (B, 1, T, S_used) bool; None when every key is visible.

        Cached positions of a row are always visible; new positions follow `new_mask` (B, T, T), or
        the config's default pattern (causal or bidirectional) when it is None.
        """
        T, S = plan.num_new, plan.used
        if new_mask is None:
            if (not self.config.causal or T == 1) and plan.uniform_start is not None:
                return None
            new_mask = default_new_mask(T, self.config.causal)
        return cache_attention_mask(plan.start.to(device), new_mask.to(device), S)

    def forward(
        self,
        tokens: Tensor,
        positions: Tensor | None = None,
        cache: KVCache | None = None,
        attention_mask: Tensor | None = None,
        hidden_layers: Sequence[int] = (),
        logits_slice: slice | None = None,
        inputs_embeds: Tensor | None = None,
        layer_gates: Tensor | None = None,
    ) -> BackboneOutput:
        """Run the backbone over `T` new tokens per row.

        Args:
            tokens: (B, T) int64 token ids.
            positions: (B, T) int64 position ids; defaults to the row's cache length + arange(T).
            cache: KV cache to read and append to (its lengths advance by T), or None for a
                cache-free forward over the whole sequence (training).
            attention_mask: (B, T, T) or (B, 1, T, T) bool (B may be 1: one mask for every row),
                which new tokens each new token attends to (a tree mask); cached positions are
                always visible. None: the config's default (causal, or bidirectional for
                diffusion LMs).
            hidden_layers: indices in 0..L of hidden states to return (see `BackboneOutput`).
            logits_slice: compute logits only for this slice of the T positions (e.g. the last one
                at prefill).
            inputs_embeds: (B, T, C) block inputs to use instead of the token embeddings (a
                feature-level drafter feeds its own); `tokens` then only gives the shape.
            layer_gates: (B, L) soft gate of every block per row: block i adds `gate * (block(x) - x)`
                (1 runs it, 0 skips it); training of layer routers (FiRST) only.
        """
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (B, T), got shape {tuple(tokens.shape)}")
        B, T = tokens.shape
        if cache is not None and cache.batch != B:
            raise ValueError(f"cache holds {cache.batch} rows but tokens have batch {B}")
        attention_mask = new_token_mask(attention_mask, B, T)
        wanted = set(hidden_layers)
        if not wanted <= set(range(self.config.n_layer + 1)):
            raise ValueError(f"hidden_layers {sorted(wanted)} out of range 0..{self.config.n_layer}")
        plan = cache.plan_write(T) if cache is not None else None
        if positions is None:
            base = plan.start[:, None] if plan is not None else torch.zeros(B, 1, dtype=torch.int64)
            positions = (base + torch.arange(T)).to(tokens.device)
        elif positions.shape != tokens.shape:
            raise ValueError(f"positions {tuple(positions.shape)} must match tokens {tuple(tokens.shape)}")

        if inputs_embeds is not None and inputs_embeds.shape != (B, T, self.input_width):
            raise ValueError(f"inputs_embeds {tuple(inputs_embeds.shape)} must be ({B}, {T}, {self.input_width})")
        if layer_gates is not None and layer_gates.shape != (B, self.config.n_layer):
            raise ValueError(f"layer_gates {tuple(layer_gates.shape)} must be ({B}, {self.config.n_layer})")
        x = self.embed(tokens) if inputs_embeds is None else inputs_embeds  # (B, T, C)
        rope = None
        if self.pos_embed is not None:
            if int(positions.max()) >= self.config.max_seq_len:
                raise ConfigError(f"position {int(positions.max())} is beyond the model's context of "
                                  f"{self.config.max_seq_len} tokens")
            x = x + self.pos_embed(positions)
        else:
            rope = self.rope_tables(positions, x.dtype)

        if plan is None:
            mask = None if attention_mask is None else attention_mask[:, None].to(x.device)
            ctx = LayerContext(rope, mask, attention_mask is None and self.config.causal, None, None)
        else:
            ctx = LayerContext(rope, self._full_mask(attention_mask, plan, x.device), False, cache, plan,
                               keep=real_positions(B, T))

        x, hidden = self._blocks(x, ctx, wanted, layer_gates)
        if cache is not None:
            assert plan is not None
            cache.advance(plan)
        if logits_slice is not None:
            x = x[:, logits_slice]
        elif ctx.keep is not None:  # padding rows' logits are unspecified: zeros, not computed
            keep = ctx.keep.to(x.device)
            real = self.head(x.reshape(B * T, -1)[keep])  # (n, V)
            logits = real.new_zeros(B * T, real.shape[-1])
            logits[keep] = real
            return BackboneOutput(logits=logits.view(B, T, -1), hidden_states=hidden)
        return BackboneOutput(logits=self.head(x), hidden_states=hidden)

    def native_stack(self) -> DecoderStack | str:
        """This model's layers as `kernels/decoder_stack.py` runs them, or why they cannot run there (one line).
        Built once; rebuilt when the blocks or the storage of a float tensor it reads change (`.to()`, a
        reload), never for new values in the same storage (an optimizer step). A layer with a forward hook
        (a LoRA adapter, `models/lora.py`) runs its PyTorch forward: the stack would skip the hook."""
        built = self._stack
        if built is None or not built.fresh(self.blocks):
            self._stack = built = _BuiltStack.of(self.blocks, *self._build_stack())
        if built.hooked():
            return "a layer has a forward hook (e.g. a LoRA adapter): its PyTorch forward runs it"
        return built.stack

    def _build_stack(self) -> tuple[DecoderStack | str, tuple[Tensor, ...]]:
        """The stack, or why none, and the model's float tensors it reads in place."""
        config = self.config
        if (config.norm, config.mlp, config.position) != ("rmsnorm", "swiglu", "rope"):
            return "the native stack runs Llama-family layers (RMSNorm, SwiGLU, rotary positions)", ()
        layers: list[StackLayer] = []
        read: list[Tensor] = []

        def dense(layer: Linear) -> DenseWeight:
            read.extend(t for t in (layer.weight, layer.bias) if t is not None)
            return DenseWeight(layer.weight.detach(), None if layer.bias is None else layer.bias.detach())

        for module in self.blocks:
            block = cast(Block, module)
            attn, mlp = block.attn, block.mlp
            if not (isinstance(block.attn_norm, RMSNorm) and isinstance(block.mlp_norm, RMSNorm)):
                return "the native stack runs layers with both RMSNorms (not an EAGLE layer)", ()
            quantized = (attn.qkv.quantized, attn.o_proj.quantized, mlp.gate_up.quantized, mlp.down_proj.quantized)
            norms = [cast(Tensor, norm.weight) for norm in (block.attn_norm, block.mlp_norm)]
            read.extend(norms)
            if all(w is None for w in quantized):
                weights: tuple[object, ...] = (tuple(map(dense, attn.qkv.layers)), dense(attn.o_proj),
                                               tuple(map(dense, mlp.gate_up.layers)), dense(mlp.down_proj))
            elif any(w is None for w in quantized):
                return "the native stack runs layers whose weights are all quantised or all float", ()
            else:
                weights = ((quantized[0],), quantized[1], (quantized[2],), quantized[3])
            layers.append(StackLayer(norms[0].detach(), norms[1].detach(), *weights))  # type: ignore[arg-type]
        stack = DecoderStack.of(layers, config.n_head, config.kv_head_count, config.head_width, config.norm_eps)
        return stack, tuple(read)

    def _stack_for(self, x: Tensor, ctx: LayerContext, layer_gates: Tensor | None) -> DecoderStack | None:
        """The native stack when this forward runs on it, unless `stack_impl` is torch: any cached forward
        of a quantised model (decode and verify steps, and prefills: over 128 to 800 prompt tokens the
        stack took 0.84-0.87x the PyTorch layers' time, measured), a step of up to `DENSE_STEP_ROWS` tokens
        (outside `batch_invariant()`) of a float32 one; on the CPU, without autograd."""
        if self.stack_impl == "torch":
            return None
        B, T, _ = x.shape
        invariant, dense = is_batch_invariant(), self.weight_bits is None
        step = (ctx.cache is not None and ctx.plan is not None and ctx.slots is None and ctx.rope is not None
                and layer_gates is None and x.dtype == torch.float32 and x.device.type == "cpu" and B * T > 0
                and (not dense or (B * T <= DENSE_STEP_ROWS and not invariant))
                and not (torch.is_grad_enabled()
                         and (x.requires_grad or cast(Block, self.blocks[0]).attn.o_proj.weight.requires_grad)))
        stack = self.native_stack() if step else None
        if self.stack_impl == "native" and not isinstance(stack, DecoderStack):
            raise ValueError(f"the native decoder stack cannot run this forward: {stack or 'not a decode or verify step'}")
        return stack if isinstance(stack, DecoderStack) else None

    def _blocks(self, x: Tensor, ctx: LayerContext, wanted: set[int],
                layer_gates: Tensor | None = None) -> tuple[Tensor, dict[int, Tensor]]:
        """Every block and the final norm over (B, T, C) inputs: the normed output and the wanted hidden states."""
        hidden: dict[int, Tensor] = {}
        stack = self._stack_for(x, ctx, layer_gates)
        if stack is not None:
            assert ctx.cache is not None and ctx.plan is not None and ctx.rope is not None
            B, T, _ = x.shape
            visible = ctx.visible(B, T, ctx.plan.used)
            if ctx.keep is not None:
                visible = visible.only(ctx.keep)
            cuts = [0, *sorted(i for i in wanted if 0 < i < len(self.blocks)), len(self.blocks)]
            if 0 in wanted:
                hidden[0] = x
            for a, b in itertools.pairwise(cuts):
                x = stack(x, a, b, *ctx.rope, ctx.cache.k, ctx.cache.v, ctx.plan.start, visible, ctx.keep)
                if b in wanted and b < len(self.blocks):
                    hidden[b] = x
            return self._final_norm(x, wanted, hidden)
        for i, block in enumerate(self.blocks):
            if i in wanted:
                hidden[i] = x
            out = block(x, ctx, i)
            x = out if layer_gates is None else x + layer_gates[:, i, None, None].to(x.dtype) * (out - x)
        return self._final_norm(x, wanted, hidden)

    def _final_norm(self, x: Tensor, wanted: set[int], hidden: dict[int, Tensor]) -> tuple[Tensor, dict[int, Tensor]]:
        x = self.norm(x)
        if self.config.n_layer in wanted:
            hidden[self.config.n_layer] = x
        return x, hidden

    def forward_static(self, tokens: Tensor, positions: Tensor, start: Tensor, new_mask: Tensor, cache: KVCache,
                       hidden_layers: Sequence[int] = (), inputs_embeds: Tensor | None = None) -> BackboneOutput:
        """`forward` with shapes and addresses that do not change from step to step, so that one CUDA
        graph can replay it (`runtime.cudagraphs`): keys and values go to the slots `start + arange(T)`
        given by a device tensor, attention reads the whole cache under `cache_attention_mask`, and
        nothing syncs with the host. Checks nothing and leaves `cache.lengths` to the caller.

        Args:
            tokens: (B, T) int64 token ids, on the model's device.
            positions: (B, T) int64 position ids, on the model's device.
            start: (1,) int64 on the model's device, the cache length before these tokens (every row's).
            new_mask: (B or 1, T, T) bool on the model's device, which new tokens each new token sees.
            inputs_embeds: (B, T, C) block inputs instead of the token embeddings, as in `forward`.
        """
        T = tokens.shape[1]
        x = self.embed(tokens) if inputs_embeds is None else inputs_embeds  # (B, T, C)
        if self.pos_embed is not None:
            x = x + self.pos_embed(positions)
            rope = None
        else:
            rope = self.rope_tables(positions, x.dtype)
        slots = start + torch.arange(T, device=start.device)  # (T,)
        mask = cache_attention_mask(start.expand(tokens.shape[0]), new_mask, cache.max_len)
        x, hidden = self._blocks(x, LayerContext(rope, mask, False, cache, None, slots), set(hidden_layers))
        return BackboneOutput(logits=self.head(x), hidden_states=hidden)

    def head(self, x: Tensor) -> Tensor:
        """LM head: (..., C) final normed hidden states → (..., V) logits. A float32 CPU head of up to
        `DENSE_STEP_ROWS` rows outside `batch_invariant()` reads its weight in place with the native dense
        matmul (unless `stack_impl` is torch), like the one-token steps' layers."""
        head = self.lm_head
        if head is not None and (head.quantized is not None or head.bias is not None):
            return head(x)
        weight = self.embed.weight if head is None else head.weight
        if (self.stack_impl != "torch" and weight.dtype == x.dtype == torch.float32 and weight.device.type == "cpu"
                and weight.numel() and x.numel() <= DENSE_STEP_ROWS * x.shape[-1] and not is_batch_invariant()):
            return dense_matmul(x, weight)
        return head(x) if head is not None else linear(x, weight, self._head_packed)

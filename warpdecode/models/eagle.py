"""The EAGLE-style feature-level draft network (Li et al. 2024; EAGLE-3's training-time test).

The target's final normed hidden state f_i at position i (the *feature* its LM head reads) says
what comes after token x_i but not which token was then chosen. The drafter gets both: its input
for pair i is `fc([f_i ; embed(x_{i+1})])`, one Llama decoder block with its own KV cache attends
over the pairs before it, and a final norm gives f̂_{i+1}, the prediction of the target's next
feature; the draft token comes from a frozen slice of the target's LM head over a reduced,
frequency-ranked draft vocabulary (FR-Spec / EAGLE-3). To draft further the drafter feeds itself:
pair (f̂_{i+1}, d_{i+2}) predicts f̂_{i+2}, and so on.

    features f_0 … f_{n-1} (target)      f̂_n          f̂_{n+1}
    tokens   x_1 … x_n (pending)         d_{n+1}       d_{n+2}       (draft tokens)
             └── true pairs, cached ──┘  └── drafted pairs, dropped after verification ──┘

Training unrolls `steps` drafting steps on teacher-forced sequences (`unrolled`): step k feeds the
features step k-1 predicted, so the drafter learns to continue from its own features. Each step's
query attends to the true pairs up to its start (causal) and to its own earlier steps at the same
start (a diagonal), exactly what the query of the k-th drafted token sees at inference.

Pair i sits at position i + 1 (the position of its token), as it does in the draft cache.

Fused features (EAGLE-3): with `feature_layers` naming several of the target's hidden states (a low,
a middle and the final one), the target's feature for pair i is `fuse([h_low; h_mid; f_i])`, a
linear map to C; the drafter's own predicted features stay C-wide and skip the fusion. The lower
layers still carry what the final one discards for predicting only the next token.

Layouts. warpdecode's network (above) mixes the feature and the embedding in `fc` before one normed
block. `layout="eagle"` is EAGLE-1's shape (no norm around the block, `fc` without a bias).
`layout="eagle3"` is EAGLE-3's shape as SafeAILab/EAGLE (`eagle/model/cnets.py`, `Model`,
`LlamaDecoderLayeremb`) and vLLM (`vllm/model_executor/models/llama_eagle3.py`) run it: the target's
feature is `fuse` (their `fc`, 3C → C, no bias) of three target hidden states (the peers read inputs
of target layers 1..L-1, by default 2, L/2 and L-3; `export/eagle_layout.py`); a pair enters the
block 2C wide as `[embed(t) ; feature]`, attention reads `[input_layernorm(embed) ; hidden_norm(feature)]`
(`Eagle3Block`) and the residual stream starts from the unnormed feature; the block's output, unnormed,
is the predicted feature fed back at the next depth, and the logits are `lm_head(norm(output))`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Self, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from warpdecode.errors import ConfigError
from warpdecode.kernels.packed_linear import FusedLinear, Linear
from warpdecode.models.cache import KVCache
from warpdecode.models.config import ModelConfig
from warpdecode.models.draft_head import DraftVocabNet, draft_backbone_config
from warpdecode.models.net_config import NetConfig
from warpdecode.models.transformer import Block, Transformer, make_norm, rotate_half

LAYOUTS = (None, "eagle", "eagle3")
"""The EAGLE network shapes (module docstring): warpdecode's, EAGLE-1's and EAGLE-3's."""


def ttt_attention(q: Tensor, keys: list[Tensor], values: list[Tensor]) -> Tensor:
    """Attention of drafting step k = len(keys) - 1 of the training-time unroll.

    Start position i sees the keys of step 0 causally (the true pairs up to i) and, of each later
    step j, only its own key i (the draft's j-th token from that start). So instead of one masked
    (n, (k + 1) n) score matrix, the later steps add k diagonal scores per row: attention costs n²
    per step rather than (k + 1) n². Equals SDPA under the causal-then-diagonal mask (tested).

    Args:
        q: (B, H, n, D) queries of step k.
        keys, values: k + 1 tensors (B, Hkv, n, D), steps 0..k (H a multiple of Hkv).
    Returns:
        (B, H, n, D).
    """
    group = q.shape[1] // keys[0].shape[1]
    if len(keys) == 1:
        return F.scaled_dot_product_attention(q, keys[0], values[0], is_causal=True, enable_gqa=group > 1)
    n, scale = q.shape[2], q.shape[3] ** -0.5
    acc = torch.promote_types(q.dtype, torch.float32)  # scores and softmax in fp32 at least (bf16 under autocast)
    k0, v0 = keys[0].repeat_interleave(group, dim=1), values[0].repeat_interleave(group, dim=1)
    later_keys = torch.stack(keys[1:], dim=-2).repeat_interleave(group, dim=1)  # (B, H, n, k, D)
    later_values = torch.stack(values[1:], dim=-2).repeat_interleave(group, dim=1)
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    scores = (q @ k0.transpose(-1, -2)).to(acc).masked_fill(~causal, float("-inf")) * scale  # (B, H, n, n)
    diagonal = (q.to(acc).unsqueeze(-2) * later_keys.to(acc)).sum(-1) * scale  # (B, H, n, k)
    weights = torch.cat([scores, diagonal], dim=-1).softmax(-1)  # (B, H, n, n + k)
    out = weights[..., :n].to(v0.dtype) @ v0 + (weights[..., n:].unsqueeze(-1) * later_values.to(acc)).sum(-2)
    return out.to(q.dtype)


def shift_left(x: Tensor, by: int, length: int) -> Tensor:
    """`x[:, by : by + length]`, zero-padded at the end to `length` positions. x: (B, T, ...)."""
    out = x[:, by : by + length]
    missing = length - out.shape[1]
    if missing <= 0:
        return out
    pad = torch.zeros((x.shape[0], missing) + tuple(x.shape[2:]), dtype=x.dtype, device=x.device)
    return torch.cat([out, pad], dim=1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EagleConfig(NetConfig):
    """An EAGLE package's network."""

    kind = "EAGLE network"
    draft_vocab_size: int
    d_ff: int
    feature_layers: tuple[int, ...] | None = None
    """The target hidden states fused into its feature (EAGLE-3); None: the final one only."""
    layout: str | None = None
    """None: warpdecode's network; "eagle" / "eagle3": EAGLE-1's / EAGLE-3's shape, which vLLM, SGLang and
    SafeAILab/EAGLE run (see the module docstring)."""
    stores_head: bool | None = None
    """True: the package stores its head (a peer's trained EAGLE-3 head); unset: the target's LM head rows."""

    def hidden_layers(self, n_layer: int) -> tuple[int, ...]:
        return self.feature_layers if self.feature_layers is not None else default_feature_layers(n_layer, self.layout)


def default_feature_layers(n_layer: int, layout: str | None) -> tuple[int, ...]:
    """The target hidden states a network of `layout` reads by default: the final one; for EAGLE-3's
    shape, the inputs of layers 2, L // 2 and L - 3 (SafeAILab/EAGLE's choice, vLLM's default)."""
    return (2, n_layer // 2, n_layer - 3) if layout == "eagle3" else (n_layer,)


class PairNorm(nn.Module):
    """EAGLE-3's attention input of a 2C-wide pair `[embedding ; feature]`: each half normed by its own
    RMSNorm (`input_layernorm`, `hidden_norm`), concatenated."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.width = config.d_model
        self.input_layernorm = make_norm(config)
        self.hidden_norm = make_norm(config)

    def forward(self, x: Tensor) -> Tensor:
        C = self.width
        return torch.cat([self.input_layernorm(x[..., :C]), self.hidden_norm(x[..., C:])], dim=-1)


class Eagle3Block(Block):
    """EAGLE-3's decoder layer: q/k/v read the 2C-wide normed pair (`PairNorm`), the residual stream
    starts from the pair's feature half, unnormed; the rest is a Llama block."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.attn_norm = PairNorm(config)
        attn, C = self.attn, config.d_model
        attn.q_proj, attn.k_proj, attn.v_proj = (Linear(2 * C, layer.out_features, bias=config.qkv_bias)
                                                 for layer in (attn.q_proj, attn.k_proj, attn.v_proj))
        attn.qkv = FusedLinear((attn.q_proj, attn.k_proj, attn.v_proj))

    def attn_input(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return x[..., x.shape[-1] // 2 :], self.attn_norm(x)


class EagleNet(DraftVocabNet):
    """fc + one decoder block + norm + frozen reduced LM head. The token embedding is the target's
    (passed in, never stored here)."""

    head_key = "layer.lm_head.weight"
    config_class = EagleConfig

    def __init__(self, target_config: ModelConfig, draft_vocab_size: int, d_ff: int | None = None,
                 feature_layers: Sequence[int] | None = None, layout: str | None = None, stores_head: bool = False) -> None:
        """feature_layers: the target's hidden states (0..L) fused into its feature, in this order; the
        final one (L) must be among them (default: only L). For `layout="eagle3"`: any three distinct
        ones (default 2, L // 2, L - 3; the peers read layer inputs 1..L-1, see `export/eagle_layout.py`).

        layout: None for warpdecode's network; "eagle" for EAGLE-1's shape as SafeAILab/EAGLE
        (`eagle/model/cnets1.py`) and vLLM (`vllm/model_executor/models/llama_eagle.py`) run it, which
        `convert-drafter --format eagle` writes: no norm in front of the block's attention, none after
        the block (its output is the predicted feature and feeds the head as it is), and `fc` without a
        bias (vLLM builds it without one). The final feature only (no EAGLE-3 fusion).
        "eagle3": EAGLE-3's shape (module docstring), which `convert-drafter --format eagle3` writes.

        stores_head: the head's weights are the package's own (read from a peer's EAGLE-3 checkpoint, whose
        head is trained), not the target's LM head rows."""
        super().__init__(draft_vocab_size)
        if layout not in LAYOUTS:
            raise ConfigError(f"eagle layout must be unset, 'eagle' (EAGLE-1's shape) or 'eagle3' (EAGLE-3's), "
                              f"got {layout!r}")
        self.config = draft_backbone_config(target_config, 1, draft_vocab_size, d_ff)
        L, C = target_config.n_layer, target_config.d_model
        self.feature_layers = tuple(feature_layers) if feature_layers is not None else default_feature_layers(L, layout)
        distinct = len(set(self.feature_layers)) == len(self.feature_layers)
        if layout == "eagle3":
            if len(self.feature_layers) != 3 or not distinct or not set(self.feature_layers) <= set(range(L + 1)):
                raise ConfigError(f"EAGLE-3's shape reads three distinct target hidden states in 0..{L} "
                                  f"(feature_layers), got {list(self.feature_layers)}")
        elif L not in self.feature_layers or not distinct or not set(self.feature_layers) <= set(range(L + 1)):
            raise ConfigError(f"eagle feature_layers must be distinct layers in 0..{L} including the final one "
                              f"({L}), got {list(self.feature_layers)}")
        if layout == "eagle" and len(self.feature_layers) > 1:
            raise ConfigError(f"eagle layout 'eagle' is EAGLE-1's shape, the final feature only; got feature_layers "
                              f"{list(self.feature_layers)} (EAGLE-3's shape is layout 'eagle3')")
        self.layout, self.stores_head = layout, stores_head
        self.fuse = Linear(len(self.feature_layers) * C, C, bias=False) if len(self.feature_layers) > 1 else None
        self.fc = None if layout == "eagle3" else Linear(2 * C, C, bias=layout is None)
        self.layer = Transformer(self.config)
        del self.layer.embed  # the pair input replaces the token embedding (`inputs_embeds`)
        self.out_norm: nn.Module = nn.Identity()
        """Between the fed-back feature and the head: EAGLE-3's `norm`; the other shapes feed back the normed output."""
        if layout == "eagle":
            self.block.attn_norm = nn.Identity()
            self.layer.norm = nn.Identity()
        elif layout == "eagle3":
            self.layer.blocks[0] = Eagle3Block(self.config)
            self.layer.input_width = 2 * C
            self.layer.norm = nn.Identity()
            self.out_norm = make_norm(self.config)

    @classmethod
    def from_config(cls, target: ModelConfig, config: EagleConfig) -> Self:
        return cls(target, config.draft_vocab_size, config.d_ff, config.feature_layers, config.layout, bool(config.stores_head))

    def graph_files(self) -> list[str]:
        """The layer's step graph (features, embeds, position_ids, attention_mask, past_key_0 /
        past_value_0 → hidden, new_keys, new_values) and the head's (features (M, C) → logits (M, N))."""
        return ["eagle_layer.onnx", "eagle_head.onnx"]

    def head(self, features: Tensor) -> Tensor:
        """(..., C) predicted features → (..., N) draft-vocabulary logits (EAGLE-3: through its `norm`)."""
        return self.frozen_head()(self.out_norm(features))

    @property
    def dtype(self) -> torch.dtype:
        """The network's float dtype (of its features and cache)."""
        return self.block.attn.o_proj.weight.dtype

    @property
    def block(self) -> Block:
        return cast(Block, self.layer.blocks[0])

    def init_from_target(self, target: Transformer, draft_vocab: Tensor, std: float = 0.02) -> None:
        """Random block weights; fc passes the feature through (identity on its feature half); the norm
        starts as the target's final norm and the head is the target's LM head rows of `draft_vocab`
        (frozen). A fusion starts as the final (EAGLE-3's shape: the highest) layer's feature plus small
        contributions of the others."""
        self.layer.init_weights(std)
        C = target.config.d_model
        with torch.no_grad():
            if self.fc is not None:
                nn.init.normal_(self.fc.weight, std=std)
                self.fc.weight[:, :C] += torch.eye(C)
                if self.fc.bias is not None:
                    nn.init.zeros_(self.fc.bias)
            if self.fuse is not None:
                nn.init.normal_(self.fuse.weight, std=std)
                top = self.feature_layers.index(max(self.feature_layers))
                self.fuse.weight[:, top * C : (top + 1) * C] += torch.eye(C)
            if self.layout is None:
                self.layer.norm.load_state_dict(target.norm.state_dict())
            elif self.layout == "eagle3":
                self.out_norm.load_state_dict(target.norm.state_dict())
            self.draft_vocab.copy_(draft_vocab)
        self.tie_head(target)

    def pack(self) -> None:
        self.layer.pack_for_cpu_inference()
        for linear in self._input_linears():
            linear.pack()

    def unpack(self) -> None:
        """Drop the packed copies (an ONNX export traces the dense weights)."""
        self.layer.unpack()
        for linear in self._input_linears():
            linear.unpack()

    def _input_linears(self) -> list[Linear]:
        """The linear layers in front of the block: fc (not in EAGLE-3's shape), and the fusion of several
        target layers if any."""
        return [layer for layer in (self.fc, self.fuse) if layer is not None]

    def target_feature(self, hidden_states: dict[int, Tensor]) -> Tensor:
        """The target's feature (..., C) from its hidden states `feature_layers` (each (..., C))."""
        if self.fuse is None:
            return hidden_states[self.feature_layers[0]]
        return self.fuse(torch.cat([hidden_states[j] for j in self.feature_layers], dim=-1))

    def pair_inputs(self, features: Tensor, tokens: Tensor, embed: nn.Embedding) -> Tensor:
        """features (B, T, C) and next tokens (B, T) → block inputs (B, T, C); EAGLE-3's shape: the pair
        itself, `[embedding ; feature]` (B, T, 2C)."""
        return mix_pair(self.fc, features, embed(tokens).to(features.dtype))

    def forward(self, features: Tensor, tokens: Tensor, embed: nn.Embedding, positions: Tensor,
                cache: KVCache | None = None, attention_mask: Tensor | None = None,
                logits_slice: slice | None = None) -> tuple[Tensor, Tensor]:
        """Run pairs through the draft (inference: appends to `cache`).

        Args:
            features: (B, T, C) input features (target features, or the draft's own predictions).
            tokens: (B, T) int64 token following each feature.
            positions: (B, T) int64 position of each pair (its token's position).
            attention_mask: (B, T, T) bool among the new pairs (a tree), or None (causal).
            logits_slice: compute logits only for this slice of the T pairs (drafting needs few).
        Returns:
            predicted next features (B, T, C) and draft-vocabulary logits (B, T', N) of the slice.
        """
        x = self.pair_inputs(features, tokens, embed)
        out = self.layer(tokens, positions, cache, attention_mask, hidden_layers=(1,), inputs_embeds=x,
                         logits_slice=slice(0, 0))
        predicted = out.hidden_states[1]
        return predicted, self.head(predicted[:, logits_slice or slice(None)])

    def unrolled(self, features: Tensor, tokens: Tensor, embed: nn.Embedding, steps: int) -> list[tuple[Tensor, Tensor]]:
        """Training-time test: `steps` drafting steps from every start position of teacher-forced sequences.

        Args:
            features: (B, T, C) target features f_0..f_{T-1} as the drafter reads them (`target_feature`).
            tokens: (B, T) int64 tokens x_0..x_{T-1}.
        Returns:
            per step k, predicted features (B, T-1, C) and logits (B, T-1, N); entry i of step k
            predicts f_{i+1+k} (and so token x_{i+2+k}) from the true pairs up to i and the draft's
            own k earlier steps. Entries whose inputs run past the sequence see zero padding.
        """
        block, attn = self.block, self.block.attn
        B, T, _ = features.shape
        n = T - 1
        positions = torch.arange(1, T, device=features.device)[None].expand(B, -1)
        keys: list[Tensor] = []
        values: list[Tensor] = []
        feature = features[:, :n]
        outputs = []
        for k in range(steps):
            x = self.pair_inputs(feature, shift_left(tokens, 1 + k, n), embed)  # (B, n, C or 2C)
            residual, h = block.attn_input(x)
            q, key, value = attn.qkv(h)
            q = q.view(B, n, attn.n_head, attn.head_dim).transpose(1, 2)  # (B, H, n, D)
            key = key.view(B, n, attn.n_kv_head, attn.head_dim).transpose(1, 2)  # (B, Hkv, n, D)
            value = value.view(B, n, attn.n_kv_head, attn.head_dim).transpose(1, 2)
            cos, sin = self.layer.rope_tables(positions + k, x.dtype)  # (B, 1, n, D)
            q = q * cos + rotate_half(q) * sin
            keys.append(key * cos + rotate_half(key) * sin)
            values.append(value)
            y = ttt_attention(q, keys, values)  # (B, H, n, D)
            x = residual + attn.o_proj(y.transpose(1, 2).reshape(B, n, attn.n_head * attn.head_dim))
            x = x + block.mlp(block.mlp_norm(x))
            feature = self.layer.norm(x)
            outputs.append((feature, self.head(feature)))
        return outputs


def mix_pair(fc: Linear | None, features: Tensor, embeds: Tensor) -> Tensor:
    """A pair's block input from its feature and token embedding (..., C) each: `fc([feature ; embedding])`,
    or, without `fc` (EAGLE-3's shape), `[embedding ; feature]` (..., 2C)."""
    if fc is None:
        return torch.cat([embeds, features], dim=-1)
    return fc(torch.cat([features, embeds], dim=-1))

"""The Clover draft network (Xiao et al. 2024): regressive heads with an attention decoder and an
augmenting block, on the target's features.

* **Augmenting block**: one causal decoder block with its own KV cache runs over the target's final
  features f_0 … f_{n-1} of the committed positions and gives augmented states H' "aligned with the
  purpose of speculation"; its keys/values for the attention decoder are computed once per
  committed position.
* **Regressive connection**: a draft step reads the previous step's state h and the embedding of
  the token just drafted (the pending token first): `x = fc([h ; embed(token)])`.
* **Attention decoder**: x attends over H' of the committed context (never over other drafts, so a
  tree needs no mask), then an MLP; a norm and the frozen reduced-vocabulary head score the next
  token, and x is the next step's h.

    committed: f_0 … f_{n-1}  → H'_0 … H'_{n-1}   (keys/values of the decoder)
    depth 1:  h_0 = H'_{n-1}, token x_n (pending)  → h_1 → scores x_{n+1}
    depth 2:  h_1, token d_{n+1}                   → h_2 → scores d_{n+2} …

The steps share their weights, so the draft can go as deep as the tree asks. Step d sits at the
position of the token it reads (n - 1 + d); the decoder's rotary positions are those of its query
and keys.
"""

from __future__ import annotations

import dataclasses
from typing import Self

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from warpdecode.kernels.packed_linear import Linear
from warpdecode.models.cache import KVCache
from warpdecode.models.config import ModelConfig
from warpdecode.models.draft_head import DraftVocabNet, draft_backbone_config
from warpdecode.models.net_config import NetConfig
from warpdecode.models.transformer import MLP, Attention, Transformer, make_norm, rotate_half


@dataclasses.dataclass(frozen=True, kw_only=True)
class CloverConfig(NetConfig):
    """A Clover package's network."""

    kind = "Clover network"
    draft_vocab_size: int
    d_ff: int


class CloverNet(DraftVocabNet):
    """Augmenting block + regressive attention decoder + frozen reduced head. The token embedding is
    the target's (passed in, never stored here)."""

    head_key = "augment.lm_head.weight"
    config_class = CloverConfig

    def __init__(self, target_config: ModelConfig, draft_vocab_size: int, d_ff: int | None = None) -> None:
        super().__init__(draft_vocab_size)
        self.config = draft_backbone_config(target_config, 1, draft_vocab_size, d_ff)
        C = target_config.d_model
        self.augment = Transformer(self.config)
        del self.augment.embed  # it reads the target's features (`inputs_embeds`)
        self.fc = Linear(2 * C, C, bias=True)
        self.cross_norm = make_norm(self.config)
        self.cross = Attention(self.config)
        self.mlp_norm = make_norm(self.config)
        self.mlp = MLP(self.config)
        self.out_norm = make_norm(self.config)

    @classmethod
    def from_config(cls, target: ModelConfig, config: CloverConfig) -> Self:
        return cls(target, config.draft_vocab_size, config.d_ff)

    def graph_files(self) -> list[str]:
        """The augmenting block's step graph (→ states, new_keys / new_values and the decoder's
        context_keys / context_values) and the decoder step's (→ next_states, logits)."""
        return ["clover_augment.onnx", "clover_step.onnx"]

    @property
    def head(self) -> Linear:
        assert self.augment.lm_head is not None
        return self.augment.lm_head

    def init_from_target(self, target: Transformer, draft_vocab: Tensor, std: float = 0.02) -> None:
        """Random weights; fc passes the state through (identity on its state half); the output norm
        starts as the target's final norm and the head is the target's LM head rows of `draft_vocab`."""
        self.augment.init_weights(std)
        C = target.config.d_model
        with torch.no_grad():
            for layer in (*self.decoder_linears(), self.mlp.up_proj, self.mlp.down_proj,
                          *([self.mlp.gate_proj] if self.mlp.gated else [])):
                nn.init.normal_(layer.weight, std=std)
                if layer.bias is not None:
                    nn.init.zeros_(layer.bias)
            self.fc.weight[:, :C] += torch.eye(C)
            self.out_norm.load_state_dict(target.norm.state_dict())
            self.draft_vocab.copy_(draft_vocab)
        self.tie_head(target)

    def decoder_linears(self) -> tuple[Linear, ...]:
        """The decoder's linear layers as `step` and `context_kv` call them (q, k, v one by one)."""
        a = self.cross
        return self.fc, a.q_proj, a.k_proj, a.v_proj, a.o_proj

    def pack(self) -> None:
        self.augment.pack_for_cpu_inference()
        for layer in self.decoder_linears():
            layer.pack()
        self.mlp.pack()

    def unpack(self) -> None:
        self.augment.unpack()
        for layer in self.decoder_linears():
            layer.unpack()
        self.mlp.unpack()

    def augmented(self, features: Tensor, positions: Tensor, cache: KVCache | None = None) -> Tensor:
        """(B, T, C) target features at `positions` (B, T) → (B, T, C) augmented states H' (appends to
        the block's `cache` when given; causal over the features otherwise)."""
        B, T, _ = features.shape
        tokens = torch.zeros(B, T, dtype=torch.int64, device=features.device)  # shape only
        out = self.augment(tokens, positions, cache, hidden_layers=(1,), logits_slice=slice(0, 0), inputs_embeds=features)
        return out.hidden_states[1]

    def _rope(self, x: Tensor, positions: Tensor) -> Tensor:
        """Rotary embedding of x (B, H, T, D) at `positions` (B, T)."""
        cos, sin = self.augment.rope_tables(positions, x.dtype)  # (B, 1, T, D)
        return x * cos + rotate_half(x) * sin

    def context_kv(self, states: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """The decoder's keys and values (B, Hkv, T, D) of augmented states (B, T, C) at `positions`."""
        B, T, _ = states.shape
        a = self.cross
        k = a.k_proj(states).view(B, T, a.n_kv_head, a.head_dim).transpose(1, 2)
        v = a.v_proj(states).view(B, T, a.n_kv_head, a.head_dim).transpose(1, 2)
        return self._rope(k, positions), v

    def step(self, states: Tensor, embeds: Tensor, positions: Tensor, keys: Tensor, values: Tensor,
             mask: Tensor | None = None) -> Tensor:
        """One draft step for M queries per row.

        Args:
            states: (B, M, C) previous states h; embeds: (B, M, C) the target's embedding of the token each reads.
            positions: (B, M) int64 position of each token.
            keys, values: (B, Hkv, S, D) the decoder's context (`context_kv`).
            mask: (B or 1, 1, M, S) bool context each query sees; None: all of it.
        Returns:
            (B, M, C) the next states (score them with `logits`).
        """
        B, M, _ = states.shape
        a = self.cross
        x = self.fc(torch.cat([states, embeds.to(states.dtype)], dim=-1))
        q = self._rope(a.q_proj(self.cross_norm(x)).view(B, M, a.n_head, a.head_dim).transpose(1, 2), positions)
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=a.n_kv_head != a.n_head)
        x = x + a.o_proj(y.transpose(1, 2).reshape(B, M, a.n_head * a.head_dim))
        return x + self.mlp(self.mlp_norm(x))

    def logits(self, states: Tensor) -> Tensor:
        """(..., C) states → (..., N) draft-vocabulary logits."""
        return self.head(self.out_norm(states))

    def unrolled(self, features: Tensor, tokens: Tensor, embed: nn.Embedding, steps: int) -> list[Tensor]:
        """`steps` draft steps from every start of teacher-forced sequences.

        Args:
            features: (B, T, C) target features f_0..f_{T-1}; tokens: (B, T) int64 x_0..x_{T-1}.
        Returns:
            per step k = 1..steps, logits (B, T-1, N): entry i scores x_{i+1+k} after the true tokens up
            to x_{i+k}, the context being H'_0..H'_i (the positions committed when x_{i+1} is pending).
            Entries whose inputs run past the sequence see zero padding.
        """
        B, T, _ = features.shape
        n = T - 1
        positions = torch.arange(T, device=features.device)[None].expand(B, -1)
        states = self.augmented(features, positions)
        keys, values = self.context_kv(states, positions)
        mask = torch.ones(n, T, dtype=torch.bool, device=features.device).tril()[None, None]  # start i sees H'_{≤i}
        h = states[:, :n]
        outputs = []
        for k in range(1, steps + 1):
            read = tokens[:, k : k + n]
            read = torch.cat([read, read.new_zeros(B, n - read.shape[1])], dim=1)
            h = self.step(h, embed(read), positions[:, :n] + k, keys, values, mask)
            outputs.append(self.logits(h))
        return outputs

"""The backbone's decode step as a pure function of explicit tensors, the form ONNX export needs.

`Transformer.forward` reads and writes a Python `KVCache`; an exported graph cannot. `StepGraph`
takes the cache as plain inputs and returns only the new tokens' keys and values, which the runtime
writes into the same `KVCache` the PyTorch backend uses (so truncation, tree commits and every
drafter's cache bookkeeping are shared):

    inputs:  input_ids (B, T) int64, position_ids (B, T) int64,
             attention_mask (B, 1, T, S + T) bool   (S cache slots, then the T new tokens; True = attend),
             logit_index (K,) int64                  (which of the T positions get logits),
             past_key_i, past_value_i (B, Hkv, S, D) for every layer i (the whole preallocated cache
                                                      row buffer, read in place; unused slots masked)
    outputs: logits (B, K, V), new_keys / new_values (L, B, Hkv, T, D), hidden_j (B, T, C) per
             exported hidden layer j.

Attention reads the cached and the new keys separately and joins the scores, so the cache buffer is
never copied inside the graph. The reference is `Transformer.forward`, which the export tests
compare against.
"""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import Tensor, nn

from warpdecode.errors import ConfigError
from warpdecode.models.config import ModelConfig
from warpdecode.models.transformer import Block, Transformer, rotate_half


def check_hidden_layers(config: ModelConfig, hidden_layers: tuple[int, ...]) -> None:
    """Refuse hidden states the model does not have (0 is the embeddings, n_layer the final block's output)."""
    if not set(hidden_layers) <= set(range(config.n_layer + 1)):
        raise ConfigError(f"hidden layers {list(hidden_layers)} out of range 0..{config.n_layer}")


class StepGraph(nn.Module):
    def __init__(self, model: Transformer, hidden_layers: tuple[int, ...]) -> None:
        super().__init__()
        config = model.config
        check_hidden_layers(config, hidden_layers)
        self.model = model
        self.hidden_layers = tuple(sorted(set(hidden_layers)))
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.kv_head_count, config.head_width

    def input_names(self) -> list[str]:
        layers = range(self.model.config.n_layer)
        return (["input_ids", "position_ids", "attention_mask", "logit_index"]
                + [name for i in layers for name in (f"past_key_{i}", f"past_value_{i}")])

    def output_names(self) -> list[str]:
        return ["logits", "new_keys", "new_values"] + [f"hidden_{j}" for j in self.hidden_layers]

    def _attend(self, block: Block, x: Tensor, rope: tuple[Tensor, Tensor] | None, mask: Tensor,
                past_k: Tensor, past_v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One attention layer. x (B, T, C); mask (B, 1, 1, T, S + T); past (B, Hkv, S, D).
        Returns the output (B, T, C) and the new keys / values (B, Hkv, T, D)."""
        attn = block.attn
        B, T, _ = x.shape
        H, Hkv, D = self.n_head, self.n_kv_head, self.head_dim
        q, k, v = (layer(x) for layer in attn.qkv.layers)
        q = q.view(B, T, H, D).transpose(1, 2)
        k = k.view(B, T, Hkv, D).transpose(1, 2)
        v = v.view(B, T, Hkv, D).transpose(1, 2)
        if rope is not None:
            cos, sin = rope  # (B, 1, T, D)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        G = H // Hkv
        qg = q.reshape(B, Hkv, G, T, D) * (1.0 / math.sqrt(D))
        scores = torch.cat(
            (qg @ past_k[:, :, None].transpose(-1, -2), qg @ k[:, :, None].transpose(-1, -2)), dim=-1
        )  # (B, Hkv, G, T, S + T)
        scores = scores.masked_fill(~mask, float("-inf"))
        probs = scores.softmax(dim=-1)
        S = past_k.shape[2]
        y = probs[..., :S] @ past_v[:, :, None] + probs[..., S:] @ v[:, :, None]  # (B, Hkv, G, T, D)
        y = y.reshape(B, H, T, D).transpose(1, 2).reshape(B, T, H * D)
        return attn.o_proj(y), k, v

    def run_blocks(self, x: Tensor, position_ids: Tensor, attention_mask: Tensor,
                   past: tuple[Tensor, ...]) -> tuple[Tensor, Tensor, Tensor, dict[int, Tensor]]:
        """The blocks and final norm over block inputs x (B, T, C) (token embeddings, or a drafter's own).

        Returns the final normed states (B, T, C), new keys / values (L, B, Hkv, T, D) and the hidden
        states of `hidden_layers` (the final one included)."""
        model = self.model
        rope = None
        if model.pos_embed is not None:
            x = x + model.pos_embed(position_ids)
        else:
            rope = model.rope_tables(position_ids, x.dtype)
        mask = attention_mask[:, :, None]  # (B, 1, 1, T, S + T): broadcast over groups of query heads
        new_keys, new_values, hidden = [], [], {}
        for i, module in enumerate(model.blocks):
            block = cast(Block, module)
            if i in self.hidden_layers:
                hidden[i] = x
            residual, h = block.attn_input(x)
            out, k, v = self._attend(block, h, rope, mask, past[2 * i], past[2 * i + 1])
            x = residual + out
            x = x + block.mlp(block.mlp_norm(x))
            new_keys.append(k)
            new_values.append(v)
        x = model.norm(x)
        hidden[model.config.n_layer] = x
        return x, torch.stack(new_keys), torch.stack(new_values), hidden

    def forward(self, input_ids: Tensor, position_ids: Tensor, attention_mask: Tensor, logit_index: Tensor,
                *past: Tensor) -> tuple[Tensor, ...]:
        x, new_keys, new_values, hidden = self.run_blocks(self.model.embed(input_ids), position_ids, attention_mask,
                                                          past)
        logits = self.model.head(x.index_select(1, logit_index))
        return (logits, new_keys, new_values, *(hidden[j] for j in self.hidden_layers))

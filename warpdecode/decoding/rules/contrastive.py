"""Contrastive search (Su et al. 2022, "A Contrastive Framework for Neural Text Generation"), with
Hugging Face's `penalty_alpha` / `top_k` semantics.

Each step takes the `top_k` most likely tokens `v` of the processed distribution p (penalties and
the caller's hooks applied, no sampling warpers) and picks

    argmax_v  (1 - α) · p(v)  -  α · max_j cos(h_v, h_j)

where `h_v` is the target's final (normed) hidden state at the candidate's position and `h_j` those
of every earlier position, prompt included: the degeneration penalty favours a likely token whose
representation differs from the context's. The `top_k` candidates run in one forward as siblings of
a one-level tree (each sees the cache and itself), and the chosen one's keys and values are kept
(`KVCache.commit`), so a step costs one forward of `top_k` tokens over one cache.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from warpdecode.decoding.outputs import DecodeStats
from warpdecode.decoding.processors import TokenHistory
from warpdecode.decoding.registry import register
from warpdecode.decoding.rules.protocols import Decoded, DecodingRule, Emitter
from warpdecode.decoding.sampler import Sampler
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone


def contrastive_choice(context: Tensor, candidates: Tensor, probs: Tensor, penalty_alpha: float) -> int:
    """Index of the candidate with the best contrastive score (the first one on a tie, as HF's argmax).

    Args:
        context: (S, C) hidden states of every position so far.
        candidates: (K, C) hidden states of the K candidates.
        probs: (K,) their probabilities under the processed distribution.
    """
    cosine = (candidates / candidates.norm(dim=-1, keepdim=True)) @ (context / context.norm(dim=-1, keepdim=True)).T
    score = (1.0 - penalty_alpha) * probs - penalty_alpha * cosine.amax(dim=-1)  # (K,)
    return int(score.argmax())


@register("rule", "contrastive")
class ContrastiveSearch(DecodingRule):
    def __init__(self, penalty_alpha: float = 0.6, top_k: int = 4) -> None:
        if not 0 < penalty_alpha <= 1:
            raise ConfigError(f"--penalty-alpha must be in (0, 1], got {penalty_alpha}")
        if top_k < 2:
            raise ConfigError(f"contrastive search needs --top-k >= 2 candidates, got {top_k}")
        self.penalty_alpha = penalty_alpha
        self.top_k = top_k

    @torch.inference_mode()
    def decode(self, target: Backbone, prompt_ids: list[int], sampler: Sampler, emit: Emitter) -> Decoded:
        device = target.embed.weight.device
        target.pack_for_cpu_inference()
        layer = target.config.n_layer  # the final normed hidden state, Hugging Face's hidden_states[-1]
        k = min(self.top_k, target.config.vocab_size)
        cache = target.new_cache(1, min(len(prompt_ids) + emit.max_new_tokens + k, target.config.max_seq_len))
        stats = DecodeStats(prompt_tokens=len(prompt_ids))
        start = time.perf_counter()
        out = target(torch.tensor([prompt_ids], device=device), cache=cache, hidden_layers=(layer,),
                     logits_slice=slice(-1, None))
        context = out.hidden_states[layer][0].float()  # (S, C)
        logits = out.logits[:, -1]  # (1, V)
        mask = torch.eye(k, dtype=torch.bool, device=device)[None]  # (1, K, K): each candidate sees itself
        tokens = list(prompt_ids)
        while True:
            logits = sampler.penalize(logits, TokenHistory.single(tokens, len(prompt_ids)))
            probs, ids = torch.softmax(logits.float(), dim=-1)[0].topk(k)  # (K,), (K,)
            n = int(cache.lengths[0])
            if cache.max_len - n >= k:
                out = target(ids[None], torch.full((1, k), n, device=device), cache, mask, hidden_layers=(layer,))
                hidden, after = out.hidden_states[layer][0].float(), out.logits[0]  # (K, C), (K, V)
            else:  # the context's last slots: one candidate at a time in slot n
                outs = []
                for i in range(k):
                    cache.truncate([n])
                    outs.append(target(ids[None, i : i + 1], cache=cache, hidden_layers=(layer,)))
                hidden = torch.cat([o.hidden_states[layer][0] for o in outs]).float()
                after = torch.cat([o.logits[0] for o in outs])
            chosen = contrastive_choice(context, hidden, probs, self.penalty_alpha)
            if cache.max_len - n >= k:
                cache.commit(torch.tensor([n]), torch.tensor([[chosen]]), torch.tensor([1]))
            else:  # keep the chosen candidate's keys and values
                cache.truncate([n])
                target(ids[None, chosen : chosen + 1], cache=cache)
            context = torch.cat([context, hidden[chosen : chosen + 1]])
            logits = after[chosen : chosen + 1]  # (1, V): after the chosen token
            token = int(ids[chosen])
            tokens.append(token)
            if not stats.time_to_first_token:
                stats.time_to_first_token = time.perf_counter() - start
            stats.target_forwards += 1
            stats.accepted_per_step.append(0)  # one token per forward: τ = 1, as plain decoding
            stats.proposed_per_step.append(0)
            if not emit.push(token):
                break
        return emit.decoded(stats, start)

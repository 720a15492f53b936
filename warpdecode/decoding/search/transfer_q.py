"""Transfer Q* (Chakraborty et al. 2024): token-level alignment by decoding, π(z | s) ∝ π_sft(z | s)·exp(α·Q(s, z)).

At each step the target (π_sft) proposes its `top_k` next tokens z; each is extended by `rollout` greedy
target tokens, and Q(s, z) is a `Scorer`'s value of the partial sequence s·z·rollout. The paper estimates
Q* from rollouts of a model aligned to a baseline reward; here the stand-in is whatever scorer the spec
names: by default a second model's summed log-probability of the sequence (`reward=model:path=...`, a
model with the target's tokenizer, e.g. a larger or instruction-tuned one), so that with `rollout=0`
the rule is the product of experts π_sft(z)·p_second(z)^α. The rollouts are the target's, not the aligned
model's. Programs (keywords, a length target, a regex) and a reward head fit too (`rewards.py`).

The next token is the argmax of `log π_sft + α·Q` over the candidates, or with sampling a draw from their
re-weighted distribution (after the sampler's filters). With `α=0` it is the target's own choice: greedy
decoding, or sampling restricted to its `top_k`. One sequence is returned.
"""

from __future__ import annotations

import math
import time

import torch

from warpdecode.decoding.outputs import Candidate, DecodeStats, FinishReason
from warpdecode.decoding.processors import TokenHistory
from warpdecode.decoding.registry import register
from warpdecode.decoding.sampler import Sampler
from warpdecode.decoding.search.protocols import SearchResult, SearchStrategy
from warpdecode.decoding.search.rewards import RewardName, reward_option, reward_scorer
from warpdecode.decoding.search.rollouts import Lookahead
from warpdecode.decoding.search.rows import MAX_ROWS, prefill_rows, with_text
from warpdecode.decoding.search.scorers import Scorer
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.tokenizer import Tokenizer


@register("search", "transfer_q")
class TransferQ(SearchStrategy):
    composes_with_speculation = False  # the re-weighted distribution is not the target's: no lossless verify
    num_return_sequences = 1

    def __init__(self, top_k: int = 4, alpha: float = 1.0, rollout: int = 4, reward: RewardName | Scorer = "model",
                 keywords: str | None = None, target_length: int | None = None, pattern: str | None = None,
                 path: str | None = None) -> None:
        if not 1 <= top_k <= MAX_ROWS or rollout < 0:
            raise ConfigError(f"transfer_q needs top_k in [1, {MAX_ROWS}] and rollout >= 0, got {top_k}, {rollout}")
        if not math.isfinite(alpha):
            raise ConfigError(f"transfer_q needs a finite alpha, got {alpha}")
        self.top_k, self.alpha, self.rollout = top_k, alpha, rollout
        if reward == "model" and path is None and alpha != 0:
            raise ConfigError("transfer_q needs the model that stands in for the aligned one: "
                              "path=NAME_OR_DIR (a model with the target's tokenizer), or another reward=")
        self.reward = reward_option(reward, keywords, target_length, pattern, path, used=alpha != 0)

    @torch.inference_mode()
    def search(self, model: Backbone, tokenizer: Tokenizer | None, prompt: list[int], sampler: Sampler, *,
               max_new_tokens: int, stop_ids: set[int]) -> SearchResult:
        P, budget, weighted = len(prompt), max_new_tokens, self.alpha != 0
        scorer = reward_scorer(self.reward if weighted else None, model)
        start = time.perf_counter()
        stats = DecodeStats(prompt_tokens=P)
        cache, logits = prefill_rows(model, prompt, 1, P + budget)
        stats.time_to_first_token = time.perf_counter() - start
        look = Lookahead(model, cache, self.top_k, P) if weighted and self.rollout else None
        tokens: list[int] = []
        logprob = 0.0
        finish: FinishReason = "length"
        while True:
            raw = torch.log_softmax(logits.float()[None], dim=-1).cpu()  # (1, V) π_sft
            scores = raw
            if sampler.penalties:
                scores = sampler.penalize(scores, TokenHistory(torch.tensor(prompt), P, (tuple(tokens),)))
            if sampler.config.do_sample:
                for warp in sampler.warpers:
                    scores = warp(scores)
            top = torch.log_softmax(scores, -1)[0].topk(self.top_k)  # (top_k,) the candidates z
            keep = top.values > float("-inf")
            values, cand = top.values[keep], top.indices[keep].tolist()
            stats.search_tokens += 1
            if weighted:
                depth = min(self.rollout, budget - len(tokens) - 1)
                tails = [[] for _ in cand] if look is None or depth <= 0 else look.rollouts(
                    cache, [0] * len(cand), cand, depth, stop_ids)
                stats.search_tokens += sum(len(t) for t in tails)
                stats.target_forwards += max((len(t) for t in tails), default=0)
                seqs = [tokens + [z] + t for z, t in zip(cand, tails, strict=True)]
                q = scorer.score(prompt, with_text([Candidate(s, "length") for s in seqs], tokenizer))
                values = values + self.alpha * torch.tensor(q, dtype=values.dtype)
            if sampler.config.do_sample:
                pick = int(torch.multinomial(torch.softmax(values, -1), 1, generator=sampler.generator))
            else:
                pick = int(values.argmax())  # the first of equals: the target's order
            token = cand[pick]
            tokens.append(token)
            logprob += float(raw[0, token])
            if token in stop_ids or len(tokens) >= budget:
                finish = "eos" if token in stop_ids else "length"
                break
            logits = model(torch.tensor([[token]], device=model.embed.weight.device), cache=cache).logits[0, -1]
            stats.target_forwards += 1
        stats.new_tokens = len(tokens)
        stats.seconds = time.perf_counter() - start
        stats.target_seconds = stats.seconds - stats.time_to_first_token
        return SearchResult(with_text([Candidate(tokens, finish, score=logprob, logprob=logprob)], tokenizer), stats)

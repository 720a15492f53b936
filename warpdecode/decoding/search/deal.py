"""DeAL (Huang et al. 2024, "Decoding-time Alignment"): decoding as a search guided by a user's reward.

A beam search whose every candidate — a beam followed by one of the target's `top_k` next tokens — is
ranked by its target log-probability plus `reward_weight` times a reward of the partial sequence, or of
that sequence extended by `lookahead` greedy target tokens (the heuristic: a reward sees where the
candidate leads, so a keyword can pull the search before it is written). Rewards are any `Scorer`:
programs (keywords present, a length target, a regular expression) or learned ones (`RewardHead`, a
second model; `rewards.py`). With `reward_weight=0` it is the unrewarded beam search (no lookahead is
run), and with one beam greedy decoding.

Finishing: only the `num_beams` best candidates of a step may finish (a stop token or the budget); the
search stops once `num_beams` have finished or none is open, and returns the finished ones by their
score (log-probability plus weighted reward, no length normalisation). Cost per step: one forward of
`num_beams` rows, plus `lookahead` forwards of `num_beams * top_k` rows and one reward call.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from warpdecode.decoding.outputs import Candidate, DecodeStats, FinishReason
from warpdecode.decoding.registry import register
from warpdecode.decoding.sampler import Sampler
from warpdecode.decoding.search.protocols import SearchResult, SearchStrategy
from warpdecode.decoding.search.rewards import RewardName, reward_option, reward_scorer
from warpdecode.decoding.search.rollouts import Lookahead
from warpdecode.decoding.search.rows import MAX_ROWS, prefill_rows, process_logprobs, with_text
from warpdecode.decoding.search.scorers import Scorer
from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.tokenizer import Tokenizer


@dataclass
class _Hyp:
    tokens: list[int]
    logprob: float
    parent: int = 0
    score: float = 0.0


def _finish(tokens: list[int], stop_ids: set[int]) -> FinishReason:
    return "eos" if tokens and tokens[-1] in stop_ids else "length"


@register("search", "deal")
class DeAL(SearchStrategy):
    composes_with_speculation = False  # beams could verify drafts in one tree forward: not built

    def __init__(self, num_beams: int = 2, top_k: int = 4, lookahead: int = 0, reward_weight: float = 1.0,
                 reward: RewardName | Scorer = "keywords", keywords: str | None = None,
                 target_length: int | None = None, pattern: str | None = None, path: str | None = None,
                 num_return_sequences: int = 1) -> None:
        if not 1 <= num_beams <= MAX_ROWS or not num_beams <= top_k <= MAX_ROWS:
            raise ConfigError(f"deal needs 1 <= num_beams <= top_k <= {MAX_ROWS}, got num_beams={num_beams}, "
                              f"top_k={top_k}")
        if lookahead < 0 or num_beams * top_k > MAX_ROWS:
            raise ConfigError(f"deal needs lookahead >= 0 and num_beams * top_k <= {MAX_ROWS}, got {lookahead}, "
                              f"{num_beams * top_k}")
        if not 1 <= num_return_sequences <= num_beams:
            raise ConfigError(f"deal needs num_return_sequences in [1, num_beams={num_beams}], got {num_return_sequences}")
        if not math.isfinite(reward_weight):
            raise ConfigError(f"deal needs a finite reward_weight, got {reward_weight}")
        self.num_beams, self.top_k, self.lookahead, self.reward_weight = num_beams, top_k, lookahead, reward_weight
        self.num_return_sequences = num_return_sequences
        self.reward = reward_option(reward, keywords, target_length, pattern, path, used=reward_weight != 0)

    def _rewards(self, scorer: Scorer, prompt: list[int], tokenizer: Tokenizer | None, sequences: list[list[int]],
                 stop_ids: set[int]) -> list[float]:
        candidates = with_text([Candidate(s, _finish(s, stop_ids)) for s in sequences], tokenizer)
        return [self.reward_weight * r for r in scorer.score(prompt, candidates)]

    @torch.inference_mode()
    def search(self, model: Backbone, tokenizer: Tokenizer | None, prompt: list[int], sampler: Sampler, *,
               max_new_tokens: int, stop_ids: set[int]) -> SearchResult:
        if sampler.config.do_sample:
            raise CapabilityError("deal is deterministic: it takes no sampling")
        K, P, budget, weighted = self.num_beams, len(prompt), max_new_tokens, self.reward_weight != 0
        scorer = reward_scorer(self.reward if weighted else None, model)
        start = time.perf_counter()
        stats = DecodeStats(prompt_tokens=P)
        cache, first = prefill_rows(model, prompt, K, P + budget)
        stats.time_to_first_token = time.perf_counter() - start
        look = Lookahead(model, cache, K * self.top_k, P) if weighted and self.lookahead else None
        logits = first[None]  # (B, V): one live beam at first
        beams, finished = [_Hyp([], 0.0)], list[_Hyp]()
        while True:
            logprobs = torch.log_softmax(logits.float(), dim=-1).cpu()  # (B, V)
            seqs = torch.tensor([prompt + b.tokens for b in beams], dtype=torch.int64)
            top = process_logprobs(logprobs, sampler, seqs, P, 0).topk(self.top_k, dim=-1)  # (B, top_k)
            cands = [_Hyp(b.tokens + [t], b.logprob + lp, parent=i)
                     for i, b in enumerate(beams) for t, lp in zip(top.indices[i].tolist(), top.values[i].tolist(),
                                                                   strict=True)]
            stats.search_tokens += len(beams)
            rewards = [0.0] * len(cands)
            if weighted:
                depth = min(self.lookahead, budget - len(cands[0].tokens))
                tails = [[] for _ in cands] if look is None or depth <= 0 else look.rollouts(
                    cache, [c.parent for c in cands], [c.tokens[-1] for c in cands], depth, stop_ids)
                stats.search_tokens += sum(len(t) for t in tails)
                stats.target_forwards += max((len(t) for t in tails), default=0)
                rewards = self._rewards(scorer, prompt, tokenizer, [c.tokens + t for c, t in zip(cands, tails, strict=True)],
                                        stop_ids)
            for c, r in zip(cands, rewards, strict=True):
                c.score = c.logprob + r
            ranked = sorted(cands, key=lambda c: -c.score)  # stable: ties keep (beam, rank) order
            ends = [c.tokens[-1] in stop_ids or len(c.tokens) >= budget for c in ranked]
            finished += [c for c, end in zip(ranked[:K], ends, strict=False) if end]
            beams = [c for c, end in zip(ranked, ends, strict=True) if not end][:K]
            if len(finished) >= K or not beams:
                break
            parents = [b.parent for b in beams]
            if len(beams) == cache.batch:
                cache.reorder_rows(parents, begin=P)
            else:
                cache.keep_rows(parents)
            pending = torch.tensor([[b.tokens[-1]] for b in beams], device=model.embed.weight.device)
            logits = model(pending, cache=cache).logits[:, -1]  # (B, V)
            stats.target_forwards += 1
        if weighted:  # the final ranking reads the finished text itself, without lookahead
            for c, r in zip(finished, self._rewards(scorer, prompt, tokenizer, [c.tokens for c in finished], stop_ids),
                            strict=True):
                c.score = c.logprob + r
        finished.sort(key=lambda c: -c.score)
        out = [Candidate(c.tokens, _finish(c.tokens, stop_ids), score=c.score, logprob=c.logprob)
               for c in finished[: self.num_return_sequences]]
        stats.new_tokens = len(out[0].token_ids)
        stats.seconds = time.perf_counter() - start
        stats.target_seconds = stats.seconds - stats.time_to_first_token
        return SearchResult(with_text(out, tokenizer), stats)

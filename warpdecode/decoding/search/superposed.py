"""Superposed Decoding (Shen et al. 2024): k drafts for the cost of one autoregressive pass.

The k drafts start as the target's k most likely first tokens. Each step feeds ONE input: the
superposition `Σ_i w_i · E[last token of draft i]` of the open drafts' last-token embeddings, weighted
by the drafts' normalised probabilities, through one (1, 1) forward over one cache row. The top k tokens
of that superposed distribution extend every open draft (k² candidates, plus the finished drafts as they
are); each is ranked by its draft probability times an n-gram model's probability of the new token after
the draft (`ngram_weight` β: `log P_draft + β·log p_ngram`), and the best k are kept. The n-gram model
(orders 1..`ngram`, interpolated, add-one unigram) is built from the prompt's tokens, plus a text file
(`corpus=`) when one is given: it filters continuations the superposition makes incoherent.

With k=1 the superposition is the draft's own embedding: greedy decoding. Candidates carry the draft's
log-probability under the superposed distributions in `logprob` (not the target's: no forward reads a
draft alone) and the n-gram-filtered score in `score`. Cost: one forward of one token per step, however
many drafts; `stats.search_tokens` counts those positions.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from warpdecode.decoding.outputs import Candidate, DecodeStats
from warpdecode.decoding.registry import register
from warpdecode.decoding.sampler import Sampler
from warpdecode.decoding.search.protocols import SearchResult, SearchStrategy
from warpdecode.decoding.search.rows import MAX_ROWS, prefill_rows, with_text
from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.tokenizer import Tokenizer


class NGramModel:
    """p(t | h): the mean of the maximum-likelihood estimates of the orders 2..n whose history was seen
    and the add-one unigram (so never 0)."""

    def __init__(self, tokens: Sequence[int], n: int, vocab_size: int) -> None:
        self.n, self.vocab_size, self.total = n, vocab_size, len(tokens)
        self.counts: Counter[tuple[int, ...]] = Counter()
        for order in range(1, n + 1):
            for i in range(len(tokens) - order + 1):
                self.counts[tuple(tokens[i : i + order])] += 1
        self.history: Counter[tuple[int, ...]] = Counter()
        for gram, count in list(self.counts.items()):
            if len(gram) < n:
                self.history[gram] += count  # a history of length m counted where an (m+1)-gram may follow

    def logprob(self, context: Sequence[int], token: int) -> float:
        estimates = [(self.counts[(token,)] + 1) / (self.total + self.vocab_size)]
        for m in range(1, self.n):
            if len(context) < m:
                break
            h = tuple(context[-m:])
            if self.history[h]:
                estimates.append(self.counts[h + (token,)] / self.history[h])
        return math.log(sum(estimates) / len(estimates))


@dataclass
class _Draft:
    tokens: list[int]
    logprob: float
    score: float
    done: bool


@register("search", "superposed")
class Superposed(SearchStrategy):
    composes_with_speculation = False  # the superposed input is no sequence a verifier could check

    def __init__(self, k: int = 3, ngram: int = 3, ngram_weight: float = 1.0, corpus: str | None = None) -> None:
        if not 1 <= k <= MAX_ROWS or ngram < 1 or not 0 <= ngram_weight < float("inf"):
            raise ConfigError(f"superposed needs k in [1, {MAX_ROWS}], ngram >= 1 and a finite ngram_weight >= 0, "
                              f"got k={k}, ngram={ngram}, ngram_weight={ngram_weight}")
        if corpus is not None and not Path(corpus).is_file():
            raise ConfigError(f"superposed corpus {corpus!r} is not a file")
        self.k = self.num_return_sequences = k
        self.ngram, self.ngram_weight, self.corpus = ngram, ngram_weight, corpus
        self._corpus_tokens: tuple[Tokenizer, list[int]] | None = None  # encoded once per tokenizer

    def _ngrams(self, model: Backbone, tokenizer: Tokenizer | None, prompt: list[int]) -> NGramModel:
        if self.corpus is None:
            return NGramModel(prompt, self.ngram, model.config.vocab_size)
        if tokenizer is None:
            raise ConfigError("superposed corpus= needs the model's tokenizer")
        if self._corpus_tokens is None or self._corpus_tokens[0] is not tokenizer:
            text = Path(self.corpus).read_text(encoding="utf-8", errors="replace")
            self._corpus_tokens = (tokenizer, tokenizer.encode(text, add_special_tokens=False))
        return NGramModel(self._corpus_tokens[1] + prompt, self.ngram, model.config.vocab_size)

    @torch.inference_mode()
    def search(self, model: Backbone, tokenizer: Tokenizer | None, prompt: list[int], sampler: Sampler, *,
               max_new_tokens: int, stop_ids: set[int]) -> SearchResult:
        if sampler.config.do_sample or sampler.penalties:
            raise CapabilityError("superposed decoding is deterministic and takes no sampling or penalties")
        if not model.accepts_inputs_embeds():
            raise CapabilityError("superposed decoding feeds embeddings: this backend takes token ids only")
        P, budget, beta = len(prompt), max_new_tokens, self.ngram_weight
        table = self._ngrams(model, tokenizer, prompt)
        start = time.perf_counter()
        stats = DecodeStats(prompt_tokens=P)
        cache, logits = prefill_rows(model, prompt, 1, P + budget)
        stats.time_to_first_token = time.perf_counter() - start
        stats.search_tokens = 1
        first = torch.log_softmax(logits.float(), -1).cpu().topk(self.k)
        drafts = [_Draft([t], lp, lp + beta * table.logprob(prompt, t), t in stop_ids or budget <= 1)
                  for t, lp in zip(first.indices.tolist(), first.values.tolist(), strict=True)]
        embed = model.embed.weight  # (V, C)
        while not all(d.done for d in drafts):
            live = [d for d in drafts if not d.done]
            weights = torch.softmax(torch.tensor([d.logprob for d in live]), 0).to(embed)  # (k_live,)
            mixed = (weights[:, None] * embed[[d.tokens[-1] for d in live]]).sum(0)  # (C,)
            dummy = torch.tensor([[live[0].tokens[-1]]], device=embed.device)  # gives the shape only
            out = model(dummy, cache=cache, inputs_embeds=mixed[None, None])
            stats.target_forwards += 1
            stats.search_tokens += 1
            top = torch.log_softmax(out.logits[0, -1].float(), -1).cpu().topk(self.k)
            pool = [d for d in drafts if d.done]
            for d in live:
                for t, lp in zip(top.indices.tolist(), top.values.tolist(), strict=True):
                    tokens = d.tokens + [t]
                    pool.append(_Draft(tokens, d.logprob + lp, d.score + lp + beta * table.logprob(prompt + d.tokens, t),
                                       t in stop_ids or len(tokens) >= budget))
            drafts = sorted(pool, key=lambda d: -d.score)[: self.k]  # stable: ties keep draft, then rank order
        out_candidates = [Candidate(d.tokens, "eos" if d.tokens[-1] in stop_ids else "length", score=d.score,
                                    logprob=d.logprob) for d in drafts]
        stats.new_tokens = len(out_candidates[0].token_ids)
        stats.seconds = time.perf_counter() - start
        stats.target_seconds = stats.seconds - stats.time_to_first_token
        return SearchResult(with_text(out_candidates, tokenizer), stats)

"""A*-decoding (Chatziveroglou et al. 2025): best-first search over partial solutions, one reasoning step
(a line) at a time, guided by a process-reward scorer, under a token and a scorer-call budget.

A node is a partial solution: the new tokens of its steps so far. The frontier is a priority queue on
the scorer's value of each node, higher first. Each iteration pops the best node. A complete node (it
ended with a stop token, or reached `max_new_tokens`) is the answer; an open one is expanded: `n`
candidate next steps are drawn from it as `n` rows of one batched KV cache (sampled with `do_sample`;
without it the `n` most likely first tokens, each continued greedily), every row running to the end of
its step (a token whose text holds a newline, a token of `step_ids`, a stop token, or `max_step_tokens`
tokens). Identical children are merged, the rest are scored in one scorer call and pushed.

The scorer is any `Scorer` (`scorers.py`); it gets the children as `Candidate`s of the whole partial
solution (finish reason "length" while they are open). No trained process reward model exists offline:
the shipped ones are stand-ins, the target's own mean log-probability of the partial solution
(`mean_logprob`, no extra forward) or a second model's (`scorer=model:scorer_model=NAME`, `rewards.ModelScorer`).

KV: the prompt runs once; each node keeps the keys and values of its own step's tokens (all but its
last, pending one), so an expansion writes the prompt's and its ancestors' keys and values into its rows
and runs only the node's pending token: no generated token is run twice.

Budgets, both exact: `max_tokens` counts the tokens sampled over all rows (`stats.search_tokens`),
`max_scorer_calls` the partial solutions scored (PRM passes). An expansion draws at most as many rows as
scorer calls remain; when tokens run out mid-step, the rows still open stop there and are scored as
they are. When a budget is spent, the best-scored complete candidate found is returned, or else the
best-scored partial one.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import time
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from warpdecode.decoding.outputs import Candidate, DecodeStats, FinishReason
from warpdecode.decoding.processors import TokenHistory
from warpdecode.decoding.registry import register
from warpdecode.decoding.sampler import Sampler
from warpdecode.decoding.search.protocols import SearchResult, SearchStrategy
from warpdecode.decoding.search.rewards import ModelScorer
from warpdecode.decoding.search.rows import MAX_ROWS, prefill_rows
from warpdecode.decoding.search.scorers import Scorer, ScorerName, named_scorer
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.cache import KVCache
from warpdecode.models.tokenizer import Tokenizer


@dataclass
class _Node:
    tokens: list[int]
    """The partial solution's new tokens, every step."""
    kv: list[tuple[Tensor, Tensor]] = field(default_factory=list)
    """Keys and values (L, Hkv, t, D) of each step's fed tokens: `tokens[:-1]` in all."""
    logprob: float = 0.0
    finish: FinishReason | None = None
    """None while open; "eos" or "length" once complete."""
    score: float = 0.0


@functools.lru_cache(maxsize=4)
def newline_ids(tokenizer: Tokenizer) -> frozenset[int]:
    """The ids whose text holds a newline: the tokens that end a step."""
    texts = tokenizer.backend.decode_batch([[i] for i in range(tokenizer.vocab_size)], skip_special_tokens=False)
    return frozenset(i for i, text in enumerate(texts) if "\n" in text)


@register("search", "astar")
class AStar(SearchStrategy):
    composes_with_speculation = False  # a step's rows could each draft (prompt lookup): not built yet

    def __init__(self, n: int = 4, scorer: ScorerName | Literal["model"] | Scorer = "mean_logprob",
                 pattern: str | None = None, scorer_model: str | None = None, max_tokens: int = 2048,
                 max_scorer_calls: int = 64, max_step_tokens: int = 128, step_ids: tuple[int, ...] = (),
                 num_return_sequences: int = 1) -> None:
        if not 1 <= n <= MAX_ROWS:
            raise ConfigError(f"astar needs n in [1, {MAX_ROWS}], got {n}")
        for option, value in (("max_tokens", max_tokens), ("max_scorer_calls", max_scorer_calls),
                              ("max_step_tokens", max_step_tokens), ("num_return_sequences", num_return_sequences)):
            if value < 1:
                raise ConfigError(f"astar option {option} must be >= 1, got {value}")
        if (scorer == "model") != (scorer_model is not None):
            raise ConfigError("astar: scorer=model needs scorer_model=NAME_OR_PATH, and scorer_model is read by "
                              "scorer=model only")
        self.scorer: Scorer | None = (scorer if isinstance(scorer, Scorer) else None if scorer == "model"
                                      else named_scorer(scorer, pattern))
        self.n, self.scorer_model, self.step_ids = n, scorer_model, frozenset(step_ids)
        self.max_tokens, self.max_scorer_calls, self.max_step_tokens = max_tokens, max_scorer_calls, max_step_tokens
        self.num_return_sequences = num_return_sequences

    def _get_scorer(self) -> Scorer:
        if self.scorer is None:  # loaded on first use: building the strategy stays cheap
            from warpdecode.models.checkpoint import load_pretrained

            assert self.scorer_model is not None
            self.scorer = ModelScorer(load_pretrained(self.scorer_model)[0], mean=True)
        return self.scorer

    @torch.inference_mode()
    def search(self, model: Backbone, tokenizer: Tokenizer | None, prompt: list[int], sampler: Sampler, *,
               max_new_tokens: int, stop_ids: set[int]) -> SearchResult:
        start = time.perf_counter()
        stats = DecodeStats(prompt_tokens=len(prompt))
        base, first = prefill_rows(model, prompt, 1, len(prompt) + max_new_tokens)
        stats.time_to_first_token = time.perf_counter() - start
        ends = self.step_ids | (newline_ids(tokenizer) if tokenizer is not None else frozenset())
        scorer, order = self._get_scorer(), itertools.count()
        frontier = [(0.0, next(order), _Node([]))]  # (-score, insertion order, node): a max-heap on score
        done: list[_Node] = []
        calls = 0
        while frontier and len(done) < self.num_return_sequences:
            entry = heapq.heappop(frontier)
            node = entry[2]
            if node.finish is not None:
                done.append(node)
                continue
            rows = min(self.n, self.max_scorer_calls - calls, self.max_tokens - stats.search_tokens)
            if rows < 1:
                heapq.heappush(frontier, entry)
                break
            children = self._expand(model, node, rows, base, first, sampler, prompt, stats,
                                    max_new_tokens=max_new_tokens, stop_ids=stop_ids, ends=ends)
            calls += len(children)
            candidates = [self._candidate(c, tokenizer) for c in children]
            for child, score in zip(children, scorer.score(prompt, candidates), strict=True):
                child.score = float(score)
                heapq.heappush(frontier, (-child.score, next(order), child))
        rest = [e[2] for e in sorted(frontier)]  # best first, ties in insertion order
        ranked = done + [n for n in rest if n.finish is not None]
        chosen = ranked[: self.num_return_sequences] or rest[:1]
        stats.seconds = time.perf_counter() - start
        stats.target_seconds = stats.seconds - stats.time_to_first_token
        candidates = [self._candidate(node, tokenizer) for node in chosen]
        for candidate, node in zip(candidates, chosen, strict=True):
            candidate.score = node.score
        stats.new_tokens = len(candidates[0].token_ids)
        return SearchResult(candidates, stats)

    @staticmethod
    def _candidate(node: _Node, tokenizer: Tokenizer | None) -> Candidate:
        text = tokenizer.decode(node.tokens) if tokenizer is not None else ""
        return Candidate(list(node.tokens), node.finish or "length", logprob=node.logprob, text=text)

    def _expand(self, model: Backbone, node: _Node, rows: int, base: KVCache, first: Tensor, sampler: Sampler,
                prompt: list[int], stats: DecodeStats, *, max_new_tokens: int, stop_ids: set[int],
                ends: frozenset[int]) -> list[_Node]:
        """`rows` next steps of `node` (fewer when identical ones merge, or when sampling greedily from a
        vocabulary smaller than `rows`), each a child node with its step's keys and values."""
        P, device = len(prompt), model.embed.weight.device
        greedy_first = not sampler.config.do_sample
        if greedy_first:
            rows = min(rows, first.shape[-1])
        cache = model.new_cache(rows, P + max_new_tokens)
        cache.fill_from_row(base)
        begin = P
        for k, v in node.kv:  # the ancestors' steps, the same in every row
            t = k.shape[2]
            cache.k[:, :, :, begin : begin + t] = k[:, None]
            cache.v[:, :, :, begin : begin + t] = v[:, None]
            begin += t
        cache.lengths = torch.full((rows,), begin, dtype=torch.int64)
        if node.tokens:
            logits = model(torch.full((rows, 1), node.tokens[-1], device=device), cache=cache).logits[:, -1]
            stats.target_forwards += 1
        else:
            logits = first[None].expand(rows, -1)  # (rows, V)
        steps: list[list[int]] = [[] for _ in range(rows)]
        logprobs = [node.logprob] * rows
        children: list[_Node] = []
        active = list(range(rows))
        while True:
            raw = torch.log_softmax(logits.float(), dim=-1)  # (B_active, V)
            if sampler.penalties:
                history = TokenHistory(torch.tensor(prompt), P, tuple(tuple(node.tokens + steps[i]) for i in active))
                logits = sampler.penalize(logits, history)
            if greedy_first:  # the `rows` most likely first tokens, then greedy
                chosen = logits[0].topk(rows).indices
                greedy_first = False
            else:
                chosen = sampler.select(logits)  # (B_active,)
            picked = raw.gather(1, chosen[:, None])[:, 0].tolist()
            stats.search_tokens += len(active)
            left = self.max_tokens - stats.search_tokens
            still: list[tuple[int, int]] = []
            ended: list[tuple[int, int, FinishReason | None]] = []
            for j, (i, token, logprob) in enumerate(zip(active, chosen.tolist(), picked, strict=True)):
                steps[i].append(token)
                logprobs[i] += logprob
                length = len(node.tokens) + len(steps[i])
                finish: FinishReason | None = ("eos" if token in stop_ids else
                                               "length" if length >= max_new_tokens else None)
                stepped = finish is not None or token in ends or len(steps[i]) >= self.max_step_tokens
                if stepped or len(still) >= left:  # a step's end, or the token budget cuts it here
                    ended.append((j, i, finish))
                else:
                    still.append((j, i))
            for j, i, finish in ended:
                fed = int(cache.lengths[j])
                kv = (cache.k[:, j, :, begin:fed].clone(), cache.v[:, j, :, begin:fed].clone())
                children.append(_Node(node.tokens + steps[i], node.kv + [kv], logprobs[i], finish))
            if not still:
                break
            if len(still) < len(active):
                cache.keep_rows([j for j, _ in still])
            active = [i for _, i in still]
            pending = torch.tensor([[steps[i][-1]] for i in active], device=device)
            logits = model(pending, cache=cache).logits[:, -1]  # (B_active, V)
            stats.target_forwards += 1
        unique: dict[tuple[int, ...], _Node] = {}
        for child in children:
            unique.setdefault(tuple(child.tokens), child)
        return list(unique.values())

"""Adaptive n-gram drafting (ADED-style): a tri-gram table of the target's own predictions, a best-first tree.

Like Token Recycling, every target forward is recycled: for each input token, the top-k next
tokens and their probabilities are stored, keyed by the token and the one before it (a tri-gram
table, as in ADED's tri-gram matrix that approximates the model's output distribution and is
updated as decoding goes), with a per-token row as back-off. Two ways to build the draft tree:

* `search="best_first"` (default): the node of highest estimated path probability (product of
  stored probabilities) is added next until the node budget is spent, so budget goes where the
  table is confident (a DySpec-style dynamic tree).
* `search="mcts"`: ADED's Monte-Carlo tree search over the table. `simulations` rollouts descend
  from the pending token; at each node the child maximising `p + exploration * sqrt(ln N / (1 + n))`
  is taken (p: its stored probability, N: visits of the node, n: of the child), which balances the
  table's estimate (exploitation) with untried alternatives (exploration). The `num_nodes` most
  visited nodes (every ancestor before its descendants) are the draft.

The tables live as long as the drafter, across requests. Lossless with any lossless verifier.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from typing import ClassVar

import torch

from warpdecode.decoding.protocols import AcceptResult, DecodeState, Drafter
from warpdecode.decoding.registry import register
from warpdecode.decoding.tree import DraftTree
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone

Candidates = tuple[list[int], list[float]]


@register("drafter", "adaptive_ngram")
class AdaptiveNgramDrafter(Drafter):
    supports_batch: ClassVar[bool] = True

    def __init__(self, top_k: int = 4, num_nodes: int = 8, max_depth: int = 8, max_entries: int = 500_000,
                 search: str = "best_first", simulations: int = 32, exploration: float = 0.5) -> None:
        """Args:
        top_k: candidates stored per context.
        num_nodes: draft tree budget (nodes).
        max_depth: deepest draft level.
        max_entries: tri-gram contexts kept (least recently written ones are dropped first).
        search: `best_first` or `mcts` (see the module docstring).
        simulations: MCTS rollouts per draft.
        exploration: MCTS exploration weight.
        """
        if min(top_k, num_nodes, max_depth, max_entries, simulations) < 1 or exploration < 0:
            raise ConfigError(f"adaptive_ngram needs positive options, got top_k={top_k}, num_nodes={num_nodes}, "
                              f"max_depth={max_depth}, max_entries={max_entries}, simulations={simulations}, "
                              f"exploration={exploration}")
        if search not in ("best_first", "mcts"):
            raise ConfigError(f"adaptive_ngram search must be best_first or mcts, got {search!r}")
        self.top_k, self.num_nodes, self.max_depth, self.max_entries = top_k, num_nodes, max_depth, max_entries
        self.search, self.simulations, self.exploration = search, simulations, exploration
        self.trigrams: OrderedDict[tuple[int, int], Candidates] = OrderedDict()
        self.unigrams: dict[int, Candidates] = {}
        self.prev = -1
        """The token before the pending one when the last draft was proposed."""

    def prepare(self, target: Backbone) -> None:
        pass

    def start(self, state: DecodeState) -> None:
        self.prev = state.tokens[state.prompt_len - 2] if state.prompt_len >= 2 else -1
        self.record(state)

    def contexts(self, state: DecodeState) -> list[int]:
        """The token before each input token of the last target forward (its tri-gram context)."""
        assert state.forward_tokens is not None
        tree = state.forward_tree
        if tree is None:
            return [self.prev]
        pending = int(state.forward_tokens[0])
        tokens = tree.tokens.tolist()
        return [self.prev] + [pending if p < 0 else tokens[p] for p in tree.parents.tolist()]

    def record(self, state: DecodeState) -> None:
        """Store the top-k next tokens after every input token of the last target forward."""
        if state.forward_tokens is None or state.forward_logits is None:
            return
        probs = torch.softmax(state.forward_logits.float(), dim=-1).topk(min(self.top_k, state.forward_logits.shape[-1]))
        for prev, token, values, indices in zip(self.contexts(state), state.forward_tokens.tolist(), probs.values.tolist(),
                                                probs.indices.tolist(), strict=True):
            entry = (indices, values)
            self.unigrams[token] = entry
            self.trigrams[(prev, token)] = entry
            self.trigrams.move_to_end((prev, token))
        while len(self.trigrams) > self.max_entries:
            self.trigrams.popitem(last=False)

    def candidates(self, prev: int, token: int) -> Candidates | None:
        return self.trigrams.get((prev, token)) or self.unigrams.get(token)

    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        prev = state.tokens[-2] if len(state.tokens) >= 2 else -1
        if self.search == "mcts":
            self.prev = prev
            return self.monte_carlo_tree(prev, state.pending, min(budget, self.num_nodes))
        tokens: list[int] = []
        parents: list[int] = []
        depths: list[int] = []
        # (-path probability, tie-break, parent node, context token, token); parents pop before children
        heap: list[tuple[float, int, int, int, int]] = []
        counter = 0

        def push_children(parent: int, prev_token: int, token: int, probability: float) -> None:
            nonlocal counter
            found = self.candidates(prev_token, token)
            if found is None:
                return
            for child, p in zip(*found, strict=True):
                counter += 1
                heapq.heappush(heap, (-probability * p, counter, parent, token, child))

        push_children(-1, prev, state.pending, 1.0)
        limit = min(budget, self.num_nodes)
        while heap and len(tokens) < limit:
            negative, _, parent, context, token = heapq.heappop(heap)
            depth = 1 if parent < 0 else depths[parent] + 1
            if depth > self.max_depth:
                continue
            tokens.append(token)
            parents.append(parent)
            depths.append(depth)
            push_children(len(tokens) - 1, context, token, -negative)
        self.prev = prev
        return DraftTree(torch.tensor(tokens, dtype=torch.int64), torch.tensor(parents, dtype=torch.int64))

    def monte_carlo_tree(self, prev: int, pending: int, limit: int) -> DraftTree:
        """The `limit` most visited nodes of `simulations` UCB rollouts over the tables."""
        visits: dict[tuple[int, ...], int] = {(): 0}  # path below the pending token → visits
        for _ in range(self.simulations):
            path: tuple[int, ...] = ()
            context, token = prev, pending
            visits[()] += 1
            while len(path) < self.max_depth:
                found = self.candidates(context, token)
                if found is None:
                    break
                log_total = math.log(visits[path])
                scores = [p + self.exploration * math.sqrt(log_total / (1 + visits.get(path + (child,), 0)))
                          for child, p in zip(*found, strict=True)]
                child = found[0][max(range(len(scores)), key=scores.__getitem__)]
                path += (child,)
                visits[path] = visits.get(path, 0) + 1
                context, token = token, child
        # Most visited first: a node's visits never exceed its parent's and ties go to the shorter
        # path, so every kept node's parent is kept, and comes before it.
        kept = sorted((p for p in visits if p), key=lambda p: (-visits[p], len(p), p))[:limit]
        index = {p: i for i, p in enumerate(kept)}
        return DraftTree(torch.tensor([p[-1] for p in kept], dtype=torch.int64),
                         torch.tensor([index[p[:-1]] if len(p) > 1 else -1 for p in kept], dtype=torch.int64))

    def observe(self, state: DecodeState, result: AcceptResult) -> None:
        self.record(state)

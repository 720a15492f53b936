"""Retrieval drafting (REST, He et al. 2024; the retrieval half of RASD): continuations from a corpus.

A datastore (`decoding/datastore.py`) holds a corpus tokenised with the target's tokenizer; each
step, the occurrences of the longest context suffix found there (at least the last two tokens)
vote for what comes next. Their continuations are merged into a trie whose nodes count the
occurrences that pass through them, and the `num_nodes` most supported nodes, best first, are the
draft tree. RASD fuses this tree with a model drafter's (`fused:drafters=retrieval+int4_self`, by
longest common prefix; RASD's pruning of the retrieval tree by the draft model's probabilities is
not done here: the fused tree is cut to its budget in drafter order).

The corpus is a `CorpusDataModule` source (default: the Python standard library), of which only
the train split enters the datastore, so the held-out `stdlib_code` prompts never retrieve
themselves. It is tokenised once and cached on disk (the corpus cache), indexed once per process.
"""

from __future__ import annotations

import heapq
from functools import cache
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from warpdecode.data.corpus import Corpus, train_subset
from warpdecode.decoding.datastore import Datastore
from warpdecode.decoding.protocols import AcceptResult, DecodeState, Drafter
from warpdecode.decoding.registry import register
from warpdecode.decoding.tree import DraftTree
from warpdecode.errors import ConfigError, one_line
from warpdecode.models.backbone import Backbone
from warpdecode.models.named import DEFAULT_MODEL


@cache
def corpus_datastore(corpus: str, tokenizer: str, max_tokens: int, vocab_size: int) -> Datastore:
    """The datastore of `corpus`, built once per process: a `.npy` of token ids is used as it is
    (its first `max_tokens`); otherwise the train split of the corpus source tokenised with
    `tokenizer` (at most `max_tokens`, whole blocks of 1024 tokens chosen by the corpus's seeded subset)."""
    if corpus.endswith(".npy"):
        path = Path(corpus)
        if not path.is_file():
            raise ConfigError(f"retrieval corpus {path} not found")
        try:
            ids = np.load(path, mmap_mode="r")  # never pickles (allow_pickle is off)
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot read retrieval corpus {path}: {one_line(e)}") from e
        if not np.issubdtype(ids.dtype, np.integer):
            raise ConfigError(f"retrieval corpus {path} holds {ids.dtype} values; it must hold integer token ids")
        return Datastore.build(ids.reshape(-1)[:max_tokens], vocab_size)
    built = Corpus(source=corpus).blocks(block_size=1024, tokenizer=tokenizer)
    blocks = train_subset(built.splits["train"], max_tokens, 1024, seed=0)  # (N, 1025): neighbours share one token
    if len(blocks) == 0:
        raise ConfigError(f"retrieval corpus {corpus!r} has no complete block of 1024 tokens in its train split")
    if built.tokenizer.vocab_size > vocab_size:
        raise ConfigError(f"the retrieval corpus was tokenised with {tokenizer!r} ({built.tokenizer.vocab_size} "
                          f"tokens) but the target has {vocab_size}: pass the target's tokenizer=")
    return Datastore.build(np.asarray(blocks[:, :-1]).reshape(-1), vocab_size)


def trie_tree(continuations: np.ndarray, num_nodes: int) -> DraftTree:
    """The `num_nodes` trie nodes of `continuations` (M, depth) (-1 = padding) passed through by the
    most rows, best first (a node joins only after its parent; ties: first inserted first).

    Example: rows [a b], [a c], [a b], [d e] → counts a:3, b:2, c:1, d:1, e:1 → 3 nodes: a, b, then c
    (c and d tie at 1; c was inserted first).
    """
    children: list[dict[int, int]] = [{}]  # trie node → {token: child}; node 0 is the root
    counts, tokens, parents = [0], [-1], [-1]
    for row in continuations.tolist():
        node = 0
        for token in row:
            if token < 0:
                break
            child = children[node].get(token)
            if child is None:
                child = len(tokens)
                children[node][token] = child
                children.append({})
                counts.append(0)
                tokens.append(token)
                parents.append(node)
            counts[child] += 1
            node = child
    out_tokens: list[int] = []
    out_parents: list[int] = []
    index_of = {0: -1}  # trie node → draft tree index (root → the pending token)
    frontier = [(-counts[c], c) for c in children[0].values()]
    heapq.heapify(frontier)
    while frontier and len(out_tokens) < num_nodes:
        _, node = heapq.heappop(frontier)
        index_of[node] = len(out_tokens)
        out_tokens.append(tokens[node])
        out_parents.append(index_of[parents[node]])
        for child in children[node].values():
            heapq.heappush(frontier, (-counts[child], child))
    return DraftTree(torch.tensor(out_tokens, dtype=torch.int64), torch.tensor(out_parents, dtype=torch.int64))


@register("drafter", "retrieval")
class RetrievalDrafter(Drafter):
    supports_batch: ClassVar[bool] = True

    def __init__(self, corpus: str = "stdlib", tokenizer: str = DEFAULT_MODEL, max_tokens: int = 4_000_000,
                 num_nodes: int = 8, depth: int = 6, max_matches: int = 64, max_ngram: int = 8) -> None:
        """Args:
        corpus: the datastore's text: `stdlib`, a folder of text files or a `.jsonl` (its train split
            enters the datastore), or a `.npy` of token ids already tokenised for the target.
        tokenizer: the model directory or name whose tokenizer matches the target's.
        max_tokens: datastore size cap, in tokens.
        num_nodes: draft tree budget.
        depth: longest retrieved continuation.
        max_matches: occurrences of the matched suffix that vote.
        max_ngram: longest context suffix matched.
        """
        if min(max_tokens, num_nodes, depth, max_matches) < 1 or max_ngram < 2:
            raise ConfigError("retrieval needs max_tokens, num_nodes, depth, max_matches >= 1 and max_ngram >= 2")
        self.corpus, self.tokenizer, self.max_tokens = corpus, tokenizer, max_tokens
        self.num_nodes, self.depth, self.max_matches, self.max_ngram = num_nodes, depth, max_matches, max_ngram
        self.datastore: Datastore | None = None

    def prepare(self, target: Backbone) -> None:
        if self.datastore is None or self.datastore.vocab_size != target.config.vocab_size:
            self.datastore = corpus_datastore(self.corpus, self.tokenizer, self.max_tokens, target.config.vocab_size)

    def start(self, state: DecodeState) -> None:
        pass

    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        assert self.datastore is not None, "prepare() must run first"
        _, continuations = self.datastore.continuations(state.tokens, self.depth, self.max_matches, self.max_ngram)
        return trie_tree(continuations, min(self.num_nodes, budget))

    def observe(self, state: DecodeState, result: AcceptResult) -> None:
        pass

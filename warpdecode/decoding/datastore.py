"""A retrieval datastore: a token stream indexed for longest-suffix lookup (REST / RASD drafting).

The stream is a corpus tokenised with the target's tokenizer. Positions are sorted by the bigram
that starts there, so the occurrences of the context's last two tokens are one binary search away;
the match is then extended backwards over those occurrences (vectorised) to keep only the ones
that share the longest context suffix, as a suffix array would find them. What followed those
occurrences are the retrieved continuations.

Memory: the stream (int32) plus one int32 position and one int64 key per token (16 bytes per
token; 64 MB for the default 4M-token cap).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from warpdecode.errors import ConfigError


@dataclass(frozen=True)
class Datastore:
    stream: np.ndarray  # (N,) int32 token ids
    order: np.ndarray  # (N - 1,) int32 positions sorted by the bigram starting there
    keys: np.ndarray  # (N - 1,) int64 sorted bigram keys: first * vocab + second
    vocab_size: int

    @classmethod
    def build(cls, stream: np.ndarray, vocab_size: int) -> Datastore:
        stream = np.ascontiguousarray(stream, dtype=np.int32)
        if stream.ndim != 1 or stream.size < 3:
            raise ConfigError(f"a retrieval datastore needs a token stream of at least 3 tokens, got shape {stream.shape}")
        if int(stream.max()) >= vocab_size or int(stream.min()) < 0:
            raise ConfigError(f"datastore token ids must lie in [0, {vocab_size}): built with another tokenizer?")
        bigrams = stream[:-1].astype(np.int64) * vocab_size + stream[1:]
        order = np.argsort(bigrams, kind="stable").astype(np.int32)
        return cls(stream, order, bigrams[order], vocab_size)

    @property
    def num_tokens(self) -> int:
        return int(self.stream.size)

    def continuations(self, context: list[int], depth: int, max_matches: int, max_ngram: int) -> tuple[int, np.ndarray]:
        """What followed the occurrences of the longest suffix of `context` (2 to `max_ngram` tokens).

        Returns:
            (suffix length matched, (M, depth) int64 continuations, the most recent occurrences
            first, M ≤ `max_matches`; shorter ones near the stream's end are padded with -1);
            (0, empty) when the last two tokens never occur.
        """
        if len(context) < 2:
            return 0, np.zeros((0, depth), dtype=np.int64)
        key = context[-2] * self.vocab_size + context[-1]
        lo, hi = np.searchsorted(self.keys, [key, key + 1])
        if lo == hi:
            return 0, np.zeros((0, depth), dtype=np.int64)
        starts = self.order[lo:hi].astype(np.int64)  # the bigram sits at stream[s : s + 2]
        matched = 2
        for back in range(1, min(max_ngram, len(context)) - 1):
            before = starts - back
            ok = (before >= 0) & (self.stream[np.clip(before, 0, None)] == context[-2 - back])
            if not ok.any():
                break
            starts, matched = starts[ok], matched + 1
        starts = np.sort(starts)[::-1][:max_matches]  # most recent occurrences first (stable choice)
        index = starts[:, None] + 2 + np.arange(depth)  # (M, depth)
        valid = index < self.num_tokens
        return matched, np.where(valid, self.stream[np.clip(index, 0, self.num_tokens - 1)], -1)

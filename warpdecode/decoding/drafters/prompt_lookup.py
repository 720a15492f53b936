"""Prompt lookup decoding (Saxena 2023): copy the continuation of the latest n-gram seen earlier.

The last `n` tokens (n from `max_ngram` down to `min_ngram`) are searched for in the prompt and the
text generated so far; the tokens that followed the most recent earlier occurrence are proposed as
a chain. No match: no draft, so the step costs what plain decoding costs.
"""

from __future__ import annotations

from typing import ClassVar

from warpdecode.decoding.protocols import AcceptResult, DecodeState
from warpdecode.decoding.registry import register
from warpdecode.decoding.tree import DraftTree
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone


def find_continuation(tokens: list[int], max_ngram: int, min_ngram: int, num_tokens: int) -> list[int]:
    """Tokens that followed the most recent earlier occurrence of the longest matching suffix n-gram.

    Example: tokens = [a, b, c, d, a, b], max_ngram = 2 → suffix [a, b] occurred at 0 → propose [c, d, a, b]
    (cut to `num_tokens`).
    """
    length = len(tokens)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        suffix = tokens[length - n :]
        # Scan right to left for the most recent occurrence that ends before the suffix itself.
        for start in range(length - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + num_tokens]
    return []


@register("drafter", "prompt_lookup")
class PromptLookup:
    needs_hidden_states: ClassVar[tuple[int, ...]] = ()
    needs_training: ClassVar[bool] = False

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, num_tokens: int = 10) -> None:
        """Args:
        max_ngram: longest suffix n-gram to look up.
        min_ngram: shortest suffix n-gram to look up.
        num_tokens: longest chain to propose.
        """
        if not 1 <= min_ngram <= max_ngram or num_tokens < 1:
            raise ConfigError(f"prompt lookup needs 1 <= min_ngram <= max_ngram and num_tokens >= 1, "
                              f"got {min_ngram}, {max_ngram}, {num_tokens}")
        self.max_ngram, self.min_ngram, self.num_tokens = max_ngram, min_ngram, num_tokens

    def prepare(self, target: Backbone) -> None:
        pass

    def start(self, state: DecodeState) -> None:
        pass

    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        found = find_continuation(state.tokens, self.max_ngram, self.min_ngram, min(self.num_tokens, budget))
        return DraftTree.chain(found)

    def observe(self, state: DecodeState, result: AcceptResult) -> None:
        pass

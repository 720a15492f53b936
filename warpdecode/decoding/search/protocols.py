"""What a search strategy is: its own loop over the target, returning ranked candidates.

Search strategies (beam search, diverse beam search, n samples, best-of-N, First Finish Search) do
not fit the one draft→verify loop: they keep several rows of one prompt in the target's batched KV
cache and choose among them. They share the backbone, the `KVCache`, the `Sampler` and the stats
types with the engine, and declare what they promise as class attributes, as drafters do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

from warpdecode.decoding.outputs import Candidate, DecodeStats
from warpdecode.decoding.sampler import Sampler
from warpdecode.models.backbone import Backbone
from warpdecode.models.tokenizer import Tokenizer


@dataclass
class SearchResult:
    candidates: list[Candidate]
    """The returned sequences, best first."""
    stats: DecodeStats
    """Of the whole search: `target_forwards` counts batched forwards after the prefill, `search_tokens`
    every row's tokens, `new_tokens` the first candidate's."""


class SearchStrategy(Protocol):
    name: ClassVar[str]
    lossless: ClassVar[bool | None] = None
    """Not applicable: a search chooses other sequences than greedy decoding by design."""
    needs_training: ClassVar[bool] = False
    needs_sampling: ClassVar[bool] = False
    """Whether it draws samples (needs `do_sample`); beam searches are deterministic."""
    takes_stop_strings: ClassVar[bool] = False
    """Whether `search` takes `stop_strings` (`generate(stop=...)`): a row ends at the token that completes
    one, finish reason "stop", its text ending before it. `generate` refuses stop strings otherwise."""
    composes_with_speculation: ClassVar[bool] = False
    """Whether the strategy can run its rows with a drafter (speculative decoding) and keep its output
    distribution: then `search` takes `method`, a builder of one row's method (`speculative_rows.py`);
    `generate` refuses a drafter together with any other search."""
    num_return_sequences: int
    """How many candidates `search` returns."""

    def search(self, model: Backbone, tokenizer: Tokenizer | None, prompt: list[int], sampler: Sampler, *,
               max_new_tokens: int, stop_ids: set[int]) -> SearchResult:
        """Run the search from the prompt's token ids, at most `max_new_tokens` tokens per row (the prompt
        plus them fit the context); `sampler` holds the sampling filters, penalties and random generator.
        A strategy that `takes_stop_strings` also takes `stop_strings: tuple[str, ...] = ()`."""
        ...

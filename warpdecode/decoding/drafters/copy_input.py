"""Input-guided aggressive decoding (IAD, Sun et al. 2021; Ge et al. 2022): copy the input as the draft.

For input-grounded tasks (grammar correction, text simplification, edits, code refactors) most of
the output is the input. The drafter keeps a read position in the prompt and drafts the next
`num_tokens` prompt tokens from it. Before each step it re-aligns: the longest suffix of the output
(up to `max_ngram` tokens) is looked up in the prompt, and of its occurrences the one nearest to
where copying was expected to continue wins, so the copy walks through the input in order instead
of jumping to the latest repeat (what prompt lookup does). When nothing aligns and the last draft
was at least partly accepted (the model just wrote a correction while copying), copying resumes at
the read position, which assumes the correction replaced as many tokens as it wrote; when nothing
aligns otherwise (the answer is not a copy), there is no draft.

Example (one token per word): prompt "... Fix: the cat sat on teh mat ." and output "the cat sat on"
→ draft "teh mat ."; the target writes "the" instead of "teh" (read position now after "teh"); "on
the" is not in the prompt and the only "the" is 4 positions back, too far for a single token →
resume at the read position → draft "mat .", accepted.
"""

from __future__ import annotations

from typing import ClassVar

from warpdecode.decoding.protocols import AcceptResult, DecodeState, Drafter
from warpdecode.decoding.registry import register
from warpdecode.decoding.tree import DraftTree
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone


def align(source: list[int], output: list[int], expected: int, max_ngram: int, near: int) -> int | None:
    """The position in `source` right after an occurrence of the longest suffix of `output` (at most
    `max_ngram` tokens), choosing the occurrence whose end is nearest to `expected` (ties: the later
    one); None when nothing aligns. A single token is too common to trust far away: a 1-token
    suffix aligns only within `near` positions of `expected`, except for the output's first token.

    Example: source [a, b, c, a, b, d], output [.., a, b], expected 5 → ends 2 and 5 → 5.
    """
    for n in range(min(max_ngram, len(output)), 0, -1):
        suffix = output[len(output) - n :]
        ends = [i + n for i in range(len(source) - n + 1) if source[i : i + n] == suffix]
        if n == 1 and len(output) > 1:
            ends = [end for end in ends if abs(end - expected) <= near]
        if ends:
            return min(ends, key=lambda end: (abs(end - expected), -end))
    return None


@register("drafter", "copy_input")
class CopyInputDrafter(Drafter):
    supports_batch: ClassVar[bool] = True

    def __init__(self, num_tokens: int = 12, max_ngram: int = 4, near: int = 3) -> None:
        """Args:
        num_tokens: longest span copied per step.
        max_ngram: longest output suffix used to re-align with the prompt.
        near: how far from the read position a single-token match may re-align.
        """
        if max_ngram < 1 or num_tokens < 1 or near < 0:
            raise ConfigError(f"copy_input needs max_ngram >= 1, num_tokens >= 1 and near >= 0, "
                              f"got {max_ngram}, {num_tokens}, {near}")
        self.num_tokens, self.max_ngram, self.near = num_tokens, max_ngram, near
        self.read = 0
        """Where in the prompt copying is expected to continue."""
        self.copying = False
        """Whether the last draft had a token accepted."""

    def prepare(self, target: Backbone) -> None:
        pass

    def start(self, state: DecodeState) -> None:
        self.read = 0  # the first output token aligns with its first occurrence in the prompt
        self.copying = False

    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        source = state.tokens[: state.prompt_len]
        output = state.tokens[state.prompt_len :]
        position = align(source, output, self.read, self.max_ngram, self.near)
        if position is not None:
            self.read = position
        elif not self.copying:
            return DraftTree.empty()
        return DraftTree.chain(source[self.read : self.read + min(self.num_tokens, budget)])

    def observe(self, state: DecodeState, result: AcceptResult) -> None:
        # Accepted drafts and the bonus token advance the read position; a mismatch is repaired by
        # the next `align`, which looks near here.
        self.read += len(result.tokens)
        self.copying = len(result.path) > 0

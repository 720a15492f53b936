"""The `Constraint` protocol: one sequence's position in a grammar, as the decoding loop sees it."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor


class Constraint(Protocol):
    """The state of one sequence in a grammar over token ids.

    The engine reads the allowed next tokens of the current state, advances by the tokens it emits,
    and walks draft trees by advancing along a node's path and rolling back. Stop tokens are part of
    the grammar: they are allowed only where the grammar accepts, and after one the state is
    `terminated` (nothing else is allowed; rolling back one token undoes it).
    """

    vocab_size: int
    """V: the model's vocabulary (mask width); ids the tokenizer lacks are never allowed."""
    stop_ids: frozenset[int]
    """The tokens that end the output where the grammar accepts."""

    def fill_mask(self, bits: Tensor) -> None:
        """Write the allowed next tokens into `bits`: (W,) int32, W = ceil(V / 32), token t at bit
        t % 32 of word t // 32 (`unpack_mask` turns rows of it into booleans)."""
        ...

    def advance(self, tokens: list[int]) -> int:
        """Consume `tokens` in order up to the first the grammar forbids; the number consumed."""
        ...

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` consumed tokens."""
        ...

    def fork(self) -> Constraint:
        """An independent copy of this state (for another branch or request)."""
        ...

    def allows(self, token: int) -> bool:
        """The grammar allows `token` next: exactly its bit in `fill_mask`, checked without the whole mask
        where possible."""
        ...

    def is_accepting(self) -> bool:
        """The tokens so far are a complete output: a stop token is allowed now."""
        ...

    def is_terminated(self) -> bool:
        """A stop token was consumed: the output is complete and nothing else is allowed."""
        ...

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar forces next (jump-forward), possibly none; a stop token when only
        stopping is allowed."""
        ...


_SHIFTS = torch.arange(32, dtype=torch.int32)


def mask_words(vocab_size: int) -> int:
    """W: int32 words of a packed mask over `vocab_size` tokens."""
    return (vocab_size + 31) // 32


def unpack_mask(bits: Tensor, vocab_size: int) -> Tensor:
    """Packed masks → booleans.

    Args:
        bits: (R, W) int32 packed masks (`Constraint.fill_mask` rows).
        vocab_size: V.

    Returns:
        (R, V) bool, True where the token is allowed. Example: word 0 = 0b101 → tokens 0 and 2.
    """
    rows = bits.shape[0]
    return ((bits[:, :, None] >> _SHIFTS) & 1).bool().reshape(rows, -1)[:, :vocab_size]

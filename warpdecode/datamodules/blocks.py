"""Fixed-length token blocks and the deterministic per-epoch shuffle that feeds them to training.

Shared by every datamodule that produces next-token training windows: a block holds
`block_size + 1` token ids, so inputs are `block[:-1]` and targets `block[1:]`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler


def cut_blocks(documents: Sequence[Sequence[int]], eos_token_id: int, block_size: int) -> np.ndarray:
    """Concatenate documents with EOS after each one and cut the stream into overlapping windows.

    Window i covers stream[i * block_size : i * block_size + block_size + 1], so consecutive
    windows share one token and every stream token except the first is a target exactly once.
    Example with block_size=3: stream [a b c d e f g h] → [[a b c d], [d e f g]]; `h` is dropped.

    Returns:
        (N, block_size + 1) uint16 when the ids fit, int32 otherwise.
    """
    lengths = [len(doc) + 1 for doc in documents]
    stream = np.empty(sum(lengths), dtype=np.int64)
    pos = 0
    for doc, length in zip(documents, lengths):
        stream[pos : pos + length - 1] = doc
        stream[pos + length - 1] = eos_token_id
        pos += length
    n_blocks = max(0, (len(stream) - 1) // block_size)
    dtype = np.uint16 if stream.size == 0 or int(stream.max()) < 2**16 else np.int32
    starts = np.arange(n_blocks)[:, None] * block_size  # (N, 1)
    return stream[starts + np.arange(block_size + 1)].astype(dtype)  # (N, block_size + 1)


class TokenBlocks(Dataset[Tensor]):
    """A (N, block_size + 1) array of token ids (possibly memory-mapped); item i is (block_size + 1,) int64."""

    def __init__(self, blocks: np.ndarray) -> None:
        self.blocks = blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> Tensor:
        return torch.from_numpy(self.blocks[index].astype(np.int64))

    @property
    def num_tokens(self) -> int:
        """Number of target tokens (block_size per block)."""
        return int(self.blocks.shape[0] * (self.blocks.shape[1] - 1))


class EpochShuffleSampler(Sampler[int]):
    """A permutation of range(num_items) that depends only on (seed, epoch).

    Lightning calls `set_epoch` before every training epoch (and forwards it through its
    distributed wrapper), so a run resumed from a checkpoint at an epoch boundary sees exactly the
    batches of the uninterrupted run; the global RNG state plays no part.
    """

    def __init__(self, num_items: int, seed: int) -> None:
        self.num_items = num_items
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_items

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return iter(torch.randperm(self.num_items, generator=generator).tolist())


class ResumableLoader(DataLoader):
    """A training DataLoader whose position within the epoch is saved in Lightning checkpoints.

    Lightning saves `state_dict()` of a loader that has one and calls `load_state_dict` on resume.
    The first iteration of the restored epoch then skips the batches the interrupted run already
    trained on, so a mid-epoch resume continues with exactly the next batch (the sampler's order
    depends only on seed and epoch, see `EpochShuffleSampler`). Skipping reads and drops those
    batches, which works unchanged under Lightning's distributed sampler wrapper.
    """

    _epoch: int | None = None
    _served = 0
    _skip: tuple[int | None, int] = (None, 0)  # (epoch, batches) to skip on the next iteration

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        epoch = getattr(self.sampler, "epoch", None)  # read lazily: Lightning calls set_epoch first
        skip = self._skip[1] if self._skip[0] == epoch else 0
        self._epoch, self._served, self._skip = epoch, 0, (None, 0)
        for index, batch in enumerate(super().__iter__()):
            self._served = index + 1
            if index >= skip:
                yield batch

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self._epoch, "batches": self._served}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._skip = (state["epoch"], state["batches"])

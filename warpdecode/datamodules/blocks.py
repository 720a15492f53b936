"""Fixed-length token blocks, and the deterministic per-epoch orders that feed examples to training.

Shared by every datamodule that produces next-token training windows: a block holds
`block_size + 1` token ids, so inputs are `block[:-1]` and targets `block[1:]`. Datamodules of
variable-length examples batch them by length instead (`LengthGroupedBatches`), so that a batch
padded to its longest example wastes little compute.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Generic, TypeVar

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

Item = TypeVar("Item")


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


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The random stream of one (seed, epoch): what every per-epoch order here draws from."""
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)


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
        return iter(torch.randperm(self.num_items, generator=epoch_generator(self.seed, self.epoch)).tolist())


class LengthGroupedBatches(Sampler[tuple[int, ...]]):
    """Batches of example indices of similar length, in an order that depends only on (seed, epoch).

    Each epoch shuffles the examples, cuts the shuffled order into groups of `group_batches` batches,
    sorts every group by length and cuts it into batches, then shuffles the batches, so a batch
    holds examples of near-equal length while the batches' order and composition still change from
    epoch to epoch (the idea of Hugging Face's `group_by_length`). With `seed=None` (evaluation) the
    examples are sorted by length once, longest first, and the order never changes.

    The sampler yields whole batches (tuples of indices): use it with `batch_size=None` and a
    dataset that takes such a tuple (`Batched`). Under Lightning's distributed sampler wrapper each
    process then gets whole batches, and `set_epoch` reaches this sampler as it reaches
    `EpochShuffleSampler`.
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int | None, group_batches: int = 32) -> None:
        """
        Args:
            lengths: Each example's length (what a batch pads to its maximum).
            batch_size: Examples per batch; the last batch of a group may hold fewer.
            seed: Seed of the per-epoch order; None: sorted by length, the same every epoch.
            group_batches: Batches per sorted group: larger groups pad less, smaller ones mix
                lengths more between neighbouring batches.
        """
        if batch_size < 1 or group_batches < 1:
            raise ValueError(f"batch_size and group_batches must be positive, got {batch_size}, {group_batches}")
        self.lengths = np.asarray(lengths, dtype=np.int64)  # (N,)
        self.batch_size, self.seed, self.group_batches = batch_size, seed, group_batches
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        group = self.batch_size * self.group_batches
        whole, rest = divmod(len(self.lengths), group)
        return whole * self.group_batches + -(-rest // self.batch_size)

    def _cut(self, indices: np.ndarray) -> list[tuple[int, ...]]:
        """`indices` sorted by length (longest first, ties by position), cut into batches."""
        ordered = indices[np.argsort(-self.lengths[indices], kind="stable")]
        return [tuple(ordered[i : i + self.batch_size].tolist()) for i in range(0, len(ordered), self.batch_size)]

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        if self.seed is None:
            return iter(self._cut(np.arange(len(self.lengths))))
        generator = epoch_generator(self.seed, self.epoch)
        shuffled = torch.randperm(len(self.lengths), generator=generator).numpy()
        group = self.batch_size * self.group_batches
        batches = [batch for start in range(0, len(shuffled), group) for batch in self._cut(shuffled[start : start + group])]
        return iter([batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()])


class Batched(Dataset[list[Item]], Generic[Item]):
    """A map-style dataset whose items are lists of `dataset`'s items, indexed by tuples of indices
    (the batches `LengthGroupedBatches` yields)."""

    def __init__(self, dataset: Dataset[Item]) -> None:
        self.dataset = dataset

    def __getitem__(self, indices: tuple[int, ...]) -> list[Item]:  # type: ignore[override]
        return [self.dataset[i] for i in indices]


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

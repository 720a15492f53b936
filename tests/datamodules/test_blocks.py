from __future__ import annotations

import numpy as np
import pytest
import torch
from lightning.fabric.utilities.distributed import DistributedSamplerWrapper

from warpdecode.data.corpus import cut_blocks
from warpdecode.datamodules.blocks import (
    Batched,
    EpochShuffleSampler,
    LengthGroupedBatches,
    ResumableLoader,
    TokenBlocks,
)


def test_cut_blocks_worked_example() -> None:
    # stream 1 2 3 EOS 4 5 EOS → windows of 4 with stride 3; the last token is only a target once
    blocks = cut_blocks([[1, 2, 3], [4, 5]], eos_token_id=0, block_size=3)
    assert blocks.dtype == np.uint16
    assert blocks.tolist() == [[1, 2, 3, 0], [0, 4, 5, 0]]
    assert cut_blocks([[70000, 1]], eos_token_id=0, block_size=2).dtype == np.int32
    assert TokenBlocks(blocks).num_tokens == 6


def test_epoch_shuffle_depends_only_on_seed_and_epoch() -> None:
    sampler = EpochShuffleSampler(10, seed=3)
    epoch0 = list(sampler)
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    torch.manual_seed(123)  # the global RNG plays no part
    sampler.set_epoch(0)
    assert list(sampler) == epoch0
    assert sorted(epoch0) == sorted(epoch1) == list(range(10))
    assert epoch0 != epoch1
    assert list(EpochShuffleSampler(10, seed=4)) != epoch0


def loader(seed: int = 5) -> ResumableLoader:
    blocks = np.arange(11 * 3, dtype=np.uint16).reshape(11, 3)  # block i starts with 3 * i
    return ResumableLoader(TokenBlocks(blocks), batch_size=2, sampler=EpochShuffleSampler(11, seed))


def firsts(batches: list[torch.Tensor]) -> list[list[int]]:
    return [(batch[:, 0] // 3).tolist() for batch in batches]


def test_resumable_loader_continues_mid_epoch() -> None:
    straight = loader()
    straight.sampler.set_epoch(1)  # type: ignore[attr-defined]
    full = firsts(list(straight))
    assert [len(batch) for batch in full] == [2, 2, 2, 2, 2, 1]

    interrupted = loader()
    interrupted.sampler.set_epoch(1)  # type: ignore[attr-defined]
    iterator = iter(interrupted)
    seen = firsts([next(iterator), next(iterator)])
    state = interrupted.state_dict()
    assert state == {"epoch": 1, "batches": 2}

    resumed = loader()
    resumed.load_state_dict(state)
    resumed.sampler.set_epoch(1)  # type: ignore[attr-defined]
    assert seen + firsts(list(resumed)) == full
    assert resumed.state_dict() == {"epoch": 1, "batches": 6}
    assert firsts(list(resumed)) == full  # the skip applies once

    at_epoch_end = loader()
    at_epoch_end.load_state_dict({"epoch": 0, "batches": 6})
    at_epoch_end.sampler.set_epoch(1)  # type: ignore[attr-defined]
    assert firsts(list(at_epoch_end)) == full  # a finished epoch is not skipped into the next one


LENGTHS = [int(n) for n in np.random.default_rng(0).integers(5, 400, size=203)]


def padded_tokens(batches: list[tuple[int, ...]]) -> int:
    return sum(len(batch) * max(LENGTHS[i] for i in batch) for batch in batches)


def test_length_grouped_batches_cover_every_example_once_in_an_order_of_seed_and_epoch() -> None:
    sampler = LengthGroupedBatches(LENGTHS, batch_size=8, seed=3, group_batches=4)
    epoch0 = list(sampler)
    assert len(epoch0) == len(sampler) == 6 * 4 + 2  # 6 whole groups of 32 examples, then 11 in 2 batches
    assert sorted(i for batch in epoch0 for i in batch) == list(range(len(LENGTHS)))
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    torch.manual_seed(123)  # the global RNG plays no part
    sampler.set_epoch(0)
    assert list(sampler) == epoch0 and epoch1 != epoch0
    assert sorted(i for batch in epoch1 for i in batch) == list(range(len(LENGTHS)))
    assert list(LengthGroupedBatches(LENGTHS, batch_size=8, seed=4, group_batches=4)) != epoch0


def test_length_grouped_batches_pad_less_than_random_batches() -> None:
    grouped = list(LengthGroupedBatches(LENGTHS, batch_size=8, seed=0))
    order = list(EpochShuffleSampler(len(LENGTHS), seed=0))
    random_batches = [tuple(order[i : i + 8]) for i in range(0, len(order), 8)]
    real = sum(LENGTHS)
    assert padded_tokens(grouped) < 1.1 * real < 1.3 * real < padded_tokens(random_batches)


def test_length_grouped_batches_without_seed_are_sorted_longest_first() -> None:
    sampler = LengthGroupedBatches(LENGTHS, batch_size=8, seed=None)
    flat = [i for batch in sampler for i in batch]
    assert [LENGTHS[i] for i in flat] == sorted(LENGTHS, reverse=True)
    sampler.set_epoch(2)
    assert [i for batch in sampler for i in batch] == flat
    with pytest.raises(ValueError, match="positive"):
        LengthGroupedBatches(LENGTHS, batch_size=0, seed=0)


def test_length_grouped_batches_shard_whole_batches_across_processes() -> None:
    sampler = LengthGroupedBatches(LENGTHS, batch_size=8, seed=1, group_batches=4)
    shards = [DistributedSamplerWrapper(sampler, num_replicas=2, rank=rank, shuffle=True, seed=0) for rank in (0, 1)]
    for shard in shards:
        shard.set_epoch(5)  # forwarded to the wrapped sampler, as Lightning does
    assert sampler.epoch == 5
    batches = [list(shard) for shard in shards]
    assert len(batches[0]) == len(batches[1]) == 13
    assert sorted(i for shard in batches for batch in shard for i in batch) == list(range(len(LENGTHS)))


def test_resumable_loader_continues_mid_epoch_with_grouped_batches() -> None:
    blocks = np.arange(len(LENGTHS), dtype=np.uint16)[:, None].repeat(3, axis=1)  # item i holds i

    def grouped_loader() -> ResumableLoader:
        return ResumableLoader(Batched(TokenBlocks(blocks)), batch_size=None, collate_fn=torch.stack,
                               sampler=LengthGroupedBatches(LENGTHS, batch_size=8, seed=2, group_batches=4))

    straight = grouped_loader()
    straight.sampler.set_epoch(1)  # type: ignore[attr-defined]
    full = [batch[:, 0].tolist() for batch in straight]
    assert full == [list(batch) for batch in straight.sampler]  # type: ignore[attr-defined]
    interrupted = grouped_loader()
    interrupted.sampler.set_epoch(1)  # type: ignore[attr-defined]
    iterator = iter(interrupted)
    seen = [next(iterator)[:, 0].tolist() for _ in range(3)]
    resumed = grouped_loader()
    resumed.load_state_dict(interrupted.state_dict())
    resumed.sampler.set_epoch(1)  # type: ignore[attr-defined]
    assert seen + [batch[:, 0].tolist() for batch in resumed] == full

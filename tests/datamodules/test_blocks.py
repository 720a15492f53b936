from __future__ import annotations

import numpy as np
import torch

from warpdecode.datamodules.blocks import EpochShuffleSampler, ResumableLoader, TokenBlocks, cut_blocks


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

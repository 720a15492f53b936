"""Learn2PD's filter network and the block inputs it reads."""

from __future__ import annotations

import pytest
import torch

from warpdecode.errors import ConfigError
from warpdecode.models.parallel_filter import ParallelFilter, block_inputs


def test_block_inputs_gather_each_rows_current_block() -> None:
    confidence = torch.arange(12, dtype=torch.float32).view(2, 6)
    masked = torch.tensor([[True, False, True, True, False, False], [True] * 6])
    block = torch.tensor([[False, True, True, False, False, False], [False, False, False, False, True, True]])
    c, m = block_inputs(confidence, masked, block)
    assert c.tolist() == [[1.0, 2.0], [10.0, 11.0]] and m.tolist() == [[False, True], [True, True]]
    with pytest.raises(ConfigError, match="multiple of block_length"):
        block_inputs(confidence, masked, torch.tensor([[True, True, False, False, False, False], [True] + [False] * 5]))


def test_committed_positions_read_as_certain() -> None:
    net = ParallelFilter(block_length=3, hidden=4)
    c = torch.tensor([[0.2, 0.5, 0.7]])
    committed = torch.tensor([[False, True, True]])
    assert torch.equal(net(c, committed), net(torch.tensor([[1.0, 0.5, 0.7]]), committed))
    assert not torch.equal(net(c, committed), net(c, torch.ones_like(committed)))
    with pytest.raises(ConfigError, match="blocks of 3"):
        net(torch.zeros(1, 4), torch.ones(1, 4, dtype=torch.bool))

"""Shared test fixtures: every test starts from the same global torch state."""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import pytest
import torch


@pytest.fixture(autouse=True)
def _reset_torch_state() -> Iterator[None]:
    """Seed every RNG and restore the default dtype, so no test depends on the ones before it."""
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    yield
    torch.set_default_dtype(dtype)


@pytest.fixture
def single_thread() -> Iterator[None]:
    """Run torch on one intra-op thread for the test's duration.

    Tiny-model matmuls gain nothing from a second thread, and when other processes share the two
    cores the OpenMP barriers make each call 50-100x slower (measured: 0.6 ms vs 50 ms per forward).
    Use with `pytestmark = pytest.mark.usefixtures("single_thread")`.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

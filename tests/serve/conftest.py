"""Fixtures of the serve tests: the tiny model (with a chat template) served on a loopback port."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from serving import CHAT_TEMPLATE, Served, serve_in_thread

from warpdecode.models.checkpoint import load_pretrained


@pytest.fixture(scope="session")
def tiny(tiny_model_dir: Path):
    """The tiny model and its tokenizer, given a chat template."""
    target, tokenizer = load_pretrained(str(tiny_model_dir))
    assert tokenizer is not None
    tokenizer.chat_template = CHAT_TEMPLATE
    return target, tokenizer


@pytest.fixture(scope="module")
def served(tiny) -> Iterator[Served]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls gain nothing from a second thread (see the single_thread fixture)
    yield from serve_in_thread(*tiny)
    torch.set_num_threads(threads)

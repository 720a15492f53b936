"""Session fixtures for tests on the real default model (kept apart from tests/conftest.py's unit-test state)."""

from __future__ import annotations

import pytest
import torch


class RealModel:
    """The embedded default model, converted once into the warpdecode cache and loaded once per session."""

    def __init__(self) -> None:
        from warpdecode.models.checkpoint import load_pretrained, resolve
        from warpdecode.models.named import DEFAULT_MODEL

        torch.set_flush_denormal(True)
        self.directory = resolve(DEFAULT_MODEL)
        self.model, self.tokenizer = load_pretrained(self.directory)


@pytest.fixture(scope="session")
def smollm2() -> RealModel:
    return RealModel()

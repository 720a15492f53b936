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


@pytest.fixture(scope="session")
def smollm2_transformers(smollm2: RealModel) -> torch.nn.Module:
    """The same checkpoint loaded by Hugging Face transformers (skips where it is not installed)."""
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(smollm2.directory), dtype=torch.float32)
    return model.eval()

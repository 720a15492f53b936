"""The device step on the real default model: plain greedy's output, the engine's accepted lengths."""

from __future__ import annotations

import pytest

from warpdecode.decoding.generate import generate

pytestmark = pytest.mark.slow

PROMPTS = [
    ("Summarize in one sentence: The city council met on Tuesday to discuss the new bicycle lanes. Residents said "
     "the bicycle lanes make the streets safer, while shop owners worried that the bicycle lanes remove parking."),
    "Write a Python function that returns the squares of the even numbers in a list.",
]


@pytest.mark.parametrize("method", ["prompt_lookup", "token_recycling"])
def test_device_step_equals_plain_greedy_and_the_engine(smollm2, method: str) -> None:
    for prompt in PROMPTS:
        plain = generate(smollm2.model, smollm2.tokenizer, prompt, max_new_tokens=40)
        engine = generate(smollm2.model, smollm2.tokenizer, prompt, max_new_tokens=40, method=method)
        device = generate(smollm2.model, smollm2.tokenizer, prompt, max_new_tokens=40, method=method, device_step=True)
        assert device.token_ids == plain.token_ids == engine.token_ids
        assert device.finish_reason == plain.finish_reason
        assert device.stats.accepted_per_step == engine.stats.accepted_per_step

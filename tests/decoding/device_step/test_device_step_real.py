"""The device step on the real default model: plain greedy's output, the engine's accepted lengths (PPD's
prompt rows in its verify forward included)."""

from __future__ import annotations

import pytest
from tiny_models import ppd_package

from warpdecode.decoding.device_step.loop import device_form, run_device
from warpdecode.decoding.engine import run
from warpdecode.decoding.generate import build_method, generate
from warpdecode.decoding.sampler import Sampler, SamplingConfig

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


@pytest.mark.usefixtures("single_thread")
def test_ppd_device_step_equals_the_engine(smollm2, tmp_path) -> None:
    """PPD's prompt rows in the verify forward of the real model (an untrained package: the recipe's
    mean-embedding prompts plus noise), eager and static forms."""
    package = ppd_package(smollm2.model, tmp_path / "drafter")
    ids = smollm2.tokenizer.encode(PROMPTS[0])
    engine = run(smollm2.model, ids, build_method("ppd", options={"path": package}), Sampler(SamplingConfig()),
                 max_new_tokens=24, stop_ids=set())
    plain = run(smollm2.model, ids, build_method("none"), Sampler(SamplingConfig()), max_new_tokens=24, stop_ids=set())
    assert engine[0] == plain[0] and sum(engine[2].accepted_per_step) > 0
    form = device_form(build_method("ppd", options={"path": package}).drafter)
    for static in (False, True):
        new, _, stats = run_device(smollm2.model, ids, form, max_new_tokens=24, stop_ids=set(), static=static)
        assert new == engine[0] and stats.accepted_per_step == engine[2].accepted_per_step

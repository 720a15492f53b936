"""Checks the device-step tests of several drafters share."""

from __future__ import annotations

from collections.abc import Sequence

from warpdecode.decoding.device_step.loop import run_device
from warpdecode.decoding.device_step.prompt_lookup import DevicePromptLookup
from warpdecode.decoding.sampler import SamplingConfig
from warpdecode.models.transformer import Transformer


def assert_sampling_equals_plain(target: Transformer, form: object, prompts: Sequence[list[int]]) -> None:
    """A device drafter's sampled output equals plain sampling's with the same seed (the draws are keyed
    by token position), on every prompt, seeds 0, 1, ..."""
    for seed, ids in enumerate(prompts):
        sampling = SamplingConfig(do_sample=True, temperature=0.8, top_k=20, seed=seed)
        plain = run_device(target, ids, DevicePromptLookup(num_tokens=0), max_new_tokens=24, stop_ids=set(),
                           sampling=sampling)[0]
        assert run_device(target, ids, form, max_new_tokens=24, stop_ids=set(), sampling=sampling)[0] == plain  # type: ignore[arg-type]

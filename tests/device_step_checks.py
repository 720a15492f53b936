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


def assert_step_device_spec_equals_engine(target: Transformer, name: str, package: str, prompt: list[int]) -> None:
    """`NAME:path=P:step=device` decodes what `NAME:path=P` does (tokens and accepted lengths), and a
    host-side `lookup=` is refused for the device form."""
    import pytest

    from warpdecode.decoding.device_step.loop import device_form
    from warpdecode.decoding.generate import build_method, generate
    from warpdecode.decoding.specs import parse_method
    from warpdecode.errors import CapabilityError

    out = generate(target, None, prompt, max_new_tokens=20, stop_at_eos=False,
                   method=parse_method(f"{name}:path={package}:step=device").build(do_sample=False))
    want = generate(target, None, prompt, max_new_tokens=20, stop_at_eos=False,
                    method=parse_method(f"{name}:path={package}").build(do_sample=False))
    assert out.token_ids == want.token_ids and out.stats.accepted_per_step == want.stats.accepted_per_step
    with pytest.raises(CapabilityError, match="lookup"):
        device_form(build_method(name, options={"path": package, "lookup": 4}).drafter)

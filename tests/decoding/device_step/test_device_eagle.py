"""EAGLE in the device step: the draft network's cache, its pairs and its tree on the device, so the
proposals, the accepted lengths and the output equal the host engine's (EAGLE-1, EAGLE-3's fused
features, EAGLE-1's checkpoint layout; static and chain trees)."""

from __future__ import annotations

import pytest
from tiny_models import eagle_package, greedy_target, oracle_eagle_package

from warpdecode.decoding.device_step.loop import device_form, run_device
from warpdecode.decoding.device_step.prompt_lookup import DevicePromptLookup
from warpdecode.decoding.engine import run
from warpdecode.decoding.generate import build_method
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.errors import CapabilityError
from warpdecode.runtime.cudagraphs import CudaGraphBackbone

pytestmark = pytest.mark.usefixtures("single_thread")
PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5], [3], list(range(40, 64))]


@pytest.fixture(scope="module")
def target():
    return greedy_target()


@pytest.fixture(scope="module")
def packages(target, tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle")
    return {"eagle": eagle_package(target, root / "eagle"),
            "eagle3": eagle_package(target, root / "eagle3", feature_layers=(1, 3)),
            "eagle-layout": eagle_package(target, root / "layout", layout="eagle"),
            "eagle3-layout": eagle_package(target, root / "layout3", layout="eagle3")}


@pytest.mark.parametrize("options", [{}, {"tree": "chain", "num_tokens": 4}, {"num_nodes": 4}],
                         ids=["static", "chain", "4 nodes"])
@pytest.mark.parametrize("kind", ["eagle", "eagle3", "eagle-layout", "eagle3-layout"])
def test_equals_the_engine_in_every_form(target, packages, kind, options) -> None:
    form = device_form(build_method("eagle", options={"path": packages[kind]} | options).drafter)
    session = CudaGraphBackbone(target, graphs=False)
    for ids in PROMPTS:
        host = build_method("eagle", options={"path": packages[kind]} | options)
        engine = run(target, ids, host, Sampler(SamplingConfig()), max_new_tokens=30, stop_ids=set())
        forms = [run_device(target, ids, form, max_new_tokens=30, stop_ids=set(), static=static)
                 for static in (False, True)]
        forms.append(run_device(session, ids, form, max_new_tokens=30, stop_ids=set()))
        for new, finish, stats in forms:
            assert new == engine[0] and finish == engine[1]
            assert stats.accepted_per_step == engine[2].accepted_per_step
            assert stats.proposed_per_step == engine[2].proposed_per_step


@pytest.mark.parametrize(("options", "depth"), [({"tree": "chain", "num_tokens": 4}, 4), ({}, 3)],
                         ids=["chain", "static"])
def test_a_drafter_that_computes_the_target_is_always_accepted(tmp_path, options, depth) -> None:
    """The pairs, positions and draft cache line up with the target's exactly only if every draft is
    accepted; a stop token then ends the output mid-step, and a short budget cuts the tree."""
    target, package = oracle_eagle_package(tmp_path / "drafter")
    prompt = [5, 6, 7, 8, 9, 10, 11]
    plain = run(target, prompt, build_method("none"), Sampler(SamplingConfig()), max_new_tokens=31, stop_ids=set())[0]
    form = device_form(build_method("eagle", options={"path": package} | options).drafter)
    for static in (False, True):
        new, _, stats = run_device(target, prompt, form, max_new_tokens=31, stop_ids=set(), static=static)
        assert new == plain
        assert stats.accepted_per_step[:-1] == [depth] * (len(stats.accepted_per_step) - 1)
        new, finish, _ = run_device(target, prompt, form, max_new_tokens=31, stop_ids={plain[9]}, static=static)
        assert new == plain[: plain.index(plain[9]) + 1] and finish == "eos"


def test_sampling_draws_what_plain_sampling_draws(target, packages) -> None:
    form = device_form(build_method("eagle", options={"path": packages["eagle"]}).drafter)
    for seed, ids in enumerate(PROMPTS):
        sampling = SamplingConfig(do_sample=True, temperature=0.8, seed=seed)
        plain = run_device(target, ids, DevicePromptLookup(num_tokens=0), max_new_tokens=24, stop_ids=set(),
                           sampling=sampling)[0]
        assert run_device(target, ids, form, max_new_tokens=24, stop_ids=set(), sampling=sampling)[0] == plain


def test_refusals(packages) -> None:
    with pytest.raises(CapabilityError, match="dynamic"):
        device_form(build_method("eagle", options={"path": packages["eagle"], "tree": "dynamic"}).drafter)
    with pytest.raises(CapabilityError, match="lookup"):
        device_form(build_method("eagle", options={"path": packages["eagle"], "lookup": 4}).drafter)

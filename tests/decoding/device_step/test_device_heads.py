"""Medusa and Hydra in the device step: the heads read the feature of the last accepted position kept
on the device (Hydra also the embeddings of each node's path), so the proposals, the accepted lengths
and the output equal the host engine's."""

from __future__ import annotations

import pytest
import torch
from device_step_checks import assert_sampling_equals_plain, assert_step_device_spec_equals_engine
from tiny_models import greedy_target, heads_package, oracle_heads_package

from warpdecode.decoding.device_step.loop import device_form, run_device
from warpdecode.decoding.engine import run
from warpdecode.decoding.generate import build_method, generate
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.runtime.cudagraphs import CudaGraphBackbone

pytestmark = pytest.mark.usefixtures("single_thread")
PROMPTS = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [5], list(range(40, 64))]
OPTIONS = [{}, {"tree": "chain"}, {"num_nodes": 3}, {"tree": "chain", "num_tokens": 2}]


@pytest.fixture(scope="module")
def target():
    return greedy_target()


KINDS = ["medusa", "hydra"]


@pytest.fixture(scope="module")
def packages(target, tmp_path_factory):
    return {kind: heads_package(target, tmp_path_factory.mktemp(kind) / "drafter", kind, num_layers=2)
            for kind in KINDS}


@pytest.fixture(scope="module")
def package(packages):
    return packages["medusa"]


@pytest.mark.parametrize("options", OPTIONS, ids=["static", "chain", "3 nodes", "chain of 2"])
@pytest.mark.parametrize("kind", KINDS)
def test_equals_the_engine_in_every_form(target, packages, kind, options) -> None:
    for ids in PROMPTS:
        host = build_method(kind, options={"path": packages[kind]} | options)
        engine = run(target, ids, host, Sampler(SamplingConfig()), max_new_tokens=30, stop_ids=set())
        form = device_form(build_method(kind, options={"path": packages[kind]} | options).drafter)
        forms = [run_device(target, ids, form, max_new_tokens=30, stop_ids=set(), static=static)
                 for static in (False, True)]
        forms.append(run_device(CudaGraphBackbone(target, graphs=False), ids, form, max_new_tokens=30,
                                stop_ids=set()))
        for new, finish, stats in forms:
            assert new == engine[0] and finish == engine[1]
            assert stats.accepted_per_step == engine[2].accepted_per_step
            assert stats.proposed_per_step == engine[2].proposed_per_step


@pytest.mark.parametrize(("options", "depth"), [({"tree": "chain"}, 4), ({}, 3)], ids=["chain", "static"])
@pytest.mark.parametrize("kind", KINDS)
def test_heads_that_know_the_future_are_always_accepted(tmp_path, kind, options, depth) -> None:
    """The device step feeds the heads the feature of the right position and Hydra's heads the right
    tokens (the oracle heads' drafts are all accepted only then), with a stop token ending the output
    mid-step."""
    target, package = oracle_heads_package(tmp_path / "drafter", kind)
    prompt = [5, 6, 7, 8, 9, 10, 11]
    plain = generate(target, None, prompt, max_new_tokens=31, stop_at_eos=False).token_ids
    form = device_form(build_method(kind, options={"path": package} | options).drafter)
    new, _, stats = run_device(target, prompt, form, max_new_tokens=31, stop_ids=set())
    assert new == plain
    assert stats.accepted_per_step[:-1] == [depth] * (len(stats.accepted_per_step) - 1)
    new, finish, _ = run_device(target, prompt, form, max_new_tokens=31, stop_ids={plain[9]}, static=True)
    assert new == plain[: plain.index(plain[9]) + 1] and finish == "eos"


@pytest.mark.parametrize("kind", KINDS)
def test_sampling_draws_what_plain_sampling_draws(target, packages, kind) -> None:
    form = device_form(build_method(kind, options={"path": packages[kind]}).drafter)
    assert_sampling_equals_plain(target, form, PROMPTS)


def test_step_device_spec_and_refusals(target, package) -> None:
    assert_step_device_spec_equals_engine(target, "medusa", package, PROMPTS[0])
    assert torch.equal(device_form(build_method("medusa", options={"path": package}).drafter).tree.tables.depths,
                       torch.zeros(0, dtype=torch.int64))  # unprepared: an empty tree until the target is known

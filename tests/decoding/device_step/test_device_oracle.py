"""The oracle pair in the device step: timing at a chosen τ on any target. The first path's nodes are
accepted with a set probability (`kernels.tree_accept.first_path_accept`, draws keyed by position), the
text is the drafter's placeholders and the target's bonus tokens."""

from __future__ import annotations

import random

import pytest
import torch
from tiny_models import greedy_target

from warpdecode.decoding.device_step.loop import device_form, run_device
from warpdecode.decoding.device_step.tree import StaticTree
from warpdecode.decoding.engine import run
from warpdecode.decoding.generate import build_method, generate
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.decoding.specs import parse_method
from warpdecode.decoding.verifiers.oracle import chain_tau
from warpdecode.kernels.tree_accept import first_path_accept
from warpdecode.runtime.cudagraphs import CudaGraphBackbone


def reference(tokens: list[int], best: list[int], valid: list[bool], first: list[int], success: list[bool]):
    """The oracle verifier's walk, one node at a time."""
    rows, emitted = [0], []
    for node, ok in zip(first, success, strict=True):
        if not (ok and valid[node]):
            break
        rows.append(node + 1)
        emitted.append(tokens[node + 1])
    return len(rows) - 1, rows, emitted + [best[rows[-1]]]


def test_first_path_accept_matches_the_walk() -> None:
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randrange(1, 9)
        paths = [(0,)]
        while len(paths) < n:  # a random tree of rank paths, parents first
            parent = rng.choice([(), *paths])
            ranks = [p[-1] for p in paths if p[:-1] == parent]
            paths.append((*parent, max(ranks, default=-1) + 1))
        tree = StaticTree.of_rank_paths(paths)
        first = tree.first_path()
        tokens = [rng.randrange(50) for _ in range(n + 1)]
        best = [rng.randrange(50) for _ in range(n + 1)]
        cut = rng.randrange(n + 1)
        valid = [i < cut for i in range(n)]
        success = [rng.random() < 0.7 for _ in first]
        accepted, rows, emitted = first_path_accept(torch.tensor(tokens), torch.tensor(best), torch.tensor(valid),
                                                    torch.tensor(first, dtype=torch.int64), torch.tensor(success),
                                                    tree.tables.max_depth)
        want_accepted, want_rows, want_emitted = reference(tokens, best, valid, first, success)
        assert int(accepted) == want_accepted
        assert rows.tolist()[: want_accepted + 1] == want_rows
        assert emitted.tolist()[: want_accepted + 1] == want_emitted


def test_first_path() -> None:
    assert StaticTree.of_rank_paths([(0,), (1,), (0, 0), (1, 0), (0, 0, 0)]).first_path() == [0, 2, 4]
    assert StaticTree.of_rank_paths([(1,), (0,), (0, 0)]).first_path() == [0]  # first in node order
    assert StaticTree.chain(0).first_path() == []


@pytest.mark.parametrize("accept", [0.0, 1.0])
def test_certain_acceptance_equals_the_engine(accept: float) -> None:
    """With acceptance 0 or 1 nothing is drawn: the device step and the engine emit the same text."""
    target = greedy_target()
    method = f"oracle:num_tokens=4:width=3:verifier=oracle:verifier.accept={accept}"
    engine = generate(target, None, [1, 2, 3], max_new_tokens=30, stop_at_eos=False,
                      method=parse_method(method).build(do_sample=False))
    device = generate(target, None, [1, 2, 3], max_new_tokens=30, stop_at_eos=False,
                      method=parse_method(method + ":step=device").build(do_sample=False))
    assert device.token_ids == engine.token_ids
    assert device.stats.accepted_per_step == engine.stats.accepted_per_step
    if accept == 0.0:
        plain = run(target, [1, 2, 3], build_method("none"), Sampler(SamplingConfig()), max_new_tokens=30,
                    stop_ids=set())[0]
        assert device.token_ids == plain


def test_tokens_per_step_follow_the_acceptance() -> None:
    """A 4-node chain at p = 0.6: τ = 1 + p + ... + p^4 = 2.31 (400 new tokens, ≈170 steps: the seeded
    draws give 2.3 ± 0.1); the same lengths again for the same seed, in every form."""
    target = greedy_target()
    form = device_form(build_method("oracle").drafter)
    stats = run_device(target, [1, 2, 3], form, max_new_tokens=400, stop_ids=set(), oracle=(0.6, 7))[2]
    assert abs(stats.new_tokens / stats.target_forwards - chain_tau(0.6, 4)) < 0.3
    runs = [run_device(target, [1, 2, 3], form, max_new_tokens=60, stop_ids=set(), oracle=(0.6, 7), static=s)
            for s in (False, True)]
    runs.append(run_device(CudaGraphBackbone(target, graphs=False), [1, 2, 3], form, max_new_tokens=60,
                           stop_ids=set(), oracle=(0.6, 7)))
    assert all(r[2].accepted_per_step == runs[0][2].accepted_per_step and r[0] == runs[0][0] for r in runs)
    short = runs[0][2].accepted_per_step[:-1]  # the last step's tree is cut by the 60-token budget
    assert short == stats.accepted_per_step[: len(short)]
    other = run_device(target, [1, 2, 3], form, max_new_tokens=60, stop_ids=set(), oracle=(0.6, 8))
    assert other[2].accepted_per_step != runs[0][2].accepted_per_step

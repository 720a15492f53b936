"""PPD in the device step: the prompt-row groups ride in the verify forward as auxiliary rows, and the
budget arithmetic of the host drafter (group size, candidate count, the groups sent) runs on the
device, so the proposals, the groups, the accepted lengths and the output equal the host engine's."""

from __future__ import annotations

import pytest
import torch
from device_step_checks import assert_sampling_equals_plain, assert_step_device_spec_equals_engine
from tiny_models import greedy_target, ppd_package

from warpdecode.decoding.device_step.loop import device_form, run_device
from warpdecode.decoding.device_step.ppd import DevicePPD, group_hosts
from warpdecode.decoding.device_step.tree import AuxiliaryRows, StaticTree
from warpdecode.decoding.drafters.ppd import PPDDrafter
from warpdecode.decoding.engine import run
from warpdecode.decoding.generate import build_method, generate
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.decoding.tree import DraftTree
from warpdecode.runtime.cudagraphs import CudaGraphBackbone

pytestmark = pytest.mark.usefixtures("single_thread")
PROMPTS = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [5], list(range(40, 64)), [3, 9, 27, 17, 51, 25, 3, 9, 27]]
OPTIONS = [{}, {"tree": "chain"}, {"num_nodes": 3}, {"attach": 1}, {"attach": 0}, {"tree": "chain", "num_tokens": 2}]
OPTION_IDS = ["static", "chain", "3 nodes", "attach 1", "attach 0", "chain of 2"]


@pytest.fixture(scope="module")
def target():
    return greedy_target()


@pytest.fixture(scope="module")
def package(target, tmp_path_factory):
    return ppd_package(target, tmp_path_factory.mktemp("ppd") / "drafter")


@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
def test_equals_the_engine_in_every_form(target, package, options) -> None:
    """Eager, static and session forms; 30 new tokens, and 7 (the last steps' budgets shrink the groups)."""
    form = device_form(build_method("ppd", options={"path": package} | options).drafter)
    session = CudaGraphBackbone(target, graphs=False)
    accepted = 0
    for ids in PROMPTS:
        for n in (30, 7):
            host = build_method("ppd", options={"path": package} | options)
            engine = run(target, ids, host, Sampler(SamplingConfig()), max_new_tokens=n, stop_ids=set())
            forms = [run_device(target, ids, form, max_new_tokens=n, stop_ids=set(), static=static)
                     for static in (False, True)]
            forms.append(run_device(session, ids, form, max_new_tokens=n, stop_ids=set()))
            for new, finish, stats in forms:
                assert new == engine[0] and finish == engine[1]
                assert stats.accepted_per_step == engine[2].accepted_per_step
                assert stats.proposed_per_step == engine[2].proposed_per_step
            accepted += sum(engine[2].accepted_per_step)
    assert accepted > 0


def host_trees(monkeypatch, target, method, prompt: list[int], n: int) -> list[DraftTree]:
    """Every tree the host drafter proposes in the engine."""
    trees: list[DraftTree] = []
    original = PPDDrafter.propose

    def spy(self, state, budget):
        trees.append(original(self, state, budget))
        return trees[-1]

    monkeypatch.setattr(PPDDrafter, "propose", spy)
    run(target, prompt, method, Sampler(SamplingConfig()), max_new_tokens=n, stop_ids=set())
    monkeypatch.undo()
    return trees


@pytest.mark.parametrize("options", [{}, {"attach": 1}], ids=["every node", "attach 1"])
def test_drafts_and_groups_are_the_host_drafters(monkeypatch, target, package, options) -> None:
    """Step by step: the valid nodes carry the host tree's candidates (tokens and parents), and the
    prompt rows sent are the host tree's groups (as many rows each, after the same nodes)."""
    drafts: list[tuple[list[int], list[int], list[int], int]] = []
    original = DevicePPD.draft

    def spy(self, state, room):
        tokens, valid = original(self, state, room)
        kept = valid.nonzero()[:, 0].tolist()  # static node → candidate index: its place among the valid ones
        parents = self.tree.parents()
        hosts = [-1, *group_hosts(list(self.tree.paths), self.host.attach)]
        sent = self.auxiliary.sent.nonzero()[:, 0].tolist()
        g = sum(r < self.num_prompts for r in sent)  # the pending token's group is always sent whole
        sent_hosts = [hosts[r // self.num_prompts] for r in sent[::g]] if g else []
        drafts.append((tokens[valid].tolist(), [kept.index(parents[i]) if parents[i] >= 0 else -1 for i in kept],
                       [kept.index(h) if h >= 0 else -1 for h in sent_hosts], g))
        return tokens, valid

    nodes_with_groups = 0
    for ids in PROMPTS:
        for n in (30, 7):
            want = host_trees(monkeypatch, target, build_method("ppd", options={"path": package} | options), ids, n)
            form = device_form(build_method("ppd", options={"path": package} | options).drafter)
            drafts.clear()
            monkeypatch.setattr(DevicePPD, "draft", spy)
            run_device(target, ids, form, max_new_tokens=n, stop_ids=set())
            monkeypatch.undo()
            assert len(drafts) == len(want)
            for (tokens, parents, hosts, g), tree in zip(drafts, want, strict=True):
                candidates = tree.verified()
                assert tokens == candidates.tokens.tolist() and parents == candidates.parents.tolist()
                assert tree.auxiliary == g * len(hosts)
                assert hosts == (tree.parents[candidates.size :: g].tolist() if g else [])
                nodes_with_groups += max(len(hosts) - 1, 0)
    assert nodes_with_groups > 0


def test_auxiliary_rows_continue_their_parents() -> None:
    """The forward layout of the rows after a tree: the mask and depths `DraftTree.verify_inputs` gives
    the same tree with its auxiliary nodes."""
    tree = StaticTree.of_rank_paths([(0,), (0, 0), (1,)])
    parents = [-1, 3, 0, 5, 1, 7]  # groups of two rows after the pending token, node 0 and node 1
    rows = AuxiliaryRows.after(tree, parents, torch.arange(12.0).view(6, 2))
    host = DraftTree(torch.zeros(9, dtype=torch.int64), torch.tensor([-1, 0, -1, *parents]), auxiliary=6)
    _, positions, mask = host.verify_inputs(0, 0)
    assert torch.equal(rows.mask, mask) and rows.row_depths.tolist() == positions[0].tolist()
    assert rows.size == 6 and rows.sent.tolist() == [False] * 6
    with pytest.raises(ValueError, match="one row per auxiliary row"):
        AuxiliaryRows.after(tree, parents, torch.zeros(5, 2))


def test_group_hosts() -> None:
    paths = [(0,), (0, 0), (1,)]
    assert group_hosts(paths, None) == [0, 1, 2]
    assert group_hosts(paths, 2) == [0, 1, 2]  # node 2 is second when the guesses are one deep
    assert group_hosts(paths, 1) == [0]
    assert group_hosts(paths, 0) == []


def test_sampling_draws_what_plain_sampling_draws(target, package) -> None:
    form = device_form(build_method("ppd", options={"path": package}).drafter)
    assert_sampling_equals_plain(target, form, PROMPTS)


def test_stop_tokens_end_the_output(target, package) -> None:
    form = device_form(build_method("ppd", options={"path": package}).drafter)
    ids = PROMPTS[3]
    plain = generate(target, None, ids, max_new_tokens=30, stop_at_eos=False).token_ids
    for static in (False, True):
        new, finish, _ = run_device(target, ids, form, max_new_tokens=30, stop_ids={plain[11]}, static=static)
        assert new == plain[: plain.index(plain[11]) + 1] and finish == "eos"


def test_step_device_spec_and_refusals(target, package) -> None:
    assert_step_device_spec_equals_engine(target, "ppd", package, PROMPTS[0])

"""PPD drafting: every tree is the ranking of the prompt rows that ran after the last accepted token
(checked against a full recompute), the prompt-row groups sit where they should and never exceed the
budget, sampling stays lossless, and a backend without input embeddings is refused."""

import pytest
import torch
from tiny_models import greedy_target, naive_greedy, ppd_package, tiny_vocab_target, tv

from warpdecode.decoding.drafters.learned import ShapeLayout, fill_shape
from warpdecode.decoding.drafters.ppd import PPDDrafter
from warpdecode.decoding.generate import build_method, generate
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.decoding.tree import DraftTree
from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.models.ppd import appended_prompt_layout

pytestmark = pytest.mark.usefixtures("single_thread")

SHAPE = [(0,), (1,), (0, 0), (0, 1), (0, 0, 0), (1, 0)]  # the package's stored tree
PROMPT = [3, 9, 27, 17, 51, 25, 3, 9, 27]


@pytest.fixture(scope="module")
def target():
    return greedy_target()


@pytest.fixture(scope="module")
def package(target, tmp_path_factory):
    return ppd_package(target, tmp_path_factory.mktemp("ppd") / "drafter")


def captured(monkeypatch, target, method, prompt, max_new_tokens=16):
    """(tokens, tree, budget) of every proposal, and the output, decoding `max_new_tokens` after `prompt`."""
    out_trees = []
    original = PPDDrafter.propose

    def spy(self, state, budget):
        tree = original(self, state, budget)
        assert tree.size <= budget
        out_trees.append((list(state.tokens), tree, budget))
        return tree

    monkeypatch.setattr(PPDDrafter, "propose", spy)
    out = generate(target, None, prompt, max_new_tokens=max_new_tokens, stop_at_eos=False, method=method)
    return out_trees, out


@torch.inference_mode()
def naive_guesses(target, net, tokens: list[int], width: int) -> list[list[int]]:
    """Reference: the prompts after the token before the pending one, in a cache-free forward of the
    whole sequence (the training layout), ranked over the draft vocabulary."""
    context = torch.tensor([tokens[:-1]])
    T, K = context.shape[1], net.num_prompts
    positions, mask = appended_prompt_layout(T, torch.tensor([[T - 1]]), K)
    x = torch.cat([target.embed(context), net.prompts[None]], dim=1)
    logits = target(torch.zeros(1, T + K, dtype=torch.int64), positions, attention_mask=mask, inputs_embeds=x).logits
    rows = logits[0, T:, net.draft_vocab]  # (K, N)
    order = torch.argsort(rows, dim=-1, descending=True, stable=True)[:, :width]
    return net.draft_vocab[order].tolist()


def test_trees_rank_the_prompt_rows_after_the_last_accepted_token(monkeypatch, target, package):
    method = build_method("ppd", options={"path": package})
    trees, out = captured(monkeypatch, target, method, PROMPT, max_new_tokens=48)
    assert out.token_ids == naive_greedy(target, PROMPT, 48)
    net = method.drafter.net
    layout = ShapeLayout.of(SHAPE)
    first = trees[0][1]
    assert first.verified().size == 0 and first.auxiliary == 3  # no guesses yet: the pending token's group only
    full = [(tokens, tree) for tokens, tree, budget in trees[1:] if budget >= len(SHAPE) + 3 * (1 + len(SHAPE))]
    assert len(full) >= 3
    for tokens, tree in full:
        guesses = naive_guesses(target, net, tokens, layout.width)
        candidates = tree.verified()
        expected = fill_shape(layout, guesses[0], lambda depth, grow, toks, g=guesses: [g[depth]] * len(grow))
        assert candidates.tokens.tolist() == expected.tokens.tolist()
        assert candidates.parents.tolist() == layout.parents
        # a group of 3 prompt rows after the pending token and after every candidate, with the prompts' embeddings
        assert tree.auxiliary == 3 * (1 + candidates.size)
        assert torch.equal(tree.auxiliary_embeds, net.prompts.detach().repeat(1 + candidates.size, 1))
        hosts = tree.parents[candidates.size :: 3].tolist()
        assert hosts == [-1, *range(candidates.size)]


def test_attach_limits_the_groups_and_small_budgets_shrink_them(monkeypatch, target, package):
    method = build_method("ppd", options={"path": package, "attach": 1})
    trees, out = captured(monkeypatch, target, method, PROMPT)
    assert out.token_ids == naive_greedy(target, PROMPT, 16)
    assert max(tree.auxiliary for _, tree, _ in trees) == 6  # the pending token's group and one node's
    drafter = method.drafter
    state = type("State", (), {"tokens": PROMPT, "pending": PROMPT[-1]})()
    tree = drafter.propose(state, 2)
    assert tree.size == 2 and tree.auxiliary == 2 and tree.verified().size == 0  # a shortened group only
    assert drafter.propose(state, 0).size == 0


def test_prompt_lookup_chains_are_verified_beside_the_guesses(target, package):
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6] * 2
    plain = naive_greedy(target, prompt, 24)
    out = generate(target, None, prompt, max_new_tokens=24, stop_at_eos=False,
                   method=build_method("ppd", options={"path": package, "lookup": 4}))
    assert out.token_ids == plain


@pytest.mark.slow
def test_sampled_tokens_follow_the_target_after_a_ppd_step(tmp_path):
    """The 3rd token is the first one a step with PPD candidates emits (the first step only has the
    pending token's group): given the first two, it follows the target's distribution.

    The most common first pair (7, 7; p = 0.48) starts ~490 of the 1000 draws: a correct engine's TV
    over their 3rd tokens is ~0.03 (P(TV > 0.1) < 1e-5 by multinomial simulation), and resampling from
    p after a rejection moves it to ~0.15 (caught in > 99% of draw sets)."""
    model = tiny_vocab_target()
    path = ppd_package(model, tmp_path / "drafter", std=1.0)
    method = build_method("ppd", do_sample=True, options={"path": path, "attach": 0})
    prompt = [1, 2, 1, 2, 1]
    triples, proposed = [], 0
    for seed in range(1000):
        # 8 new tokens leave the second step room for a 2-node tree beside the pending token's group
        out = generate(model, None, prompt, max_new_tokens=8, do_sample=True, seed=seed, stop_at_eos=False,
                       method=method)
        triples.append(tuple(out.token_ids[:3]))
        proposed += sum(out.stats.proposed_per_step[1:2])
    pairs = [t[:2] for t in triples]
    common = max(set(pairs), key=pairs.count)
    thirds = [t[2] for t in triples if t[:2] == common]
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + list(common)])).logits[0, -1]
    expected = Sampler(SamplingConfig(do_sample=True)).probs(logits[None])[0]
    assert proposed > 650  # the second step verified PPD candidates
    assert len(thirds) > 400
    assert tv(thirds, expected) < 0.1


def test_refuses_a_backend_without_input_embeddings_and_bad_options(package):
    without = type("IdsOnlyBackbone", (), {"accepts_inputs_embeds": lambda self: False})()
    with pytest.raises(CapabilityError, match="torch backend"):
        PPDDrafter(package).prepare(without)
    with pytest.raises(ConfigError, match="attach must be >= 0"):
        PPDDrafter(package, attach=-1)
    with pytest.raises(ConfigError, match="at most 3 tokens deep"):
        build_method("ppd", options={"path": package, "tree": "chain", "num_tokens": 4}).drafter.prepare(greedy_target())


def test_groups_continue_their_host_nodes():
    """A chain of two candidates with groups of two rows: after the pending token and after each node."""
    drafter = PPDDrafter.__new__(PPDDrafter)
    drafter.attach = None
    drafter.net = type("Net", (), {"prompts": torch.arange(4.0).view(2, 2)})()
    tree = drafter.with_groups(DraftTree.chain([7, 8]), 2)
    assert tree.tokens.tolist() == [7, 8, 0, 0, 0, 0, 0, 0]
    assert tree.parents.tolist() == [-1, 0, -1, 2, 0, 4, 1, 6]
    assert tree.depths().tolist() == [1, 2, 1, 2, 2, 3, 3, 4]
    assert drafter.groups == {-1: 2, 0: 4, 1: 6} and tree.auxiliary == 6
    assert tree.auxiliary_embeds.tolist() == [[0, 1], [2, 3]] * 3

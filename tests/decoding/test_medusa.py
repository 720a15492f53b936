"""Medusa and Hydra drafting: trees follow the heads, every tree shape is lossless, a drafter that knows
the target's future is always accepted, a drafter for another target is refused."""

import pytest
import torch
from tiny_models import greedy_target, heads_package, oracle_heads_package, tiny_vocab_target

from warpdecode.decoding.drafters.learned import ShapeLayout
from warpdecode.decoding.drafters.medusa import HydraDrafter, MedusaDrafter
from warpdecode.decoding.generate import build_method, generate
from warpdecode.errors import CheckpointError, ConfigError
from warpdecode.models.medusa import HydraHeads, MedusaHeads

pytestmark = pytest.mark.usefixtures("single_thread")

KINDS = ["medusa", "hydra"]
SHAPE = [(0,), (1,), (0, 0), (0, 1), (0, 0, 0), (1, 0)]  # the packages' stored tree


@pytest.fixture(scope="module")
def target():
    return greedy_target()


@pytest.fixture(scope="module")
def packages(target, tmp_path_factory):
    return {kind: heads_package(target, tmp_path_factory.mktemp(kind) / "drafter", kind, num_layers=2)
            for kind in KINDS}


def ranked(logits: torch.Tensor, vocab: torch.Tensor) -> list[int]:
    """Reference ranking: target token ids by decreasing score (a stable sort, not topk)."""
    return vocab[torch.argsort(logits, descending=True, stable=True)].tolist()


def naive_tree(target, net, kind: str, tokens: list[int], shape: list[tuple[int, ...]]) -> list[int]:
    """Reference: each node's token computed on its own, head by head, from a full-recompute feature."""
    with torch.inference_mode():
        L = target.config.n_layer
        pending = tokens[-1]
        feature = target(torch.tensor([tokens[:-1]]), hidden_layers=(L,)).hidden_states[L][0, -1]  # (C,)
        out: dict[tuple[int, ...], int] = {}
        for path in shape:
            depth = len(path)
            if kind == "medusa":
                logits = net.head(net.hidden(depth, feature))
            else:
                before = [pending] + [out[path[:j]] for j in range(1, depth)]
                logits = net.step(depth, feature[None], target.embed(torch.tensor([before])))[0]
            out[path] = ranked(logits, net.draft_vocab)[path[-1]]
        return [out[path] for path in shape]


def captured_trees(monkeypatch, target, method, prompt):
    """(tokens, tree) of every proposal while decoding 12 tokens after `prompt`."""
    captured = []
    drafter_class = type(method.drafter)
    original = drafter_class.propose

    def spy(self, state, budget):
        captured.append((list(state.tokens), original(self, state, budget)))
        return captured[-1][1]

    monkeypatch.setattr(drafter_class, "propose", spy)
    generate(target, None, prompt, max_new_tokens=12, stop_at_eos=False, method=method)
    return captured


@pytest.mark.parametrize("kind", KINDS)
def test_static_tree_follows_the_heads(monkeypatch, target, packages, kind):
    method = build_method(kind, options={"path": packages[kind]})
    captured = captured_trees(monkeypatch, target, method, [3, 9, 27, 17, 51, 25])
    drafter = method.drafter
    assert drafter.shape == SHAPE and isinstance(drafter.net, {"medusa": MedusaHeads, "hydra": HydraHeads}[kind])
    assert len(captured) >= 3
    for tokens, tree in captured[:3]:
        assert tree.parents.tolist() == ShapeLayout.of(SHAPE).parents and tree.draft_probs is None
        assert tree.tokens.tolist() == naive_tree(target, drafter.net, kind, tokens, SHAPE)


def test_medusa_trees_are_cartesian_products(monkeypatch, target, packages):
    """Medusa's heads ignore the path: sibling subtrees at the same depth repeat the same tokens."""
    method = build_method("medusa", options={"path": packages["medusa"]})
    captured = captured_trees(monkeypatch, target, method, [1, 2, 3])
    full = [tree.tokens.tolist() for _, tree in captured if tree.size == len(SHAPE)]  # the last steps' budgets cut it
    assert len(full) >= 3
    for tokens in full:
        assert tokens[SHAPE.index((0, 0))] == tokens[SHAPE.index((1, 0))]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("options", "depth"), [({"tree": "chain", "num_tokens": 3}, 3), ({"tree": "chain"}, 4),
                                                ({}, 3), ({"num_nodes": 4}, 2)],
                         ids=["chain-3", "chain-K", "static", "static-4"])
def test_every_tree_is_greedy_identical(target, packages, kind, options, depth):
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5]
    plain = generate(target, None, prompt, max_new_tokens=20, stop_at_eos=False).token_ids
    out = generate(target, None, prompt, max_new_tokens=20, stop_at_eos=False,
                   method=build_method(kind, options={"path": packages[kind]} | options))
    assert out.token_ids == plain
    assert max(out.stats.proposed_per_step) == depth


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("options", "depth"), [({"tree": "chain"}, 4), ({}, 3)], ids=["chain", "static"])
def test_heads_that_know_the_future_are_always_accepted(tmp_path, kind, options, depth):
    target, package = oracle_heads_package(tmp_path / "drafter", kind)
    prompt = [5, 6, 7, 8, 9, 10, 11]
    plain = generate(target, None, prompt, max_new_tokens=31, stop_at_eos=False).token_ids
    out = generate(target, None, prompt, max_new_tokens=31, stop_at_eos=False,
                   method=build_method(kind, options={"path": package} | options))
    assert out.token_ids == plain
    assert out.stats.accepted_per_step[:-1] == [depth] * (len(out.stats.accepted_per_step) - 1)


@pytest.mark.parametrize("kind", KINDS)
def test_a_drafter_for_another_target_is_refused(packages, kind):
    with pytest.raises(CheckpointError, match="trained for 'tiny'"):
        generate(tiny_vocab_target(), None, [1, 2], max_new_tokens=4,
                 method=build_method(kind, options={"path": packages[kind]}))


def test_bad_options_are_refused(target, packages, tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        MedusaDrafter(str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="tree must be one of static, chain"):
        HydraDrafter(packages["hydra"], tree="dynamic")
    with pytest.raises(ConfigError, match="at most 4 tokens deep"):
        MedusaDrafter(packages["medusa"], tree="chain", num_tokens=5).prepare(target)
    with pytest.raises(CheckpointError, match="holds a 'medusa' drafter"):
        HydraDrafter(packages["medusa"]).prepare(target)


def test_prompt_lookup_fuses_into_the_learned_tree(drafter_options, single_thread):
    """On text that repeats, `lookup` adds the copied chain to the heads' tree: longer proposals,
    the same greedy output (full chains: the tiny model's answer only ever matches one token)."""
    from tiny_models import naive_greedy

    model, prompt = greedy_target(), [5, 6, 7, 8, 9, 10] * 4
    plain = generate(model, None, prompt, max_new_tokens=24, stop_at_eos=False,
                     method=build_method("hydra", options=drafter_options["hydra"]))
    fused = generate(model, None, prompt, max_new_tokens=24, stop_at_eos=False,
                     method=build_method("hydra", options=drafter_options["hydra"] | {"lookup": 6, "lookup_scale": False}))
    assert fused.token_ids == plain.token_ids == naive_greedy(model, prompt, 24)
    assert max(fused.stats.proposed_per_step) > max(plain.stats.proposed_per_step)
    with pytest.raises(ConfigError, match="lookup"):
        build_method("hydra", options=drafter_options["hydra"] | {"lookup": -1})

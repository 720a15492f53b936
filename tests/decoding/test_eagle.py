"""The EAGLE-style drafter: its trees follow the network, every tree shape is lossless, a drafter for
another target is refused."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from tiny_models import eagle_package, greedy_target, oracle_eagle_package, tiny_vocab_target

from warpdecode.decoding.drafters.eagle import EagleDrafter, ancestor_mask
from warpdecode.decoding.generate import build_method, generate
from warpdecode.errors import CheckpointError, ConfigError
from warpdecode.models.eagle import EagleNet

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def target():
    return greedy_target()


@pytest.fixture(scope="module", params=[{}, {"feature_layers": (1, 3)}, {"layout": "eagle3"}],
                ids=["final-feature", "fused-features", "eagle3-shape"])
def package(target, tmp_path_factory, request):
    """An EAGLE drafter on the target's final feature, one fusing hidden states 1 and 3, and one of
    EAGLE-3's shape (`models/eagle.py`: layer inputs 2, 1 and 0 of this 3-layer target)."""
    return eagle_package(target, tmp_path_factory.mktemp("eagle") / "drafter", std=0.5, **request.param)


def naive_chain(target, net: EagleNet, prompt: list[int], pending: int, depth: int) -> list[int]:
    """Reference: recompute every draft step from scratch, without cache, tree or reduced-vocab tricks."""
    with torch.inference_mode():
        hidden = target(torch.tensor([prompt]), hidden_layers=net.feature_layers).hidden_states
        features = net.target_feature({j: h[0] for j, h in hidden.items()})  # (T, C)
        tokens = prompt[1:] + [pending]
        drafted: list[int] = []
        for _ in range(depth):
            hidden, logits = net(features[None], torch.tensor([tokens]), target.embed, torch.arange(1, len(tokens) + 1)[None])
            token = int(net.draft_vocab[logits[0, -1].argmax()])
            drafted.append(token)
            features = torch.cat([features, hidden[0, -1:]])
            tokens = tokens + [token]
        return drafted


def test_ancestor_mask():
    assert ancestor_mask([-1, 0, -1, 1]).int()[0].tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [1, 1, 0, 1]]


def test_chain_follows_the_network(target, package):
    prompt = [3, 9, 27, 17, 51, 25]
    method = build_method("eagle", options={"path": package, "tree": "chain", "num_tokens": 4})
    captured = []
    original = EagleDrafter.propose

    def spy(self, state, budget):
        tree = original(self, state, budget)
        captured.append((list(state.tokens), tree.tokens.tolist(), tree.parents.tolist()))
        return tree

    EagleDrafter.propose = spy
    try:
        generate(target, None, prompt, max_new_tokens=12, stop_at_eos=False, method=method)
    finally:
        EagleDrafter.propose = original
    net = method.drafter.net
    assert net is not None and len(captured) >= 3
    assert method.drafter.needs_hidden_states == net.feature_layers
    for tokens, drafted, parents in captured[:3]:
        assert parents == [-1, 0, 1, 2]
        assert drafted == naive_chain(target, net, tokens[:-1], tokens[-1], 4)


def test_static_tree_ranks_follow_the_stored_shape(target, package):
    method = build_method("eagle", options={"path": package})
    out = generate(target, None, [5, 6, 7, 8, 5, 6], max_new_tokens=10, stop_at_eos=False, method=method)
    drafter = method.drafter
    assert drafter.shape == [(0,), (1,), (0, 0), (0, 1), (0, 0, 0), (1, 0)]
    assert max(out.stats.proposed_per_step) == 3


@pytest.mark.parametrize("options", [{"tree": "chain", "num_tokens": 3}, {"tree": "dynamic", "num_nodes": 6, "top_k": 2},
                                     {"tree": "static", "num_nodes": 4}], ids=["chain", "dynamic", "static-4"])
def test_every_tree_is_greedy_identical(target, package, options):
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5]
    plain = generate(target, None, prompt, max_new_tokens=20, stop_at_eos=False).token_ids
    out = generate(target, None, prompt, max_new_tokens=20, stop_at_eos=False,
                   method=build_method("eagle", options={"path": package} | options))
    assert out.token_ids == plain


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    return oracle_eagle_package(tmp_path_factory.mktemp("oracle") / "drafter")


@pytest.mark.parametrize(("options", "depth"), [({"tree": "chain", "num_tokens": 4}, 4), ({}, 3),
                                                ({"tree": "dynamic", "num_nodes": 6, "num_tokens": 4, "top_k": 1}, 5)],
                         ids=["chain", "static", "dynamic"])
def test_a_drafter_that_computes_the_target_is_always_accepted(oracle, options, depth):
    """The oracle drafter's pairs, positions and cache must line up with the target's exactly, or
    its drafts would stop matching: every step accepts the whole depth (until the token budget)."""
    target, package = oracle
    prompt = [5, 6, 7, 8, 9, 10, 11]
    plain = generate(target, None, prompt, max_new_tokens=31, stop_at_eos=False).token_ids
    out = generate(target, None, prompt, max_new_tokens=31, stop_at_eos=False,
                   method=build_method("eagle", options={"path": package} | options))
    assert out.token_ids == plain
    assert out.stats.accepted_per_step[:-1] == [depth] * (len(out.stats.accepted_per_step) - 1)


def test_a_drafter_for_another_target_is_refused(package):
    with pytest.raises(CheckpointError, match="trained for 'tiny'"):
        generate(tiny_vocab_target(), None, [1, 2], max_new_tokens=4, method=build_method("eagle", options={"path": package}))


def test_broken_packages_are_refused(target, package, tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        EagleDrafter(str(tmp_path / "nowhere"))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "drafter.json").write_text(json.dumps({"format": "warpdecode-drafter", "version": 1, "kind": "eagle"}))
    (broken / "drafter.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(CheckpointError, match="field target is missing"):
        EagleDrafter(str(broken)).prepare(target)
    shutil.copy(Path(package) / "drafter.json", broken / "drafter.json")  # valid metadata, truncated weights
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        EagleDrafter(str(broken)).prepare(target)
    with pytest.raises(ConfigError, match="tree must be"):
        EagleDrafter(package, tree="bushy")


def test_the_drafter_runs_on_packed_weights(target, package):
    """`prepare` runs inside the engine's inference mode; the network must still get packed copies."""
    method = build_method("eagle", options={"path": package})
    generate(target, None, [1, 2, 3], max_new_tokens=4, stop_at_eos=False, method=method)
    net = method.drafter.net
    assert net.frozen_head().packed is not None and net.block.attn.qkv.packed is not None
    assert all(linear.packed is not None for linear in (net.fc, net.fuse) if linear is not None)

"""The device drafters draft what the host drafters propose (same nodes, same tokens), and the
static tree follows decoding/tree.py's conventions."""

from __future__ import annotations

import random

import pytest
import torch
from tiny_models import random_model

from warpdecode.decoding.device_step.prompt_lookup import DevicePromptLookup
from warpdecode.decoding.device_step.state import DeviceState
from warpdecode.decoding.device_step.token_recycling import DeviceTokenRecycling
from warpdecode.decoding.device_step.tree import StaticTree
from warpdecode.decoding.drafters.prompt_lookup import PromptLookupDrafter
from warpdecode.decoding.drafters.token_recycling import TokenRecyclingDrafter
from warpdecode.decoding.protocols import DecodeState
from warpdecode.decoding.tree import DraftTree

NO_STOP = torch.zeros(0, dtype=torch.int64)


def test_static_tree_of_rank_paths() -> None:
    tree = StaticTree.of_rank_paths([(0,), (1,), (0, 0)])
    assert tree.tables.parent_rows.tolist() == [0, 0, 1] and tree.width == 4
    assert [level.nodes.tolist() for level in tree.levels] == [[0, 1], [2]]
    assert [level.ranks.tolist() for level in tree.levels] == [[0, 1], [0]]
    assert [level.parent_rows.tolist() for level in tree.levels] == [[0, 0], [1]]
    with pytest.raises(ValueError, match="parent"):
        StaticTree.of_rank_paths([(0, 0)])


def test_token_recycling_tree_mask_is_the_draft_tree_mask() -> None:
    host = TokenRecyclingDrafter()
    tree = StaticTree.of_rank_paths(host.shape)
    parents = (tree.tables.parent_rows - 1)
    _, positions, mask = DraftTree(torch.zeros(tree.size, dtype=torch.int64), parents).verify_inputs(0, 0)
    assert torch.equal(tree.tables.mask, mask) and tree.tables.row_depths.tolist() == positions[0].tolist()


def state_of(tokens: list[int], max_new_tokens: int = 64) -> DeviceState:
    """A device state whose history is `tokens` (the last one pending)."""
    return DeviceState.start(tokens[:-1], torch.tensor(tokens[-1:]), max_new_tokens=max_new_tokens, width=16,
                             stop_ids=NO_STOP)


def host_state(tokens: list[int]) -> DecodeState:
    return DecodeState(None, None, list(tokens), 1, None)  # type: ignore[arg-type]  # drafters read only the tokens


def random_model_of_vocab(vocab: int):
    return random_model(seed=0, std=0.1, vocab_size=vocab, n_layer=1, n_head=2, d_model=8, d_ff=16, max_seq_len=64)


def valid_tokens(tokens: torch.Tensor, valid: torch.Tensor) -> list[int]:
    return tokens[valid].tolist()


@pytest.mark.parametrize("options", [{}, {"scale": False}, {"max_ngram": 2, "min_ngram": 2, "num_tokens": 4}])
def test_prompt_lookup_drafts_the_host_chain(options: dict) -> None:
    host = PromptLookupDrafter(**options)
    device = DevicePromptLookup.of(host)
    device.prepare(random_model_of_vocab(16))
    rng = random.Random(0)
    for trial in range(300):
        length = rng.randrange(1, 40)
        tokens = [rng.randrange(4 if trial % 2 else 12) for _ in range(length)]  # small alphabets: many matches
        budget = rng.choice([0, 1, 3, 64])
        want = host.propose(host_state(tokens), budget)
        got, valid = device.draft(state_of(tokens), torch.tensor(budget))
        assert valid_tokens(got, valid) == want.tokens.tolist(), (tokens, budget)
        assert valid.tolist() == sorted(valid.tolist(), reverse=True)  # a prefix of the chain


def test_prompt_lookup_worked_example() -> None:
    device = DevicePromptLookup(max_ngram=2, num_tokens=5, scale=False)
    got, valid = device.draft(state_of([0, 1, 2, 3, 0, 1]), torch.tensor(64))
    assert valid_tokens(got, valid) == [2, 3, 0, 1]


@pytest.mark.parametrize("num_nodes,top_k", [(8, 8), (16, 4), (3, 2)])
def test_token_recycling_drafts_the_host_tree(num_nodes: int, top_k: int) -> None:
    vocab = 12
    host = TokenRecyclingDrafter(top_k=top_k, num_nodes=num_nodes)
    host.prepare(type("Target", (), {"config": type("Config", (), {"vocab_size": vocab})})())  # type: ignore[arg-type]
    device = DeviceTokenRecycling.of(host)
    device.prepare(random_model_of_vocab(vocab))
    assert host.matrix is not None and host.known is not None and device.matrix is not None
    g = torch.Generator().manual_seed(0)
    rng = random.Random(0)
    for _ in range(100):
        logits = torch.randn(5, vocab, generator=g)
        rows = torch.randint(0, vocab, (5,), generator=g)
        keep = torch.rand(5, generator=g) < 0.8
        host.matrix[rows[keep]] = logits[keep].topk(top_k, -1).indices
        host.known[rows[keep]] = True
        device.update(rows, logits, keep)
        assert torch.equal(device.matrix[:vocab][host.known], host.matrix[host.known])
        pending, budget = rng.randrange(vocab), rng.choice([0, 2, 5, 64])
        want = host.propose(host_state([3, pending]), budget)
        got, valid = device.draft(state_of([3, pending]), torch.tensor(budget))
        assert valid_tokens(got, valid) == want.tokens.tolist()
        kept = valid.nonzero()[:, 0].tolist()  # the same tree: each valid node's parent, renumbered
        parents = (device.tree.tables.parent_rows - 1).tolist()
        assert [kept.index(parents[i]) if parents[i] >= 0 else -1 for i in kept] == want.parents.tolist()

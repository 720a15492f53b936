import dataclasses

import pytest
import torch

from warpdecode.decoding.drafters.draft_model import DraftModelDrafter, first_layers
from warpdecode.decoding.generate import build_method, generate
from warpdecode.decoding.protocols import AcceptResult, DecodeState
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.errors import ConfigError
from warpdecode.models.cache import KVCache
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.models.config import ModelConfig
from warpdecode.models.transformer import Transformer


def test_target_as_its_own_draft_accepts_everything(tiny_model_dir, single_thread):
    target, tokenizer = load_pretrained(tiny_model_dir)
    plain = generate(target, tokenizer, "for i in range", max_new_tokens=20, stop_at_eos=False, chat=False)
    method = build_method("draft_model", options={"model": str(tiny_model_dir), "num_tokens": 4})
    drafted = generate(target, tokenizer, "for i in range", max_new_tokens=20, stop_at_eos=False, chat=False,
                       method=method)
    assert drafted.token_ids == plain.token_ids
    assert drafted.stats.acceptance_rate == 1.0
    # 1 token from the prefill, then 4 accepted + 1 bonus per verify forward (the last one is cut to fit)
    assert drafted.stats.accepted_per_step[:3] == [4, 4, 4]
    assert drafted.stats.target_forwards == 4


def test_needs_exactly_one_draft_source():
    with pytest.raises(ConfigError, match="exactly one"):
        DraftModelDrafter()
    with pytest.raises(ConfigError, match="exactly one"):
        DraftModelDrafter(model="x", layers=2)


PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [1, 2, 3], list(range(10, 40))]


@pytest.fixture(scope="module")
def random_target():
    config = ModelConfig(vocab_size=64, n_layer=3, n_head=4, n_kv_head=2, d_model=32, d_ff=64, max_seq_len=256)
    torch.manual_seed(1)
    model = Transformer(config)
    model.init_weights(std=0.3)
    return model.eval()


class Recorder:
    """A verifier wrapper that keeps every (tree, result) it verifies."""

    def __init__(self, inner):
        self.inner, self.seen = inner, []

    needs_hidden_states = ()

    def prepare(self, target):
        self.inner.prepare(target)

    def accept(self, tree, target_logits, sampler, hidden_states=None):
        result = self.inner.accept(tree, target_logits, sampler)
        self.seen.append((tree, result))
        return result


def tree_method(top_k, num_tokens=3):
    method = build_method("draft_model", options={"layers": 1, "num_tokens": num_tokens, "top_k": top_k})
    return dataclasses.replace(method, verifier=Recorder(method.verifier))


@pytest.mark.parametrize("top_k", [2, 3])
def test_tree_greedy_matches_plain_greedy(random_target, top_k, single_thread):
    for prompt in PROMPTS:
        plain = generate(random_target, None, prompt, max_new_tokens=24, stop_at_eos=False)
        method = tree_method(top_k)
        tree = generate(random_target, None, prompt, max_new_tokens=24, stop_at_eos=False, method=method)
        assert tree.token_ids == plain.token_ids
        assert sum(tree.stats.accepted_per_step) + tree.stats.target_forwards == 23
        assert max(t.size for t, _ in method.verifier.seen) == top_k * 3


def test_tree_accepts_non_first_siblings(random_target, single_thread):
    """The tree is really used: some accepted node is not the first (expanded) child of its parent."""
    side_steps = 0
    for prompt in PROMPTS:
        method = tree_method(top_k=3)
        generate(random_target, None, prompt, max_new_tokens=24, stop_at_eos=False, method=method)
        for tree, result in method.verifier.seen:
            children = tree.children()
            side_steps += sum(children[int(tree.parents[c])][0] != c for c in result.path)
    assert side_steps > 0


def started(target, prompt, top_k, num_tokens=3, do_sample=False):
    """A drafter started on the state right after prefilling `prompt` (pending = the target's argmax)."""
    cache = KVCache.for_model(target.config, 1, 64)
    with torch.inference_mode():
        pending = int(target(torch.tensor([prompt]), cache=cache).logits[0, -1].argmax())
    state = DecodeState(target, cache, prompt + [pending], len(prompt), Sampler(SamplingConfig(do_sample, seed=0)))
    drafter = DraftModelDrafter(layers=1, num_tokens=num_tokens, top_k=top_k)
    drafter.prepare(target)
    drafter.start(state)
    return drafter, state


@pytest.mark.parametrize(("budget", "parents"), [
    (100, [-1, -1, -1, 0, 0, 0, 3, 3, 3]),
    (7, [-1, -1, -1, 0, 0, 0, 3]),
    (5, [-1, -1, -1, 0, 0]),
    (2, [-1, -1]),
    (0, []),
])
def test_greedy_tree_shape(random_target, budget, parents, single_thread):
    drafter, state = started(random_target, PROMPTS[1], top_k=3)
    tree = drafter.propose(state, budget)
    assert tree.parents.tolist() == parents and tree.draft_probs is None
    # each level holds the draft's top 3 after the path through the previous levels' first siblings
    draft = first_layers(random_target, 1)
    tokens = tree.tokens.tolist()
    for level in range(0, len(tokens), 3):
        path = state.tokens + tokens[0:level:3]
        with torch.inference_mode():
            top = draft(torch.tensor([path])).logits[0, -1].topk(3).indices.tolist()
        assert tokens[level : level + 3] == top[: len(tokens) - level]


def test_sampled_tree_shape(random_target, single_thread):
    drafter, state = started(random_target, PROMPTS[1], top_k=2, do_sample=True)
    tree = drafter.propose(state, 5)
    assert tree.parents.tolist() == [-1, -1, 0, 0, 2]
    q = tree.draft_probs
    assert q.shape == (5, 64) and torch.allclose(q.sum(-1), torch.ones(5))
    assert torch.equal(q[0], q[1]) and torch.equal(q[2], q[3]) and not torch.equal(q[0], q[2])
    assert all(q[i, t] > 0 for i, t in enumerate(tree.tokens.tolist()))


@pytest.mark.parametrize(("path", "kept"), [([1], 0), ([0, 3], 1), ([0, 2, 5], 2), ([0, 2, 4], 2)],
                         ids=["sibling-at-1", "sibling-at-2", "sibling-at-3", "expanded-chain"])
def test_observe_keeps_the_committed_prefix(random_target, path, kept, single_thread):
    """The draft cache ran the expanded nodes 0 and 2 (not the leaves); after an accepted path it holds
    exactly the committed tokens but the new pending one, and the next proposal equals a fresh drafter's."""
    drafter, state = started(random_target, PROMPTS[1], top_k=2)
    tree = drafter.propose(state, 6)
    before = len(state.tokens)  # the prompt and the old pending token, all in the draft cache now
    result = AcceptResult.from_path(tree, path, bonus=7)
    state.tokens.extend(result.tokens)
    drafter.observe(state, result)
    assert int(drafter.cache.lengths[0]) == before + kept
    fresh = DraftModelDrafter(layers=1, num_tokens=3, top_k=2)
    fresh.prepare(random_target)
    fresh.start(state)
    assert drafter.propose(state, 6).tokens.tolist() == fresh.propose(state, 6).tokens.tolist()


def test_top_k_must_be_positive():
    with pytest.raises(ConfigError, match="top_k"):
        DraftModelDrafter(layers=1, top_k=0)


def test_prepare_loads_the_draft_once_before_decoding(tiny_model_dir):
    target, _ = load_pretrained(tiny_model_dir)
    drafter = DraftModelDrafter(model=str(tiny_model_dir))
    drafter.prepare(target)
    loaded = drafter.draft
    drafter.prepare(target)
    assert loaded is not None and drafter.draft is loaded


def test_a_quantised_draft_model_stays_lossless(tiny_model_dir, single_thread):
    """dtype= changes what the draft reads, never the output: an int8 draft of the target itself
    proposes almost what the target picks, and the verified output is plain decoding's."""
    target, tokenizer = load_pretrained(tiny_model_dir)
    plain = generate(target, tokenizer, "for i in range", max_new_tokens=20, stop_at_eos=False, chat=False)
    method = build_method("draft_model", options={"model": str(tiny_model_dir), "num_tokens": 4, "dtype": "q8"})
    drafted = generate(target, tokenizer, "for i in range", max_new_tokens=20, stop_at_eos=False, chat=False,
                       method=method)
    assert drafted.token_ids == plain.token_ids
    draft = method.drafter.draft
    assert draft is not None and draft.weight_bits == 8
    with pytest.raises(ConfigError, match="dtype"):
        DraftModelDrafter(model="x", dtype="fp8")
    with pytest.raises(ConfigError, match="layers= drafts with the target"):
        DraftModelDrafter(layers=2, dtype="q4")


@pytest.mark.parametrize("dtype", ["fp32", "q8"])
def test_a_draft_vocabulary_prefix_stays_lossless(tiny_model_dir, single_thread, dtype):
    """vocab=N: the draft's head keeps its first N rows (the same logits for them, -inf past them), so
    it never drafts a later token, and the verified output is plain decoding's."""
    target, tokenizer = load_pretrained(tiny_model_dir)
    V = target.config.vocab_size
    plain = generate(target, tokenizer, "for i in range", max_new_tokens=20, stop_at_eos=False, chat=False)
    whole = DraftModelDrafter(model=str(tiny_model_dir), dtype=dtype)
    whole.prepare(target)
    for rows in (V // 2, V // 2 + 3):  # a whole number of 16-channel tiles, and not
        method = build_method("draft_model", options={"model": str(tiny_model_dir), "num_tokens": 4, "dtype": dtype,
                                                      "vocab": rows})
        drafted = generate(target, tokenizer, "for i in range", max_new_tokens=20, stop_at_eos=False, chat=False,
                           method=method)
        assert drafted.token_ids == plain.token_ids
        drafter = method.drafter
        assert isinstance(drafter, DraftModelDrafter) and drafter.draft_rows() == rows
        drafter.prepare(target)  # a second prepare keeps the cut head
        assert drafter.draft_rows() == rows
        drafter.cache, whole.cache = drafter.new_draft_cache(16), whole.new_draft_cache(16)
        with torch.inference_mode():
            cut, full = drafter.run_draft([1, 5, 7]), whole.run_draft([1, 5, 7])  # (1, V) each
        assert cut.shape == full.shape == (1, V)
        # the same logits up to the matmul's blocking for another number of rows (float32)
        torch.testing.assert_close(cut[:, :rows], full[:, :rows], rtol=1e-5, atol=1e-5)
        assert bool((cut[:, rows:] == float("-inf")).all())
    with pytest.raises(ConfigError, match="vocab= must be >= 1 and needs model="):
        DraftModelDrafter(layers=2, vocab=100)
    with pytest.raises(ConfigError, match="exceeds the draft vocabulary of 4"):
        DraftModelDrafter(model=str(tiny_model_dir), vocab=4, top_k=5).prepare(target)


def test_confidence_stops_the_chain_after_an_unsure_level(random_target, single_thread):
    """confidence=c: the chain ends after the first level whose token has draft probability < c (the
    token still proposed, no draft forward after it); output stays plain decoding's."""
    drafter, state = started(random_target, PROMPTS[1], top_k=1, num_tokens=6)
    full = drafter.propose(state, 100).tokens.tolist()
    draft = first_layers(random_target, 1)
    with torch.inference_mode():
        probs = [float(draft(torch.tensor([state.tokens + full[:i]])).logits[0, -1].softmax(-1)[full[i]])
                 for i in range(6)]
    for c in (min(probs[:5]) / 2, (probs[0] + 1) / 2, sorted(probs[:5])[2] + 1e-6):
        drafter, state = started(random_target, PROMPTS[1], top_k=1, num_tokens=6)
        drafter.confidence = c
        expected = next((i + 1 for i, p in enumerate(probs[:5]) if p < c), 6)
        assert drafter.propose(state, 100).tokens.tolist() == full[:expected], c
        assert drafter.fed == full[: expected - 1]  # the draft ran the kept levels only
    for prompt in PROMPTS:
        plain = generate(random_target, None, prompt, max_new_tokens=24, stop_at_eos=False)
        method = build_method("draft_model", options={"layers": 1, "num_tokens": 5, "confidence": 0.5})
        assert generate(random_target, None, prompt, max_new_tokens=24, stop_at_eos=False,
                        method=method).token_ids == plain.token_ids
        sampled = [generate(random_target, None, prompt, max_new_tokens=12, stop_at_eos=False, do_sample=True,
                            seed=3, method=m).token_ids
                   for m in ("none", build_method("draft_model", options={"layers": 1, "confidence": 0.5},
                                                  do_sample=True))]
        assert len(sampled[1]) == len(sampled[0]) == 12
    for bad in (0, 1, 1.5):
        with pytest.raises(ConfigError, match=r"confidence must be in \(0, 1\)"):
            DraftModelDrafter(layers=1, confidence=bad)
    with pytest.raises(ConfigError, match="num_nodes grows a dynamic tree"):
        DraftModelDrafter(layers=1, confidence=0.5, num_nodes=8)

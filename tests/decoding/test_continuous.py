"""Continuous batching: rows join and leave between steps, and a row's numbers never depend on its batch."""

from typing import ClassVar

import pytest
import torch
from tiny_models import random_model

from warpdecode.decoding.continuous import ContinuousBatch, Row
from warpdecode.decoding.generate import generate
from warpdecode.decoding.protocols import DecodeState
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.errors import ConfigError
from warpdecode.models.config import ModelConfig
from warpdecode.models.transformer import Transformer

PROMPTS = [[5, 6, 7], list(range(10, 30)), [1, 2, 3, 4, 5, 6, 7, 8, 9], [40, 41], list(range(3, 14))]


class RecordingSampler(Sampler):
    """A sampler that keeps every logits row it chooses from, to compare them bit for bit."""

    def __init__(self, config: SamplingConfig) -> None:
        super().__init__(config)
        self.seen: list[torch.Tensor] = []

    def select(self, logits: torch.Tensor) -> torch.Tensor:
        self.seen.append(logits.clone())
        return super().select(logits)


@pytest.fixture(scope="module")
def target():
    return random_model(seed=2, std=0.3, vocab_size=64, n_layer=2, n_head=4, n_kv_head=2, d_model=32, d_ff=64,
                        max_seq_len=64)


def serve(model, schedule: list[tuple[int, list[int]]], *, new_tokens: int, max_rows: int = 8,
          stop_ids: set[int] | None = None, config: SamplingConfig | None = None,
          prefill_chunk: int | None = None) -> list[Row]:
    """Decode `schedule`'s prompts, each queued before the step of its number (0: before the first step)
    and added once a row is free, removing rows as they finish. Returns the rows in schedule order."""
    batch = ContinuousBatch(model, max_rows=max_rows, max_len=64, stop_ids=stop_ids or set(),
                            prefill_chunk=prefill_chunk)
    rows: dict[int, Row] = {}
    step = 0
    while len(rows) < len(schedule) or batch.rows or batch.filling:
        for i, (when, prompt) in enumerate(schedule):
            if when <= step and i not in rows and batch.free:
                rows[i] = batch.add(prompt, max_new_tokens=new_tokens, sampler=RecordingSampler(config or SamplingConfig()))
                if rows[i].finish is not None:
                    batch.remove(rows[i])
        batch.step()
        for row in [r for r in batch.rows if r.finish is not None]:
            batch.remove(row)
        step += 1
    return [rows[i] for i in range(len(schedule))]


def test_rows_equal_generate_alone(target, single_thread):
    rows = serve(target, [(0, p) for p in PROMPTS], new_tokens=12)
    for prompt, row in zip(PROMPTS, rows, strict=True):
        alone = generate(target, None, prompt, max_new_tokens=12, stop_at_eos=False)
        assert row.new == alone.token_ids
        assert row.finish == "length" and row.stats.new_tokens == 12 and row.stats.target_forwards == 11


def test_a_row_sees_the_same_logits_whatever_joins_or_leaves(target, single_thread):
    """Bitwise: the logits a request decodes from are the same alone, in a full batch, and with rows
    joining at later steps and leaving earlier (the last row moves into a freed cache row)."""
    alone = [serve(target, [(0, p)], new_tokens=10)[0] for p in PROMPTS]
    together = serve(target, [(0, p) for p in PROMPTS], new_tokens=10)
    staggered = serve(target, [(i * 2, p) for i, p in enumerate(PROMPTS)], new_tokens=10, max_rows=3)
    for reference, *others in zip(alone, together, staggered, strict=True):
        for row in others:
            assert row.new == reference.new
            assert len(row.sampler.seen) == len(reference.sampler.seen) == 10
            assert all(torch.equal(a, b) for a, b in zip(row.sampler.seen, reference.sampler.seen, strict=True))


def test_stop_token_ends_a_row_and_the_others_go_on(target, single_thread):
    alone = [serve(target, [(0, p)], new_tokens=10)[0].new for p in PROMPTS[:3]]
    stop = alone[0][2]
    rows = serve(target, [(0, p) for p in PROMPTS[:3]], new_tokens=10, stop_ids={stop})
    assert rows[0].new == alone[0][: alone[0].index(stop) + 1] and rows[0].finish == "eos"
    for row, reference in zip(rows[1:], alone[1:], strict=True):
        expected = reference[: reference.index(stop) + 1] if stop in reference else reference
        assert row.new == expected


def test_seeded_sampling_is_the_same_at_any_batch_size(target, single_thread):
    config = SamplingConfig(do_sample=True, temperature=0.9, top_k=20, seed=7)
    alone = serve(target, [(0, PROMPTS[1])], new_tokens=12, config=config)[0].new
    crowded = serve(target, [(0, PROMPTS[0]), (1, PROMPTS[1]), (1, PROMPTS[2])], new_tokens=12, config=config)[1].new
    assert alone == crowded
    assert alone == generate(target, None, PROMPTS[1], max_new_tokens=12, stop_at_eos=False, do_sample=True,
                             temperature=0.9, top_k=20, seed=7).token_ids


def test_penalties_use_the_rows_own_context(target, single_thread):
    config = SamplingConfig(repetition_penalty=1.6, frequency_penalty=0.4)
    rows = serve(target, [(0, p) for p in PROMPTS[:3]], new_tokens=10, config=config)
    for prompt, row in zip(PROMPTS[:3], rows, strict=True):
        assert row.new == generate(target, None, prompt, max_new_tokens=10, stop_at_eos=False,
                                   repetition_penalty=1.6, frequency_penalty=0.4).token_ids


def test_refuses_what_it_cannot_hold(target):
    batch = ContinuousBatch(target, max_rows=1, max_len=16, stop_ids=set())
    with pytest.raises(ConfigError, match="does not fit"):
        batch.add(list(range(10)), max_new_tokens=7, sampler=Sampler(SamplingConfig()))
    with pytest.raises(ConfigError, match="does not fit"):
        batch.add([], max_new_tokens=1, sampler=Sampler(SamplingConfig()))
    batch.add([1, 2], max_new_tokens=3, sampler=Sampler(SamplingConfig()))
    with pytest.raises(ConfigError, match="full"):
        batch.add([1, 2], max_new_tokens=3, sampler=Sampler(SamplingConfig()))


@pytest.mark.slow
@pytest.mark.parametrize("size", [3, 8])
def test_real_model_batch_invariance(smollm2, size, single_thread):
    """The default model, mixed prompt lengths: every row's logits equal the row's logits alone, bit for
    bit, with the batch full from the start or filled as rows leave."""
    tok = smollm2.tokenizer
    texts = ["def add(a, b):", "The capital of France is", "Write a haiku about the sea.\n",
             "import numpy as np\nx = np.", "Once upon a time", "SELECT name FROM", "1, 2, 3, 5, 8,",
             "Q: What is 12 * 7?\nA:"][:size]
    prompts = [tok.encode(t) for t in texts]
    alone = [serve(smollm2.model, [(0, p)], new_tokens=6)[0] for p in prompts]
    together = serve(smollm2.model, [(0, p) for p in prompts], new_tokens=6)
    queued = serve(smollm2.model, [(i, p) for i, p in enumerate(prompts)], new_tokens=6, max_rows=max(2, size // 2))
    for reference, *others in zip(alone, together, queued, strict=True):
        for row in others:
            assert row.new == reference.new
            assert all(torch.equal(a, b) for a, b in zip(row.sampler.seen, reference.sampler.seen, strict=True))


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_targets_are_batch_invariant(bits, single_thread):
    from warpdecode.models.quantized import quantized_target

    config = ModelConfig(vocab_size=96, n_layer=2, n_head=4, n_kv_head=2, d_model=64, d_ff=160, max_seq_len=64)
    torch.manual_seed(3)
    model = Transformer(config)
    model.init_weights(std=0.2)
    target = quantized_target(model.eval(), bits)
    alone = [serve(target, [(0, p)], new_tokens=8)[0] for p in PROMPTS]
    staggered = serve(target, [(i, p) for i, p in enumerate(PROMPTS)], new_tokens=8, max_rows=3)
    for reference, row in zip(alone, staggered, strict=True):
        assert row.new == reference.new
        assert all(torch.equal(a, b) for a, b in zip(row.sampler.seen, reference.sampler.seen, strict=True))


def spec_serve(model, prompts, methods, *, new_tokens: int, max_rows: int = 8, max_nodes: int | None = None,
               config: SamplingConfig | None = None, ragged: bool = False,
               batch_type: type[ContinuousBatch] = ContinuousBatch, keep=None) -> list[Row]:
    """Every prompt added at once with its own method (None: plain), stepped to the end (`keep`: the
    step's tree cut)."""
    from warpdecode.decoding.generate import build_method

    batch = batch_type(model, max_rows=max_rows, max_len=model.config.max_seq_len, stop_ids=set(), ragged_verify=ragged)
    do_sample = config is not None and config.do_sample
    rows = [batch.add(p, max_new_tokens=new_tokens, sampler=Sampler(config or SamplingConfig()),
                      method=None if m is None else build_method(m, do_sample=do_sample))
            for p, m in zip(prompts, methods, strict=True)]
    while batch.rows:
        batch.step(max_nodes, keep)
        for row in [r for r in batch.rows if r.finish is not None]:
            batch.remove(row)
    return rows


BATCHABLE = ["prompt_lookup", "token_recycling", "lookahead", "adaptive_ngram", "copy_input"]


@pytest.mark.parametrize("ragged", [False, True])
def test_speculative_rows_equal_plain_decoding_alone(target, single_thread, ragged):
    """Ragged speculation in one forward: every row (each with its own drafter, or plain) decodes the
    tokens it decodes alone and plainly."""
    prompts = [p * 2 for p in PROMPTS]  # repeated text gives the n-gram drafters something to find
    alone = [generate(target, None, p, max_new_tokens=16, stop_at_eos=False).token_ids for p in prompts]
    methods = [*BATCHABLE[: len(prompts) - 1], None]
    rows = spec_serve(target, prompts, methods, new_tokens=16, ragged=ragged)
    assert [row.new for row in rows] == alone
    assert all(row.finish == "length" and len(row.new) == 16 for row in rows)
    plain = spec_serve(target, prompts, methods, new_tokens=16, max_nodes=0, ragged=ragged)  # drafting switched off
    assert [row.new for row in plain] == alone and all(row.stats.target_forwards == 15 for row in plain)
    cut = spec_serve(target, prompts, methods, new_tokens=16, ragged=ragged,
                     keep=lambda row, tree: len(row.new) % 3)  # trees cut to depth 0, 1 or 2 by turns
    assert [row.new for row in cut] == alone
    assert all(row.drafted[1] <= 2 for row in cut) and any(sum(row.stats.accepted_per_step) for row in cut)


class KeptLogits(ContinuousBatch):
    """Keeps the logits of every position each row kept (its accepted path and bonus, in order)."""

    kept: ClassVar[dict[Row, list[torch.Tensor]]] = {}  # shared by the batches of a test

    def _accept(self, row, tree, logits, tokens):
        kept = super()._accept(row, tree, logits, tokens)
        self.kept.setdefault(row, []).extend(logits[i].clone() for i in kept)
        return kept


def test_ragged_verify_is_bit_for_bit_plain_decoding_in_any_batch(target, single_thread):
    """With `ragged_verify`, a speculative row's logits at every position are the same bits whether it
    drafted or not, and alone or beside other rows (drafting and plain)."""
    prompts = [p * 2 for p in PROMPTS]
    methods = ["oracle", "prompt_lookup", "token_recycling", "lookahead", None]
    runs = []
    for max_nodes, groups in ((None, [range(5)]), (0, [range(5)]), (None, [[i] for i in range(5)])):
        rows = [row for group in groups for row in spec_serve(target, [prompts[i] for i in group], [methods[i] for i in group],
                                                              new_tokens=14, max_nodes=max_nodes, ragged=True,
                                                              batch_type=KeptLogits)]
        runs.append([KeptLogits.kept[row][:13] for row in rows])  # the positions after the first token
        if max_nodes is None:
            assert sum(sum(row.stats.accepted_per_step) for row in rows) > 3  # verified positions are compared
    for drafting, plain, alone in zip(*runs, strict=True):
        assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(drafting, plain, alone, strict=True))


def test_a_row_that_cannot_draft_in_a_batch_is_refused(target):
    from warpdecode.decoding.generate import build_method
    from warpdecode.errors import CapabilityError

    batch = ContinuousBatch(target, max_rows=2, max_len=64, stop_ids=set())
    with pytest.raises(CapabilityError, match="cannot draft for a row of a batch"):
        batch.add([1, 2, 3], max_new_tokens=4, sampler=Sampler(SamplingConfig()),
                  method=build_method("draft_model", options={"layers": 1}))


def test_sampled_speculative_rows_keep_to_their_budget(target, single_thread):
    config = SamplingConfig(do_sample=True, temperature=0.8, seed=5)
    rows = spec_serve(target, [p * 2 for p in PROMPTS[:3]], ["prompt_lookup", "token_recycling", None],
                      new_tokens=12, config=config)
    assert all(len(row.new) == 12 and row.finish == "length" for row in rows)
    assert all(0 <= t < target.config.vocab_size for row in rows for t in row.new)


@pytest.mark.slow
def test_real_model_ragged_speculation_is_exact(smollm2, single_thread):
    """The default model, 8 rows with prompt lookup, token recycling and plain decoding side by side:
    every row's greedy tokens equal plain decoding alone, and the drafters do get tokens accepted."""
    tok = smollm2.tokenizer
    code = "def area(r):\n    return 3.14 * r * r\n\ndef perimeter(r):\n    return 2 * 3.14 * r\n\n"
    texts = [code + "def volume(r):", "List: apple, banana, cherry, apple, banana,", code + "def diameter(r):",
             "The capital of France is", "1, 2, 3, 4, 5, 6, 7,", "Say hello three times: hello hello", code,
             "Q: What is 12 * 7?\nA:"]
    prompts = [tok.encode(t) for t in texts]
    methods = ["prompt_lookup", "token_recycling", "prompt_lookup", None, "token_recycling", "prompt_lookup",
               "adaptive_ngram", None]
    rows = spec_serve(smollm2.model, prompts, methods, new_tokens=20)
    for prompt, row in zip(prompts, rows, strict=True):
        assert row.new == generate(smollm2.model, tok, prompt, max_new_tokens=20, stop_at_eos=False).token_ids
    accepted = sum(sum(row.stats.accepted_per_step) for row in rows)
    assert accepted > 10


def test_draft_budget_drafts_where_it_measured_more_tokens_per_second():
    from warpdecode.decoding.continuous import DraftBudget

    budget = DraftBudget(explore_every=4)  # every 4 steps at one row, 64 at 16 rows
    assert [DraftBudget.bucket(n) for n in (1, 2, 3, 4, 5, 9, 16, 17)] == [1, 2, 4, 4, 8, 16, 16, 32]
    assert budget.choose(1, can_draft=False) is False
    assert budget.choose(1, can_draft=True) is True  # nothing measured: draft first
    budget.observe(1, True, tokens=2, seconds=0.030)
    assert budget.choose(1, can_draft=True) is False  # then the plain step
    budget.observe(1, False, tokens=1, seconds=0.020)
    assert [budget.choose(1, can_draft=True) for _ in range(4)] == [True, False, True, True]  # 67 vs 50 tok/s; explore
    assert budget.choose(2, can_draft=True) is True  # it won at one row: tried at two
    assert budget.choose(16, can_draft=True) is False  # not measured at 8 rows: not tried at 16
    budget.observe(16, True, tokens=19, seconds=0.260)
    budget.observe(16, False, tokens=16, seconds=0.048)
    assert budget.choose(12, can_draft=True) is False  # 73 vs 333 tok/s (12 rows: the 9-16 bucket)
    assert budget.choose(32, can_draft=True) is False  # lost at 16 rows: not tried with more
    for _ in range(10):
        budget.observe(16, True, tokens=30, seconds=0.060)  # the traffic changed: drafting got cheap
    assert budget.rate(16, True) > budget.rate(16, False) and budget.choose(16, can_draft=True) is True


@pytest.mark.parametrize("ragged", [False, True])
def test_a_full_row_limits_the_others_trees(target, single_thread, ragged):
    """The step's forward pads every row to the widest tree: a row near the end of its cache row must
    not make it overflow (the others draft smaller trees then), and every row stays exact."""
    from warpdecode.decoding.generate import build_method

    batch = ContinuousBatch(target, max_rows=2, max_len=40, stop_ids=set(), ragged_verify=ragged)
    full, drafting = list(range(3, 33)), [5, 6, 7]
    rows = [batch.add(full, max_new_tokens=10, sampler=Sampler(SamplingConfig())),
            batch.add(drafting, max_new_tokens=30, sampler=Sampler(SamplingConfig()),
                      method=build_method("oracle", options={"num_tokens": 8}))]  # 8 nodes every step
    while batch.rows:
        batch.step()
        for row in [r for r in batch.rows if r.finish is not None]:
            batch.remove(row)
    for prompt, row, n in zip((full, drafting), rows, (10, 30), strict=True):
        assert row.new == generate(target, None, prompt, max_new_tokens=n, stop_at_eos=False).token_ids
    proposed = rows[1].stats.proposed_per_step
    assert max(proposed) == 8 and min(proposed[:9]) < 8  # smaller trees while the full row was near its end


def test_cut_keeps_the_levels_down_to_a_depth():
    from warpdecode.decoding.tree import DraftTree

    chain = DraftTree.chain([7, 8, 9])
    assert chain.cut(1).tokens.tolist() == [7] and chain.cut(0).size == 0 and chain.cut(5) is chain
    tree = DraftTree(torch.tensor([1, 2, 3, 4, 5]), torch.tensor([-1, 0, 0, -1, 3]), torch.rand(5, 8))  # 1 → (2, 3); 4 → 5
    two = tree.cut(1)
    assert two.tokens.tolist() == [1, 4] and two.parents.tolist() == [-1, -1]
    assert torch.equal(two.draft_probs, tree.draft_probs[[0, 3]])


def test_draft_budget_verifies_the_levels_worth_their_cost():
    """Steps of 20 ms plus 2 ms per verified position; trees of 4 nodes accepted to depth 1 a fifth of
    the time, to depth 2 never; trees of 10 nodes always accepted to depth 6. The 4-node trees are
    cut to depth 1 (0.2 token for 2 ms, 100 tok/s, beats the step's 50), the 10-node ones to depth 6."""
    from warpdecode.decoding.continuous import DraftBudget
    from warpdecode.decoding.generate import build_method
    from warpdecode.decoding.tree import DraftTree

    budget = DraftBudget()
    row = Row([1, 2], 10, Sampler(SamplingConfig()), method=build_method("prompt_lookup"))
    short, long = DraftTree.chain([5, 6, 7, 8]), DraftTree.chain(list(range(10)))
    assert budget.keep(1, row, short) == 4  # no step measured: the whole tree
    for width in (1, 5, 1, 11, 3):
        budget.observe(1, True, tokens=1, seconds=0.020 + 0.002 * (width - 1), width=width)
    first, per_level = budget.cost(1)
    assert first == pytest.approx(0.020) and per_level == pytest.approx(0.002)
    assert budget.keep(1, row, short) == 4  # levels not measured count as accepted half the time
    for i in range(100):
        row.drafted, row.stats.accepted_per_step = (4, 4), [int(i % 5 == 0)]
        budget.learn(row)
        row.drafted, row.stats.accepted_per_step = (10, 10), [6]
        budget.learn(row)
    assert budget.accepted("prompt_lookup", 4, 1) == pytest.approx(0.2, abs=0.02)
    assert budget.keep(1, row, short) == 1
    assert budget.keep(1, row, long) == 6
    assert budget.keep(16, row, long) == 10  # nothing measured at 16 rows


def test_draft_budget_drafts_at_every_step_of_one_row_when_trees_are_cut():
    from warpdecode.decoding.continuous import DraftBudget
    from warpdecode.decoding.generate import build_method
    from warpdecode.decoding.tree import DraftTree

    budget = DraftBudget(explore_every=4)
    budget.observe(1, True, tokens=1, seconds=0.030)
    budget.observe(1, False, tokens=1, seconds=0.020)  # plain measured faster: noise at one row, or a real loss
    assert [budget.choose(1, can_draft=True) for _ in range(4)] == [False, False, False, True]
    assert all(budget.choose(1, can_draft=True, cut=True) for _ in range(8))  # cut to what pays: a plain step at worst
    assert budget.choose(2, can_draft=True, cut=True) is True  # one row, cut, counts as won: tried at two
    row = Row([1, 2], 10, Sampler(SamplingConfig()), method=build_method("lookahead"))
    row.drafted, row.stats.accepted_per_step = (6, 2), [1]
    row.state = DecodeState(None, None, [1, 2], 2, row.sampler)
    row.state.forward_tree = DraftTree(torch.tensor([5, 6, 7]), torch.tensor([-1, 0, -1]), auxiliary=1)
    budget.learn(row)
    assert budget.uncut == {"lookahead"}  # a window the cut cannot keep: the server compares modes for it

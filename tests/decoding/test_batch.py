"""Batched plain decoding: each row equals decoding its prompt alone."""

import pytest
import torch
from tiny_models import random_model

from warpdecode.decoding.batch import decode_batch
from warpdecode.decoding.generate import generate, generate_batch
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.errors import ConfigError

PROMPTS = [[5, 6, 7], list(range(10, 30)), [1, 2, 3, 4, 5, 6, 7, 8, 9]]


@pytest.fixture(scope="module")
def target():
    return random_model(seed=2, std=0.3, vocab_size=64, n_layer=2, n_head=4, n_kv_head=2, d_model=32, d_ff=64,
                        max_seq_len=64)


@pytest.mark.parametrize("penalties", [{}, {"repetition_penalty": 1.5, "frequency_penalty": 0.3}])
def test_batch_rows_equal_single_prompt_decoding(target, penalties, single_thread):
    batch = generate_batch(target, None, PROMPTS, max_new_tokens=12, stop_at_eos=False, **penalties)
    for prompt, out in zip(PROMPTS, batch, strict=True):
        alone = generate(target, None, prompt, max_new_tokens=12, stop_at_eos=False, **penalties)
        assert out.token_ids == alone.token_ids
        assert out.finish_reason == "length" and out.stats.new_tokens == 12 and out.stats.target_forwards == 11


def test_finished_rows_leave_and_the_others_go_on(target, single_thread):
    alone = [generate(target, None, p, max_new_tokens=10, stop_at_eos=False).token_ids for p in PROMPTS]
    stop = alone[0][2]  # row 0 stops at its third token; the others must not be disturbed
    results = decode_batch(target, PROMPTS, Sampler(SamplingConfig()), budgets=[10, 10, 4], stop_ids={stop})
    tokens, finish, stats = results[0]
    assert tokens == alone[0][: alone[0].index(stop) + 1] and finish == "eos"
    for i in (1, 2):
        expected = alone[i][: 10 if i == 1 else 4]
        if stop in expected:
            expected = expected[: expected.index(stop) + 1]
        assert results[i][0] == expected
    assert results[2][1] in ("length", "eos") and len(results[2][0]) <= 4
    assert stats.seconds <= results[1][2].seconds


def test_context_limit_is_per_row(target, single_thread):
    long_prompt = list(range(1, 60))  # 59 of 64 positions: 5 tokens of room
    outs = generate_batch(target, None, [long_prompt, [1, 2]], max_new_tokens=8, stop_at_eos=False)
    assert len(outs[0].token_ids) == 5 and outs[0].finish_reason == "context"
    assert len(outs[1].token_ids) == 8 and outs[1].finish_reason == "length"


def test_seeded_batch_sampling_is_reproducible(target, single_thread):
    a = generate_batch(target, None, PROMPTS, max_new_tokens=6, do_sample=True, seed=3, top_p=0.9)
    b = generate_batch(target, None, PROMPTS, max_new_tokens=6, do_sample=True, seed=3, top_p=0.9)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]


@pytest.mark.parametrize("prompts, kwargs, message", [
    ([], {}, "at least one prompt"),
    ([[1, 2]], {"temprature": 0.5}, "sampling options"),
    ([[1, 2], []], {}, "the prompt is empty"),
    ([[1, 2]], {"max_new_tokens": 0}, "--max-new-tokens"),
])
def test_bad_requests_raise_config_errors(target, prompts, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        generate_batch(target, None, prompts, **kwargs)


@pytest.mark.parametrize("layer", [1, 2])
def test_captured_hidden_states_equal_a_teacher_forced_forward(target, layer, single_thread):
    alone = generate(target, None, PROMPTS[0], max_new_tokens=10, stop_at_eos=False).token_ids
    stop = alone[3]  # row 0 finishes early, so rows leave the batch at different steps
    results = decode_batch(target, PROMPTS, Sampler(SamplingConfig()), budgets=[10, 7, 1], stop_ids={stop},
                           hidden_layer=layer)
    plain = decode_batch(target, PROMPTS, Sampler(SamplingConfig()), budgets=[10, 7, 1], stop_ids={stop})
    for prompt, (new, finish, _, hidden), (plain_new, plain_finish, _) in zip(PROMPTS, results, plain, strict=True):
        assert (new, finish) == (plain_new, plain_finish)
        tokens = torch.tensor(prompt + new)
        assert hidden.shape == (len(tokens) - 1, target.config.d_model)
        forced = target(tokens[None], hidden_layers=(layer,)).hidden_states[layer][0, :-1]  # (T - 1, C)
        torch.testing.assert_close(hidden, forced, atol=1e-4, rtol=1e-4)
    assert [len(r[0]) for r in results] == [4, 7, 1]

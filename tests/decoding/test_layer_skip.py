"""SWIFT-style layer skipping: skip-set moves, the on-the-fly search, losslessness."""

import random

import pytest
from tiny_models import random_model

from warpdecode.decoding.drafters.layer_skip import LayerSkipDrafter, initial_skip, mutate
from warpdecode.decoding.generate import build_method, generate
from warpdecode.errors import ConfigError


def test_initial_skip_spreads_over_the_middle():
    assert initial_skip(10, 3) == [2, 4, 6]
    assert initial_skip(4, 2) == [1, 2]
    for n_layer, num_skip in [(30, 6), (12, 10), (6, 1)]:
        skip = initial_skip(n_layer, num_skip)
        assert len(skip) == num_skip and 0 not in skip and n_layer - 1 not in skip


def test_mutation_swaps_one_skipped_layer_for_one_kept_intermediate_layer():
    rng = random.Random(0)
    for _ in range(50):
        skip = mutate([2, 4, 6], 10, rng)
        assert len(skip) == 3 and len(set(skip) & {2, 4, 6}) == 2 and set(skip) <= set(range(1, 9))


def target():
    return random_model(seed=1, std=0.3, vocab_size=64, n_layer=6, n_head=4, n_kv_head=2, d_model=32, d_ff=64,
                        max_seq_len=256)


@pytest.mark.parametrize("bits", [None, 4])
def test_layer_skip_is_lossless_and_searches_while_decoding(bits, single_thread):
    model = target()
    prompt = [3, 9, 27, 17, 51, 25, 11, 40]
    plain = generate(model, None, prompt, max_new_tokens=40, stop_at_eos=False)
    method = build_method("layer_skip", options={"num_skip": 2, "bits": bits, "search_steps": 6, "window": 8})
    out = generate(model, None, prompt, max_new_tokens=40, stop_at_eos=False, method=method)
    assert out.token_ids == plain.token_ids
    drafter = method.drafter
    assert drafter.steps == out.stats.target_forwards and len(drafter.skip) == 2
    assert sum(out.stats.proposed_per_step) > 0


def test_search_climbs_the_score_and_never_steps_down(single_thread):
    """With a synthetic score that prefers skipping early blocks, the search walks to the best set."""
    method = build_method("layer_skip", options={"num_skip": 3, "search_steps": 30, "candidates": 3})
    drafter = method.drafter
    drafter.score = lambda state, keep: sum(keep)  # keeping late blocks scores higher
    chosen = []
    original = drafter.use_skip

    def recording(skip):
        original(skip)
        chosen.append(skip)

    drafter.use_skip = recording
    generate(target(), None, [3, 9, 27, 17, 51, 25, 11, 40], max_new_tokens=40, stop_at_eos=False, method=method)
    searched = chosen[2:]  # after prepare() and start() set the initial skip set
    values = [-sum(skip) for skip in searched]
    assert values == sorted(values)  # each switch is an improvement
    assert drafter.skip == [1, 2, 3]


def test_bad_options():
    with pytest.raises(ConfigError):
        LayerSkipDrafter(num_skip=0)
    with pytest.raises(ConfigError, match="bits"):
        LayerSkipDrafter(bits=3)
    with pytest.raises(ConfigError, match="num_skip"):
        generate(target(), None, [1, 2, 3], max_new_tokens=3, method=build_method("layer_skip", options={"num_skip": 5}))

"""The block-wise denoising loop: layout, blocks, end-of-text stopping, batching, input checks."""

from __future__ import annotations

import pytest
import torch
from oracle_dlm import EOS, MASK, OracleDLM
from tiny_models import random_model

from warpdecode.decoding.diffusion.decoder import diffusion_generate, end_of_text_fill
from warpdecode.decoding.diffusion.layout import layout
from warpdecode.decoding.diffusion.policies.fixed import FixedCommit
from warpdecode.decoding.diffusion.policies.threshold import ThresholdCommit
from warpdecode.errors import ConfigError

PROMPT = [5, 6, 7]
ANSWER = [9, 10, 11, 12, 13, EOS, EOS, EOS]


def oracle(confidences: list[float]) -> OracleDLM:
    truth = torch.tensor([PROMPT + ANSWER])
    c = torch.tensor([[0.99] * len(PROMPT) + confidences])
    return OracleDLM(truth, c)


def test_layout_masks_the_answer_region_and_hides_padding() -> None:
    tokens, answer, attention = layout([[5, 6], [5, 6, 7, 8]], 3, MASK, EOS)
    assert tokens.tolist() == [[5, 6, MASK, MASK, MASK, EOS, EOS], [5, 6, 7, 8, MASK, MASK, MASK]]
    assert answer.tolist() == [[False, False, True, True, True, False, False], [False] * 4 + [True] * 3]
    assert attention[0, 0].tolist() == [True] * 5 + [False, False]  # padding is invisible to real positions
    assert attention[0, :, 5].tolist() == [False] * 5 + [True, False]  # a padding key: only its own query
    assert attention[1].all()


def test_one_token_per_step_commits_in_confidence_order_within_blocks() -> None:
    model = oracle([0.5, 0.9, 0.6, 0.95, 0.7, 0.8, 0.99, 0.3])
    out = diffusion_generate(model, [PROMPT], FixedCommit(1), gen_length=8, block_length=4, eos_token_id=EOS)
    assert out.answers == [ANSWER[:5]]
    assert out.stats.steps == [8] and out.stats.forwards == 8
    order = [int((before != after).nonzero()[0, 1]) - len(PROMPT) for before, after in zip(model.seen, model.seen[1:])]
    # block 0 (answer positions 0-3) by confidence 0.95, 0.9, 0.6, 0.5, then block 1 (4-7): 0.99, 0.8, 0.7
    assert order == [3, 1, 2, 0, 6, 5, 4]


def test_threshold_commits_every_confident_position_of_the_block_at_once() -> None:
    model = oracle([0.95, 0.95, 0.5, 0.95, 0.95, 0.95, 0.95, 0.95])
    out = diffusion_generate(model, [PROMPT], ThresholdCommit(0.9), gen_length=8, block_length=4, eos_token_id=EOS)
    assert out.answers == [ANSWER[:5]]
    # step 1: three confident positions of block 0; step 2: the last one (forced progress); step 3: block 1
    assert out.stats.committed_per_step == [[3], [1], [4]]


def test_end_of_text_stop_fills_the_rest_of_the_answer() -> None:
    # the first EOS (answer position 5) is the most confident: committed first, then 6 and 7 come free
    model = oracle([0.5, 0.5, 0.5, 0.5, 0.5, 0.99, 0.4, 0.4])
    out = diffusion_generate(model, [PROMPT], FixedCommit(1), gen_length=8, block_length=8, eos_token_id=EOS,
                             eot_stop=True)
    assert out.answers == [ANSWER[:5]]
    assert out.stats.committed_per_step[0] == [3] and out.stats.steps == [6]


def test_end_of_text_fill_only_after_a_committed_end_of_text() -> None:
    tokens = torch.tensor([[5, 9, EOS, MASK, MASK], [5, MASK, 9, EOS, MASK]])
    masked = tokens == MASK
    answer = torch.tensor([[False, True, True, True, True]] * 2)
    assert end_of_text_fill(tokens, masked, answer, EOS).tolist() == [[False, False, False, True, True],
                                                                       [False, False, False, False, True]]


def test_a_batch_decodes_each_row_as_it_would_alone() -> None:
    model = random_model(seed=4, std=0.5, vocab_size=16, n_layer=2, n_head=2, d_model=16, d_ff=32, max_seq_len=32,
                         causal=False, mask_token_id=MASK)
    prompts = [[3, 4, 5], [6, 7, 8, 9, 10, 11], [12, 2]]
    for policy in (FixedCommit(1), ThresholdCommit(0.3)):
        together = diffusion_generate(model, prompts, policy, gen_length=6, block_length=3, eos_token_id=EOS)
        alone = [diffusion_generate(model, [p], policy, gen_length=6, block_length=3, eos_token_id=EOS) for p in prompts]
        assert together.answers == [a.answers[0] for a in alone]
        assert together.stats.steps == [a.stats.steps[0] for a in alone]
        assert together.stats.forwards == max(together.stats.steps)


def test_refuses_causal_models_missing_masks_and_overlong_prompts() -> None:
    causal = random_model(seed=0, std=0.1, vocab_size=16, n_layer=1, n_head=1, d_model=8, d_ff=8, max_seq_len=16)
    with pytest.raises(ConfigError, match="autoregressive"):
        diffusion_generate(causal, [PROMPT], FixedCommit(), gen_length=4, block_length=4, eos_token_id=EOS)
    causal.config.causal = False
    with pytest.raises(ConfigError, match="mask_token_id"):
        diffusion_generate(causal, [PROMPT], FixedCommit(), gen_length=4, block_length=4, eos_token_id=EOS)
    causal.config.mask_token_id = MASK
    with pytest.raises(ConfigError, match="exceeds the model's context of 16"):
        diffusion_generate(causal, [PROMPT], FixedCommit(), gen_length=14, block_length=4, eos_token_id=EOS)
    with pytest.raises(ConfigError, match="at least one token"):
        diffusion_generate(causal, [[]], FixedCommit(), gen_length=4, block_length=4, eos_token_id=EOS)


def test_sampling_draws_each_candidate_from_the_tempered_distribution() -> None:
    """One masked position, one step: the committed token follows softmax(logits / T) (mask excluded)."""
    from warpdecode.decoding.diffusion.decoder import sample_candidates

    logits = torch.tensor([[[2.0, 5.0, 1.0, 0.0, 1.5]]])  # token 1 is the mask token: never drawn
    generator = torch.Generator().manual_seed(0)
    for temperature in (1.0, 2.0):
        draws = torch.cat([sample_candidates(logits.expand(1, 4000, 5), 1, temperature, generator)[0]
                           for _ in range(5)])
        expected = (logits[0, 0].index_fill(0, torch.tensor([1]), -torch.inf) / temperature).softmax(0)
        freq = torch.bincount(draws, minlength=5).float() / len(draws)
        assert freq[1] == 0
        assert (freq - expected).abs().max() < 0.02, (freq, expected)


def test_sampled_decoding_is_seeded_and_a_tiny_temperature_is_greedy() -> None:
    model = random_model(seed=4, std=0.5, vocab_size=16, n_layer=2, n_head=2, d_model=16, d_ff=32, max_seq_len=32,
                         causal=False, mask_token_id=MASK)
    prompts = [[3, 4, 5], [6, 7, 8, 9]]

    def run(temperature: float, seed: int) -> torch.Tensor:
        return diffusion_generate(model, prompts, ThresholdCommit(0.3), gen_length=6, block_length=3, eos_token_id=EOS,
                                  temperature=temperature, generator=torch.Generator().manual_seed(seed)).sequences

    greedy = diffusion_generate(model, prompts, ThresholdCommit(0.3), gen_length=6, block_length=3,
                                eos_token_id=EOS).sequences
    assert torch.equal(run(1e-4, 0), greedy)
    assert torch.equal(run(1.5, 7), run(1.5, 7))
    assert any(not torch.equal(run(1.5, seed), greedy) for seed in range(5))
    with pytest.raises(ConfigError, match="temperature"):
        run(-1.0, 0)

"""Approximate KV reuse within a block: the refresh is exact, a cached step recomputes only its positions
against the kept keys/values, and decoding with a cache stays a valid decode of every row."""

from __future__ import annotations

import pytest
import torch
from oracle_dlm import EOS, MASK
from tiny_models import random_model

from warpdecode.decoding.diffusion.decoder import diffusion_generate
from warpdecode.decoding.diffusion.kv_reuse import BlockKVReuse, recomputed_positions
from warpdecode.decoding.diffusion.layout import answer_blocks, layout
from warpdecode.decoding.diffusion.policies.fixed import FixedCommit
from warpdecode.decoding.diffusion.policies.threshold import ThresholdCommit
from warpdecode.errors import ConfigError

PROMPTS = [[3, 4, 5], [6, 7, 8, 9, 10, 11], [12, 2]]


def model():
    return random_model(seed=4, std=0.5, vocab_size=16, n_layer=2, n_head=2, d_model=16, d_ff=32, max_seq_len=32,
                        causal=False, mask_token_id=MASK)


def state(gen_length: int = 6, block_length: int = 3):
    tokens, answer, attention = layout(PROMPTS, gen_length, MASK, EOS)
    block = answer_blocks(answer, block_length, tokens.shape[1])
    return tokens, answer, attention, block


def full_logits(net, tokens: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return net(tokens, attention_mask=attention).logits.float()


def test_recomputed_positions_prefix_runs_the_rest_of_the_answer_dual_only_the_block() -> None:
    _, answer, _, block = state()
    current = torch.tensor([[0], [1], [2]])  # row 2 is finished (past its last block)
    prefix = recomputed_positions("prefix", answer, block, current)
    dual = recomputed_positions("dual", answer, block, current)
    assert prefix[0].nonzero().flatten().tolist() == [3, 4, 5, 6, 7, 8]
    assert dual[0].nonzero().flatten().tolist() == [3, 4, 5]
    assert prefix[1].nonzero().flatten().tolist() == dual[1].nonzero().flatten().tolist() == [9, 10, 11]
    assert not prefix[2].any() and not dual[2].any()


@pytest.mark.parametrize("mode", ["prefix", "dual"])
def test_refresh_is_exact_and_an_unchanged_cached_step_reproduces_it(mode: str) -> None:
    net = model()
    tokens, answer, attention, block = state()
    reuse = BlockKVReuse(net, mode, answer, attention)
    current = torch.tensor([[0], [1], [0]])
    exact = full_logits(net, tokens, attention)
    with torch.inference_mode():
        refreshed = reuse(tokens, block, current).clone()
        again = reuse(tokens, block, current).clone()  # nothing committed: the kept keys are not stale
    real = attention[:, 0, :]
    assert torch.allclose(refreshed[real], exact[real], atol=1e-5)
    run = recomputed_positions(mode, answer, block, current)
    assert torch.allclose(again[run], exact[run], atol=1e-5)
    assert reuse.refreshes == 1


@pytest.mark.parametrize("mode", ["prefix", "dual"])
def test_a_cached_step_runs_only_its_positions_and_reads_kept_keys(mode: str) -> None:
    """After a commit inside the block, the cached step equals a forward in which the kept positions'
    keys/values are those of the refresh: check against a by-hand reference that runs the whole
    sequence at the refreshed tokens for the kept part."""
    net = model()
    tokens, answer, attention, block = state()
    current = torch.tensor([[0], [0], [0]])
    reuse = BlockKVReuse(net, mode, answer, attention)
    run = recomputed_positions(mode, answer, block, current)
    committed = tokens.clone()
    first = run.long().argmax(1)  # each row's first answer position
    committed[torch.arange(3), first] = 7
    with torch.inference_mode():
        reuse(tokens, block, current)
        cached = reuse(committed, block, current).clone()
    exact_after = full_logits(net, committed, attention)
    exact_before = full_logits(net, tokens, attention)
    # the run positions moved with the commit (bidirectional attention sees it)...
    assert not torch.allclose(cached[run], exact_before[run], atol=1e-4)
    # ...yet differ from the exact forward only through the stale kept keys (close, not equal)
    assert (cached[run] - exact_after[run]).abs().max() < (exact_before[run] - exact_after[run]).abs().max() + 1e-3
    # positions outside the run keep their refreshed logits
    stale = attention[:, 0, :] & ~run
    assert torch.equal(cached[stale], exact_before[stale].to(cached.dtype)) or torch.allclose(
        cached[stale], exact_before[stale], atol=1e-5)


@pytest.mark.parametrize("mode", ["prefix", "dual"])
def test_decoding_with_reuse_commits_every_answer_position(mode: str) -> None:
    net = model()
    for policy in (FixedCommit(1), ThresholdCommit(0.3)):
        out = diffusion_generate(net, PROMPTS, policy, gen_length=6, block_length=3, eos_token_id=EOS, kv_cache=mode)
        committed = torch.tensor(out.stats.committed_per_step).sum(0)
        assert committed.tolist() == [6, 6, 6]
        assert out.stats.forwards == max(out.stats.steps) >= 2  # two blocks at least one step each
        if isinstance(policy, FixedCommit):
            assert out.stats.steps == [6, 6, 6]


def test_a_single_block_one_token_per_step_with_the_dual_cache_matches_plain_decoding_at_step_one() -> None:
    """With one token per step the first commit of each block comes from an exact forward."""
    net = model()
    gen = 4
    plain = diffusion_generate(net, [PROMPTS[1]], FixedCommit(1), gen_length=gen, block_length=1, eos_token_id=EOS)
    dual = diffusion_generate(net, [PROMPTS[1]], FixedCommit(1), gen_length=gen, block_length=1, eos_token_id=EOS,
                              kv_cache="dual")
    # blocks of one position: every step is a block's first, so every step is exact
    assert torch.equal(plain.sequences, dual.sequences)


def test_bad_modes_and_free_draft_with_a_cache_are_refused() -> None:
    from warpdecode.decoding.diffusion.free_draft import FreeDraftVerify

    net = model()
    with pytest.raises(ConfigError, match="kv_cache must be one of"):
        diffusion_generate(net, PROMPTS, FixedCommit(1), gen_length=6, block_length=3, eos_token_id=EOS, kv_cache="full")
    with pytest.raises(ConfigError, match="free_draft"):
        diffusion_generate(net, [PROMPTS[0]], FreeDraftVerify(), gen_length=6, block_length=3, eos_token_id=EOS,
                           kv_cache="dual")

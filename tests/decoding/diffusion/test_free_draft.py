"""FreeDave: the output of one-token-per-step decoding, token for token, in fewer forwards."""

from __future__ import annotations

import pytest
import torch
from oracle_dlm import EOS, MASK, OracleDLM
from tiny_models import random_model

from warpdecode.decoding.diffusion.decoder import diffusion_generate
from warpdecode.decoding.diffusion.free_draft import FreeDraftVerify, static_choice
from warpdecode.decoding.diffusion.policies.fixed import FixedCommit
from warpdecode.errors import ConfigError


def test_static_choice_is_the_most_confident_masked_position_of_the_first_open_block() -> None:
    confidence = torch.tensor([0.9, 0.2, 0.8, 0.99, 0.5])
    block = torch.tensor([5, 0, 0, 1, 1])
    assert static_choice(confidence, torch.tensor([False, True, True, True, True]), block) == 2
    assert static_choice(confidence, torch.tensor([False, False, False, True, True]), block) == 3
    assert static_choice(confidence, torch.zeros(5, dtype=torch.bool), block) is None


def test_drafts_that_hold_are_all_accepted() -> None:
    truth = torch.tensor([[5, 6] + list(range(7, 15))])
    model = OracleDLM(truth, torch.full(truth.shape, 0.7))
    out = diffusion_generate(model, [[5, 6]], FreeDraftVerify(4), gen_length=8, block_length=4, eos_token_id=EOS)
    assert out.answers == [list(range(7, 15))]
    # one forward of the prompt, four drafted states, then three (the fourth would be complete)
    assert out.stats.forwards == 3 and [len(s) for s in model.seen] == [1, 4, 3]
    assert out.stats.committed_per_step == [[4], [4]]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_output_is_token_identical_to_one_token_per_step_decoding(seed: int) -> None:
    model = random_model(seed=seed, std=0.5, vocab_size=16, n_layer=2, n_head=2, d_model=16, d_ff=32, max_seq_len=40,
                         causal=False, mask_token_id=MASK)
    saved = 0
    for prompt in ([3, 4, 5], [6, 7, 8, 9, 10, 11], [12, 2]):
        for block_length in (4, 12):
            static = diffusion_generate(model, [prompt], FixedCommit(1), gen_length=12, block_length=block_length,
                                        eos_token_id=EOS)
            free = diffusion_generate(model, [prompt], FreeDraftVerify(3), gen_length=12, block_length=block_length,
                                      eos_token_id=EOS)
            assert torch.equal(free.sequences, static.sequences)
            assert free.stats.forwards <= static.stats.forwards + 1
            saved += static.stats.forwards - free.stats.forwards
    assert saved > 0  # some drafts held on these random models


def test_free_draft_refuses_batches_and_end_of_text_stopping() -> None:
    model = random_model(seed=0, std=0.5, vocab_size=16, n_layer=1, n_head=2, d_model=16, d_ff=32, max_seq_len=40,
                         causal=False, mask_token_id=MASK)
    with pytest.raises(ConfigError, match="one prompt at a time"):
        diffusion_generate(model, [[3], [4]], FreeDraftVerify(), gen_length=4, block_length=4, eos_token_id=EOS)
    with pytest.raises(ConfigError, match="without eot_stop"):
        diffusion_generate(model, [[3]], FreeDraftVerify(), gen_length=4, block_length=4, eos_token_id=EOS, eot_stop=True)
    with pytest.raises(ConfigError, match="draft_length"):
        FreeDraftVerify(1)


def test_every_commit_policy_says_whether_it_replaces_the_loop() -> None:
    """`diffusion_generate` dispatches on the `replaces_loop` capability, never on a class: a policy
    that replaces the loop implements `decode`, the others inherit the shared loop."""
    from warpdecode.decoding import registry

    for name in registry.names("commit_policy"):
        cls = registry.get("commit_policy", name)
        assert isinstance(cls.replaces_loop, bool), name
        assert callable(getattr(cls, "decode", None)) == cls.replaces_loop, name
    assert registry.get("commit_policy", "free_draft").replaces_loop

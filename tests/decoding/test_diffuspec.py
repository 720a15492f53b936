"""DiffuSpec: the diffusion LM's filled answer region is the chain the target verifies."""

from __future__ import annotations

import pytest
from tiny_models import greedy_target, naive_greedy, save_diffusion_drafter

from warpdecode.decoding.diffusion.decoder import diffusion_generate
from warpdecode.decoding.diffusion.policies.fixed import FixedCommit
from warpdecode.decoding.drafters.diffuspec import DiffuSpecDrafter, confident_prefix
from warpdecode.decoding.generate import build_method, generate
from warpdecode.decoding.protocols import DecodeState
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.errors import ConfigError
from warpdecode.models.cache import KVCache
from warpdecode.models.checkpoint import load_pretrained


@pytest.fixture(scope="module")
def dlm(tmp_path_factory) -> str:
    return str(save_diffusion_drafter(tmp_path_factory.mktemp("dlm") / "model", 64))


def state_of(target, tokens: list[int]) -> DecodeState:
    return DecodeState(target, KVCache.for_model(target.config, 1, 64), tokens, 2, Sampler(SamplingConfig()))


def test_confident_prefix_cuts_before_the_first_unsure_position() -> None:
    assert confident_prefix([0.9, 0.8, 0.3, 0.9], 0.5) == 2
    assert confident_prefix([0.1, 0.9], 0.5) == 1  # at least one token
    assert confident_prefix([0.1, 0.9], None) == 2


def test_the_chain_is_the_diffusion_lms_answer_region_capped_by_the_budget(dlm: str) -> None:
    target = greedy_target()
    drafter = DiffuSpecDrafter(model=dlm, num_tokens=6, steps=3)
    drafter.prepare(target)
    tokens = [3, 9, 27, 5, 11]
    model, tokenizer = load_pretrained(dlm)
    direct = diffusion_generate(model, [tokens], FixedCommit(2), gen_length=6, block_length=6,
                                eos_token_id=tokenizer.eos_token_id)
    expected = direct.sequences[0, len(tokens):].tolist()
    chain = drafter.propose(state_of(target, tokens), budget=10)
    assert chain.tokens.tolist() == expected and chain.depth == 6
    assert drafter.propose(state_of(target, tokens), budget=4).tokens.tolist() == expected[:4]
    confident = DiffuSpecDrafter(model=dlm, num_tokens=6, steps=3, min_confidence=0.999)
    confident.prepare(target)
    assert confident.propose(state_of(target, tokens), budget=10).depth < 6  # a random model is never that sure


def test_the_context_window_reads_only_the_latest_tokens(dlm: str) -> None:
    target = greedy_target()
    windowed = DiffuSpecDrafter(model=dlm, num_tokens=4, context=3)
    windowed.prepare(target)
    full = DiffuSpecDrafter(model=dlm, num_tokens=4)
    full.prepare(target)
    long, short = [7, 8, 1, 2, 3], [1, 2, 3]
    assert windowed.propose(state_of(target, long), 8).tokens.tolist() == full.propose(state_of(target, short), 8).tokens.tolist()


def test_greedy_output_is_the_targets_and_bad_setups_are_refused(dlm: str, tmp_path) -> None:
    target = greedy_target()
    prompt = [5, 6, 7, 8, 5, 6]
    out = generate(target, None, prompt, max_new_tokens=20, stop_at_eos=False,
                   method=build_method("diffuspec", options={"model": dlm}))
    assert out.token_ids == naive_greedy(target, prompt, 20)
    for options, message in (({}, "needs model="), ({"model": dlm, "steps": 9}, "1 <= steps <= num_tokens"),
                             ({"model": dlm, "min_confidence": 1.5}, "min_confidence")):
        with pytest.raises(ConfigError, match=message):
            DiffuSpecDrafter(**options)
    small = save_diffusion_drafter(tmp_path / "small", 32)
    with pytest.raises(ConfigError, match="share the target's tokenizer"):
        DiffuSpecDrafter(model=str(small)).prepare(target)
    model, _ = load_pretrained(dlm)
    model.config.causal = True
    from warpdecode.models.checkpoint import save_pretrained

    save_pretrained(model, load_pretrained(dlm)[1], tmp_path / "causal")
    with pytest.raises(ConfigError, match="autoregressive"):
        DiffuSpecDrafter(model=str(tmp_path / "causal")).prepare(target)

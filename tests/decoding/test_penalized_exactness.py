"""Speculative decoding with penalties is token-identical to plain decoding with the same penalties.

Every tree row must be penalised with its own context (committed tokens + root-to-node path); a
verifier that penalised every row with the committed tokens only would diverge on repetitive text.
"""

import pytest
import torch
from tiny_models import greedy_target

from warpdecode.decoding import registry
from warpdecode.decoding.generate import build_method, generate

PENALTIES = [
    {"repetition_penalty": 1.8},
    {"frequency_penalty": 0.7, "presence_penalty": 0.4},
]


@pytest.fixture(scope="module")
def target():
    return greedy_target()


def naive_penalized_greedy(model, ids, n, repetition_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0):
    """Full recompute; penalties written out per token, independently of `processors`."""
    seq = list(ids)
    with torch.inference_mode():
        for _ in range(n):
            logits = model(torch.tensor([seq])).logits[0, -1].clone()
            for token in set(seq):
                if repetition_penalty != 1.0:
                    value = logits[token]
                    logits[token] = value / repetition_penalty if value > 0 else value * repetition_penalty
            generated = seq[len(ids):]
            for token in set(generated):
                logits[token] -= frequency_penalty * generated.count(token) + presence_penalty
            seq.append(int(logits.argmax()))
    return seq[len(ids):]


@pytest.mark.parametrize("penalties", PENALTIES, ids=["repetition", "frequency_presence"])
@pytest.mark.parametrize("name", registry.names("drafter"))
def test_greedy_identity_with_penalties(target, name, penalties, drafter_options, single_thread):
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]  # repetitive: drafts are proposed and penalties bite
    out = generate(target, None, prompt, max_new_tokens=24, stop_at_eos=False,
                   method=build_method(name, options=drafter_options.get(name, {})), **penalties)
    assert out.token_ids == naive_penalized_greedy(target, prompt, 24, **penalties)


def test_penalties_change_the_output(target, single_thread):
    """Power check: the penalised reference differs from plain greedy on this prompt."""
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    plain = generate(target, None, prompt, max_new_tokens=24, stop_at_eos=False).token_ids
    for penalties in PENALTIES:
        assert naive_penalized_greedy(target, prompt, 24, **penalties) != plain

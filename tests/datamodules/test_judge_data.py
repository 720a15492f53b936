"""Judge labels: substitutes along the target's greedy answers, labelled by whether the target's own
rollout comes back to its answer; the batched rollouts equal a naive recomputation."""

from __future__ import annotations

import pytest
import torch
from tiny_models import naive_greedy

from warpdecode.datamodules.judge import JudgeDataModule, judge_samples, rejoins
from warpdecode.datamodules.self_distill import Example
from warpdecode.errors import ConfigError
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.models.judge_head import judge_signals

pytestmark = pytest.mark.usefixtures("single_thread")
STOP = {0}


@pytest.mark.parametrize("rollout, original, expected", [
    ([9, 4, 5, 6, 7], [4, 5, 6, 7, 8], True),        # paraphrase of one token, then the same words
    ([9, 8, 4, 5, 6], [4, 5, 6, 7, 8], True),        # one token longer, rejoins a step later
    ([9, 4, 5, 6, 9], [4, 5, 6, 7, 8], False),       # the substitute is carried forward
    ([9, 3, 3, 3, 3], [4, 5, 6, 7, 8], False),
    ([9, 6, 7, 0, 11], [4, 5, 6, 7, 0], True),       # stops where the original stops
    ([9, 6, 7, 0, 11], [4, 5, 6, 7, 8], False),      # stops where the original goes on
    ([9, 6, 7, 8, 2], [6, 0, 6, 7, 8], False),       # the match is after the original's stop
], ids=["paraphrase", "shifted", "carried", "lost", "same-stop", "early-stop", "after-stop"])
def test_rejoins(rollout, original, expected):
    assert rejoins(rollout, original, 3, STOP) is expected


def test_samples_equal_a_naive_rollout(tiny_model_dir):
    model, _ = load_pretrained(tiny_model_dir)
    stop = set(model.config.eos_token_ids)
    prompt = [5, 9, 12, 40]
    answer = naive_greedy(model, prompt, 40)
    if stop & set(answer):
        answer = answer[: min(answer.index(s) for s in stop & set(answer)) + 1]
    tokens = prompt + answer
    example = Example(torch.tensor(tokens).numpy().astype("int32"), len(prompt), None)
    window, slack, min_match = 6, 3, 2
    out = judge_samples(model, [example], substitutes_per_answer=5, window=window, slack=slack, min_match=min_match,
                        stop_ids=stop, seed=0, desc="test")
    assert out["features"].shape == (5, model.config.d_model) and out["signals"].shape == (5, 3)
    assert len(set(out["positions"].tolist())) == 5  # distinct positions
    L = model.config.n_layer
    with torch.inference_mode():
        for i, (t, x) in enumerate(zip(out["positions"].tolist(), out["substitutes"].tolist(), strict=True)):
            assert len(prompt) <= t < len(tokens) - 1 - (0 if tokens[-1] in stop else window + slack)
            full = model(torch.tensor([tokens[:t]]))
            assert x != int(full.logits[0, -1].argmax()) and x not in stop  # never the target's own token
            assert torch.allclose(out["signals"][i], judge_signals(full.logits[0, -1:], torch.tensor([x]))[0], atol=1e-4)
            hidden = model(torch.tensor([tokens[:t] + [x]]), hidden_layers=(L,)).hidden_states[L][0, -1]
            assert torch.allclose(out["features"][i].float(), hidden, atol=2e-2)
            rollout = [x] + naive_greedy(model, tokens[:t] + [x], window)
            assert bool(out["labels"][i]) == rejoins(rollout, tokens[t + 1 : t + 1 + window + slack], min_match, stop)


def test_bad_settings_are_refused():
    with pytest.raises(ConfigError, match="min_match"):
        JudgeDataModule(window=4, min_match=8)
    with pytest.raises(ConfigError, match="substitutes_per_answer"):
        JudgeDataModule(substitutes_per_answer=0)


@pytest.mark.slow
def test_batched_rollouts_equal_naive_ones_on_the_real_model(smollm2):
    """The real target (GQA, RoPE, packed weights): each substitute's hidden state and rollout from the
    batched, per-row-length cache equal a recomputation of the whole sequence."""
    from warpdecode.decoding.generate import encode_prompt, generate

    model, tokenizer = smollm2.model, smollm2.tokenizer
    prompt = encode_prompt(tokenizer, "Name three primary colors.", chat=True)
    answer = generate(model, tokenizer, prompt, max_new_tokens=24, stop_at_eos=False).token_ids
    tokens = prompt + answer
    example = Example(torch.tensor(tokens).numpy().astype("int32"), len(prompt), None)
    window, slack, min_match = 4, 2, 2
    out = judge_samples(model, [example], substitutes_per_answer=3, window=window, slack=slack, min_match=min_match,
                        stop_ids=set(model.config.eos_token_ids), seed=1, desc="test")
    L = model.config.n_layer
    with torch.inference_mode():
        for i, (t, x) in enumerate(zip(out["positions"].tolist(), out["substitutes"].tolist(), strict=True)):
            full = model(torch.tensor([tokens[:t] + [x]]), hidden_layers=(L,))
            torch.testing.assert_close(out["features"][i].float(), full.hidden_states[L][0, -1], atol=2e-2, rtol=2e-2)
            rollout = [x] + naive_greedy(model, tokens[:t] + [x], window)
            assert bool(out["labels"][i]) == rejoins(rollout, tokens[t + 1 : t + 1 + window + slack], min_match,
                                                     set(model.config.eos_token_ids))

"""Cautious next-token prediction: the trial schedule by hand, and the batched rule against a reference
that recomputes every trial row from scratch (no cache) and keeps the lowest-perplexity trial, drawing
the same uniforms (one per row and step, the authors' semantics with explicit randomness)."""

import json
import math

import pytest
import torch

from warpdecode.decoding import registry
from warpdecode.decoding.generate import generate
from warpdecode.decoding.rules.cntp import inverse_cdf, punctuation_ids, trial_count
from warpdecode.errors import ConfigError
from warpdecode.models.checkpoint import load_pretrained

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_pretrained(tiny_model_dir)


def test_the_schedule():
    assert [trial_count(h, 0.01, 1.5, 10) for h in (0.0, 0.01, 0.17, 0.18, 0.76, 1.49, 1.5, 7.0)] == [
        1, 1, 1, 1 + int(9 * (0.17 / 1.49)), 5, 9, 10, 10]
    assert trial_count(0.18, 0.01, 1.5, 10) == 2  # the first step above one trial: (H - low) / (high - low) >= 1/9
    assert [trial_count(h, 1.0, 3.0, 4) for h in (0.5, 1.5, 2.0, 2.5, 3.0)] == [1, 1, 2, 3, 4]


def test_inverse_cdf_never_picks_a_filtered_token():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]]).expand(5, -1)
    assert inverse_cdf(probs, torch.tensor([0.0, 0.49, 0.5, 0.99, 0.999999])).tolist() == [1, 1, 3, 3, 3]


def context_hook(input_ids, scores):
    """A caller's processor that reads its row's context: each trial row must get its own."""
    scores[0, int(input_ids[0, -1])] -= 2.0
    scores[0, int(input_ids.sum()) % scores.shape[-1]] += 1.5
    return scores


def reference(model, marks, prompt, n_new, *, seed, temperature, low, high, max_trials, hook=None):
    """Tokens, and the trial counts of each step, by full recompute."""
    g = torch.Generator().manual_seed(seed)

    def dist(seq):
        with torch.inference_mode():
            logits = model(torch.tensor([seq])).logits[0, -1:].float()
            if hook is not None:
                logits = hook(torch.tensor([seq]), logits.clone())
            return torch.softmax(logits[0] / temperature, -1)

    seq, new, counts = list(prompt), [], []
    while len(new) < n_new:
        probs = dist(seq)
        h = float(-(probs * torch.log(probs + 1e-10)).sum())
        n = trial_count(h, low, high, max_trials)
        budget = n_new - len(new)
        if n == 1 or budget == 1:
            counts.append(1)
            pick = inverse_cdf(probs[None], torch.rand(1, generator=g)).tolist()
        else:
            counts.append(n)
            first = inverse_cdf(probs.expand(n, -1), torch.rand(n, generator=g)).tolist()
            trials = [[t] for t in first]
            nll = [[-math.log(float(probs[t]))] for t in first]
            done = [t in marks for t in first]
            while not all(done):
                u = torch.rand(n, generator=g)
                for r in range(n):
                    if not done[r]:
                        p = dist(seq + trials[r])
                        t = int(inverse_cdf(p[None], u[r : r + 1])[0])
                        trials[r].append(t)
                        nll[r].append(-math.log(float(p[t])))
                        done[r] = t in marks or len(trials[r]) >= budget
            ppl = [math.exp(sum(x) / len(x)) for x in nll]
            pick = trials[min(range(n), key=lambda r: ppl[r])]
        seq += pick
        new += pick
    return new[:n_new], counts


@pytest.mark.parametrize("seed, temperature, low, high, max_trials, hook", [
    (0, 1.0, 0.01, 1.5, 10, None), (1, 0.4, 1.0, 5.0, 4, None), (2, 0.7, 2.0, 5.5, 6, None),
    (3, 0.7, 2.0, 5.5, 6, context_hook)])
def test_equals_the_reference(tiny, seed, temperature, low, high, max_trials, hook):
    model, tokenizer = tiny
    marks = punctuation_ids(tokenizer, ".,\n?!:;)]}")
    prompt = tokenizer.encode("Write a story about a cat.\n")
    rule = registry.build("rule", "cntp", max_trials=max_trials, entropy_low=low, entropy_high=high)
    hooks = {"logits_processor": [hook]} if hook is not None else {}
    out = generate(model, tokenizer, prompt, max_new_tokens=30, stop_at_eos=False, do_sample=True,
                   temperature=temperature, seed=seed, rule=rule, **hooks)
    tokens, counts = reference(model, marks, prompt, 30, seed=seed, temperature=temperature, low=low, high=high,
                               max_trials=max_trials, hook=hook)
    assert out.token_ids == tokens
    assert max(counts) > 1  # trials ran
    again = generate(model, tokenizer, prompt, max_new_tokens=30, stop_at_eos=False, do_sample=True,
                     temperature=temperature, seed=seed, rule=rule, **hooks)
    assert again.token_ids == out.token_ids


def test_keeps_the_lowest_perplexity_trial(tiny):
    """With many trials at every step the kept text is more likely than plain sampling's, per token."""
    model, tokenizer = tiny
    prompt = tokenizer.encode("for i in range(10):\n")

    def mean_nll(ids):
        with torch.inference_mode():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
        return float(torch.nn.functional.cross_entropy(logits, torch.tensor(ids)))

    cautious, plain = [], []
    for seed in range(3):
        kwargs = {"max_new_tokens": 40, "stop_at_eos": False, "do_sample": True, "seed": seed}
        cautious.append(mean_nll(generate(model, tokenizer, prompt, rule=registry.build(
            "rule", "cntp", max_trials=8, entropy_low=0.0, entropy_high=0.01), **kwargs).token_ids))
        plain.append(mean_nll(generate(model, tokenizer, prompt, **kwargs).token_ids))
    assert sum(cautious) < sum(plain) - 0.3


def test_max_trials_one_is_plain_inverse_cdf_sampling(tiny):
    model, tokenizer = tiny
    prompt = tokenizer.encode("print('hello world')\n")
    out = generate(model, tokenizer, prompt, max_new_tokens=12, stop_at_eos=False, do_sample=True, seed=5,
                   rule=registry.build("rule", "cntp", max_trials=1))
    tokens, counts = reference(model, set(), prompt, 12, seed=5, temperature=1.0, low=0.01, high=1.5, max_trials=1)
    assert out.token_ids == tokens and counts == [1] * 12


@pytest.mark.parametrize("options", [{"max_trials": 0}, {"entropy_low": 2.0, "entropy_high": 1.0},
                                     {"entropy_low": -1.0}, {"entropy_high": math.inf},
                                     {"punctuation": " ", "newline": False}])
def test_refusals(options):
    with pytest.raises(ConfigError):
        registry.build("rule", "cntp", **options)


def test_needs_sampling_and_a_tokenizer(tiny):
    model, tokenizer = tiny
    with pytest.raises(ConfigError, match="temperature"):
        generate(model, tokenizer, [5, 6, 7], max_new_tokens=4, rule=registry.build("rule", "cntp"))
    with pytest.raises(ConfigError, match="tokenizer"):
        generate(model, None, [5, 6, 7], max_new_tokens=4, do_sample=True, rule=registry.build("rule", "cntp"))


def test_both_rules_run_from_the_cli(tiny, tiny_model_dir, capsys):
    from warpdecode.cli import main

    model, tokenizer = tiny
    base = ["generate", "--model", str(tiny_model_dir), "--prompt", "print(", "--chat", "false", "--max-new-tokens", "8",
            "--json"]
    main([*base, "--method", "momentum:alpha=0.3:top_k=3"])
    out = json.loads(capsys.readouterr().out)
    ref = generate(model, tokenizer, "print(", chat=False, max_new_tokens=8,
                   rule=registry.build("rule", "momentum", alpha=0.3, top_k=3))
    assert out["token_ids"] == ref.token_ids
    main([*base, "--method", "cntp:max_trials=4", "--temperature", "0.8", "--seed", "2"])
    out = json.loads(capsys.readouterr().out)
    ref = generate(model, tokenizer, "print(", chat=False, max_new_tokens=8, do_sample=True, temperature=0.8, seed=2,
                   rule=registry.build("rule", "cntp", max_trials=4))
    assert out["token_ids"] == ref.token_ids

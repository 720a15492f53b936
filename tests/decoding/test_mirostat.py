"""Mirostat v1 and v2 against a line-by-line transcription of llama.cpp's samplers
(`llama_sampler_mirostat_apply`, `llama_sampler_mirostat_v2_apply` in src/llama-sampling.cpp) on fixed
logits and uniforms, and through `generate()`."""

import math

import pytest
import torch
from tiny_models import greedy_target

from warpdecode.decoding.generate import generate
from warpdecode.decoding.rules.mirostat import mirostat_step
from warpdecode.errors import ConfigError


def llama_cpp(logits_rows, uniforms, version, tau, eta, m=100, mu=None):
    """llama.cpp's Mirostat in Python floats, from μ = 2τ (or `mu`): tokens and μ after each step. The draw is the inverse CDF
    of the given uniform (llama.cpp's `llama_sample_dist` draws from std::discrete_distribution)."""
    mu, tokens, mus = 2 * tau if mu is None else mu, [], []
    for logits, u in zip(logits_rows, uniforms, strict=True):
        cur = sorted(enumerate(logits), key=lambda c: -c[1])  # llama_sampler_softmax_impl: sort, normalise
        top = cur[0][1]
        p = [math.exp(logit - top) for _, logit in cur]
        p = [x / sum(p) for x in p]
        n_vocab = len(cur)
        if version == 1:
            sum_ti_bi = sum_ti_sq = 0.0
            i = 0
            while i < m - 1 and i < len(cur) - 1:
                t_i = math.log((i + 2) / (i + 1))
                b_i = math.log(p[i] / p[i + 1])
                sum_ti_bi += t_i * b_i
                sum_ti_sq += t_i * t_i
                i += 1
            s_hat = sum_ti_bi / sum_ti_sq
            epsilon_hat = s_hat - 1
            k = ((epsilon_hat * 2**mu) / (1 - n_vocab ** (-epsilon_hat))) ** (1 / s_hat)
            size = min(max(int(k), 1), len(cur))  # llama_sampler_top_k_impl
        else:
            size = next((j for j, x in enumerate(p) if -math.log2(x) > mu), len(cur))
            size = max(size, 1)
        kept = [x / sum(p[:size]) for x in p[:size]]  # the second softmax over the kept tokens
        idx, acc = size - 1, 0.0
        for j, x in enumerate(kept):
            acc += x
            if u < acc:
                idx = j
                break
        observed_surprise = -math.log2(kept[idx])
        mu = mu - eta * (observed_surprise - tau)
        tokens.append(cur[idx][0])
        mus.append(mu)
    return tokens, mus


def rows(vocab, steps, seed):
    """Logits from flat to peaked, and a Zipf-like row, so k and the v2 cut vary from step to step."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.linspace(0.5, 6.0, steps)
    out = [torch.randn(vocab, generator=g) * s for s in scales]
    out[steps // 2] = -1.1 * torch.log(torch.arange(1, vocab + 1, dtype=torch.float32))
    return out, torch.rand(steps, generator=g).tolist()


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("vocab, tau, eta", [(50, 3.0, 0.1), (1000, 5.0, 0.2), (1000, 1.5, 0.5)])
def test_equals_the_llama_cpp_transcription(version, vocab, tau, eta):
    logits, uniforms = rows(vocab, 40, seed=vocab + version)
    ref_tokens, ref_mus = llama_cpp([r.tolist() for r in logits], uniforms, version, tau, eta)
    mu, tokens, mus = 2 * tau, [], []
    for row, u in zip(logits, uniforms, strict=True):
        token, mu = mirostat_step(row, mu, u, version=version, tau=tau, eta=eta)
        tokens.append(token)
        mus.append(mu)
    assert tokens == ref_tokens
    assert mus == pytest.approx(ref_mus, abs=1e-6)


@pytest.mark.parametrize("version", [1, 2])
def test_the_observed_surprise_tracks_tau(version):
    """Power check of the feedback: on a fixed Zipfian distribution the mean surprise settles near τ."""
    logits = -1.2 * torch.log(torch.arange(1, 2001, dtype=torch.float32))
    g = torch.Generator().manual_seed(0)
    mu, surprises = 2 * 4.0, []
    probs = torch.softmax(logits.double(), -1)
    for _ in range(1500):
        token, new_mu = mirostat_step(logits, mu, float(torch.rand((), generator=g)), version=version, tau=4.0, eta=0.1)
        mu = new_mu
        surprises.append(-math.log2(float(probs[token])))
    assert abs(sum(surprises[500:]) / 1000 - 4.0) < 0.6


PROMPT = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]


@pytest.mark.parametrize("version", [1, 2])
def test_generate_runs_the_transcription_token_by_token(version, single_thread):
    target = greedy_target()
    out = generate(target, None, PROMPT, max_new_tokens=12, stop_at_eos=False, do_sample=True, temperature=0.8,
                   seed=3, mirostat=version, mirostat_tau=3.0, mirostat_eta=0.2)
    g = torch.Generator().manual_seed(3)  # the sampler's generator: one uniform per token
    seq, mu = list(PROMPT), 6.0
    with torch.inference_mode():
        for _ in range(12):
            logits = (target(torch.tensor([seq])).logits[0, -1] / 0.8).tolist()
            [token], [mu] = llama_cpp([logits], [float(torch.rand((), generator=g))], version, 3.0, 0.2, mu=mu)
            seq.append(token)
    assert out.token_ids == seq[len(PROMPT):]
    assert out.token_ids != generate(target, None, PROMPT, max_new_tokens=12, stop_at_eos=False, do_sample=True,
                                     temperature=0.8, seed=3).token_ids


@pytest.mark.parametrize("kwargs", [
    {"mirostat": 2},  # greedy
    {"mirostat": 3, "do_sample": True},
    {"mirostat": 2, "do_sample": True, "top_p": 0.9},
    {"mirostat": 2, "do_sample": True, "mirostat_tau": -1.0},
    {"mirostat": 1, "do_sample": True, "penalty_alpha": 0.6, "top_k": 4},
])
def test_refusals(kwargs):
    with pytest.raises(ConfigError):
        generate(greedy_target(), None, PROMPT, max_new_tokens=4, **kwargs)


def test_runs_to_the_end_of_the_context(single_thread):
    out = generate(greedy_target(), None, PROMPT * 25, max_new_tokens=20, stop_at_eos=False, do_sample=True, seed=0,
                   mirostat=1)
    assert out.finish_reason == "context" and len(out.token_ids) == 6

"""Sampling in the device step: a token's draw uses the uniform of (seed, its position), so for a seed
every drafter and every form of the step (eager, static, in a session) gives the tokens plain
sampling gives (lossless by identity), and those follow the target's filtered distribution."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from tiny_models import greedy_target, tiny_vocab_target

from warpdecode.decoding.device_step.loop import device_form, run_device
from warpdecode.decoding.device_step.prompt_lookup import DevicePromptLookup
from warpdecode.decoding.generate import build_method, generate
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.runtime.cudagraphs import CudaGraphBackbone

METHODS = ["prompt_lookup", "token_recycling"]


def exact_sequences(model, prompt: list[int], n: int, config: SamplingConfig) -> dict[tuple[int, ...], float]:
    """Probability of every n-token continuation under the target's filtered distribution."""
    sampler = Sampler(config)
    out: dict[tuple[int, ...], float] = {}
    vocab = model.config.vocab_size
    with torch.inference_mode():
        for seq in itertools.product(range(vocab), repeat=n):
            ids = torch.tensor([prompt + list(seq)])
            probs = sampler.probs(model(ids).logits[0, len(prompt) - 1 : -1])  # (n, V)
            out[seq] = float(probs[torch.arange(n), torch.tensor(seq)].prod())
    return out


def test_sequences_follow_the_target_distribution() -> None:
    """3-token continuations of an 8-token model (512 outcomes), 800 draws by seed through Token
    Recycling: total variation from the exact distribution within what as many draws from the exact
    distribution give."""
    model = tiny_vocab_target()
    prompt = [0, 3, 3, 7, 2, 7, 1, 4, 5, 6, 0, 3]
    config = SamplingConfig(do_sample=True, temperature=0.8)
    exact = exact_sequences(model, prompt, 3, config)
    form = device_form(build_method("token_recycling").drafter)
    backbone = CudaGraphBackbone(model, graphs=False)  # one session: the buffers are reused
    counts: dict[tuple[int, ...], int] = {}
    accepted = 0
    draws = 800
    for seed in range(draws):
        new, _, stats = run_device(backbone, prompt, form, max_new_tokens=3, stop_ids=set(),
                                   sampling=dataclasses.replace(config, seed=seed))
        counts[tuple(new)] = counts.get(tuple(new), 0) + 1
        accepted += sum(stats.accepted_per_step)
    probs = torch.tensor(list(exact.values()), dtype=torch.float64)
    tv = 0.5 * sum(abs(counts.get(s, 0) / draws - p) for s, p in exact.items())
    generator = torch.Generator().manual_seed(0)  # the same number of draws from the exact distribution
    reference = torch.multinomial(probs, draws, replacement=True, generator=generator)
    tv_reference = 0.5 * (torch.bincount(reference, minlength=len(exact)) / draws - probs).abs().sum().item()
    assert accepted > draws // 10  # the drafts were really used
    assert tv < 1.3 * tv_reference + 0.02, (tv, tv_reference)


CONFIGS = [SamplingConfig(do_sample=True), SamplingConfig(do_sample=True, temperature=0.7, top_k=5),
           SamplingConfig(do_sample=True, top_p=0.8), SamplingConfig(do_sample=True, min_p=0.1, typical_p=0.9)]


@pytest.mark.parametrize("config", CONFIGS, ids=["plain", "top_k", "top_p", "min_p+typical_p"])
@pytest.mark.parametrize("method", METHODS)
def test_every_drafter_and_form_draws_what_plain_sampling_draws(method: str, config: SamplingConfig) -> None:
    """Plain sampling here is the device step with no draft (a chain of 0 nodes): the same uniform at
    each position, so a drafter may change how many forwards it takes, never the tokens."""
    model = greedy_target()
    backbone = CudaGraphBackbone(model, graphs=False)
    form = device_form(build_method(method).drafter)  # one form across requests: recycling's matrix learns
    accepted = 0
    for seed, prompt in enumerate([[1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [5], list(range(40, 64)), [9, 8, 7] * 5]):
        sampling = dataclasses.replace(config, seed=seed)
        plain = run_device(model, prompt, DevicePromptLookup(num_tokens=0), max_new_tokens=32, stop_ids=set(),
                           sampling=sampling)[0]
        for got in (run_device(model, prompt, form, max_new_tokens=32, stop_ids=set(), sampling=sampling,
                               static=static) for static in (False, True)):
            assert got[0] == plain
            accepted += sum(got[2].accepted_per_step)
        assert run_device(backbone, prompt, form, max_new_tokens=32, stop_ids=set(), sampling=sampling)[0] == plain
    assert accepted > 0  # drafts were accepted (few at temperature 1 on a random model)


def test_stop_tokens_and_budgets_when_sampling() -> None:
    model = greedy_target()
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    sampling = SamplingConfig(do_sample=True, temperature=0.9, seed=3)
    plain = run_device(model, prompt, DevicePromptLookup(num_tokens=0), max_new_tokens=30, stop_ids=set(),
                       sampling=sampling)[0]
    stop = plain[9]
    for method in METHODS:
        new, finish, _ = run_device(model, prompt, device_form(build_method(method).drafter), max_new_tokens=30,
                                    stop_ids={stop}, sampling=sampling)
        assert new == plain[: plain.index(stop) + 1] and finish == "eos"
        for n in (1, 2, 5):
            assert run_device(model, prompt, device_form(build_method(method).drafter), max_new_tokens=n,
                              stop_ids=set(), sampling=sampling)[0] == plain[:n]


def test_generate_samples_in_the_device_step() -> None:
    model = greedy_target()
    out = [generate(model, None, [1, 2, 3, 4, 1, 2], max_new_tokens=16, method="token_recycling", device_step=True,
                    do_sample=True, temperature=0.9, seed=s, stop_at_eos=False).token_ids for s in (3, 3, 4)]
    assert len(out[0]) == 16 and out[0] == out[1] and out[0] != out[2]
    greedy = generate(model, None, [1, 2, 3, 4, 1, 2], max_new_tokens=16, method="token_recycling",
                      device_step=True, stop_at_eos=False).token_ids
    tiny = generate(model, None, [1, 2, 3, 4, 1, 2], max_new_tokens=16, method="token_recycling", device_step=True,
                    do_sample=True, temperature=1e-4, seed=5, stop_at_eos=False).token_ids
    assert tiny == greedy  # a near-zero temperature draws the argmax

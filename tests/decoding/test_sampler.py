import pytest
import torch

from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.errors import ConfigError


def test_greedy_selects_argmax_per_row():
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, -1.0, 4.9]])
    assert Sampler(SamplingConfig()).select(logits).tolist() == [1, 0]


def test_top_k_keeps_exactly_k_tokens():
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0]])
    probs = Sampler(SamplingConfig(do_sample=True, top_k=2)).probs(logits)
    expected = torch.softmax(torch.tensor([4.0, 3.0]), -1)
    torch.testing.assert_close(probs[0], torch.tensor([0.0, expected[0], expected[1], 0.0]))


def test_top_p_keeps_smallest_set_reaching_mass():
    probs_in = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    sampler = Sampler(SamplingConfig(do_sample=True, top_p=0.8))
    probs = sampler.probs(probs_in.log())
    # 0.5 + 0.3 reaches 0.8: the two most likely tokens stay, renormalised.
    torch.testing.assert_close(probs[0], torch.tensor([0.625, 0.375, 0.0, 0.0]))


def test_temperature_sharpens_distribution():
    logits = torch.tensor([[1.0, 2.0]])
    cold = Sampler(SamplingConfig(do_sample=True, temperature=0.5)).probs(logits)
    torch.testing.assert_close(cold, torch.softmax(logits / 0.5, -1))


def test_sampling_is_seeded_and_matches_distribution():
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.7]])).expand(20000, 3)
    a = Sampler(SamplingConfig(do_sample=True, seed=7)).select(logits)
    b = Sampler(SamplingConfig(do_sample=True, seed=7)).select(logits)
    assert torch.equal(a, b)
    freq = torch.bincount(a, minlength=3).float() / a.numel()
    # TV distance bound: 3 categories, n = 20000 → a few standard errors is well under 0.02.
    assert 0.5 * (freq - torch.tensor([0.1, 0.2, 0.7])).abs().sum() < 0.02


@pytest.mark.parametrize(
    "kwargs, flag",
    [({"temperature": 0.0}, "--temperature"), ({"top_k": -1}, "--top-k"), ({"top_p": 0.0}, "--top-p"),
     ({"top_p": 1.5}, "--top-p")],
)
def test_invalid_values_name_the_flag(kwargs, flag):
    with pytest.raises(ConfigError, match=flag):
        SamplingConfig(do_sample=True, **kwargs)

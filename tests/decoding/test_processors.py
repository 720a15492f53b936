"""Logits processors against hand-computed values and against Hugging Face's implementations."""

import functools

import pytest
import torch

from warpdecode.decoding.processors import (
    FrequencyPresencePenalty,
    MinP,
    RepetitionPenalty,
    Temperature,
    TokenHistory,
    TopK,
    TopP,
    TypicalP,
)
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.errors import ConfigError


def test_history_counts_prefix_and_row_extras():
    history = TokenHistory(torch.tensor([4, 2, 4, 7]), prompt_len=2, extra=((), (7,), (9, 9)))
    ids, counts = history.counts(generated_only=False)
    assert ids.tolist() == [2, 4, 7, 9]
    assert counts.tolist() == [[1, 2, 1, 0], [1, 2, 2, 0], [1, 2, 1, 2]]
    ids, counts = history.counts(generated_only=True)  # the prompt [4, 2] is not counted
    assert ids.tolist() == [4, 7, 9]
    assert counts.tolist() == [[1, 1, 0], [1, 2, 0], [1, 1, 2]]


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits():
    logits = torch.tensor([[2.0, -1.0, 3.0, 0.5]])
    out = RepetitionPenalty(2.0)(logits, TokenHistory.single([0, 1], prompt_len=2))
    assert out.tolist() == [[1.0, -2.0, 3.0, 0.5]]


def test_frequency_and_presence_count_generated_tokens_only():
    logits = torch.zeros(2, 4)
    history = TokenHistory(torch.tensor([3, 1, 1]), prompt_len=1, extra=((), (2,)))
    out = FrequencyPresencePenalty(frequency=0.5, presence=0.25)(logits, history)
    # token 3 is only in the prompt; token 1 was generated twice; row 1 also generated token 2 once
    assert out.tolist() == [[0.0, -1.25, 0.0, 0.0], [0.0, -1.25, -0.75, 0.0]]


def test_min_p_keeps_tokens_relative_to_the_top_one():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    out = MinP(0.4)(probs.log())
    assert torch.isinf(out).tolist() == [[False, False, True, True]]  # 0.15 < 0.4 * 0.5


def test_typical_p_keeps_tokens_nearest_the_entropy():
    probs = torch.tensor([[0.4, 0.3, 0.2, 0.1]])
    out = TypicalP(0.45)(probs.log())
    entropy = -(probs * probs.log()).sum()
    distance = (-probs.log() - entropy).abs()[0]
    nearest = distance.argsort()[:2].tolist()  # 0.3 alone is below 0.45; with 0.2 the mass is reached
    kept = (~torch.isinf(out[0])).nonzero()[:, 0].tolist()
    assert sorted(kept) == sorted(nearest)


WARPERS = [
    (Temperature(0.7), "TemperatureLogitsWarper", {"temperature": 0.7}),
    (TopK(5), "TopKLogitsWarper", {"top_k": 5}),
    (TopP(0.8), "TopPLogitsWarper", {"top_p": 0.8}),
    (MinP(0.1), "MinPLogitsWarper", {"min_p": 0.1}),
    (TypicalP(0.7), "TypicalLogitsWarper", {"mass": 0.7}),
]


@pytest.mark.parametrize("ours, name, kwargs", WARPERS, ids=[w[1] for w in WARPERS])
def test_warpers_match_transformers(ours, name, kwargs):
    transformers = pytest.importorskip("transformers")
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0)) * 3
    ref = getattr(transformers, name)(**kwargs)(torch.zeros(4, 1, dtype=torch.long), logits.clone())
    torch.testing.assert_close(torch.softmax(ours(logits), -1), torch.softmax(ref, -1))


def test_repetition_penalty_matches_transformers():
    transformers = pytest.importorskip("transformers")
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(1)) * 3
    context = [3, 17, 3, 40, 8]
    ref = transformers.RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([context]), logits.clone())
    torch.testing.assert_close(RepetitionPenalty(1.3)(logits, TokenHistory.single(context, 2)), ref)


def test_sampler_applies_warpers_only_when_sampling():
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0]])
    assert Sampler(SamplingConfig(top_k=1, min_p=0.9)).warpers == []
    probs = Sampler(SamplingConfig(do_sample=True, top_k=3, min_p=0.3)).probs(logits)
    # top-3 keeps 4, 3, 2; min-p 0.3 then drops 2 (e^2 / e^4 = 0.14, e^3 / e^4 = 0.37)
    assert (probs > 0).tolist() == [[False, True, True, False]]


def test_penalties_apply_in_greedy_selection():
    sampler = Sampler(SamplingConfig(repetition_penalty=4.0))
    logits = torch.tensor([[1.0, 3.0, 2.0]])
    assert int(sampler.select(sampler.penalize(logits, TokenHistory.single([1], 1)))[0]) == 2


@pytest.mark.parametrize(
    "kwargs, flag",
    [({"min_p": 1.5}, "--min-p"), ({"typical_p": 0.0}, "--typical-p"), ({"repetition_penalty": 0.0}, "--repetition-penalty")],
)
def test_invalid_values_name_the_flag(kwargs, flag):
    with pytest.raises(ConfigError, match=flag):
        SamplingConfig(do_sample=True, **kwargs)


SMOLLM2_VOCAB = 49_152


@functools.cache
def _nucleus_rows() -> torch.Tensor:
    """288 rows of logits over the real vocabulary size: flat (std 0.5) to peaked (std 5), a few rows
    with one dominant token and a few already cut by top-k (-inf entries)."""
    g = torch.Generator().manual_seed(0)
    rows = [torch.randn(96, SMOLLM2_VOCAB, generator=g) * scale for scale in (0.5, 2.0, 5.0)]
    dominant = torch.randn(8, SMOLLM2_VOCAB, generator=g)
    dominant[:, 123] = 12.0
    cut = torch.randn(8, SMOLLM2_VOCAB, generator=g) * 2
    return torch.cat(rows + [dominant, TopK(200)(cut)])


def _descending_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """The earlier rule: the mass before a token, summed in descending float32 order, reaches p."""
    sorted_probs, order = torch.softmax(logits, -1).sort(dim=-1, descending=True)
    drop = (sorted_probs.cumsum(-1) - sorted_probs) >= p
    return drop.scatter(-1, order, drop)


@pytest.mark.parametrize("p", [0.5, 0.8, 0.95, 0.99])
def test_top_p_keeps_the_same_set_as_transformers_on_the_real_vocabulary(p):
    transformers = pytest.importorskip("transformers")
    logits = _nucleus_rows()
    ref = transformers.TopPLogitsWarper(p)(torch.zeros(len(logits), 1, dtype=torch.long), logits.clone())
    kept, ref_kept = ~torch.isinf(TopP(p)(logits)), ~torch.isinf(ref)
    different = (kept != ref_kept).any(-1).nonzero()[:, 0].tolist()
    assert different == [], f"rows {different} keep other tokens than transformers' TopPLogitsWarper"
    assert kept.sum(-1).min() >= 1


def test_the_nucleus_rows_include_rows_a_descending_cumsum_gets_wrong():
    """The data of the comparison above are sensitive: the descending float32 rule differs there."""
    transformers = pytest.importorskip("transformers")
    logits = _nucleus_rows()
    ref = transformers.TopPLogitsWarper(0.99)(torch.zeros(len(logits), 1, dtype=torch.long), logits.clone())
    assert (_descending_top_p(logits, 0.99) != torch.isinf(ref)).any(-1).sum() > 0


@pytest.mark.parametrize("keep", [1, 3, 50])
def test_top_p_min_tokens_to_keep_matches_transformers(keep):
    transformers = pytest.importorskip("transformers")
    logits = torch.randn(16, 1000, generator=torch.Generator().manual_seed(keep)) * 6
    ref = transformers.TopPLogitsWarper(0.3, min_tokens_to_keep=keep)(torch.zeros(16, 1, dtype=torch.long), logits.clone())
    out = TopP(0.3, min_tokens_to_keep=keep)(logits)
    assert torch.equal(torch.isinf(out), torch.isinf(ref))
    assert ((~torch.isinf(out)).sum(-1) >= keep).all()


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    assert torch.isinf(TopP(0.75)(probs.log())).tolist() == [[False, False, True, True]]  # 0.5 + 0.3 reaches 0.75
    assert torch.isinf(TopP(0.4)(probs.log())).tolist() == [[False, True, True, True]]  # the top token alone
    assert torch.isinf(TopP(0.01)(probs.log())).tolist() == [[False, True, True, True]]  # the top token always stays

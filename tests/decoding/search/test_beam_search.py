"""Beam search equals Hugging Face's `generate(num_beams=...)` on the same weights: sequences, finish
and `sequences_scores`, over its options (length penalty, early stopping, n-gram bans, several stop ids)."""

import pytest
import torch
from tiny_models import naive_greedy

from warpdecode.decoding import registry
from warpdecode.decoding.generate import generate
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.decoding.search.beam import BeamSearch, length_norm
from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.models.checkpoint import load_pretrained

pytestmark = pytest.mark.usefixtures("single_thread")
transformers = pytest.importorskip("transformers")

SETTINGS = [  # num_beams, num_return_sequences, length_penalty, early_stopping, no_repeat_ngram_size
    (4, 2, 1.0, False, 0),
    (3, 3, 0.5, True, 0),
    (4, 4, 2.0, "never", 2),
    (5, 2, -1.0, False, 3),
    (2, 1, 0.0, "never", 0),
]


@pytest.fixture(scope="module")
def pair(tiny_model_dir):
    model, tokenizer = load_pretrained(tiny_model_dir)
    transformers.logging.set_verbosity_error()
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    return model, tokenizer, hf


def hf_beams(hf, ids, stops, n, **options):
    """Hugging Face's returned sequences (new tokens, cut at each one's own length) and scores."""
    with torch.inference_mode():
        out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          max_new_tokens=n, pad_token_id=0, eos_token_id=sorted(stops),
                          return_dict_in_generate=True, output_scores=True, **{"do_sample": False} | options)
    lengths = (out.beam_indices >= 0).sum(1).tolist()
    return ([out.sequences[i, len(ids) : len(ids) + m].tolist() for i, m in enumerate(lengths)],
            out.sequences_scores.tolist())


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_search_equals_transformers(pair, setting, seed):
    model, _, hf = pair
    K, n_return, lp, early, ngram = setting
    ids = torch.randint(3, model.config.vocab_size, (4 + 3 * seed,), generator=torch.Generator().manual_seed(seed)).tolist()
    # stop tokens the model actually emits, so that beams finish early and by the length limit alike
    stops = set(naive_greedy(model, ids, 6)[2 : 3 + seed % 2])
    ours = BeamSearch(num_beams=K, num_return_sequences=n_return, length_penalty=lp, early_stopping=early,
                      no_repeat_ngram_size=ngram).search(model, None, ids, Sampler(SamplingConfig()),
                                                         max_new_tokens=12, stop_ids=stops)
    sequences, scores = hf_beams(hf, ids, stops, 12, num_beams=K, num_return_sequences=n_return, length_penalty=lp,
                                 early_stopping=early, no_repeat_ngram_size=ngram)
    assert [c.token_ids for c in ours.candidates] == sequences
    assert [c.score for c in ours.candidates] == pytest.approx(scores, rel=1e-6, abs=1e-5)  # float32 rounding of other kernels
    for c in ours.candidates:
        assert c.finish_reason == ("eos" if c.token_ids[-1] in stops else "length")


@pytest.mark.parametrize("filters", [{"temperature": 0.7}, {"temperature": 1.0, "top_k": 20}, {"temperature": 1.3, "top_p": 0.9}])
@pytest.mark.parametrize("seed", [0, 1])
def test_beam_sampling_equals_transformers_with_the_same_seed(pair, filters, seed):
    """do_sample with num_beams: the same draws from the same seeded stream (transformers samples from
    torch's global generator, ours from the sampler's), so the same sequences."""
    model, _, hf = pair
    ids = torch.randint(3, model.config.vocab_size, (5 + seed,), generator=torch.Generator().manual_seed(seed)).tolist()
    stops = set(naive_greedy(model, ids, 5)[2:3])
    ours = BeamSearch(num_beams=3, num_return_sequences=2).search(
        model, None, ids, Sampler(SamplingConfig(do_sample=True, seed=seed, **filters)), max_new_tokens=10, stop_ids=stops)
    torch.manual_seed(seed)
    sequences, scores = hf_beams(hf, ids, stops, 10, num_beams=3, num_return_sequences=2, do_sample=True,
                                 top_k=filters.get("top_k", 0), top_p=filters.get("top_p", 1.0),
                                 temperature=filters["temperature"])
    assert [c.token_ids for c in ours.candidates] == sequences
    assert [c.score for c in ours.candidates] == pytest.approx(scores, rel=1e-5)


def test_repetition_penalty_equals_transformers(pair):
    model, _, hf = pair
    ids = [5, 9, 5, 9, 17, 30]
    ours = BeamSearch(num_beams=3).search(model, None, ids, Sampler(SamplingConfig(repetition_penalty=1.5)),
                                          max_new_tokens=10, stop_ids={0})
    sequences, scores = hf_beams(hf, ids, {0}, 10, num_beams=3, repetition_penalty=1.5)
    assert ours.candidates[0].token_ids == sequences[0]
    assert ours.candidates[0].score == pytest.approx(scores[0], abs=1e-5)


def test_generate_returns_every_sequence_best_first(pair):
    model, tokenizer, hf = pair
    out = generate(model, tokenizer, "print('hello", max_new_tokens=8, num_beams=4, num_return_sequences=3, chat=False)
    ids = tokenizer.encode("print('hello")
    sequences, _ = hf_beams(hf, ids, set(model.config.eos_token_ids), 8, num_beams=4, num_return_sequences=3)
    assert [s.token_ids for s in out.sequences] == sequences
    assert out.token_ids == sequences[0] and out.text == tokenizer.decode(sequences[0]) == out.sequences[0].text
    scores = [s.score for s in out.sequences]
    assert scores == sorted(scores, reverse=True)
    # one prefill, then one batched forward per further token of the longest beam
    assert out.stats.target_forwards == 7 and out.stats.search_tokens == 4 * 8


def test_one_beam_is_greedy_without_stops(pair):
    model, _, _ = pair
    ids = [7, 8, 9, 10]
    out = BeamSearch(num_beams=1).search(model, None, ids, Sampler(SamplingConfig()), max_new_tokens=10, stop_ids=set())
    assert out.candidates[0].token_ids == naive_greedy(model, ids, 10)


def test_gnmt_length_normalisation():
    assert length_norm(1, 0.6, "gnmt") == 1.0  # (5 + 1) / 6
    assert length_norm(7, 1.0, "gnmt") == 2.0
    assert length_norm(7, 0.0, "gnmt") == 1.0
    assert length_norm(4, 2.0, "hf") == 16.0


def test_gnmt_ranks_by_its_own_score(pair):
    model, _, _ = pair
    out = BeamSearch(num_beams=4, num_return_sequences=4, length_normalization="gnmt", length_penalty=0.6).search(
        model, None, [3, 4, 5], Sampler(SamplingConfig()), max_new_tokens=8, stop_ids=set(naive_greedy(model, [3, 4, 5], 3)[1:2]))
    for c in out.candidates:
        assert c.score == pytest.approx(c.logprob / length_norm(len(c.token_ids), 0.6, "gnmt"), rel=1e-5)
    assert [c.score for c in out.candidates] == sorted((c.score for c in out.candidates), reverse=True)


@pytest.mark.parametrize(("options", "message"), [
    ({"num_beams": 0}, "--num-beams must be in [1, 256]"),
    ({"num_beams": 2, "num_return_sequences": 3}, "--num-return-sequences must be in [1, --num-beams=2]"),
    ({"early_stopping": "sometimes"}, "--early-stopping must be true, false or never"),
    ({"no_repeat_ngram_size": -1}, "--no-repeat-ngram-size must be >= 0"),
    ({"length_penalty": float("nan")}, "--length-penalty must be a finite number"),
])
def test_bad_options_are_refused(options, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        BeamSearch(**options)


def test_generate_refuses_what_it_cannot_run(pair):
    model, tokenizer, _ = pair
    with pytest.raises(CapabilityError, match="does not run with a drafter"):
        generate(model, tokenizer, "hi", num_beams=2, method="prompt_lookup", chat=False)
    with pytest.raises(CapabilityError, match="deterministic"):
        generate(model, tokenizer, "hi", num_beams=4, num_beam_groups=2, diversity_penalty=1.0, do_sample=True, chat=False)
    with pytest.raises(ConfigError, match="greedy decoding has one answer"):
        generate(model, tokenizer, "hi", num_return_sequences=2, chat=False)
    with pytest.raises(ConfigError, match="needs --num-beam-groups > 1"):
        generate(model, tokenizer, "hi", num_beams=2, diversity_penalty=1.0, chat=False)
    with pytest.raises(ConfigError, match="give --num-beams > 1"):
        generate(model, tokenizer, "hi", no_repeat_ngram_size=2, chat=False)
    with pytest.raises(ConfigError, match="takes its options in its spec"):
        generate(model, tokenizer, "hi", num_beams=3, search=BeamSearch(num_beams=2), chat=False)


def test_registered_and_declared():
    cls = registry.get("search", "beam")
    assert cls is BeamSearch and cls.composes_with_speculation is False and cls.lossless is None
    for name in registry.names("search"):  # every strategy declares what it promises
        strategy = registry.get("search", name)
        assert isinstance(strategy.composes_with_speculation, bool) and isinstance(strategy.needs_sampling, bool)


def test_a_search_cut_by_the_context_says_so(pair):
    model, _, _ = pair
    ids = [5] * (model.config.max_seq_len - 4)
    out = generate(model, None, ids, max_new_tokens=20, num_beams=2, num_return_sequences=2, stop_at_eos=False)
    assert [len(s.token_ids) for s in out.sequences] == [4, 4]
    assert out.finish_reason == "context" and {s.finish_reason for s in out.sequences} == {"context"}

"""EDU segmentation, content plans, the plan reranker and the `edu_plans` search on a tiny model."""

import math

import pytest
import torch
from tiny_models import random_model

from warpdecode.decoding import registry
from warpdecode.decoding.generate import generate
from warpdecode.decoding.outputs import Candidate, DecodeStats
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.decoding.search.edu import content_plans, salience, segment, sentences
from warpdecode.decoding.search.edu_plans import EduPlans, split_prompt
from warpdecode.decoding.search.plan_scorer import PlanScorer, bigram_precision
from warpdecode.decoding.search.rows import prefill_rows
from warpdecode.decoding.search.sample import decode_rows
from warpdecode.decoding.search.scorers import ProgramScorer
from warpdecode.decoding.specs import parse_spec
from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.models.tokenizer import char_tokenizer

pytestmark = pytest.mark.usefixtures("single_thread")
ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?-'\n<>/"
DOCUMENT = ("Mr. Smith opened the new bridge on Monday, which the city had planned for years. The bridge cost "
            "ten million dollars. Critics said the bridge was too expensive, although traffic fell by half. "
            "The city council praised the bridge; Smith thanked the workers. Snow came at night.")
TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</>{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"


@pytest.fixture(scope="module")
def pair():
    tokenizer = char_tokenizer(ALPHABET)
    tokenizer.chat_template = TEMPLATE
    model = random_model(seed=3, std=0.3, vocab_size=tokenizer.vocab_size, n_layer=2, n_head=2, d_model=32,
                         d_ff=64, max_seq_len=1024, eos_token_ids=[tokenizer.eos_token_id])
    return model, tokenizer


def greedy():
    return Sampler(SamplingConfig())


def test_sentences_keep_abbreviations_and_initials():
    text = "Mr. Smith met J. K. Rowling at 5 p.m. on Monday. It rained! Did it stop? Yes.\nA new line"
    assert sentences(text) == ["Mr. Smith met J. K. Rowling at 5 p.m. on Monday.", "It rained!", "Did it stop?",
                               "Yes.", "A new line"]


def test_segment_splits_clauses_at_punctuation_and_connectives():
    edus = segment(DOCUMENT)
    assert [(e.sentence, e.text) for e in edus] == [
        (0, "Mr. Smith opened the new bridge on Monday"), (0, "which the city had planned for years."),
        (1, "The bridge cost ten million dollars."), (2, "Critics said the bridge was too expensive"),
        (2, "although traffic fell by half."), (3, "The city council praised the bridge;"),
        (3, "Smith thanked the workers."), (4, "Snow came at night.")]
    # a piece under min_words joins the piece before it
    assert [e.text for e in segment("He left, because he was tired.", min_words=4)] == ["He left because he was tired."]
    assert [e.text for e in segment("He left early, because he was tired.", min_words=2)] == [
        "He left early", "because he was tired."]


def test_salience_rewards_repeated_words_and_the_lead():
    edus = segment(DOCUMENT)
    scores = salience(edus, position_weight=0.0)
    assert scores[-1] == 0.0  # "Snow came at night." repeats nothing
    assert scores[2] > scores[-1]  # "The bridge cost ..." shares "bridge"
    lead = salience(edus, position_weight=1.0)
    assert lead[0] - scores[0] == pytest.approx(1.0) and lead[-1] - scores[-1] == pytest.approx(1 / 5)


@pytest.mark.parametrize(("n", "size"), [(4, 3), (6, 2), (3, 1)])
def test_plans_are_distinct_ordered_and_sized(n, size):
    edus = segment(DOCUMENT)
    plans = content_plans(edus, salience(edus), n=n, size=size, diversity=0.5)
    assert len(plans) == n and len(set(plans)) == n
    assert all(len(p) == size and list(p) == sorted(p) for p in plans)


def test_plans_stop_at_the_number_of_distinct_sets():
    edus = segment("The cat sat down. The dog ran off. The bird flew away.")
    assert len(edus) == 3
    assert content_plans(edus, salience(edus), n=5, size=2, diversity=0.0) == [(0, 1), (0, 2), (1, 2)]
    assert content_plans(edus, salience(edus), n=5, size=9) == [(0, 1, 2)]  # size capped at the EDU count
    assert content_plans([], [], n=3, size=2) == []


def test_plan_scorer_weighs_coverage_support_and_logprob():
    source = "the bridge cost ten million dollars"
    a, b = Candidate([1, 2], "eos", logprob=-1.0, text="bridge cost ten"), Candidate([1, 2], "eos", logprob=-4.0,
                                                                                       text="a cat sat")
    assert bigram_precision("bridge cost ten", source) == 1.0 and bigram_precision("a cat sat", source) == 0.0
    scorer = PlanScorer(source, ("bridge dollars", "cat"), coverage_weight=1.0, support_weight=2.0, logprob_weight=1.0)
    assert scorer.score([0], [a, b]) == pytest.approx([0.5 + 2.0 - 0.5, 1.0 + 0.0 - 2.0])
    assert PlanScorer(source).score([0], [a, b]) == pytest.approx([1.0 - 0.5, -2.0])
    with pytest.raises(ConfigError, match="finite weights"):
        PlanScorer(source, support_weight=-1.0)


def test_split_prompt_finds_the_message_inside_the_chat_template(pair):
    _, tokenizer = pair
    ids = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": "Summarize: A cat sat."}]))
    cut, source = split_prompt(tokenizer, ids)
    assert tokenizer.decode(ids[cut:]) == "</><a>" and source == "A cat sat."
    plain = tokenizer.encode("Summarize: A cat sat.")
    assert split_prompt(tokenizer, plain) == (len(plain), "A cat sat.")


def test_one_candidate_per_plan_within_the_budget(pair):
    model, tokenizer = pair
    strategy = EduPlans(plans=4, plan_size=2)
    out = generate(model, tokenizer, "Summarize: " + DOCUMENT, max_new_tokens=7, chat=True, search=strategy)
    assert len(out.sequences) == 4 and all(len(c.token_ids) <= 7 for c in out.sequences)
    assert out.stats.search_tokens == sum(len(c.token_ids) for c in out.sequences)
    scores = [c.score for c in out.sequences]
    assert scores == sorted(scores, reverse=True) and out.token_ids == out.sequences[0].token_ids
    # every token a row ends on is EOS: each row stops after one token
    prompt = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": DOCUMENT}]))
    every = set(range(tokenizer.vocab_size))
    result = strategy.search(model, tokenizer, prompt, greedy(), max_new_tokens=7, stop_ids=every)
    assert [(len(c.token_ids), c.finish_reason) for c in result.candidates] == [(1, "eos")] * 4


@pytest.mark.parametrize("guide", ["prompt", "bias", "both"])
def test_each_row_decodes_as_its_plan_prompt_alone(pair, guide):
    """Batched rows with ragged plan prompts equal one-by-one greedy decoding of each plan's prompt."""
    model, tokenizer = pair
    prompt = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": DOCUMENT}]))
    strategy = EduPlans(plans=3, plan_size=2, guide=guide, bias=0.0, scorer=ProgramScorer(lambda text: 0.0))
    result = strategy.search(model, tokenizer, prompt, greedy(), max_new_tokens=6, stop_ids=set())
    cut, source = split_prompt(tokenizer, prompt)
    for plan, candidate in zip(strategy.content_plans(source), result.candidates, strict=True):
        insert = "" if guide == "bias" else "\n\nKey points to cover:\n" + "\n".join(f"- {e}" for e in plan)
        alone = prompt[:cut] + tokenizer.encode(insert, add_special_tokens=False) + prompt[cut:]
        single = generate(model, tokenizer, alone, max_new_tokens=6)
        assert candidate.token_ids == single.token_ids


def test_the_reranker_picks_what_its_scorer_prefers(pair):
    model, tokenizer = pair
    prompt = tokenizer.encode(DOCUMENT)
    plain = EduPlans(plans=3, scorer=ProgramScorer(lambda text: 0.0)).search(
        model, tokenizer, prompt, greedy(), max_new_tokens=5, stop_ids=set())
    texts = [c.text for c in plain.candidates]  # ties keep plan order
    wanted = texts[2]
    ranked = EduPlans(plans=3, scorer=ProgramScorer(lambda text: float(text == wanted))).search(
        model, tokenizer, prompt, greedy(), max_new_tokens=5, stop_ids=set())
    assert ranked.candidates[0].text == wanted and ranked.candidates[0].score == 1.0


def test_sampled_plans_are_seeded(pair):
    model, tokenizer = pair
    runs = [generate(model, tokenizer, DOCUMENT, max_new_tokens=6, do_sample=True, seed=seed,
                     search=EduPlans(plans=3)) for seed in (7, 7, 8)]
    assert [c.token_ids for c in runs[0].sequences] == [c.token_ids for c in runs[1].sequences]
    assert [c.token_ids for c in runs[0].sequences] != [c.token_ids for c in runs[2].sequences]


def test_bias_is_paid_once_per_token(pair):
    model, _ = pair
    prompt = [5, 6, 7]
    cache, first = prefill_rows(model, prompt, 2, 16)
    bias = torch.zeros(2, model.config.vocab_size)
    bias[0, 9] = 1e4  # row 0 must emit token 9 first, then decodes as it would have
    result = decode_rows(model, None, prompt, greedy(), cache, first[None].expand(2, -1), DecodeStats(), 0.0,
                         max_new_tokens=4, stop_ids=set(), bias=bias)
    alone = generate(model, None, prompt + [9], max_new_tokens=3).token_ids
    assert result.candidates[0].token_ids == [9] + alone
    assert result.candidates[1].token_ids == generate(model, None, prompt, max_new_tokens=4).token_ids
    assert math.isfinite(result.candidates[0].logprob)


def test_bad_options_are_config_errors(pair):
    model, _ = pair
    for options in ({"plans": 0}, {"plan_size": 0}, {"guide": "nope"}, {"bias": -1.0}, {"diversity": float("inf")},
                    {"coverage_weight": -0.5}):
        with pytest.raises(ConfigError):
            registry.build("search", "edu_plans", **options)
    name, options = parse_spec("edu_plans:plans=2:guide=both:bias=1.5")
    assert registry.build("search", name, **options).plans == 2
    name, options = parse_spec("edu_plans:guide=3")
    with pytest.raises(ConfigError, match="guide"):
        registry.build("search", name, **options)
    with pytest.raises(CapabilityError, match="tokenizer"):
        EduPlans().search(model, None, [1, 2, 3], greedy(), max_new_tokens=2, stop_ids=set())


def test_stop_strings_end_each_row(pair):
    model, tokenizer = pair
    free = generate(model, tokenizer, DOCUMENT, max_new_tokens=12, search=EduPlans(plans=3))
    stop = free.sequences[0].text[3:5]
    out = generate(model, tokenizer, DOCUMENT, max_new_tokens=12, search=EduPlans(plans=3), stop=(stop,))
    assert all(stop not in c.text for c in out.sequences)
    assert any(c.finish_reason == "stop" for c in out.sequences)


def test_plans_that_fill_the_context_cut_the_budget(pair):
    model, tokenizer = pair
    prompt = tokenizer.encode(DOCUMENT * 3)
    room = model.config.max_seq_len - len(prompt)
    out = EduPlans(plans=2).search(model, tokenizer, prompt, greedy(), max_new_tokens=room, stop_ids=set())
    assert {c.finish_reason for c in out.candidates} == {"context"}
    assert all(len(prompt) + len(c.token_ids) < model.config.max_seq_len for c in out.candidates)
    with pytest.raises(ConfigError, match="context"):
        EduPlans(plans=2).search(model, tokenizer, tokenizer.encode(DOCUMENT * 4), greedy(), max_new_tokens=8,
                                 stop_ids=set())

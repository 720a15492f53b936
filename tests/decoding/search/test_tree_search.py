"""A*-decoding and PG-TD: budgets, what they return, the keys and values they share, their option errors."""

import pytest
import torch
from tiny_models import greedy_target, naive_greedy

from warpdecode.decoding import registry
from warpdecode.decoding.generate import generate
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.decoding.search.astar import AStar
from warpdecode.decoding.search.pg_td import PGTD
from warpdecode.decoding.search.rewards import ModelScorer
from warpdecode.errors import CapabilityError, ConfigError

pytestmark = pytest.mark.usefixtures("single_thread")
PROMPT = [1, 5, 2, 6]
STOP = {3}
STEP = (32, 13)  # ids that end a step on the tiny target (it emits both often)


def greedy():
    return Sampler(SamplingConfig(do_sample=False))


def sampling(seed=0):
    return Sampler(SamplingConfig(do_sample=True, seed=seed))


def target_logprob(model, prompt, tokens):
    with torch.inference_mode():
        logp = torch.log_softmax(model(torch.tensor([prompt + tokens])).logits[0].float(), -1)
    return sum(float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(tokens))


class Counting:
    """A scorer that records every candidate it scored, with a score from `value(tokens)`."""

    def __init__(self, value=lambda tokens: -len(tokens)):
        self.value, self.seen = value, []

    def score(self, prompt, candidates):
        scores = [float(self.value(c.token_ids)) for c in candidates]
        self.seen += [(list(c.token_ids), c.finish_reason, s) for c, s in zip(candidates, scores, strict=True)]
        return scores


class Ids:
    """A tokenizer stand-in whose text is the token ids: rewards read which tokens a program has."""

    def decode(self, ids):
        return " ".join(map(str, ids))


def test_astar_with_one_greedy_row_is_greedy_decoding():
    """One row per expansion, greedy: the steps chain into plain greedy decoding, each token run once."""
    model = greedy_target()
    out = AStar(n=1, step_ids=STEP, max_tokens=100, max_scorer_calls=100).search(
        model, None, PROMPT, greedy(), max_new_tokens=30, stop_ids=STOP)
    assert out.candidates[0].token_ids == naive_greedy(model, PROMPT, 30)
    assert (out.stats.search_tokens, out.stats.target_forwards) == (30, 29)


def test_astar_partial_solutions_carry_the_targets_logprob():
    """Sampled steps branch from nodes whose keys and values are written back from their ancestors' steps:
    every scored partial solution's log-probability equals a cache-free forward's."""
    model = greedy_target()
    scorer = Counting(lambda tokens: (sum(tokens) * 7919) % 101)  # an arbitrary order of expansion
    AStar(n=3, scorer=scorer, step_ids=STEP, max_step_tokens=4, max_tokens=120, max_scorer_calls=40).search(
        model, None, PROMPT, sampling(), max_new_tokens=24, stop_ids=STOP)
    depths = {len(tokens) for tokens, _, _ in scorer.seen}
    assert len(scorer.seen) > 6 and max(depths) > 6

    seen = []
    logprobs = AStar(n=3, scorer=_LogProbs(seen), step_ids=STEP, max_step_tokens=4, max_tokens=120, max_scorer_calls=40)
    logprobs.search(model, None, PROMPT, sampling(), max_new_tokens=24, stop_ids=STOP)
    for tokens, logprob in seen:
        assert logprob == pytest.approx(target_logprob(model, PROMPT, tokens), abs=1e-4)


class _LogProbs:
    def __init__(self, seen):
        self.seen = seen

    def score(self, prompt, candidates):
        self.seen += [(list(c.token_ids), c.logprob) for c in candidates]
        return [(sum(c.token_ids) * 7919) % 101 for c in candidates]


@pytest.mark.parametrize(("max_tokens", "max_scorer_calls"), [(1, 50), (17, 50), (200, 5), (200, 11), (45, 9)])
def test_astar_budgets_are_exact(max_tokens, max_scorer_calls):
    model = greedy_target()
    scorer = Counting()
    out = AStar(n=4, scorer=scorer, step_ids=STEP, max_step_tokens=4, max_tokens=max_tokens, max_scorer_calls=max_scorer_calls).search(
        model, None, PROMPT, sampling(), max_new_tokens=40, stop_ids=STOP)
    assert out.stats.search_tokens <= max_tokens and len(scorer.seen) <= max_scorer_calls
    assert out.stats.search_tokens == max_tokens or len(scorer.seen) > max_scorer_calls - 4  # one ran out
    assert len(out.candidates) == 1


def test_astar_returns_the_best_scored_complete_candidate():
    model = greedy_target()
    for seed in range(3):
        scorer = Counting(lambda tokens: (sum(tokens) * 7919) % 101 - len(tokens))
        out = AStar(n=3, scorer=scorer, step_ids=STEP, max_step_tokens=4, max_tokens=400, max_scorer_calls=60).search(
            model, None, PROMPT, sampling(seed), max_new_tokens=12, stop_ids=STOP)
        complete = [(s, tokens) for tokens, finish, s in scorer.seen
                    if finish == "eos" or len(tokens) >= 12]
        best = out.candidates[0]
        assert complete and best.score == max(s for s, _ in complete)
        assert best.token_ids in [tokens for s, tokens in complete if s == best.score]


def test_astar_is_seeded_and_greedy_expansions_are_distinct():
    model = greedy_target()
    runs = [AStar(n=3, step_ids=STEP, max_tokens=80).search(model, None, PROMPT, sampling(seed), max_new_tokens=20,
                                                          stop_ids=STOP) for seed in (4, 4, 5)]
    assert runs[0].candidates[0].token_ids == runs[1].candidates[0].token_ids != runs[2].candidates[0].token_ids
    scorer = Counting()
    AStar(n=3, scorer=scorer, step_ids=STEP, max_scorer_calls=3).search(model, None, PROMPT, greedy(),
                                                                        max_new_tokens=20, stop_ids=STOP)
    first = [tokens[0] for tokens, _, _ in scorer.seen]
    with torch.inference_mode():
        top = model(torch.tensor([PROMPT])).logits[0, -1].topk(3).indices.tolist()
    assert sorted(first) == sorted(top)


def test_model_scorer_is_the_mean_logprob_of_a_cache_free_forward():
    from warpdecode.decoding.outputs import Candidate

    model = greedy_target()
    tokens = [[7, 8, 9, 10], [11], []]
    scores = ModelScorer(model, mean=True).score(PROMPT, [Candidate(t, "length") for t in tokens])
    assert scores[0] == pytest.approx(target_logprob(model, PROMPT, tokens[0]) / 4, abs=1e-5)
    assert scores[1] == pytest.approx(target_logprob(model, PROMPT, tokens[1]), abs=1e-5) and scores[2] == 0.0
    with pytest.raises(ConfigError, match="needs the target's tokenizer"):
        ModelScorer(model, mean=True).score(PROMPT, [Candidate([999], "length")])


def test_pg_td_first_rollout_is_greedy_and_programs_stay_in_the_top_k():
    model = greedy_target()
    rewards = []
    out = PGTD(k=3, max_rollouts=12, reward=lambda text: rewards.append(text) or 0.25,
               num_return_sequences=12).search(model, Ids(), PROMPT, greedy(), max_new_tokens=16, stop_ids=STOP)
    programs = [c.token_ids for c in out.candidates]
    assert programs[0] == naive_greedy(model, PROMPT, 16) and len(programs) > 3 and len(rewards) <= 12
    for tokens in programs:
        with torch.inference_mode():
            logits = model(torch.tensor([PROMPT + tokens])).logits[0, len(PROMPT) - 1:-1]  # (len, V)
        ranks = [(row > row[t]).sum().item() for row, t in zip(logits, tokens, strict=True)]
        deviations = [i for i, r in enumerate(ranks) if r > 0]
        assert max(ranks) < 3  # every token is one of the k most likely
        assert all(r == 0 for r in ranks[deviations[-1] + 1:]) if deviations else True


def test_pg_td_finds_a_rewarded_sequence_off_the_greedy_path():
    model = greedy_target()
    with torch.inference_mode():
        second = model(torch.tensor([PROMPT + naive_greedy(model, PROMPT, 2)])).logits[0, -1].topk(2).indices[1]
    wanted = naive_greedy(model, PROMPT, 2) + [int(second)]
    wanted += naive_greedy(model, PROMPT + wanted, 16 - len(wanted))

    def reward(text):
        tokens = [int(t) for t in text.split()]
        same = next((i for i, (a, b) in enumerate(zip(tokens, wanted, strict=False)) if a != b), len(wanted))
        return same / len(wanted)

    out = PGTD(k=2, max_rollouts=30, reward=reward, num_return_sequences=30).search(
        model, Ids(), PROMPT, greedy(), max_new_tokens=16, stop_ids=STOP)
    assert out.candidates[0].token_ids == wanted and out.candidates[0].score == 1.0
    again = PGTD(k=2, max_rollouts=30, reward=reward, num_return_sequences=30).search(
        model, Ids(), PROMPT, greedy(), max_new_tokens=16, stop_ids=STOP)
    assert [c.token_ids for c in again.candidates] == [c.token_ids for c in out.candidates]  # deterministic
    # alone, each program would run 15 tokens after the prompt; a rollout runs only those after the prefix
    # it shares with the cache row (here 6 programs, 87 tokens)
    assert 2 < len(out.candidates) and out.stats.search_tokens < 15 * len(out.candidates)


@pytest.mark.parametrize(("max_rollouts", "max_tokens"), [(1, 1000), (5, 1000), (40, 7), (40, 23)])
def test_pg_td_budgets_are_exact(max_rollouts, max_tokens):
    model = greedy_target()
    calls = []
    out = PGTD(k=3, max_rollouts=max_rollouts, max_tokens=max_tokens, reward=lambda text: calls.append(text) or 0.0,
               num_return_sequences=50).search(model, Ids(), PROMPT, greedy(), max_new_tokens=16, stop_ids=STOP)
    assert out.stats.search_tokens <= max_tokens and len(calls) <= max_rollouts
    if max_rollouts == 1:
        assert [c.token_ids for c in out.candidates] == [naive_greedy(model, PROMPT, 16)]
    if max_tokens < 16:  # the first rollout is cut at the budget and scored as it is
        assert out.stats.search_tokens == max_tokens and out.candidates[0].finish_reason == "length"


def test_pg_td_from_generate_with_a_pattern(tiny_model_dir):
    from warpdecode.models.checkpoint import load_pretrained

    model, tokenizer = load_pretrained(tiny_model_dir)
    search = registry.build("search", "pg_td", pattern="o", max_rollouts=4)
    out = generate(model, tokenizer, "print", max_new_tokens=6, search=search, chat=False)
    assert out.sequences[0].score in (0.0, 1.0) and out.text == out.sequences[0].text


def test_bad_options_are_one_line_errors():
    model = greedy_target()
    for name, options, message in [
        ("astar", {"n": 0}, "n in"), ("astar", {"max_tokens": 0}, "max_tokens must be >= 1"),
        ("astar", {"scorer": "model"}, "needs scorer_model"), ("astar", {"scorer_model": "x"}, "needs scorer_model"),
        ("astar", {"scorer": "bogus"}, "must be one of"), ("pg_td", {"k": 0}, "k must be >= 1"),
        ("pg_td", {"c": -1.0}, "c must be"), ("pg_td", {"pattern": "a", "reward": len}, "one of reward"),
        ("pg_td", {"max_rollouts": 0}, "max_rollouts must be"),
    ]:
        with pytest.raises(ConfigError, match=message) as error:
            registry.build("search", name, **options)
        assert "\n" not in str(error.value)
    with pytest.raises(CapabilityError, match="pg_td needs a reward"):
        generate(model, None, PROMPT, max_new_tokens=4, search=PGTD())
    with pytest.raises(CapabilityError, match="rolls out greedily"):
        generate(model, None, PROMPT, max_new_tokens=4, search=PGTD(pattern="a"), do_sample=True)


def test_pg_td_rollouts_end_at_stop_strings():
    model = greedy_target()
    greedy_tokens = naive_greedy(model, PROMPT, 16)
    texts = []
    out = PGTD(max_rollouts=1, reward=lambda text: texts.append(text) or 0.0).search(
        model, Ids(), PROMPT, greedy(), max_new_tokens=16, stop_ids=STOP, stop_strings=("32",))
    (program,) = out.candidates
    assert program.token_ids == greedy_tokens[: greedy_tokens.index(32) + 1] and program.finish_reason == "stop"
    assert texts == [program.text] and "32" not in program.text  # the text ends before the stop string


def test_astar_from_generate_splits_steps_at_newlines(tiny_model_dir):
    from warpdecode.decoding.search.astar import newline_ids
    from warpdecode.models.checkpoint import load_pretrained

    model, tokenizer = load_pretrained(tiny_model_dir)
    ends = newline_ids(tokenizer)
    assert ends and all("\n" in tokenizer.decode([i], skip_special_tokens=False) for i in ends)
    search = registry.build("search", "astar", n=2, max_tokens=30, max_step_tokens=50)
    out = generate(model, tokenizer, "for i in range(10):\n", max_new_tokens=12, do_sample=True, seed=0,
                   search=search, chat=False)
    assert out.stats.search_tokens <= 30 and out.text == out.sequences[0].text

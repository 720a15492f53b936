"""Reward-guided search (DeAL, Transfer Q*), superposed decoding, and the rewards they read."""

import pytest
import torch
from tiny_models import greedy_target, naive_greedy, random_model

from warpdecode.decoding import registry
from warpdecode.decoding.outputs import Candidate
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.decoding.search.deal import DeAL
from warpdecode.decoding.search.rewards import ModelScorer, RewardHead, fit_reward_head
from warpdecode.decoding.search.scorers import LengthTargetScorer, keyword_scorer
from warpdecode.decoding.search.superposed import NGramModel, Superposed
from warpdecode.decoding.search.transfer_q import TransferQ
from warpdecode.errors import CapabilityError, ConfigError

pytestmark = pytest.mark.usefixtures("single_thread")
PROMPT = [1, 5, 2, 6]
GREEDY = Sampler(SamplingConfig())


def second_model():
    """Another 64-token model: the stand-in for an aligned model on the tiny target's vocabulary."""
    return random_model(seed=7, std=0.3, vocab_size=64, n_layer=2, n_head=4, n_kv_head=2, d_model=32, d_ff=64,
                        max_seq_len=256)


class HasToken:
    """1 when the candidate (lookahead included) contains `token`."""

    def __init__(self, token):
        self.token = token

    def score(self, prompt, candidates):
        return [float(self.token in c.token_ids) for c in candidates]


def logprobs(model, seq):
    with torch.inference_mode():
        return torch.log_softmax(model(torch.tensor([seq])).logits[0].float(), -1)  # (T, V)


def reference_beam(model, prompt, width, top_k, n, stop):
    """Cache-free beam search over the top_k tokens of each beam with DeAL's finishing rule, no reward."""
    beams, finished = [([], 0.0)], []
    while True:
        cands = []
        for tokens, lp in beams:
            top = logprobs(model, prompt + tokens)[-1].topk(top_k)
            cands += [(tokens + [t], lp + v) for t, v in zip(top.indices.tolist(), top.values.tolist(), strict=True)]
        cands.sort(key=lambda c: -c[1])
        ends = [c[0][-1] in stop or len(c[0]) >= n for c in cands]
        finished += [c for c, e in zip(cands[:width], ends, strict=False) if e]
        beams = [c for c, e in zip(cands, ends, strict=True) if not e][:width]
        if len(finished) >= width or not beams:
            return max(finished, key=lambda c: c[1])[0]


def test_deal_without_reward_is_the_unrewarded_search():
    model = greedy_target()
    one = DeAL(num_beams=1, reward_weight=0).search(model, None, PROMPT, GREEDY, max_new_tokens=10, stop_ids=set())
    assert one.candidates[0].token_ids == naive_greedy(model, PROMPT, 10)
    for stop in (set(), {29, 32}):
        out = DeAL(num_beams=3, top_k=4, lookahead=3, reward_weight=0, reward=HasToken(7)).search(
            model, None, PROMPT, GREEDY, max_new_tokens=9, stop_ids=stop)
        assert out.candidates[0].token_ids == reference_beam(model, PROMPT, 3, 4, 9, stop)
        assert out.stats.search_tokens == 3 * out.stats.target_forwards + 1  # no lookahead ran at weight 0


def test_deal_reward_pulls_the_choice_and_lookahead_sees_further():
    model = greedy_target()
    greedy = naive_greedy(model, PROMPT, 8)
    # a token neither greedy decoding nor any one-token candidate of its first two steps takes, but the
    # greedy rollout of two tokens from another first candidate does
    near = set(logprobs(model, PROMPT)[-1].topk(4).indices.tolist()) | set(
        logprobs(model, PROMPT + greedy[:1])[-1].topk(4).indices.tolist())
    first = logprobs(model, PROMPT)[-1].topk(4).indices.tolist()[1:]
    keyword = next(t for c in first for t in naive_greedy(model, PROMPT + [c], 2) if t not in greedy and t not in near)
    blind = DeAL(num_beams=1, top_k=4, reward=HasToken(keyword), reward_weight=10).search(
        model, None, PROMPT, GREEDY, max_new_tokens=8, stop_ids=set())
    ahead = DeAL(num_beams=1, top_k=4, lookahead=2, reward=HasToken(keyword), reward_weight=10).search(
        model, None, PROMPT, GREEDY, max_new_tokens=8, stop_ids=set())
    assert keyword in ahead.candidates[0].token_ids[:3] and ahead.candidates[0].token_ids[0] != greedy[0]
    assert blind.candidates[0].token_ids[:2] == greedy[:2]  # one token ahead the reward is blind: a tie, greedy wins
    assert ahead.stats.target_forwards > blind.stats.target_forwards
    again = DeAL(num_beams=1, top_k=4, lookahead=2, reward=HasToken(keyword), reward_weight=10).search(
        model, None, PROMPT, GREEDY, max_new_tokens=8, stop_ids=set())
    assert again.candidates[0].token_ids == ahead.candidates[0].token_ids


def test_deal_keyword_reward_on_text(tiny_model_dir):
    from warpdecode.models.checkpoint import load_pretrained

    model, tokenizer = load_pretrained(tiny_model_dir)
    prompt = tokenizer.encode("for i in")
    greedy = DeAL(num_beams=2, top_k=8, reward_weight=0).search(model, tokenizer, prompt, GREEDY, max_new_tokens=6,
                                                                stop_ids=set()).candidates[0]
    first = [tokenizer.decode([t]) for t in logprobs(model, prompt)[-1].topk(8).indices.tolist()]
    word = next(w.strip() for w in first if w.strip() and w.strip() not in greedy.text)
    guided = DeAL(num_beams=2, top_k=8, keywords=word, reward_weight=20).search(
        model, tokenizer, prompt, GREEDY, max_new_tokens=6, stop_ids=set()).candidates[0]
    assert word in guided.text and word not in greedy.text
    assert guided.score == pytest.approx(guided.logprob + 20.0)


def test_transfer_q_alpha_zero_is_the_target_and_rollout_zero_a_product_of_experts():
    model, second = greedy_target(), second_model()
    plain = TransferQ(alpha=0).search(model, None, PROMPT, GREEDY, max_new_tokens=10, stop_ids=set())
    assert plain.candidates[0].token_ids == naive_greedy(model, PROMPT, 10)
    alpha = 2.0
    out = TransferQ(top_k=4, alpha=alpha, rollout=0, reward=ModelScorer(second)).search(
        model, None, PROMPT, GREEDY, max_new_tokens=8, stop_ids=set())
    seq = list(PROMPT)
    for _ in range(8):  # argmax over the target's top 4 of log pi_sft + alpha * log p_second
        top = logprobs(model, seq)[-1].topk(4)
        q = logprobs(second, seq)[-1][top.indices]
        seq.append(int(top.indices[int((top.values + alpha * q).argmax())]))
    assert out.candidates[0].token_ids == seq[len(PROMPT):] != plain.candidates[0].token_ids[:8]


def test_transfer_q_with_rollouts_and_sampling_is_seeded():
    model, second = greedy_target(), second_model()
    runs = [TransferQ(top_k=3, alpha=1.0, rollout=2, reward=ModelScorer(second)).search(
        model, None, PROMPT, Sampler(SamplingConfig(do_sample=True, seed=s)), max_new_tokens=8, stop_ids=set())
        for s in (0, 0)]
    assert runs[0].candidates[0].token_ids == runs[1].candidates[0].token_ids
    # 7 forwards after the prefill; rollouts of 2 tokens, cut to the budget in the last two steps (1, then 0)
    assert runs[0].stats.target_forwards == 7 + 2 * 6 + 1


def reference_superposed(model, prompt, k, n, beta, stop, corpus=()):
    """Cache-free superposed decoding: every step re-runs the prompt embeddings and every superposed input."""
    table = NGramModel(list(corpus) + prompt, 3, model.config.vocab_size)
    embed = model.embed.weight
    inputs = [embed[t] for t in prompt]
    top = logprobs(model, prompt)[-1].topk(k)
    drafts = [([t], v, v + beta * table.logprob(prompt, t)) for t, v in zip(top.indices.tolist(), top.values.tolist(),
                                                                           strict=True)]
    while any(d[0][-1] not in stop and len(d[0]) < n for d in drafts):
        live = [d for d in drafts if d[0][-1] not in stop and len(d[0]) < n]
        w = torch.softmax(torch.tensor([d[1] for d in live]), 0)
        inputs.append(sum(wi * embed[d[0][-1]] for wi, d in zip(w, live, strict=True)))
        with torch.inference_mode():
            x = torch.stack(inputs)[None]
            lp = torch.log_softmax(model(torch.zeros(1, x.shape[1], dtype=torch.int64), inputs_embeds=x).logits[0, -1], -1)
        top = lp.topk(k)
        pool = [d for d in drafts if d not in live]
        pool += [(d[0] + [t], d[1] + v, d[2] + v + beta * table.logprob(prompt + d[0], t))
                 for d in live for t, v in zip(top.indices.tolist(), top.values.tolist(), strict=True)]
        drafts = sorted(pool, key=lambda d: -d[2])[:k]
    return [d[0] for d in drafts]


@pytest.mark.parametrize(("k", "beta", "stop"), [(3, 1.0, set()), (4, 0.0, {29, 11}), (2, 2.0, {32})])
def test_superposed_matches_a_cache_free_reference(k, beta, stop):
    model = greedy_target()
    out = Superposed(k=k, ngram_weight=beta).search(model, None, PROMPT, GREEDY, max_new_tokens=8, stop_ids=stop)
    assert [c.token_ids for c in out.candidates] == reference_superposed(model, PROMPT, k, 8, beta, stop)
    assert len({tuple(c.token_ids) for c in out.candidates}) == k
    assert out.stats.search_tokens == out.stats.target_forwards + 1 <= 8  # one position per step for all k drafts


def test_superposed_reads_its_n_grams_from_a_corpus(tiny_model_dir, tmp_path):
    from warpdecode.models.checkpoint import load_pretrained

    model, tokenizer = load_pretrained(tiny_model_dir)
    prompt = tokenizer.encode("for i in")
    plain = Superposed(k=3, ngram_weight=3.0).search(model, tokenizer, prompt, GREEDY, max_new_tokens=6, stop_ids=set())
    last = plain.candidates[-1].token_ids  # a corpus that continues the prompt as the last draft does
    text = (tokenizer.decode(prompt + last) + "\n") * 5
    (tmp_path / "corpus.txt").write_text(text)
    search = Superposed(k=3, ngram_weight=3.0, corpus=str(tmp_path / "corpus.txt"))
    out = search.search(model, tokenizer, prompt, GREEDY, max_new_tokens=6, stop_ids=set())
    corpus = tokenizer.encode(text, add_special_tokens=False)
    assert [c.token_ids for c in out.candidates] == reference_superposed(model, prompt, 3, 6, 3.0, set(), corpus)
    assert [c.token_ids[:3] for c in out.candidates] == [last[:3]] * 3 != [c.token_ids[:3] for c in plain.candidates]
    again = search.search(model, tokenizer, prompt, GREEDY, max_new_tokens=6, stop_ids=set())  # the cached corpus
    assert [c.token_ids for c in again.candidates] == [c.token_ids for c in out.candidates]


def test_superposed_with_one_draft_is_greedy():
    model = greedy_target()
    out = Superposed(k=1).search(model, None, PROMPT, GREEDY, max_new_tokens=10, stop_ids=set())
    assert out.candidates[0].token_ids == naive_greedy(model, PROMPT, 10)


def test_ngram_model_by_hand():
    table = NGramModel([1, 2, 3, 1, 2, 4], 3, vocab_size=10)
    # token 1 after (1, 2): unigram (2+1)/(6+10); bigram 2->1 never (0/2); trigram (1,2)->1 never
    assert table.logprob([1, 2], 1) == pytest.approx(torch.tensor((3 / 16 + 0 + 0) / 3).log().item())
    # token 3 after (1, 2): unigram (1+1)/16, bigram 2->3 1/2, trigram (1,2)->3 1/2
    assert table.logprob([1, 2], 3) == pytest.approx(torch.tensor((2 / 16 + 0.5 + 0.5) / 3).log().item())
    assert table.logprob([9], 3) == pytest.approx(torch.tensor(2 / 16).log().item())  # unseen history: unigram


def test_rewards_read_candidates():
    cands = [Candidate([1, 2], "eos", text="Sort the list"), Candidate([1, 2, 3, 4, 5], "length", text="a list")]
    assert keyword_scorer(["sort", "LIST"]).score([], cands) == [1.0, 0.5]
    assert LengthTargetScorer(3).score([], cands) == [-1 / 3, -2 / 3]
    model = greedy_target()
    cands = [Candidate([7, 8, 9], "length"), Candidate([7, 8, 10, 11], "length"), Candidate([12], "length")]
    scorer = ModelScorer(model)
    for _ in range(2):  # the second call reuses the kept prefix
        got = scorer.score(PROMPT, cands)
        want = [sum(float(logprobs(model, PROMPT + c.token_ids)[len(PROMPT) - 1 + i, t])
                    for i, t in enumerate(c.token_ids)) for c in cands]
        assert got == pytest.approx(want, abs=1e-4)


def test_reward_head_fits_saves_and_loads(tmp_path):
    model = greedy_target()
    cands = [Candidate([t, t + 1], "length") for t in range(0, 40, 4)]
    labels = [float(t % 3) for t in range(len(cands))]
    head = fit_reward_head(model, PROMPT, cands, labels, l2=1e-4)
    assert head.score(PROMPT, cands) == pytest.approx(labels, abs=0.05)
    head.save(tmp_path / "head.safetensors")
    loaded = RewardHead.load(model, tmp_path / "head.safetensors")
    assert loaded.score(PROMPT, cands) == pytest.approx(head.score(PROMPT, cands), abs=1e-5)
    guided = DeAL(num_beams=1, reward="head", path=str(tmp_path / "head.safetensors"), reward_weight=1).search(
        model, None, PROMPT, GREEDY, max_new_tokens=4, stop_ids=set())
    assert len(guided.candidates[0].token_ids) == 4


@pytest.mark.parametrize(("name", "options", "match"), [
    ("deal", {"num_beams": 4, "top_k": 2}, "num_beams <= top_k"),
    ("deal", {}, "takes keywords="),
    ("deal", {"reward": "length", "target_length": 0}, "target_length >= 1"),
    ("deal", {"reward": "regex", "pattern": "("}, "not a regular expression"),
    ("deal", {"reward": "head", "path": "/nonexistent"}, "not a file"),
    ("deal", {"keywords": "a", "reward_weight": float("nan")}, "finite"),
    ("deal", {"keywords": ",", "reward_weight": 1}, "at least one keyword"),
    ("transfer_q", {}, "stands in for the aligned one"),
    ("transfer_q", {"top_k": 0}, "top_k"),
    ("transfer_q", {"reward": "bogus", "path": "x"}, "reward must be one of"),
    ("superposed", {"k": 0}, "k in"),
    ("superposed", {"corpus": "/nonexistent"}, "not a file"),
])
def test_bad_options_are_one_line_config_errors(name, options, match):
    with pytest.raises(ConfigError, match=match) as error:
        registry.build("search", name, **options)
    assert "\n" not in str(error.value)


def test_refusals_at_search_time():
    model = greedy_target()
    sampling = Sampler(SamplingConfig(do_sample=True, seed=0))
    with pytest.raises(CapabilityError, match="deterministic"):
        DeAL(keywords="a").search(model, None, PROMPT, sampling, max_new_tokens=3, stop_ids=set())
    with pytest.raises(CapabilityError, match="deterministic"):
        Superposed().search(model, None, PROMPT, sampling, max_new_tokens=3, stop_ids=set())
    with pytest.raises(ConfigError, match="tokens"):
        small = random_model(seed=1, std=0.3, vocab_size=32, n_layer=1, n_head=2, d_model=16, d_ff=32, max_seq_len=64)
        ModelScorer(small).score(PROMPT, [Candidate([40], "length")])
    with pytest.raises(ConfigError, match="named reward"):
        DeAL(reward=HasToken(1), keywords="a")
    assert not any(registry.get("search", n).composes_with_speculation for n in ("deal", "transfer_q", "superposed"))


def test_guided_searches_run_from_the_cli(tiny_model_dir, capsys, tmp_path):
    import json

    from warpdecode.cli import main

    base = ["generate", "--model", str(tiny_model_dir), "--prompt", "for i in", "--chat", "false",
            "--max-new-tokens", "5", "--json"]
    main([*base, "--method", "superposed:k=3:ngram=2"])
    out = json.loads(capsys.readouterr().out)
    assert len(out["sequences"]) == 3 and out["stats"]["search_tokens"] == out["stats"]["target_forwards"] + 1
    main([*base, "--method", "deal:num_beams=2:lookahead=2:reward=length:target_length=3"])
    assert len(json.loads(capsys.readouterr().out)["sequences"]) == 1
    main([*base, "--method", f"transfer_q:alpha=0.5:rollout=1:reward=model:path={tiny_model_dir}"])
    assert json.loads(capsys.readouterr().out)["stats"]["new_tokens"] == 5
    with pytest.raises(SystemExit) as status:
        main([*base, "--method", "transfer_q:alpha=1"])
    assert status.value.code == 2 and "stands in for the aligned one" in capsys.readouterr().err

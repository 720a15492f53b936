"""Diverse beam search. transformers 5 moved group beam search out of its core (to the hub repository
`transformers-community/group-beam-search`, which cannot be loaded offline), so it is checked here against
a cache-free reference written from the same rules, and for the property it exists for: groups differ."""

import pytest
import torch
from tiny_models import greedy_target, naive_greedy

from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.decoding.search.diverse_beam import DiverseBeamSearch
from warpdecode.errors import ConfigError

pytestmark = pytest.mark.usefixtures("single_thread")


def reference(model, ids, *, K, G, penalty, n_return, lp, early, stops, budget):
    """Group beam search recomputing every beam from scratch each step (no cache, no reordering),
    hypotheses as plain lists: Hugging Face's `BeamHypotheses` rules, written out once more."""
    size, keep = K // G, max(2, 1 + len(stops)) * (K // G)
    beams = [[] for _ in range(K)]
    scores = torch.tensor([0.0 if r % size == 0 else -1e9 for r in range(K)])
    hyps = [[] for _ in range(G)]
    done = [False] * G

    def add(g, tokens, total, finish):
        score = total / float(len(tokens) ** lp)
        worst = min((h[0] for h in hyps[g]), default=1e9)
        if len(hyps[g]) < size or score > worst:
            hyps[g].append((score, tokens, finish))
            if len(hyps[g]) > size:
                hyps[g].remove(min(hyps[g], key=lambda h: h[0]))

    def is_done(g, best, length):
        if len(hyps[g]) < size:
            return False
        if early is True:
            return True
        length = budget if early == "never" and lp > 0 else length
        return min(h[0] for h in hyps[g]) >= best / float(length**lp)

    with torch.inference_mode():
        for step in range(budget):
            logp = torch.log_softmax(model(torch.tensor([ids + b for b in beams])).logits[:, -1].float(), -1)
            current, next_beams, next_scores = [], [], []
            for g in range(G):
                if done[g]:
                    next_beams += [beams[g * size] + [0]] * size
                    next_scores += [0.0] * size
                    current += [0] * size
                    continue
                rows = list(range(g * size, (g + 1) * size))
                group = logp[rows] - penalty * torch.bincount(torch.tensor(current, dtype=torch.int64),
                                                              minlength=logp.shape[1]).float()
                top, index = (group + scores[rows, None]).view(-1).topk(keep)
                chosen = []
                for rank, (s, i) in enumerate(zip(top.tolist(), index.tolist())):
                    parent, token = rows[i // logp.shape[1]], i % logp.shape[1]
                    if token in stops:
                        if rank < size:
                            add(g, beams[parent] + [token], s, "eos")
                    else:
                        chosen.append((beams[parent] + [token], top[rank]))
                    if len(chosen) == size:
                        break
                done[g] = is_done(g, float(top.max()), step + 1)
                next_beams += [b for b, _ in chosen]
                next_scores += [s for _, s in chosen]
                current += [b[-1] for b, _ in chosen]
            beams, scores = next_beams, torch.tensor(next_scores)
            if all(done):
                break
    for g in range(G):
        if not done[g]:
            for r in range(g * size, (g + 1) * size):
                add(g, beams[r], float(scores[r]), "length")
    ranked = sorted((h for group in hyps for h in group), key=lambda h: h[0])
    return [ranked.pop() for _ in range(n_return)]


@pytest.mark.parametrize(("K", "G", "penalty", "lp", "early"), [
    (4, 2, 1.0, 1.0, False), (6, 3, 0.5, 0.0, True), (4, 4, 2.0, 2.0, "never"), (6, 2, 5.0, -1.0, False)])
@pytest.mark.parametrize("seed", [0, 1])
def test_equals_the_reference(K, G, penalty, lp, early, seed):
    model = greedy_target()
    ids = torch.randint(1, 64, (3 + 4 * seed,), generator=torch.Generator().manual_seed(seed)).tolist()
    stops = set(naive_greedy(model, ids, 4)[1:2 + seed])
    n_return = K // 2
    ours = DiverseBeamSearch(num_beams=K, num_beam_groups=G, diversity_penalty=penalty, num_return_sequences=n_return,
                             length_penalty=lp, early_stopping=early).search(
        model, None, ids, Sampler(SamplingConfig()), max_new_tokens=10, stop_ids=stops)
    ref = reference(model, ids, K=K, G=G, penalty=penalty, n_return=n_return, lp=lp, early=early, stops=stops, budget=10)
    assert [c.token_ids for c in ours.candidates] == [tokens for _, tokens, _ in ref]
    assert [c.finish_reason for c in ours.candidates] == [finish for _, _, finish in ref]
    assert [c.score for c in ours.candidates] == pytest.approx([score for score, _, _ in ref], rel=1e-5)


def test_groups_differ():
    """One beam per group and a penalty no log-probability gap outweighs: every group starts with
    another token, and each is the best token its earlier groups left free."""
    model = greedy_target()
    ids = [5, 6, 7]
    out = DiverseBeamSearch(num_beams=4, num_beam_groups=4, diversity_penalty=1e3, num_return_sequences=4).search(
        model, None, ids, Sampler(SamplingConfig()), max_new_tokens=6, stop_ids=set())
    firsts = sorted(c.token_ids[0] for c in out.candidates)
    with torch.inference_mode():
        ranked = model(torch.tensor([ids])).logits[0, -1].argsort(descending=True)[:4].tolist()
    assert firsts == sorted(ranked)
    # the same search without diversity: plain beams share their first token more often than not
    plain = DiverseBeamSearch(num_beams=4, num_beam_groups=4, diversity_penalty=1e-9, num_return_sequences=4).search(
        model, None, ids, Sampler(SamplingConfig()), max_new_tokens=6, stop_ids=set())
    assert len({c.token_ids[0] for c in plain.candidates}) == 1


@pytest.mark.parametrize(("options", "message"), [
    ({"num_beams": 4, "num_beam_groups": 3}, "must be >= 2 and divide --num-beams=4"),
    ({"num_beam_groups": 1}, "must be >= 2"),
    ({"diversity_penalty": 0.0}, "--diversity-penalty must be > 0"),
])
def test_bad_options_are_refused(options, message):
    with pytest.raises(ConfigError, match=message):
        DiverseBeamSearch(**options)

"""Speculative decoding with the caller's hooks is token-identical to plain decoding with the same
hooks: a context-dependent logits processor, a bad-word list and a stop string, for every drafter.

The processor and the bad words must see each tree row's own context (committed tokens + the row's
root-to-node path); the stop string must cut inside an accepted path where it ends there.
"""

import pytest
import torch
from tiny_models import greedy_target, id_tokenizer

from warpdecode.decoding import registry
from warpdecode.decoding.generate import build_method, generate

PROMPT = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]  # repetitive: drafts are proposed and accepted
NEW = 24


@pytest.fixture(scope="module")
def target():
    return greedy_target()


def processor(input_ids, scores):
    """Context-dependent: favours the token four back (the output turns periodic, so drafts get
    accepted) and one chosen by the last three tokens of the row's context."""
    scores[0, int(input_ids[0, -4])] += 1.5
    scores[0, int(input_ids[0, -3:].sum()) % scores.shape[-1]] += 1.0
    return scores


def naive(model, ids, n, step):
    """Full recompute; `step(seq, logits (V,))` returns the processed logits."""
    seq = list(ids)
    with torch.inference_mode():
        for _ in range(n):
            seq.append(int(step(seq, model(torch.tensor([seq])).logits[0, -1].clone()).argmax()))
    return seq[len(ids):]


def with_processor(seq, logits):
    return processor(torch.tensor([seq]), logits[None])[0]


@pytest.fixture(scope="module")
def plain(target):
    return generate(target, None, PROMPT, max_new_tokens=NEW, stop_at_eos=False).token_ids


@pytest.fixture(scope="module")
def processed(target):
    return generate(target, None, PROMPT, max_new_tokens=NEW, stop_at_eos=False, logits_processor=[processor]).token_ids


@pytest.fixture(scope="module")
def bad_words(plain):
    return [[plain[2]], [plain[5], plain[6]], [plain[0], plain[1], 9]]


def with_bad_words(bad):
    def step(seq, logits):
        for words in bad:
            if len(words) == 1 or seq[-(len(words) - 1):] == words[:-1]:
                logits[words[-1]] = float("-inf")
        return logits
    return step


def test_the_hooks_change_the_output_and_drafts_get_accepted(target, plain, processed, bad_words):
    """Power checks: each hook's reference differs from plain greedy on this prompt; with the
    processor, prompt lookup accepts paths of several tokens, and the stop string of the stop test
    ends inside one of them."""
    assert naive(target, PROMPT, NEW, with_processor) == processed != plain
    assert naive(target, PROMPT, NEW, with_bad_words(bad_words)) != plain
    lookup = generate(target, None, PROMPT, max_new_tokens=NEW, stop_at_eos=False, logits_processor=[processor],
                      method="prompt_lookup").stats.accepted_per_step
    ends = torch.tensor([1] + [a + 1 for a in lookup]).cumsum(0).tolist()  # tokens emitted after each step
    assert max(lookup) >= 3 and STOP.stop not in ends  # the stop's last token is inside an accepted path
    assert tuple(processed[STOP]) not in {tuple(processed[i : i + 6]) for i in range(STOP.start)}  # its first occurrence


@pytest.mark.parametrize("name", registry.names("drafter"))
def test_greedy_identity_with_hooks(target, name, drafter_options, bad_words, single_thread):
    def run(**hooks):
        method = build_method(name, options=drafter_options.get(name, {}))
        return generate(target, None, PROMPT, max_new_tokens=NEW, stop_at_eos=False, method=method, **hooks).token_ids

    assert run(logits_processor=[processor]) == naive(target, PROMPT, NEW, with_processor)
    assert run(bad_words_ids=bad_words) == naive(target, PROMPT, NEW, with_bad_words(bad_words))


STOP = slice(6, 12)
"""The processed output's tokens 6..11 are the stop string (their first occurrence)."""


@pytest.mark.parametrize("name", registry.names("drafter"))
def test_a_stop_string_ends_and_streams_every_method_where_plain_decoding_ends(target, name, drafter_options,
                                                                               processed, single_thread):
    tokenizer = id_tokenizer(64)
    chunks: list[str] = []
    out = generate(target, tokenizer, PROMPT, max_new_tokens=NEW, stop_at_eos=False,
                   stop=tokenizer.decode(processed[STOP]), logits_processor=[processor], streamer=chunks.append,
                   method=build_method(name, options=drafter_options.get(name, {})))
    assert out.token_ids == processed[: STOP.stop] and out.finish_reason == "stop"
    assert out.text == tokenizer.decode(processed[: STOP.start]) + " " == "".join(chunks)

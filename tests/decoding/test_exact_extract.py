"""Exact-extract against brute force: every span of the passage scored by its own uncached forward."""

import pytest
import torch
from tiny_models import greedy_target

from warpdecode.decoding import registry
from warpdecode.decoding.generate import generate
from warpdecode.decoding.rules.exact_extract import passage_bounds, window_tree
from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.models.tokenizer import train_bpe

pytestmark = pytest.mark.usefixtures("single_thread")


def brute_force(model, prompt, passage, max_length, stops, starts=None):
    """(span, score) maximising log p(span) + log p(any stop | span) over every span of `passage` (that
    starts at one of `starts`, default any)."""
    best, best_span = float("-inf"), None
    with torch.inference_mode():
        for i in range(len(passage)) if starts is None else starts:
            for j in range(i + 1, min(i + max_length, len(passage)) + 1):
                span = passage[i:j]
                logprobs = torch.log_softmax(model(torch.tensor([prompt + span])).logits[0].float(), dim=-1)
                rows = logprobs[len(prompt) - 1 :]  # row t predicts span[t]; the last row, the end
                score = sum(float(rows[t, token]) for t, token in enumerate(span))
                score += float(torch.logsumexp(rows[-1, stops], dim=0))
                if score > best:
                    best, best_span = score, span
    return best_span, best


@pytest.mark.parametrize(("prompt", "begin", "end", "max_length", "chunk"), [
    ([3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37], 0, None, 4, 256),
    ([8, 1, 40, 2, 9, 9, 14, 33, 60, 5, 6, 7, 50, 51], 2, -3, 3, 6),  # a marked passage, several forwards
])
def test_the_span_is_brute_force_map(prompt, begin, end, max_length, chunk):
    model = greedy_target()
    stops = [22, 46]
    rule = registry.build("rule", "exact_extract", max_length=max_length, begin=begin, end=end, chunk=chunk)
    out = generate(model, None, prompt, max_new_tokens=16, eos_token_id=stops, rule=rule)
    span, _ = brute_force(model, prompt, prompt[begin:end], max_length, stops)
    assert out.token_ids[:-1] == span and out.token_ids[-1] in stops and out.finish_reason == "eos"
    assert out.stats.target_forwards == -(-len(prompt[begin:end]) // (chunk // max_length))


def test_window_tree_layout():
    offsets, mask = window_tree([2, 3], torch.device("cpu"))
    assert offsets.tolist() == [0, 1, 0, 1, 2]
    assert mask[0, 3].tolist() == [False, False, True, True, False]


def test_passage_bounds_find_the_passage_tokens():
    tokenizer = train_bpe(["Passage: the cat sat on the mat.\nQuestion: where?\n"] * 20, vocab_size=300)
    ids = tokenizer.encode("Passage: the cat sat on the mat.\nQuestion: where?\n")
    begin, end = passage_bounds(tokenizer, ids, "the cat sat on the mat.")
    assert "the cat sat on the mat." in tokenizer.decode(ids[begin:end])
    assert "Question" not in tokenizer.decode(ids[begin:end]) and "Passage" not in tokenizer.decode(ids[begin:end])
    with pytest.raises(ConfigError, match="does not contain"):
        passage_bounds(tokenizer, ids, "a dog")


def test_refusals():
    model = greedy_target()
    rule = registry.build("rule", "exact_extract")
    with pytest.raises(CapabilityError, match="stop tokens"):
        generate(model, None, [3, 5, 7], max_new_tokens=8, stop_at_eos=False, rule=rule)
    with pytest.raises(CapabilityError, match="no penalties"):
        generate(model, None, [3, 5, 7], max_new_tokens=8, eos_token_id=[1], repetition_penalty=1.3, rule=rule)
    with pytest.raises(ConfigError, match="is empty"):
        generate(model, None, [3, 5, 7], max_new_tokens=8, eos_token_id=[1],
                 rule=registry.build("rule", "exact_extract", begin=5))
    for options in ({"max_length": 0}, {"max_length": 8, "chunk": 4}):
        with pytest.raises(ConfigError, match="max_length >= 1"):
            registry.build("rule", "exact_extract", **options)


def test_spans_start_at_content_tokens_when_the_text_is_known():
    """With a tokenizer a span never starts at a token without a letter or digit (a bare "." or space);
    `content_start=False` searches every start, as without a tokenizer."""
    from tiny_models import id_tokenizer

    model = greedy_target()
    prompt = [3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37]
    stops = [22, 46]
    tokenizer = id_tokenizer(64)
    every = generate(model, None, prompt, max_new_tokens=16, eos_token_id=stops,
                     rule=registry.build("rule", "exact_extract", max_length=4))
    blank = {every.token_ids[0]}

    class Blanks:  # the id tokenizer, with the best span's first token written as a space
        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def decode(self, ids):
            return " " if list(ids) and set(ids) <= blank else tokenizer.decode(ids)

    content = generate(model, Blanks(), prompt, max_new_tokens=16, eos_token_id=stops,
                       rule=registry.build("rule", "exact_extract", max_length=4))
    assert content.token_ids[0] not in blank
    span, _ = brute_force(model, prompt, prompt, 4, stops, starts=[
        i for i, t in enumerate(prompt) if t not in blank])
    assert content.token_ids[:-1] == span
    anywhere = generate(model, Blanks(), prompt, max_new_tokens=16, eos_token_id=stops,
                        rule=registry.build("rule", "exact_extract", max_length=4, content_start=False))
    assert anywhere.token_ids == every.token_ids

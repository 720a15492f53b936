"""The real draft/target pair (docs/models.md): Qwen2.5-Coder-0.5B-Instruct drafting for -1.5B-Instruct.

Opt-in: skipped unless the pair's part packages are installed (`make pair`); the first run assembles and
converts both models into `$WARPDECODE_CACHE` (minutes, and about 8 GB of fp32 weights on disk).
"""

from __future__ import annotations

import pytest

from warpdecode.decoding.generate import build_method, generate
from warpdecode.errors import ConfigError
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.models.named import NAMED_MODELS, PartedModel, part_files

DRAFT, TARGET = "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"
PROMPT = "Write a Python function that returns the squares of the even numbers in a list."


def missing_parts() -> str | None:
    """Why the pair cannot run here, or None when every part is installed."""
    for name in (DRAFT, TARGET):
        entry = NAMED_MODELS[name]
        assert isinstance(entry, PartedModel)
        try:
            part_files(name, entry)
        except ConfigError as e:
            return str(e)
    return None


pytestmark = [pytest.mark.slow, pytest.mark.skipif(missing_parts() is not None, reason="the pair is not installed (make pair)")]


@pytest.fixture(scope="module")
def pair():
    draft, draft_tokenizer = load_pretrained(DRAFT)
    target, tokenizer = load_pretrained(TARGET)
    return draft, draft_tokenizer, target, tokenizer


def test_the_draft_and_the_target_load_and_share_a_tokenizer(pair):
    draft, draft_tokenizer, target, tokenizer = pair
    assert (draft.config.n_layer, target.config.n_layer) == (24, 28)
    assert draft.config.vocab_size == target.config.vocab_size
    assert draft_tokenizer.encode(PROMPT) == tokenizer.encode(PROMPT)


def test_draft_model_is_greedy_identical_to_plain_decoding(pair):
    _, _, target, tokenizer = pair
    plain = generate(target, tokenizer, PROMPT, max_new_tokens=24, stop_at_eos=False)
    method = build_method("draft_model", options={"model": DRAFT, "num_tokens": 4})
    drafted = generate(target, tokenizer, PROMPT, max_new_tokens=24, stop_at_eos=False, method=method)
    assert drafted.token_ids == plain.token_ids
    assert drafted.stats.target_forwards < plain.stats.target_forwards

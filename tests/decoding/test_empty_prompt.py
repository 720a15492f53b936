"""An empty prompt: generated from when it still gives the model a token (the chat template's, or the
BOS token), refused with a one-line reason when it gives none; the same rule for text and id prompts."""

from __future__ import annotations

import pytest
import torch

from warpdecode.decoding.generate import encode_prompt, generate, generate_batch, prompt_ids
from warpdecode.errors import ConfigError
from warpdecode.models.config import ModelConfig
from warpdecode.models.tokenizer import Tokenizer, train_bpe
from warpdecode.models.transformer import Transformer

TEXT = ["def add(a, b):\n    return a + b\n", "Write a story about a cat.\n"]
TEMPLATE = "{% for m in messages %}<|endoftext|>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return train_bpe(TEXT * 20, vocab_size=300)


def model(tokenizer: Tokenizer, bos_token_id: int | None = None) -> Transformer:
    config = ModelConfig(vocab_size=tokenizer.vocab_size, n_layer=1, n_head=2, d_model=32, d_ff=64, max_seq_len=64,
                         bos_token_id=bos_token_id, eos_token_ids=[])
    torch.manual_seed(0)
    out = Transformer(config)
    out.init_weights(std=0.5)
    return out.eval()


def with_template(tokenizer: Tokenizer) -> Tokenizer:
    return Tokenizer(tokenizer.backend, eos_token=tokenizer.eos_token, chat_template=TEMPLATE)


@pytest.mark.parametrize("prompt", ["", []], ids=["text", "ids"])
def test_without_bos_or_chat_template_an_empty_prompt_is_refused_saying_why(tokenizer, prompt):
    with pytest.raises(ConfigError) as error:
        generate(model(tokenizer), tokenizer, prompt, max_new_tokens=3)
    assert str(error.value) == ("the prompt is empty: it gives no tokens and this model has no BOS token to start "
                                "from; give some text")


def test_refusing_a_template_that_was_turned_off_points_at_it(tokenizer):
    with pytest.raises(ConfigError, match=r"give some text or the chat template \(--chat true\)$"):
        generate(model(tokenizer), with_template(tokenizer), "", chat=False, max_new_tokens=3)


def test_the_chat_template_gives_an_empty_prompt_tokens(tokenizer):
    chat = with_template(tokenizer)
    target = model(tokenizer)
    ids = encode_prompt(chat, "", chat=True)
    assert ids and prompt_ids(target, chat, "", chat=None) == ids
    out = generate(target, chat, "", max_new_tokens=4, stop_at_eos=False)
    assert out.token_ids == generate(target, None, ids, max_new_tokens=4, stop_at_eos=False).token_ids


@pytest.mark.parametrize("prompt", ["", []], ids=["text", "ids"])
def test_without_the_template_an_empty_prompt_starts_from_the_bos_token(tokenizer, prompt):
    bos = 7
    target = model(tokenizer, bos_token_id=bos)
    assert prompt_ids(target, tokenizer, prompt, chat=False) == [bos]
    out = generate(target, tokenizer, prompt, chat=False, max_new_tokens=4, stop_at_eos=False)
    assert out.token_ids == generate(target, None, [bos], max_new_tokens=4, stop_at_eos=False).token_ids
    assert [o.token_ids for o in generate_batch(target, tokenizer, [prompt, [bos]], chat=False, max_new_tokens=4,
                                                stop_at_eos=False)] == [out.token_ids] * 2


def test_the_tokenizers_bos_token_serves_when_the_config_has_none(tokenizer):
    named = Tokenizer(tokenizer.backend, eos_token=tokenizer.eos_token, bos_token=tokenizer.eos_token)
    assert prompt_ids(model(tokenizer), named, "", chat=False) == [named.eos_token_id]


def test_a_non_empty_prompt_is_not_given_a_bos_token(tokenizer):
    target = model(tokenizer, bos_token_id=7)
    assert prompt_ids(target, tokenizer, "def", chat=False) == tokenizer.encode("def")
    assert prompt_ids(target, None, [3, 4], chat=False) == [3, 4]

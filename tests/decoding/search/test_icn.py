"""In-context navigation: each answer is plain decoding of the prompt continued with the answers so far
and the instruction, built here by hand."""

import pytest
from tiny_models import naive_greedy

from warpdecode.decoding import registry
from warpdecode.decoding.generate import generate
from warpdecode.decoding.search.icn import follow_up
from warpdecode.errors import ConfigError
from warpdecode.models.checkpoint import load_pretrained

pytestmark = pytest.mark.usefixtures("single_thread")

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_answers_follow_the_explored_ones(tiny_model_dir):
    model, tokenizer = load_pretrained(tiny_model_dir)
    prompt = tokenizer.encode("Write a story about a cat.\n")
    out = generate(model, tokenizer, prompt, max_new_tokens=10, stop_at_eos=False,
                   search=registry.build("search", "icn", n=3, instruction="Another one:"))
    answers = [c.token_ids for c in out.sequences]
    assert answers[0] == naive_greedy(model, prompt, 10) == out.token_ids
    context = list(prompt)
    for i in range(1, 3):
        context += tokenizer.encode(tokenizer.decode(answers[i - 1]) + "\n\nAnother one:\n", add_special_tokens=False)
        assert answers[i] == naive_greedy(model, context, 10)
    assert len({tuple(a) for a in answers}) > 1


def test_the_chat_template_turn():
    from warpdecode.models.tokenizer import char_tokenizer

    tokenizer = char_tokenizer("abcdefghijklmnopqrstuvwxyz .\n")
    tokenizer.chat_template = CHATML
    assert follow_up(tokenizer, "Else.") == ("<|im_end|>\n", "<|im_start|>user\nElse.<|im_end|>\n<|im_start|>assistant\n")
    tokenizer.chat_template = "{{ messages[-1]['content'] }}"  # forgets earlier turns
    with pytest.raises(ConfigError, match="icn"):
        follow_up(tokenizer, "Else.")


@pytest.mark.parametrize("options", [{"n": 0}, {"instruction": "  "}])
def test_refusals(options):
    with pytest.raises(ConfigError):
        registry.build("search", "icn", **options)


def test_needs_a_tokenizer(tiny_model_dir):
    model, _ = load_pretrained(tiny_model_dir)
    with pytest.raises(ConfigError, match="tokenizer"):
        generate(model, None, [5, 6, 7], max_new_tokens=4, search=registry.build("search", "icn"))

"""Parity of the backbone with transformers on the real default model (SmolLM2-135M-Instruct)."""

import pytest
import torch

from warpdecode.decoding.generate import encode_prompt, generate

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "Translate to German: The weather is nice today and we are going for a walk in the park.",
]


@pytest.fixture
def hf_model(smollm2_transformers):
    return smollm2_transformers


@pytest.mark.parametrize("prompt", PROMPTS)
def test_logits_match_transformers(smollm2, hf_model, prompt):
    ids = torch.tensor([smollm2.tokenizer.encode(prompt)])
    with torch.inference_mode():
        ours = smollm2.model(ids).logits
        ref = hf_model(ids).logits
    assert ours.shape == ref.shape == (1, ids.shape[1], 49152)
    assert (ours - ref).abs().max().item() <= 1e-3


def test_tokenizer_matches_transformers(smollm2):
    transformers = pytest.importorskip("transformers")
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(smollm2.directory))
    for prompt in PROMPTS:
        assert smollm2.tokenizer.encode(prompt) == hf_tok(prompt)["input_ids"]
    messages = [{"role": "user", "content": PROMPTS[0]}]
    assert smollm2.tokenizer.apply_chat_template(messages) == hf_tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )


@pytest.mark.parametrize("prompt", [PROMPTS[1], "Explain in detail how a hash table handles collisions."])
def test_greedy_64_tokens_identical_to_transformers(smollm2, hf_model, prompt):
    ids = encode_prompt(smollm2.tokenizer, prompt, chat=True)
    ours = generate(smollm2.model, smollm2.tokenizer, ids, max_new_tokens=64)
    with torch.inference_mode():
        ref = hf_model.generate(torch.tensor([ids]), max_new_tokens=64, do_sample=False, pad_token_id=0)
    ref = ref[0, len(ids):].tolist()
    assert len(ours.token_ids) == 64
    assert ours.token_ids == ref


def test_default_model_answers_a_fact(smollm2):
    out = generate(smollm2.model, smollm2.tokenizer, "The capital of France is", max_new_tokens=3, chat=False)
    assert "Paris" in out.text

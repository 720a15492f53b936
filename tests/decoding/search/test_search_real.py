"""Beam search on the real default model equals Hugging Face's `generate(num_beams=...)` on the same checkpoint."""

import pytest
import torch

from warpdecode.decoding.generate import encode_prompt, generate

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("single_thread")]
PROMPTS = ["What is the capital of France?", "Write a Python function that reverses a string."]


@pytest.mark.parametrize(("prompt", "options"), [
    (PROMPTS[0], {"num_beams": 3, "num_return_sequences": 2}),
    (PROMPTS[1], {"num_beams": 4, "length_penalty": 0.5, "no_repeat_ngram_size": 3, "early_stopping": True}),
])
def test_beam_search_equals_transformers(smollm2, smollm2_transformers, prompt, options):
    ids = encode_prompt(smollm2.tokenizer, prompt, chat=True)
    with torch.inference_mode():
        ref = smollm2_transformers.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                            max_new_tokens=16, do_sample=False, pad_token_id=0,
                                            return_dict_in_generate=True, output_scores=True, **options)
    lengths = (ref.beam_indices >= 0).sum(1).tolist()
    out = generate(smollm2.model, smollm2.tokenizer, ids, max_new_tokens=16, **options)
    assert [s.token_ids for s in out.sequences] == [ref.sequences[i, len(ids) : len(ids) + n].tolist()
                                                    for i, n in enumerate(lengths)]
    assert [s.score for s in out.sequences] == pytest.approx(ref.sequences_scores.tolist(), rel=1e-5)

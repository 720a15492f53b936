"""Adding a mask token to an autoregressive model and its tokenizer (AR → diffusion adaptation)."""

from __future__ import annotations

import torch
from tiny_models import id_tokenizer, random_model

from warpdecode.models.mask_token import add_mask_token
from warpdecode.models.tokenizer import MASK


def test_the_mask_token_gets_the_next_id_and_a_mean_embedding_row() -> None:
    tokenizer = id_tokenizer(20)
    model = random_model(seed=0, std=0.5, vocab_size=20, n_layer=1, n_head=2, d_model=8, d_ff=16, max_seq_len=16,
                         tie_embeddings=False)
    before_embed, before_head = model.embed.weight.detach().clone(), model.lm_head.weight.detach().clone()
    mask_id = add_mask_token(model, tokenizer, MASK)
    assert mask_id == 20 and tokenizer.vocab_size == 21 and tokenizer.encode(MASK) == [20]
    assert model.config.vocab_size == 21 and model.config.mask_token_id == 20
    assert torch.equal(model.embed.weight[:20], before_embed)
    assert torch.allclose(model.embed.weight[20], before_embed.mean(0))
    assert model.lm_head.weight.shape == (21, 8) and torch.allclose(model.lm_head.weight[20], before_head.mean(0))
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, mask_id]])).logits
    assert logits.shape == (1, 3, 21)
    assert add_mask_token(model, tokenizer, MASK) == 20 and model.config.vocab_size == 21  # idempotent


def test_a_tokenizer_that_has_the_token_keeps_its_id_and_the_model_its_size() -> None:
    tokenizer = id_tokenizer(20)
    tokenizer.backend.add_special_tokens([MASK])
    model = random_model(seed=0, std=0.5, vocab_size=32, n_layer=1, n_head=2, d_model=8, d_ff=16, max_seq_len=16)
    assert add_mask_token(model, tokenizer, MASK) == 20
    assert model.config.vocab_size == 32  # already covered by the (padded) embedding

"""Give an autoregressive model and its tokenizer a mask token (AR → masked-diffusion adaptation).

Most autoregressive tokenizers (the default SmolLM2 one included) have no mask token. Adapting such
a model into a masked diffusion LM adds one as a special token and grows the embedding (and an
untied LM head) to cover it. The new embedding row starts at the mean of the existing rows, the
usual initialisation of an added token (it keeps the input statistics the blocks were trained on);
the new head row starts at the mean as well, so the mask token starts with an average logit.
"""

from __future__ import annotations

import torch
from tokenizers import AddedToken
from torch import nn

from warpdecode.kernels.packed_linear import Linear
from warpdecode.models.tokenizer import Tokenizer
from warpdecode.models.transformer import Transformer


def grow_vocabulary(model: Transformer, vocab_size: int) -> None:
    """Grow the embedding (and an untied LM head) to `vocab_size` rows; new rows are the mean row."""
    old = model.config.vocab_size
    if vocab_size <= old:
        return
    weight = model.embed.weight.data
    grown = torch.cat([weight, weight.mean(0, keepdim=True).expand(vocab_size - old, -1)])
    model.embed = nn.Embedding(vocab_size, model.config.d_model, device=weight.device, dtype=weight.dtype)
    model.embed.weight.data.copy_(grown)
    if model.lm_head is not None:
        head = model.lm_head.weight.data
        model.lm_head = Linear(model.config.d_model, vocab_size, bias=False).to(device=head.device, dtype=head.dtype)
        model.lm_head.weight.data.copy_(torch.cat([head, head.mean(0, keepdim=True).expand(vocab_size - old, -1)]))
    model.unpack()  # packed inference copies describe the old shapes
    model.config.vocab_size = vocab_size


def add_mask_token(model: Transformer, tokenizer: Tokenizer, token: str) -> int:
    """Add `token` to `tokenizer` as a special token unless it has it, make `model`'s embeddings cover
    it, and return its id (the model's config records it as `mask_token_id`)."""
    mask_id = tokenizer.backend.token_to_id(token)
    if mask_id is None:
        tokenizer.backend.add_special_tokens([AddedToken(token, special=True, normalized=False)])
        mask_id = tokenizer.backend.token_to_id(token)
        assert mask_id is not None
    grow_vocabulary(model, mask_id + 1)
    model.config.mask_token_id = mask_id
    return mask_id

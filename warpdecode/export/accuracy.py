"""What a lossy export costs: a quantised graph against the full-precision one, on the reference's own text.

The reference model continues a few fixed prompts greedily; both models then read the same
sequences (teacher forcing) and we compare their next-token distributions at every generated
position: how often their top-1 tokens agree (greedy decoding follows the reference while they do),
the mean KL divergence, and the largest logit difference.
"""

from __future__ import annotations

import torch

from warpdecode.decoding.generate import encode_prompt, generate
from warpdecode.models.backbone import Backbone
from warpdecode.models.tokenizer import Tokenizer

ACCURACY_PROMPTS = [
    "Explain in two sentences why the sky is blue.",
    "Write a Python function that checks whether a string is a palindrome.",
    ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether?"),
    "Summarize: The library will close early on Friday for maintenance and reopen on Monday morning.",
]
TOKEN_PROMPTS = [[1, 2, 3, 4], [7, 7, 8, 9, 10], [3, 1, 4, 1, 5, 9, 2, 6]]
"""Prompts for a model without a tokenizer (token ids)."""


@torch.inference_mode()
def compare_models(reference: Backbone, candidate: Backbone, tokenizer: Tokenizer | None,
                   new_tokens: int = 48) -> dict[str, float]:
    """Top-1 agreement, mean KL(reference ‖ candidate) and max |Δlogit| over the generated positions."""
    prompts = ([encode_prompt(tokenizer, p, chat=None) for p in ACCURACY_PROMPTS] if tokenizer is not None
               else TOKEN_PROMPTS)
    agree = positions = 0
    kl_sum, max_diff = 0.0, 0.0
    for ids in prompts:
        out = generate(reference, None, ids, max_new_tokens=new_tokens, stop_at_eos=False).token_ids
        sequence = torch.tensor([ids + out[:-1]])
        span = slice(len(ids) - 1, None)  # the positions whose next token was generated
        ref = reference(sequence, logits_slice=span).logits[0].float()  # (n, V)
        cand = candidate(sequence, logits_slice=span).logits[0].float()
        agree += int((ref.argmax(-1) == cand.argmax(-1)).sum())
        positions += ref.shape[0]
        log_p, log_q = ref.log_softmax(-1), cand.log_softmax(-1)
        kl_sum += float((log_p.exp() * (log_p - log_q)).sum())
        max_diff = max(max_diff, float((ref - cand).abs().max()))
    return {"top1_agreement": round(agree / positions, 4), "mean_kl": round(kl_sum / positions, 5),
            "max_logit_diff": round(max_diff, 3), "positions": positions}

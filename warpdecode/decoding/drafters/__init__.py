"""Drafters: one module each, registered on import."""

from warpdecode.decoding.drafters import (  # noqa: F401
    adaptive_ngram,
    draft_model,
    empty,
    fused,
    prompt_lookup,
    quantized_self,
    token_recycling,
)

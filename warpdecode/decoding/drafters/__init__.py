"""Drafters: one module each, registered on import."""

from warpdecode.decoding.drafters import (  # noqa: F401
    adaptive_ngram,
    draft_model,
    empty,
    fused,
    int8_self,
    prompt_lookup,
    token_recycling,
)

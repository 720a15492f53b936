"""Drafters: one module each, registered on import."""

from warpdecode.decoding.drafters import (  # noqa: F401
    adaptive_ngram,
    clover,
    copy_input,
    diffuspec,
    distilled,
    draft_model,
    eagle,
    empty,
    first,
    fused,
    layer_skip,
    lookahead,
    medusa,
    oracle,
    ppd,
    prompt_lookup,
    quantized_self,
    retrieval,
    token_recycling,
)

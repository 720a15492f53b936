"""Drafters: one module each, registered on import."""

from warpdecode.decoding.drafters import draft_model, empty, int8_self, prompt_lookup, token_recycling  # noqa: F401

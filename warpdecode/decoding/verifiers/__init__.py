"""Verifiers: one module each, registered on import."""

from warpdecode.decoding.verifiers import greedy_match, spectr, speculative_sampling, typical_acceptance  # noqa: F401

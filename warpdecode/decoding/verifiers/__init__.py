"""Verifiers: one module each, registered on import."""

from warpdecode.decoding.verifiers import (  # noqa: F401
    greedy_match,
    judge,
    oracle,
    spectr,
    speculative_sampling,
    trust,
    typical_acceptance,
)

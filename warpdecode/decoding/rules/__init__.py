"""Decoding rules that reshape the next-token choice with a loop of their own (contrastive search,
Mirostat, context-aware decoding, USCD): one module each, registered on import."""

from warpdecode.decoding.rules import adadec, cad, cntp, contrastive, exact_extract, mirostat, momentum, uscd  # noqa: F401

"""Decoding rules that reshape the next-token choice with a loop of their own (contrastive search,
Mirostat): one module each, registered on import."""

from warpdecode.decoding.rules import adadec, contrastive, exact_extract, mirostat  # noqa: F401

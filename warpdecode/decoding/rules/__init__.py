"""Decoding rules that reshape the next-token choice with a loop of their own (contrastive search,
Mirostat): one module each, registered on import."""

from warpdecode.decoding.rules import cntp, contrastive, mirostat, momentum  # noqa: F401

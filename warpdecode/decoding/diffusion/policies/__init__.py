"""Commit policies for diffusion-LM decoding: one module each, registered on import."""

from warpdecode.decoding.diffusion.policies import credit, fixed, learn2pd, local_leap, prophet, threshold  # noqa: F401

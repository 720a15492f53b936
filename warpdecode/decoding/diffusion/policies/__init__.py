"""Commit policies for diffusion-LM decoding: one module each, registered on import."""

from warpdecode.decoding.diffusion.policies import credit, fixed, local_leap, prophet, threshold  # noqa: F401

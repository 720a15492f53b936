"""Commit policies for diffusion-LM decoding: one module each, registered on import.

FreeDave (`free_draft`) is registered from `decoding/diffusion/free_draft.py`: it is a decoder of its
own (batched verification forwards), selected through the same registry.
"""

from warpdecode.decoding.diffusion import free_draft  # noqa: F401
from warpdecode.decoding.diffusion.policies import credit, fixed, learn2pd, local_leap, prophet, threshold  # noqa: F401

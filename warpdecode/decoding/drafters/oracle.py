"""The oracle drafter: a fixed tree of placeholder tokens, for the oracle verifier.

With `verifier=oracle` a step accepts a controlled number of its nodes
(`decoding/verifiers/oracle.py`), so `warpdecode bench --model random:llama3.1-8b --methods
none,oracle:verifier=oracle:verifier.tau=2.4` measures what speculation at τ = 2.4 would cost and
give on that shape, with no drafter and no trained weights: the text is meaningless, the timing is
real. With the lossless verifiers it is a (useless) lossless drafter like any other.

The tree: a chain of `num_tokens` nodes, plus `width - 1` siblings of the first node (a wider
first level, as the stored trees of the head drafters have). Tokens repeat the pending token.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from warpdecode.decoding.device_step.oracle import DeviceOracle
from warpdecode.decoding.protocols import AcceptResult, DecodeState, Drafter
from warpdecode.decoding.registry import register
from warpdecode.decoding.tree import DraftTree
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone


@register("drafter", "oracle")
class OracleDrafter(Drafter):
    supports_batch: ClassVar[bool] = True
    device_drafter: ClassVar[type[DeviceOracle]] = DeviceOracle
    """Its form made of tensor ops, for the device-resident step (`decoding/device_step`)."""

    def __init__(self, num_tokens: int = 4, width: int = 1) -> None:
        """Args:
        num_tokens: chain length (the most tokens a step can accept).
        width: nodes at the first level (the chain's first node and `width - 1` siblings).
        """
        if num_tokens < 1 or width < 1:
            raise ConfigError(f"oracle needs num_tokens >= 1 and width >= 1, got {num_tokens}, {width}")
        self.num_tokens, self.width = num_tokens, width

    def prepare(self, target: Backbone) -> None:
        pass

    def start(self, state: DecodeState) -> None:
        pass

    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        chain = min(self.num_tokens, budget)
        siblings = max(0, min(self.width - 1, budget - chain))
        parents = [i - 1 for i in range(chain)] + [-1] * siblings
        return DraftTree(torch.full((chain + siblings,), state.pending, dtype=torch.int64),
                         torch.tensor(parents, dtype=torch.int64))

    def observe(self, state: DecodeState, result: AcceptResult) -> None:
        pass

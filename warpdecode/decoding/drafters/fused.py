"""Tree fusion: several training-free drafters propose, and their trees are merged into one verify forward.

Each drafter proposes within the remaining budget, in the listed order; paths shared by several
drafters are verified once (longest-common-prefix fusion, as RASD fuses retrieval and model
trees). Prompt lookup copies from the context when the answer quotes it; a recycling drafter covers
open-ended text; fused, one forward tries both. Every drafter observes every verification.
Deterministic drafters only (their trees carry no draft distributions).
"""

from __future__ import annotations

from warpdecode.decoding import registry
from warpdecode.decoding.protocols import AcceptResult, DecodeState, Drafter
from warpdecode.decoding.registry import register
from warpdecode.decoding.tree import DraftTree
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone


@register("drafter", "fused")
class FusedDrafter(Drafter):
    def __init__(self, drafters: str = "prompt_lookup,token_recycling", num_nodes: int = 16) -> None:
        """Args:
        drafters: names of training-free deterministic drafters to fuse, '+'- or comma-separated, in
            priority order (each with its default options).
        num_nodes: budget of the fused tree.
        """
        names = [n.strip() for n in drafters.replace("+", ",").split(",") if n.strip()]
        if len(names) < 2 or "fused" in names or num_nodes < 1:
            raise ConfigError(f"fused needs two or more other drafters and num_nodes >= 1, got {drafters!r}, {num_nodes}")
        self.parts: list[Drafter] = [registry.build("drafter", name) for name in names]
        if any(part.needs_hidden_states or part.needs_training for part in self.parts):
            raise ConfigError("fused takes training-free drafters that need no hidden states")
        self.num_nodes = num_nodes

    def prepare(self, target: Backbone) -> None:
        for part in self.parts:
            part.prepare(target)

    def start(self, state: DecodeState) -> None:
        for part in self.parts:
            part.start(state)

    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        budget = min(budget, self.num_nodes)
        trees = []
        for part in self.parts:
            trees.append(part.propose(state, budget))
        try:
            return DraftTree.fuse(trees, budget)
        except ValueError as error:
            raise ConfigError(f"fused: {error} (use greedy decoding, or drafters without draft distributions)") from None

    def observe(self, state: DecodeState, result: AcceptResult) -> None:
        for part in self.parts:
            part.observe(state, result)

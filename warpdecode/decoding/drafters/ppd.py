"""Parallel prompt decoding (PPD, Chen et al. 2024): the target drafts for itself through K trained
prompt tokens (`models/ppd.py`) that ride along in every verify forward.

Each verify forward carries, after the candidate tree, a *group* of K prompt rows after the pending
token and after each of the first `attach` candidate nodes: auxiliary rows run with the trained
embeddings, never verified and never committed, that continue their node's path at positions
+1..+K. Once the step is verified, the group of the last accepted node (the pending token's when
nothing was accepted) holds the target's guesses for the tokens after the new pending one: row j
ranks the token j places after it. They fill the next tree as Medusa's heads fill theirs (the stored
tree of rank paths, every node of depth d taking a candidate of row d, whatever its parent).

    step s:   pending ─ candidates ...        group after the last accepted node: p_1 p_2 p_3
    step s+1: bonus ─ guesses of p_1 ─ p_2 ─ p_3 (a tree of their ranked candidates) + new groups

A step whose last accepted node had no group (and the first step) has no guesses: it proposes the
groups only (and the prompt-lookup chain, with `lookup`). The groups are the cost: K rows each, so a
tree of n nodes with every node attached verifies 1 + n + K(n + 1) rows; `num_nodes=auto` counts
them when it chooses the size.

The rows are input embeddings: on ONNX Runtime they run through the package's embeds graphs
(`backbone.embeds.onnx`); the int8/int4 graphs have none and refuse PPD with `CapabilityError`.
Deterministic trees: lossless under every lossless verifier. The device step (`step=device`) runs
PPD too (`device_step/ppd.py`).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from warpdecode.decoding.device_step.ppd import DevicePPD
from warpdecode.decoding.drafters.learned import PackagedDrafter, ShapeLayout, fill_shape, ranked_tokens
from warpdecode.decoding.latency import choose_nodes, verify_seconds
from warpdecode.decoding.protocols import AcceptResult, DecodeState
from warpdecode.decoding.registry import register
from warpdecode.decoding.tree import DraftTree
from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.ppd import PromptTokens


@register("drafter", "ppd")
class PPDDrafter(PackagedDrafter[PromptTokens]):
    kind = "ppd"
    device_drafter: ClassVar[type[DevicePPD]] = DevicePPD
    """Its form made of tensor ops, for the device-resident step (`decoding/device_step`): the groups ride
    in the verify forward as auxiliary rows."""

    net_class = PromptTokens

    def __init__(self, path: str, tree: str = "static", num_nodes: int | str | None = None,
                 num_tokens: int | None = None, attach: int | None = None, lookup: int = 0,
                 lookup_scale: bool = True) -> None:
        """Args:
        path: a drafter package trained with `warpdecode fit --config configs/drafters/ppd.yaml`.
        tree: `static` (the tree stored with the drafter) or `chain`.
        num_nodes: candidate nodes (default: the stored tree's size); `auto`: the size with the most
            expected tokens per second on this machine, prompt rows included.
        num_tokens: chain length, at most the number of prompt tokens (default: all of them).
        attach: candidate nodes, best first, that carry a group of prompt rows besides the pending
            token (default: every node; fewer rows per step, but no guesses after a step that ends
            on a node without one).
        lookup: fuse a prompt-lookup chain of up to this many tokens into every proposal whose context
            has a match (0: off).
        lookup_scale: cut the lookup chain after a shorter match in proportion to the match.
        """
        if attach is not None and attach < 0:
            raise ConfigError(f"ppd attach must be >= 0, got {attach}")
        super().__init__(path, tree, num_nodes, num_tokens, lookup, lookup_scale)
        self.attach = attach
        self.guesses: list[list[int]] = []
        """Ranked candidate tokens per depth after the pending token (empty: none this step)."""
        self.sent: DraftTree | None = None
        self.groups: dict[int, int] = {}
        """Node (-1: the pending token) → tree index of the first prompt row of its group, in `sent`."""
        self.group_rows = 0
        """Prompt rows per group in `sent`."""
        self.width = 1
        """Candidates ranked per prompt row: one more than the shape's largest rank."""

    def max_depth(self, net: PromptTokens) -> int:
        return net.num_prompts

    def prepare(self, target: Backbone) -> None:
        if not target.accepts_inputs_embeds():
            raise CapabilityError("ppd runs its prompt tokens through the target as input embeddings, which this "
                                  "backend's graph does not take: use the torch backend, or an unquantised graph of "
                                  "a package exported with its embeds variant")
        super().prepare(target)
        self.needs_hidden_states = ()  # the guesses are the target's own logits
        self.width = ShapeLayout.of(self.shape).width

    def start(self, state: DecodeState) -> None:
        self.guesses, self.sent, self.groups, self.group_rows = [], None, {}, 0

    def attached(self, nodes: int) -> int:
        """Candidate nodes that carry a group when the tree has `nodes` nodes."""
        return nodes if self.attach is None else min(self.attach, nodes)

    def rows(self, nodes: int, group: int) -> int:
        """Tree entries (candidates and prompt rows) of a tree of `nodes` nodes with groups of `group` rows."""
        return nodes + group * (1 + self.attached(nodes))

    def fastest_size(self, stored: int) -> int:
        """`num_nodes=auto`: as for the other drafters, with every group's prompt rows in the verify cost."""
        assert self.net is not None and self.checked is not None
        curve = self.validation_curve(stored)
        rows = [1 + self.rows(n, self.net.num_prompts) for n in range(len(curve) + 1)]
        seconds = verify_seconds(self.checked, rows[-1])
        return choose_nodes(curve, [seconds[r - 1] for r in rows])

    @torch.inference_mode()
    def draft(self, state: DecodeState, budget: int) -> DraftTree:
        """The tree of the stored shape from the last step's guesses (empty without them)."""
        shape = [p for p in self.shape if len(p) <= len(self.guesses)][:budget]
        if not shape:
            return DraftTree.empty()
        guesses = self.guesses
        return fill_shape(ShapeLayout.of(shape), guesses[0], lambda depth, grow, tokens: [guesses[depth]] * len(grow))

    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        """The candidates (`draft`, fused with prompt lookup) and the prompt-row groups, within `budget` entries."""
        assert self.net is not None, "prepare() must run first"
        group = min(self.net.num_prompts, budget)
        if group < 1:
            self.sent = None
            return DraftTree.empty()
        nodes = budget
        while nodes > 0 and self.rows(nodes, group) > budget:
            nodes -= 1
        candidates = super().propose(state, nodes) if nodes else DraftTree.empty()
        self.sent = self.with_groups(candidates, group)
        return self.sent

    def with_groups(self, candidates: DraftTree, group: int) -> DraftTree:
        """`candidates` followed by a group of `group` prompt rows (a chain) after the pending token and
        after each of its first `attached` nodes; records where each group starts (`groups`)."""
        assert self.net is not None
        hosts = [-1, *range(self.attached(candidates.size))]
        parents = candidates.parents.tolist()
        self.groups, self.group_rows = {}, group
        for host in hosts:
            first = len(parents)
            self.groups[host] = first
            parents += [host, *range(first, first + group - 1)]
        extra = group * len(hosts)
        tokens = torch.cat([candidates.tokens, torch.zeros(extra, dtype=torch.int64)])  # placeholders
        embeds = self.net.prompts.detach()[:group].repeat(len(hosts), 1)  # (extra, C)
        return DraftTree(tokens, torch.tensor(parents, dtype=torch.int64), auxiliary=extra, auxiliary_embeds=embeds)

    def observe(self, state: DecodeState, result: AcceptResult) -> None:
        """Keep the guesses of the last accepted node's group (none when it had no group, or when the
        forward did not run this drafter's tree, e.g. inside a fused one)."""
        self.guesses = []
        net, tree, logits = self.net, state.forward_tree, state.forward_logits
        if self.sent is None or tree is not self.sent or logits is None or net is None:
            return
        first = self.groups.get(result.path[-1] if result.path else -1)
        if first is None:
            return
        rows = logits[1 + first : 1 + first + self.group_rows, net.draft_vocab]  # (group, N): forward row = tree index + 1
        self.guesses = ranked_tokens(rows, net.draft_vocab, self.width)

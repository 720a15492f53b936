"""PPD with tensor ops: `drafters/ppd.py`'s prompt-row groups ride in the device step's verify
forward as auxiliary rows (`tree.AuxiliaryRows`: the trained prompt embeddings as block inputs, never
verified or committed), and the guesses of the group after the last accepted node fill the next
static tree as Medusa's heads fill theirs (a node of rank path (r1, ..., rd) takes the rd-th
candidate of prompt row d).

The static forward holds the tree of the stored shape, then a group of K prompt rows (a chain) after
the pending token and after every node that can carry one (with `attach`, the nodes that can be
among the first `attach` proposed). What the host drafter decides from its budget each step is
computed from `room` with tensor ops, so the proposals, the accepted lengths and the output are the
host drafter's:

    g = min(K, room)                               prompt rows per group sent
    n = most nodes with n + g (1 + min(attach, n)) <= room
    valid = the first n nodes in node order no deeper than the guesses (g of the last step; none first)
    sent  = the first g rows of the pending token's group and of the first `attach` valid nodes' groups

After the verify the guesses are the ranked draft-vocabulary logits of the kept path's last node's
group (`read_auxiliary`), or none when that node had no group sent. The static form runs every row
(a tree of N nodes: 1 + N + K (1 + N) rows with `attach` unset, however many the budget lets the host
drafter send); the eager form runs the sent ones only, the engine's rows in the engine's order.
`lookup=` stays on the host (`learned.DeviceLearned`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from warpdecode.decoding.device_step.learned import DeviceLearned
from warpdecode.decoding.device_step.state import DeviceState
from warpdecode.decoding.device_step.tree import AuxiliaryRows
from warpdecode.decoding.tree_shapes import RankPath
from warpdecode.models.ppd import PromptTokens
from warpdecode.models.transformer import Transformer

if TYPE_CHECKING:
    from warpdecode.decoding.drafters.ppd import PPDDrafter


def group_hosts(paths: list[RankPath], attach: int | None) -> list[int]:
    """The nodes that can carry a group: node i is among the first `attach` proposed nodes in some step
    iff fewer than `attach` nodes before it are no deeper than it (the fewest that can come before it,
    with guesses exactly as deep as it).

    Example: paths [(0,), (0, 0), (1,)], attach 2 → [0, 1, 2] (node 2 is second when the guesses are one deep).
    """
    if attach is None:
        return list(range(len(paths)))
    return [i for i, p in enumerate(paths) if sum(len(q) <= len(p) for q in paths[:i]) < attach]


class DevicePPD(DeviceLearned[PromptTokens]):
    host: PPDDrafter

    def __init__(self, host: PPDDrafter) -> None:
        super().__init__(host)
        self.num_prompts = 0  # K
        self.attach = 0  # most nodes with a group (N when unlimited)
        self.depths = torch.zeros(0, dtype=torch.int64)  # (N,)
        self.ranks = torch.zeros(0, dtype=torch.int64)  # (N,)
        self.counts = torch.zeros(0, dtype=torch.int64)  # (N,) 1..N, candidate counts
        self.group_nodes = torch.zeros(0, dtype=torch.int64)  # (G - 1,) the nodes carrying groups 1.. (0: pending)
        self.group_of = torch.zeros(0, dtype=torch.int64)  # (N + 1,) group of the pending token, of each node; -1
        self.prompt_index = torch.zeros(0, dtype=torch.int64)  # (K,) 0..K-1
        self.guesses = torch.zeros(0, 0, dtype=torch.int64)  # (K, width) ranked candidates per prompt row
        self.depth = torch.zeros((), dtype=torch.int64)  # () guess rows that count (0: none)
        self.group_sent = torch.zeros(0, dtype=torch.bool)  # (G,) this step's groups (draft → read_auxiliary)
        self.rows_sent = torch.zeros((), dtype=torch.int64)  # () this step's g

    @classmethod
    def of(cls, drafter: PPDDrafter) -> DevicePPD:
        return cls(drafter)

    def prepare_tree(self, paths: list[RankPath], target: Transformer) -> None:
        assert self.net is not None
        device, K, N = target.embed.weight.device, self.net.num_prompts, len(paths)
        hosts = [-1, *group_hosts(paths, self.host.attach)]
        parents: list[int] = []  # of the auxiliary rows, in node numbering (N + b: auxiliary row b)
        for host in hosts:
            first = N + len(parents)
            parents += [host, *range(first, first + K - 1)]
        embeds = self.net.prompts.detach().repeat(len(hosts), 1).to(target.embed.weight.dtype)  # (G K, C)
        self.auxiliary = AuxiliaryRows.after(self.tree, parents, embeds)
        self.num_prompts, self.attach = K, N if self.host.attach is None else self.host.attach
        self.depths = torch.tensor([len(p) for p in paths], dtype=torch.int64, device=device)
        self.ranks = torch.tensor([p[-1] for p in paths], dtype=torch.int64, device=device)
        self.counts = torch.arange(1, N + 1, device=device)
        self.group_nodes = torch.tensor(hosts[1:], dtype=torch.int64, device=device)
        group_of = [-1] * (N + 1)
        for g, host in enumerate(hosts):
            group_of[host + 1] = g
        self.group_of = torch.tensor(group_of, dtype=torch.int64, device=device)
        self.prompt_index = torch.arange(K, device=device)
        self.guesses = torch.zeros(K, self.width, dtype=torch.int64, device=device)
        self.depth = torch.zeros((), dtype=torch.int64, device=device)

    def start(self, hidden: dict[int, Tensor], tokens: Tensor, capacity: int) -> None:
        """A new request has no guesses: its first step sends the pending token's group only."""
        self.depth.zero_()

    def observe(self, hidden: dict[int, Tensor], tokens: Tensor, count: Tensor, keep: Tensor) -> None:
        """Reads no features: the guesses come from the auxiliary rows' logits (`read_auxiliary`)."""

    def draft(self, state: DeviceState, room: Tensor) -> tuple[Tensor, Tensor]:
        aux = self.auxiliary
        assert aux is not None, "prepare() must run first"
        g = room.clamp(max=self.num_prompts)  # () the host drafter's group size
        fits = self.counts + g * (1 + self.counts.clamp(max=self.attach)) <= room  # (N,) a prefix
        deep_enough = self.depths <= self.depth  # (N,) the host drafter's shape cut to the guesses
        order = deep_enough.to(torch.int64).cumsum(0)  # (N,) 1-based rank among them
        valid = deep_enough & (order <= fits.sum())
        tokens = self.guesses[(self.depths - 1).clamp(min=0), self.ranks]  # (N,) rows of depth d-1, rank r_d
        some = (g > 0).view(1)
        carries = (valid & (order <= self.attach)).index_select(0, self.group_nodes)  # (G - 1,)
        self.group_sent = torch.cat([some, carries & some])  # (G,)
        aux.sent.copy_((self.group_sent[:, None] & (self.prompt_index < g)[None, :]).view(-1))
        self.rows_sent = g
        return tokens, valid

    def read_auxiliary(self, logits: Tensor, rows: Tensor, end: Tensor, keep: Tensor) -> None:
        """The guesses of `end`'s group (its first g rows count), found among the rows that ran."""
        assert self.net is not None
        group = self.group_of.index_select(0, end + 1)  # (1,) -1: no group
        has = (group >= 0) & self.group_sent.index_select(0, group.clamp(min=0))  # (1,)
        wanted = group.clamp(min=0) * self.num_prompts + self.prompt_index  # (K,) auxiliary rows
        at = torch.searchsorted(rows, wanted).clamp(max=max(rows.shape[0] - 1, 0))  # (K,) their rows in `logits`
        if rows.shape[0]:
            ranked = self.ranked(logits.index_select(0, at)[:, self.net.draft_vocab])  # (K, width)
            self.guesses.copy_(torch.where(keep, ranked, self.guesses))
        depth = torch.where(has[0], self.rows_sent, 0)
        self.depth.copy_(torch.where(keep, depth, self.depth))

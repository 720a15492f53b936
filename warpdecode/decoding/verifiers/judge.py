"""Judge decoding (Bachmann et al. 2025). Lossy: accepted tokens need not be the target's choice.

Walk the tree as greedy matching does, but where no child is the target's argmax, follow the child
the trained judge (`models/judge_head.py`) approves with the highest score, if any. The judge reads
the target's final hidden state at each drafted token from the verify forward itself, so judging
costs one small matrix-vector product per node. The bonus token comes from the sampler at the row
after the accepted path (argmax at temperature 0). `AcceptResult.divergent` counts the approved
tokens that are not the target's choice: the output divergence the method trades for speed.

    warpdecode bench --methods int4_self:verifier=judge:verifier.path=drafters/judge:verifier.threshold=0.5
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch
from torch import Tensor

from warpdecode.decoding.protocols import NO_HIDDEN_STATES, AcceptResult, Verifier
from warpdecode.decoding.registry import register
from warpdecode.decoding.sampler import Sampler
from warpdecode.decoding.tree import DraftTree
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.models.judge_head import JudgeHead, judge_signals

KIND = "judge"


def judge_accept(tree: DraftTree, target_logits: Tensor, scores: Tensor, threshold: float,
                 sampler: Sampler) -> AcceptResult:
    """Args:
    tree: N-node proposal.
    target_logits: (N+1, V); row 0 follows the pending token, row i+1 follows node i.
    scores: (N,) the judge's probability that each node's token is acceptable.
    threshold: approve a node whose score exceeds this.
    """
    best = target_logits.argmax(dim=-1).tolist()  # (N+1,)
    tokens, score = tree.tokens.tolist(), scores.tolist()
    children = tree.children()
    path: list[int] = []
    divergent = 0
    node = -1
    while True:
        kids = children.get(node, [])
        child = next((c for c in kids if tokens[c] == best[node + 1]), None)
        if child is None:
            approved = [c for c in kids if score[c] > threshold]
            if not approved:
                bonus = int(sampler.select(target_logits[node + 1 : node + 2])[0])
                return AcceptResult.from_path(tree, path, bonus, divergent=divergent)
            child = max(approved, key=lambda c: score[c])
            divergent += 1
        path.append(child)
        node = child


def load_judge(path: str, target: Backbone) -> JudgeHead:
    """The trained head of a `judge` package, checked to be trained for `target`."""
    package = DrafterPackage.load(path, KIND)
    package.check_target(target)
    head = JudgeHead(**package.config)
    head.load_state_dict(package.weights)
    return head.to(target.embed.weight.device).eval()


@register("verifier", "judge")
class Judge(Verifier):
    lossless: ClassVar[bool] = False
    needs_sampling: ClassVar[bool] = False
    needs_training: ClassVar[bool] = True

    def __init__(self, path: str | None = None, threshold: float = 0.5) -> None:
        """Args:
        path: a judge package (`warpdecode fit --config configs/controls/judge.yaml`).
        threshold: approve a token the target disagrees with when the judge's probability that it is
            acceptable exceeds this (higher: fewer approvals, closer to the target's own output).
        """
        if path is None:
            raise ConfigError("the judge verifier needs a trained judge: verifier.path=DIR "
                              "(train one with `warpdecode fit --config configs/controls/judge.yaml`)")
        if not 0.0 <= threshold <= 1.0:
            raise ConfigError(f"judge threshold must be in [0, 1], got {threshold}")
        self.path, self.threshold = path, threshold
        self.head: JudgeHead | None = None
        self.needs_hidden_states: tuple[int, ...] = ()

    def prepare(self, target: Backbone) -> None:
        if self.head is None:
            self.head = load_judge(self.path, target)
        self.needs_hidden_states = (target.config.n_layer,)

    def accept(self, tree: DraftTree, target_logits: Tensor, sampler: Sampler,
               hidden_states: Mapping[int, Tensor] = NO_HIDDEN_STATES) -> AcceptResult:
        if self.head is None or not self.needs_hidden_states:
            raise RuntimeError("call prepare(target) before accept")
        if tree.size == 0:
            return judge_accept(tree, target_logits, target_logits.new_zeros(0), self.threshold, sampler)
        rows = (tree.parents + 1).to(target_logits.device)  # (N,) the row that predicted each node
        features = hidden_states[self.needs_hidden_states[0]][1 : tree.size + 1]  # (N, C) at each node
        with torch.inference_mode():
            scores = self.head(features, judge_signals(target_logits[rows], tree.tokens)).sigmoid()
        return judge_accept(tree, target_logits, scores, self.threshold, sampler)

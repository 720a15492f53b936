"""Judge decoding (Bachmann et al. 2025). Lossy: accepted tokens need not be the target's choice.

Walk the tree as greedy matching does, but where no child is the target's argmax, follow the child
the trained judge (`models/judge_head.py`) approves with the highest score, if any. The judge reads
the target's final hidden state at each drafted token from the verify forward itself, so judging
costs one small matrix-vector product per judged node (only where no child is the target's choice). The bonus token comes from the sampler at the row
after the accepted path (argmax at temperature 0). `AcceptResult.divergent` counts the approved
tokens that are not the target's choice: the output divergence the method trades for speed.

    warpdecode bench --methods int4_self:verifier=judge:verifier.path=drafters/judge:verifier.threshold=0.5
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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
from warpdecode.models.judge_head import JudgeHead, JudgeHeadConfig, judge_signals

KIND = "judge"


def judge_accept(tree: DraftTree, target_logits: Tensor, score: Callable[[list[int]], list[float]], threshold: float,
                 sampler: Sampler) -> AcceptResult:
    """Args:
    tree: N-node proposal.
    target_logits: (N+1, V); row 0 follows the pending token, row i+1 follows node i.
    score: the judge's probabilities that the given nodes' tokens are acceptable (asked only where
        no child is the target's choice).
    threshold: approve a node whose score exceeds this.
    """
    best = target_logits.argmax(dim=-1).tolist()  # (N+1,)
    tokens = tree.tokens.tolist()
    children = tree.children()
    path: list[int] = []
    divergent = 0
    node = -1
    while True:
        kids = children.get(node, [])
        child = next((c for c in kids if tokens[c] == best[node + 1]), None)
        if child is None:
            scored = [(p, c) for p, c in zip(score(kids), kids, strict=True) if p > threshold] if kids else []
            if not scored:
                bonus = int(sampler.select(target_logits[node + 1 : node + 2])[0])
                return AcceptResult.from_path(tree, path, bonus, divergent=divergent)
            child = max(scored)[1]
            divergent += 1
        path.append(child)
        node = child


def load_judge(path: str, target: Backbone) -> JudgeHead:
    """The trained head of a `judge` package, checked to be trained for `target`."""
    package = DrafterPackage.load(path, KIND)
    package.check_target(target)
    head = JudgeHead.from_config(JudgeHeadConfig.from_dict(package.config, f"{path}/drafter.json"))
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
        self.checked: Backbone | None = None
        self.needs_hidden_states: tuple[int, ...] = ()

    def prepare(self, target: Backbone) -> None:
        if self.checked is not target:
            self.head, self.checked = load_judge(self.path, target), target
            self.needs_hidden_states = (target.config.n_layer,)

    def accept(self, tree: DraftTree, target_logits: Tensor, sampler: Sampler,
               hidden_states: Mapping[int, Tensor] = NO_HIDDEN_STATES) -> AcceptResult:
        if self.head is None or not self.needs_hidden_states:
            raise RuntimeError("call prepare(target) before accept")
        features = hidden_states[self.needs_hidden_states[0]]  # (N+1, C): row i+1 at node i
        head = self.head

        def score(nodes: list[int]) -> list[float]:
            index = torch.tensor(nodes)
            rows = (tree.parents[index] + 1).to(target_logits.device)  # the rows that predicted them
            signals = judge_signals(target_logits[rows], tree.tokens[index])
            with torch.inference_mode():
                return head(features[index + 1], signals).sigmoid().tolist()

        return judge_accept(tree, target_logits, score, self.threshold, sampler)

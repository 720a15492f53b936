"""Train a distilled draft model (`models/distilled_draft.py`) on a frozen target's own answers.

The draft starts as `init_layers` of the target's blocks (evenly spread by default, first and last
included) and is distilled on the target's greedy answers: at every position the soft
cross-entropy against the target's distribution of the next token, the softmax of the frozen draft
head over the target's feature there (sequence-level distillation through the data, token-level
through the loss; prompt positions teach too, since the draft prefills the prompt itself).

Validation ranks are exact for the trees a draft model makes: a draft token at depth k is proposed
after the k-1 tokens above it, and a node is only reached when those were the true tokens, so the
teacher-forced rank of x_{j+1} after the true prefix x_0..x_j is the rank the draft gives it at any
depth (`ranks`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from warpdecode.errors import ConfigError
from warpdecode.models.distilled_draft import (
    DistilledConfig,
    DistilledDraftNet,
    check_init_layers,
    spread_layers,
)
from warpdecode.models.eagle import shift_left
from warpdecode.modules.drafter import DrafterModule, DrafterTraining


class DistilledDraftModule(DrafterModule):
    aliases = ("warpdecode.modules.distilled_draft.DistilledDraftDrafter",)  # former class path (old recipes)
    kind = "distilled"
    net: DistilledDraftNet

    def __init__(
        self,
        num_layers: int = 4,
        init_layers: list[int] | None = None,
        depth: int = 6,
        **training: Any,
    ) -> None:
        """
        Args:
            num_layers: Blocks of the draft model.
            init_layers: The target blocks the draft's blocks start from (default: `num_layers` spread
                evenly, the first and the last included).
            depth: Draft depth of the validation ranks the simulated acceptance and the tree come from.
            **training: `DrafterTraining`'s keywords (target, draft vocabulary, optimizer, tree,
                export_dir).
        """
        if depth < 1:
            raise ConfigError(f"depth must be >= 1, got {depth}")
        super().__init__(DrafterTraining(**training))
        L = self.target.config.n_layer
        layers = spread_layers(L, num_layers) if init_layers is None else list(init_layers)
        check_init_layers(layers, L)
        if len(layers) != num_layers:
            raise ConfigError(f"init_layers names {len(layers)} blocks but num_layers is {num_layers}")
        self.init_layers = layers
        vocab = min(self.training_args.draft_vocab_size, self.target.config.vocab_size)
        self.net = DistilledDraftNet(self.target.config, num_layers, vocab)
        self.net.tie_head(self.target)

    def init_drafter(self, draft_vocab: Tensor) -> None:
        self.net.init_from_target(self.target, self.init_layers, draft_vocab)
        self._initialised = True

    def draft_logits(self, batch: dict[str, Tensor]) -> Tensor:
        """(B, T, N) teacher-forced draft logits; entry i scores x_{i+1}."""
        return self.net(batch["tokens"], self.target.embed)

    def loss(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        logits = self.draft_logits(batch)
        tokens, lengths = batch["tokens"], batch["lengths"]
        features = self.features(batch)
        with torch.no_grad():
            teacher = self.net.frozen_head()(features.to(self.net.frozen_head().weight.dtype)).float().softmax(-1)
        valid = (torch.arange(tokens.shape[1], device=tokens.device)[None] + 1 < lengths[:, None]).float()  # x_{i+1} exists
        soft_ce = -(teacher * logits.float().log_softmax(-1)).sum(-1)  # (B, T)
        loss = (soft_ce * valid).sum() / valid.sum().clamp_min(1)
        agree = ((logits.argmax(-1) == teacher.argmax(-1)).float() * valid).sum() / valid.sum().clamp_min(1)
        return loss, {"top1_agreement": agree.detach()}

    def ranks(self, batch: dict[str, Tensor]) -> Tensor:
        logits = self.draft_logits(batch)
        n = batch["tokens"].shape[1] - 1
        one_step = self.ranks_of(logits[:, :n], batch, 1)  # (B, n): rank of x_{j+1} after x_0..x_j
        # Start i: the target has just emitted x_{i+1}; depth k+1 drafts x_{i+2+k} after x_0..x_{i+1+k}.
        depth = self.hparams["depth"]
        depth_ranks = torch.stack([shift_left(one_step, 1 + k, n) for k in range(depth)], dim=-1)  # (B, n, depth)
        label_at = torch.arange(n, device=one_step.device)[None, :, None] + 2 + torch.arange(depth, device=one_step.device)
        depth_ranks = torch.where(label_at < batch["lengths"][:, None, None], depth_ranks, self.training_args.max_rank)
        return depth_ranks[batch["answer_mask"][:, 1:]]  # (M, depth)

    def package_config(self) -> DistilledConfig:
        return DistilledConfig(draft_vocab_size=self.net.config.vocab_size, num_layers=self.net.config.n_layer,
                               init_layers=tuple(self.init_layers))

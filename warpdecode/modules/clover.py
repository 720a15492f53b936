"""Train Clover's draft network (`models/clover.py`) on a frozen target, by teacher distillation.

Step k (1..`steps`) from start i reads the true tokens x_{i+1}..x_{i+k} (teacher forcing, as a tree
path whose tokens were all accepted) and scores x_{i+1+k}; its loss is the soft cross-entropy against
the target's own distribution of that token (the softmax of the frozen draft head over f_{i+k}),
weighted `step_decay**(k-1)` and averaged over the positions where x_{i+1+k} exists, prompt positions
included (the Hydra++ teacher loss, with Clover's regressive network).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from warpdecode.errors import ConfigError
from warpdecode.models.clover import CloverConfig, CloverNet
from warpdecode.modules.drafter import DrafterModule, DrafterTraining, distillation_loss


class CloverModule(DrafterModule):
    aliases = ("warpdecode.modules.clover.CloverDrafter",)  # former class path (old recipes)
    kind = "clover"
    net: CloverNet

    def __init__(
        self,
        d_ff: int | None = None,
        steps: int = 4,
        step_decay: float = 0.8,
        **training: Any,
    ) -> None:
        """
        Args:
            d_ff: MLP width of the augmenting block and the decoder (default: the target's).
            steps: Draft steps unrolled in training; also the depth of the validation ranks the
                simulated acceptance and the tree are computed from.
            step_decay: Loss weight of step k is step_decay**(k-1).
            **training: `DrafterTraining`'s keywords (target, draft vocabulary, optimizer, tree,
                export_dir).
        """
        if steps < 1 or not 0 < step_decay <= 1:
            raise ConfigError(f"need steps >= 1 and 0 < step_decay <= 1, got {steps}, {step_decay}")
        super().__init__(DrafterTraining(**training))
        vocab = min(self.training_args.draft_vocab_size, self.target.config.vocab_size)
        self.net = CloverNet(self.target.config, vocab, d_ff)
        self.net.tie_head(self.target)

    def init_drafter(self, draft_vocab: Tensor) -> None:
        self.net.init_from_target(self.target, draft_vocab)
        self._initialised = True

    def _unroll(self, batch: dict[str, Tensor]) -> tuple[list[Tensor], Tensor]:
        """Logits of every step and the (B, T, C) target features."""
        features = self.features(batch)
        outputs = self.net.unrolled(features.to(self.net.fc.weight.dtype), batch["tokens"], self.target.embed,
                                    self.hparams["steps"])
        return outputs, features

    def loss(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        outputs, features = self._unroll(batch)
        lengths = batch["lengths"]
        with torch.no_grad():
            target_probs = self.net.head(features.to(self.net.head.weight.dtype)).float().softmax(-1)  # (B, T, N)
        total = torch.zeros((), device=lengths.device)
        parts: dict[str, Tensor] = {}
        for k, logits in enumerate(outputs, start=1):
            token_loss = distillation_loss(logits, target_probs, lengths, ahead=k)  # step k drafts x_{i+1+k}
            total = total + self.hparams["step_decay"] ** (k - 1) * token_loss
            parts[f"token_loss/d{k}"] = token_loss.detach()
        return total, parts

    def ranks(self, batch: dict[str, Tensor]) -> Tensor:
        outputs, _ = self._unroll(batch)
        # Start i: the target has just emitted x_{i+1}; step k drafts x_{i+1+k}.
        columns = [self.ranks_of(logits, batch, 1 + k) for k, logits in enumerate(outputs, start=1)]
        return torch.stack(columns, dim=-1)[batch["answer_mask"][:, 1:]]  # (M, steps)

    def package_config(self) -> CloverConfig:
        return CloverConfig(draft_vocab_size=self.net.config.vocab_size, d_ff=self.net.config.d_ff)

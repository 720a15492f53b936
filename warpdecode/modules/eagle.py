"""Train the EAGLE-style feature-level drafter (`models/eagle.py`) on a frozen target.

Loss per unrolled drafting step k (training-time test, weighted `step_decay**k`):
`feature_weight * SmoothL1(f̂, f) + token_weight * CE(draft logits, target distribution)`, where
the target distribution is the target's softmax over the draft vocabulary at the same position
(distillation, so prompt positions teach as much as answer positions). EAGLE uses weights 1.0 and 0.1;
EAGLE-3 drops the feature loss (weight 0) and fuses several of the target's layers into the feature
(`feature_layers`), which the frozen target then computes during training (the on-disk feature
cache holds only the final layer).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from warpdecode.errors import ConfigError
from warpdecode.models.eagle import EagleConfig, EagleNet
from warpdecode.modules.drafter import DrafterModule, DrafterTraining, distillation_loss, valid_starts


class EagleModule(DrafterModule):
    aliases = ("warpdecode.modules.eagle.EagleDrafter",)  # former class path (old recipes)
    kind = "eagle"
    net: EagleNet

    def __init__(
        self,
        d_ff: int | None = None,
        feature_layers: list[int] | None = None,
        steps: int = 5,
        step_decay: float = 0.8,
        feature_weight: float | None = None,
        token_weight: float = 0.1,
        layout: str | None = None,
        **training: Any,
    ) -> None:
        """
        Args:
            d_ff: MLP width of the draft block (default: the target's).
            feature_layers: The target's hidden states (0..L, the final one L included) fused into the
                drafter's input feature, EAGLE-3 style (default: only the final one). For `layout: eagle3`,
                three distinct target layer inputs in 0..L-1 (default 2, L // 2, L - 3).
            steps: Drafting steps unrolled in training (training-time test); also the depth of the
                validation ranks the simulated acceptance and the tree are computed from.
            step_decay: Loss weight of step k is step_decay**k.
            feature_weight: Weight of the feature regression (SmoothL1) loss (default 1.0; 0 for
                `layout: eagle3`, whose fed-back features are unnormed block outputs with no target to match).
            token_weight: Weight of the token distillation (soft cross-entropy) loss.
            layout: None for warpdecode's network; "eagle" for EAGLE-1's shape (no norms around the
                block, fc without a bias) and "eagle3" for EAGLE-3's (the embedding and the fused feature
                normed apart and read 2C wide by attention), which `convert-drafter --format eagle|eagle3`
                writes for vLLM, SGLang and SafeAILab/EAGLE (`models/eagle.py`).
            **training: `DrafterTraining`'s keywords (target, draft vocabulary, optimizer, tree,
                export_dir).
        """
        if feature_weight is None:
            feature_weight = 0.0 if layout == "eagle3" else 1.0
        elif layout == "eagle3" and feature_weight > 0:
            raise ConfigError("layout eagle3 trains on the token loss alone: its fed-back features are unnormed block "
                              f"outputs with no target feature to regress on; set feature_weight: 0, got {feature_weight}")
        if steps < 1 or not 0 < step_decay <= 1 or feature_weight < 0 or token_weight < 0:
            raise ConfigError(f"need steps >= 1, 0 < step_decay <= 1 and non-negative loss weights, got "
                              f"{steps}, {step_decay}, {feature_weight}, {token_weight}")
        super().__init__(DrafterTraining(**training))
        self.hparams["feature_weight"] = feature_weight
        vocab = min(self.training_args.draft_vocab_size, self.target.config.vocab_size)
        self.net = EagleNet(self.target.config, vocab, d_ff, feature_layers, layout)
        self.net.tie_head(self.target)

    def init_drafter(self, draft_vocab: Tensor) -> None:
        self.net.init_from_target(self.target, draft_vocab)
        self._initialised = True

    def _unroll(self, batch: dict[str, Tensor]) -> tuple[list[tuple[Tensor, Tensor]], Tensor]:
        """The unrolled steps and the (B, T, C) target's final features."""
        L = self.target.config.n_layer
        layers = self.net.feature_layers if L in self.net.feature_layers else (*self.net.feature_layers, L)
        hidden = self.hidden_states(batch, layers)
        fused = self.net.target_feature({j: hidden[j].to(self.net.dtype) for j in self.net.feature_layers})
        outputs = self.net.unrolled(fused, batch["tokens"], self.target.embed, self.hparams["steps"])
        return outputs, hidden[L]

    def loss(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        outputs, features = self._unroll(batch)
        tokens, lengths = batch["tokens"], batch["lengths"]
        n = tokens.shape[1] - 1
        with torch.no_grad():
            head = self.net.frozen_head()  # the target's LM head rows: its distribution on the draft vocabulary
            target_probs = head(features.to(head.weight.dtype)).float().softmax(-1)  # (B, T, N)
        total = torch.zeros((), device=tokens.device)
        parts: dict[str, Tensor] = {}
        for k, (predicted, logits) in enumerate(outputs):
            m = n - k  # the starts i whose f_{i+1+k} lies inside the (padded) sequence; no later one is valid
            valid = valid_starts(lengths, m, ahead=1 + k)  # (B, m): f_{i+1+k} exists (not after the last token)
            count = valid.sum().clamp_min(1)
            wanted = features[:, 1 + k :].float()  # (B, m, C)
            feature_loss = (F.smooth_l1_loss(predicted[:, :m].float(), wanted, reduction="none").mean(-1) * valid).sum() / count
            token_loss = distillation_loss(logits, target_probs, lengths, ahead=1 + k)  # step k drafts x_{i+2+k}
            weight = self.hparams["step_decay"] ** k
            total = total + weight * (self.hparams["feature_weight"] * feature_loss + self.hparams["token_weight"] * token_loss)
            parts[f"feature_loss/d{k + 1}"] = feature_loss.detach()
            parts[f"token_loss/d{k + 1}"] = token_loss.detach()
        return total, parts

    def ranks(self, batch: dict[str, Tensor]) -> Tensor:
        outputs, _ = self._unroll(batch)
        # Start i: the target has just emitted x_{i+1} (an answer token); step k drafts x_{i+2+k}.
        columns = [self.ranks_of(logits, batch, 2 + k) for k, (_, logits) in enumerate(outputs)]
        return torch.stack(columns, dim=-1)[batch["answer_mask"][:, 1:]]  # (M, steps)

    def package_config(self) -> EagleConfig:
        return EagleConfig(draft_vocab_size=self.net.config.vocab_size, d_ff=self.net.config.d_ff,
                           feature_layers=self.net.feature_layers, layout=self.net.layout)

"""Train Medusa-1 and Hydra heads (`models/medusa.py`) on a frozen target, by teacher distillation.

Head k at position i scores x_{i+1+k}; its loss is the soft cross-entropy against the target's own
distribution of that token, the softmax of the frozen draft head over the target feature f_{i+k}
(Hydra++'s teacher loss; the data are the target's greedy answers, so this keeps their labels and
adds the rest of the distribution). Heads are weighted `head_decay**(k-1)` (Medusa's λ_k = 0.8^k up
to a constant) and averaged over the positions where x_{i+1+k} exists, prompt positions included.
Hydra's head k reads the true tokens x_{i+1}..x_{i+k} (teacher forcing), as a tree path whose
tokens were all accepted does.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from warpdecode.errors import ConfigError
from warpdecode.models.medusa import FutureHeads, HeadsConfig, HydraHeads, MedusaHeads
from warpdecode.modules.drafter import DrafterModule, DrafterTraining, distillation_loss


class FutureHeadsModule(DrafterModule):
    """What Medusa and Hydra share: subclasses name their network (`net_class`) and its default depth."""

    net_class: ClassVar[type[FutureHeads]]
    net: FutureHeads
    default_layers: ClassVar[int]

    def __init__(
        self,
        num_heads: int = 4,
        num_layers: int | None = None,
        head_decay: float = 0.8,
        **training: Any,
    ) -> None:
        """
        Args:
            num_heads: Heads K: head k drafts the token k places after the one the target emits.
            num_layers: Blocks per head (default: 1 for Medusa, 2 for Hydra).
            head_decay: Loss weight of head k is head_decay**(k-1).
            **training: `DrafterTraining`'s keywords (target, draft vocabulary, optimizer, tree,
                export_dir).
        """
        layers = self.default_layers if num_layers is None else num_layers
        if num_heads < 1 or layers < 1 or not 0 < head_decay <= 1:
            raise ConfigError(f"need num_heads >= 1, num_layers >= 1 and 0 < head_decay <= 1, got "
                              f"{num_heads}, {layers}, {head_decay}")
        super().__init__(DrafterTraining(**training))
        vocab = min(self.training_args.draft_vocab_size, self.target.config.vocab_size)
        self.net = self.net_class(self.target.config.d_model, vocab, num_heads, layers)
        self.net.tie_head(self.target)

    def logits(self, batch: dict[str, Tensor], features: Tensor) -> Tensor:
        """(B, T, K, N) head logits at every position from the batch's `features` (B, T, C)."""
        raise NotImplementedError

    def init_drafter(self, draft_vocab: Tensor) -> None:
        self.net.init_from_target(self.target, draft_vocab)
        self._initialised = True

    def _logits(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Head logits (B, T, K, N) and target features (B, T, C) in the heads' dtype."""
        features = self.features(batch).to(self.net.head.weight.dtype)
        return self.logits(batch, features), features

    def loss(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        logits, features = self._logits(batch)
        lengths = batch["lengths"]
        with torch.no_grad():
            target_probs = self.net.head(features).float().softmax(-1)  # (B, T, N): entry i is x_{i+1}'s
        total = torch.zeros((), device=lengths.device)
        parts: dict[str, Tensor] = {}
        for k in range(1, self.net.num_heads + 1):
            head_loss = distillation_loss(logits[:, :, k - 1], target_probs, lengths, ahead=k)  # head k drafts x_{i+1+k}
            total = total + self.hparams["head_decay"] ** (k - 1) * head_loss
            parts[f"token_loss/d{k}"] = head_loss.detach()
        return total, parts

    def ranks(self, batch: dict[str, Tensor]) -> Tensor:
        logits, _ = self._logits(batch)
        n = logits.shape[1] - 1
        # Start i: the target has just emitted x_{i+1} (an answer token); head k drafts x_{i+1+k}.
        columns = [self.ranks_of(logits[:, :n, k - 1], batch, 1 + k) for k in range(1, self.net.num_heads + 1)]
        return torch.stack(columns, dim=-1)[batch["answer_mask"][:, 1:]]  # (M, K)

    def package_config(self) -> HeadsConfig:
        return HeadsConfig(draft_vocab_size=int(self.net.draft_vocab.numel()), num_heads=self.net.num_heads,
                           num_layers=self.net.num_layers)


class MedusaModule(FutureHeadsModule):
    """Medusa-1 heads: each head reads the target feature alone."""

    aliases = ("warpdecode.modules.medusa.MedusaDrafter",)  # former class path (old recipes)
    kind = "medusa"
    net_class = MedusaHeads
    default_layers = 1

    def logits(self, batch: dict[str, Tensor], features: Tensor) -> Tensor:
        return self.net(features)


class HydraModule(FutureHeadsModule):
    """Hydra heads: head k also reads the embeddings of the k tokens between the feature and its prediction."""

    aliases = ("warpdecode.modules.medusa.HydraDrafter",)  # former class path (old recipes)
    kind = "hydra"
    net_class = HydraHeads
    default_layers = 2

    def logits(self, batch: dict[str, Tensor], features: Tensor) -> Tensor:
        return self.net(features, batch["tokens"], self.target.embed)

"""SpecDec++: train the acceptance-prediction head of a quantised self-drafter.

Samples come from `AcceptanceDataModule` (the drafter's hidden state and distribution signals at
each answer position, labelled with the greedy verifier's decision); the loss is BCE
(`TokenClassifierModule`: validation AUROC, accuracy and calibration). At the end of `fit` the head
is saved in the drafter-package format (kind `acceptance_head`) naming the target; run it with
`warpdecode bench --methods int4_self:num_tokens=12:acceptance_head=DIR:stop_threshold=0.7`.
"""

from __future__ import annotations

from typing import ClassVar

from warpdecode.models.acceptance_head import AcceptanceHead, AcceptanceHeadConfig
from warpdecode.modules.token_classifier import TokenClassifierModule


class AcceptanceHeadModule(TokenClassifierModule):
    kind: ClassVar[str] = "acceptance_head"

    def __init__(self, d_model: int = 576, hidden: int = 256, lr: float = 1e-3, weight_decay: float = 0.01,
                 export_dir: str | None = None) -> None:
        """
        Args:
            d_model: Width of the drafter's hidden states (the target's d_model).
            hidden: Width of the head's two hidden layers.
            lr: AdamW learning rate (constant).
            weight_decay: AdamW weight decay.
            export_dir: Where the head package is written at the end of `fit` (default `acceptance_head/` in the run).
        """
        config = AcceptanceHeadConfig(d_model=d_model, hidden=hidden)
        super().__init__(AcceptanceHead.from_config(config), config.to_dict(), lr, weight_decay, export_dir)
        self.save_hyperparameters()

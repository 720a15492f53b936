"""Judge decoding: train the judge that lets the `judge` verifier accept correct-but-unaligned
draft tokens.

Samples come from `JudgeDataModule` (substitute tokens along the target's greedy answers, labelled
by whether the target's own rollout comes back to its answer); the loss is BCE
(`TokenClassifierModule`: validation AUROC, accuracy and calibration). At the end of `fit` the
judge is saved in the drafter-package format (kind `judge`) naming the target; run it with
`warpdecode bench --methods int4_self:verifier=judge:verifier.path=DIR`.
"""

from __future__ import annotations

from typing import ClassVar

from warpdecode.decoding.verifiers.judge import KIND
from warpdecode.models.judge_head import JudgeHead, JudgeHeadConfig
from warpdecode.modules.token_classifier import TokenClassifierModule


class JudgeModule(TokenClassifierModule):
    kind: ClassVar[str] = KIND

    def __init__(self, d_model: int = 576, lr: float = 1e-3, weight_decay: float = 0.01,
                 export_dir: str | None = None) -> None:
        """
        Args:
            d_model: Width of the target's hidden states.
            lr: AdamW learning rate (constant).
            weight_decay: AdamW weight decay.
            export_dir: Where the judge package is written at the end of `fit` (default `judge/` in the run).
        """
        config = JudgeHeadConfig(d_model=d_model)
        super().__init__(JudgeHead.from_config(config), config.to_dict(), lr, weight_decay, export_dir)
        self.save_hyperparameters()

"""SpecDec++: train the acceptance-prediction head of a quantised self-drafter.

Samples come from `AcceptanceDataModule` (the drafter's hidden state and distribution signals at
each answer position, labelled with the greedy verifier's decision); the loss is BCE. Validation
logs the AUROC, the accuracy at 0.5 and the mean predicted vs measured acceptance (calibration: the
stopping rule multiplies these probabilities). At the end of `fit` the head is saved in the
drafter-package format (kind `acceptance_head`) naming the target; run it with
`warpdecode bench --methods int4_self:num_tokens=12:acceptance_head=DIR:stop_threshold=0.7`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torchmetrics import MeanMetric
from torchmetrics.classification import BinaryAccuracy, BinaryAUROC

from warpdecode.datamodules.acceptance import AcceptanceDataModule
from warpdecode.errors import ConfigError
from warpdecode.models.acceptance_head import AcceptanceHead
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.modules.run_outputs import last_logged, output_dir

KIND = "acceptance_head"


class AcceptanceHeadModule(LightningModule):
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
        super().__init__()
        self.save_hyperparameters()
        self.head = AcceptanceHead(d_model, hidden)
        self.auroc = BinaryAUROC()
        self.accuracy = BinaryAccuracy()
        self.predicted = MeanMetric()
        self.measured = MeanMetric()
        self.fit_started = time.perf_counter()
        self.package_dir: Path | None = None

    def on_fit_start(self) -> None:
        self.fit_started = time.perf_counter()

    def _loss(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        logits = self.head(batch["features"], batch["signals"])  # (B,)
        return F.binary_cross_entropy_with_logits(logits, batch["labels"]), logits.sigmoid()

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss, _ = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        loss, probs = self._loss(batch)
        labels = batch["labels"].long()
        self.log("val/loss", loss, prog_bar=True)
        self.auroc.update(probs, labels)
        self.accuracy.update(probs, labels)
        self.predicted.update(probs)
        self.measured.update(batch["labels"])

    def on_validation_epoch_end(self) -> None:
        for name, metric in (("auroc", self.auroc), ("accuracy", self.accuracy),
                             ("predicted_accept", self.predicted), ("measured_accept", self.measured)):
            self.log(f"val/{name}", metric.compute(), prog_bar=name == "auroc")
            metric.reset()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.head.parameters(), lr=self.hparams["lr"], weight_decay=self.hparams["weight_decay"])

    def package(self) -> DrafterPackage:
        datamodule = self.trainer.datamodule  # type: ignore[attr-defined]
        if not isinstance(datamodule, AcceptanceDataModule) or datamodule.target is None:
            raise ConfigError("the acceptance head is trained on an AcceptanceDataModule")
        training: dict[str, Any] = {"optimizer_steps": self.global_step, "bits": datamodule.bits, **datamodule.stats,
                                    "minutes": round((time.perf_counter() - self.fit_started) / 60, 2)}
        training.update(last_logged(self.trainer, ("val/auroc", "val/accuracy", "val/loss", "val/predicted_accept", "val/measured_accept")))
        target = DrafterPackage.describe_target(datamodule.target, datamodule.target_source)
        config = {"d_model": self.hparams["d_model"], "hidden": self.hparams["hidden"]}
        weights = {k: v.detach().float() for k, v in self.head.state_dict().items()}
        return DrafterPackage(KIND, target, config, weights, training=training)

    def on_fit_end(self) -> None:
        if not self.trainer.is_global_zero:
            return
        self.package_dir = self.package().save(output_dir(self.trainer, self.hparams["export_dir"], KIND))
        rank_zero_info(f"saved the acceptance head to {self.package_dir}")

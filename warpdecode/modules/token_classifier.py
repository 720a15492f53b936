"""BCE training of a small head that classifies drafted tokens (SpecDec++'s acceptance head, Judge
decoding's judge) on `AnswerSamplesDataModule` samples: `features`, `signals` and binary `labels`.

Validation logs the AUROC, the accuracy at 0.5 and the mean predicted vs measured positive rate
(calibration). At the end of `fit` the head is saved in the drafter-package format under the
subclass's `kind`, naming the target, with what the data and the training cost.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import BinaryAccuracy, BinaryAUROC

from warpdecode.datamodules.answer_samples import AnswerSamplesDataModule
from warpdecode.errors import ConfigError
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.modules.run_outputs import last_logged, output_dir

VALIDATION_KEYS = ("val/auroc", "val/accuracy", "val/loss", "val/predicted_positive", "val/measured_positive")


class TokenClassifierModule(LightningModule):
    kind: ClassVar[str]
    """The package kind the trained head is saved as (the component that loads it)."""

    def __init__(self, head: nn.Module, head_config: dict[str, Any], lr: float, weight_decay: float,
                 export_dir: str | None) -> None:
        super().__init__()
        self.head, self.head_config = head, head_config
        self.lr, self.weight_decay, self.export_dir = lr, weight_decay, export_dir
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
                             ("predicted_positive", self.predicted), ("measured_positive", self.measured)):
            self.log(f"val/{name}", metric.compute(), prog_bar=name == "auroc")
            metric.reset()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.head.parameters(), lr=self.lr, weight_decay=self.weight_decay)

    def package(self) -> DrafterPackage:
        datamodule = self.trainer.datamodule  # type: ignore[attr-defined]
        if not isinstance(datamodule, AnswerSamplesDataModule) or datamodule.target is None:
            raise ConfigError(f"the {self.kind} head trains on an AnswerSamplesDataModule "
                              "(AcceptanceDataModule, JudgeDataModule)")
        data = {k: v for k, v in datamodule.hparams.items() if not k.startswith("_")}  # not the CLI's own entries
        training: dict[str, Any] = {"optimizer_steps": self.global_step, **data, **datamodule.stats,
                                    "minutes": round((time.perf_counter() - self.fit_started) / 60, 2)}
        training.update(last_logged(self.trainer, VALIDATION_KEYS))
        target = DrafterPackage.describe_target(datamodule.target, datamodule.target_source)
        weights = {k: v.detach().float() for k, v in self.head.state_dict().items()}
        return DrafterPackage(self.kind, target, self.head_config, weights, training=training)

    def on_fit_end(self) -> None:
        if not self.trainer.is_global_zero:
            return
        self.package_dir = self.package().save(output_dir(self.trainer, self.export_dir, self.kind))
        rank_zero_info(f"saved the {self.kind} head to {self.package_dir}")

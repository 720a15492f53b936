"""Learn2PD: train the filter that tells a diffusion LM's decoder which positions are already final.

Samples come from `TrajectoryDataModule` (one per block and step of one-token-per-step decoding);
the loss is BCE on the still-masked positions. Validation logs, at the accept threshold the policy
will use, the precision (accepted positions that were indeed final: what keeps accuracy) and the
recall (final positions accepted: what saves steps). At the end of `fit` the filter is saved in the
drafter-package format (`drafter.json` + `drafter.safetensors`, kind `learn2pd`) naming the diffusion
LM it was trained for; run it with `warpdecode bench --methods learn2pd:path=DIR`.
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
from torchmetrics.classification import BinaryPrecision, BinaryRecall

from warpdecode.datamodules.trajectories import TrajectoryDataModule
from warpdecode.errors import ConfigError
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.models.parallel_filter import ParallelFilter, ParallelFilterConfig
from warpdecode.modules.run_outputs import last_logged, output_dir


class ParallelFilterModule(LightningModule):
    def __init__(self, block_length: int = 8, hidden: int = 128, lr: float = 3e-3, weight_decay: float = 0.0,
                 accept_threshold: float = 0.96, export_dir: str | None = None) -> None:
        """
        Args:
            block_length: Positions per block (the datamodule's block_length).
            hidden: Width of the filter's two hidden layers.
            lr: AdamW learning rate (constant).
            weight_decay: AdamW weight decay.
            accept_threshold: Filter probability above which a position is committed (validation metrics).
            export_dir: Where the filter package is written at the end of `fit` (default `learn2pd/` in the run).
        """
        super().__init__()
        if not 0 < accept_threshold < 1:
            raise ConfigError(f"accept_threshold must be in (0, 1), got {accept_threshold}")
        self.save_hyperparameters()
        self.filter = ParallelFilter(block_length, hidden)
        self.precision_metric = BinaryPrecision(threshold=accept_threshold)
        self.recall_metric = BinaryRecall(threshold=accept_threshold)
        self.fit_started = time.perf_counter()
        self.package_dir: Path | None = None

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        if isinstance(datamodule, TrajectoryDataModule) and datamodule.block_length != self.hparams["block_length"]:
            raise ConfigError(f"the filter is built for blocks of {self.hparams['block_length']} positions but the "
                              f"trajectories use {datamodule.block_length}; set model.block_length to match")

    def on_fit_start(self) -> None:
        self.fit_started = time.perf_counter()

    def _loss(self, batch: list[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        confidence, masked, final = batch
        logits = self.filter(confidence, masked)  # (N, K)
        loss = F.binary_cross_entropy_with_logits(logits[masked], final[masked].float())
        return loss, logits[masked].sigmoid(), final[masked]

    def training_step(self, batch: list[Tensor], batch_idx: int) -> Tensor:
        loss, _, _ = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: list[Tensor], batch_idx: int) -> None:
        loss, probs, final = self._loss(batch)
        self.log("val/loss", loss, prog_bar=True)
        self.precision_metric.update(probs, final.long())
        self.recall_metric.update(probs, final.long())

    def on_validation_epoch_end(self) -> None:
        self.log("val/precision", self.precision_metric.compute(), prog_bar=True)
        self.log("val/recall", self.recall_metric.compute(), prog_bar=True)
        self.precision_metric.reset()
        self.recall_metric.reset()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.filter.parameters(), lr=self.hparams["lr"], weight_decay=self.hparams["weight_decay"])

    def package(self) -> DrafterPackage:
        datamodule = self.trainer.datamodule  # type: ignore[attr-defined]
        if not isinstance(datamodule, TrajectoryDataModule) or datamodule.target is None:
            raise ConfigError("the learn2pd filter is trained on a TrajectoryDataModule")
        training: dict[str, Any] = {"optimizer_steps": self.global_step, "samples": datamodule.stats.get("samples"),
                                    "final_share": datamodule.stats.get("final_share"),
                                    "minutes": round((time.perf_counter() - self.fit_started) / 60, 2)}
        training.update(last_logged(self.trainer, ("val/precision", "val/recall", "val/loss")))
        target = DrafterPackage.describe_target(datamodule.target, datamodule.model_source)
        config = ParallelFilterConfig(block_length=self.hparams["block_length"], hidden=self.hparams["hidden"]).to_dict()
        weights = {k: v.detach().float() for k, v in self.filter.state_dict().items()}
        return DrafterPackage("learn2pd", target, config, weights, training=training)

    def on_fit_end(self) -> None:
        if not self.trainer.is_global_zero:
            return
        self.package_dir = self.package().save(output_dir(self.trainer, self.hparams["export_dir"], "learn2pd"))
        rank_zero_info(f"saved the learn2pd filter to {self.package_dir}")

"""AdaDec's learned entropy threshold: a logistic fit of "greedy's top-1 is wrong" on the entropy.

On `EntropyErrorsDataModule`'s positions (the target teacher-forced on held-out text), it fits
P(wrong | H) = sigmoid(weight * H + bias) by full-batch L-BFGS on the binary cross-entropy; the
threshold is where the fit crosses 0.5, H* = -bias / weight (He et al. 2025's criterion: above it,
greedy's choice is more likely wrong than right, and decoding pauses to rerank). Validation logs the
loss, the AUROC of entropy as a predictor of errors, the accuracy of "H > H*" as that prediction, the
fraction of positions above H* (how often decoding would pause) and H* itself. At the end of `fit`
the threshold is saved as a package (kind `adadec`, `drafter.json` + `drafter.safetensors`) naming the
target; `warpdecode generate --method adadec:path=DIR` runs it.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import BinaryAccuracy, BinaryAUROC

from warpdecode.datamodules.entropy_errors import EntropyErrorsDataModule
from warpdecode.decoding.rules.adadec import KIND
from warpdecode.errors import ConfigError
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.modules.run_outputs import last_logged, output_dir

VALIDATION_KEYS = ("val/loss", "val/auroc", "val/accuracy", "val/pause_rate", "val/threshold")


class EntropyThresholdModule(LightningModule):
    def __init__(self, lr: float = 1.0, max_iter: int = 50, export_dir: str | None = None) -> None:
        """
        Args:
            lr: L-BFGS step size.
            max_iter: L-BFGS iterations per optimizer step (one step per full batch).
            export_dir: Where the package is written at the end of `fit` (default `adadec/` in the run).
        """
        super().__init__()
        if not lr > 0 or max_iter < 1:
            raise ConfigError(f"need lr > 0 and max_iter >= 1, got {lr} and {max_iter}")
        self.save_hyperparameters()
        self.weight = nn.Parameter(torch.tensor(1.0))
        self.bias = nn.Parameter(torch.tensor(0.0))
        self.auroc, self.accuracy, self.paused = BinaryAUROC(), BinaryAccuracy(), MeanMetric()
        self.fit_started = time.perf_counter()
        self.package_dir: Path | None = None

    @property
    def threshold(self) -> float:
        """H* = -bias / weight, where the fitted P(wrong) is 0.5 (inf when the fit found no rise)."""
        weight = float(self.weight.detach())
        return -float(self.bias.detach()) / weight if weight > 0 else float("inf")

    def forward(self, entropy: Tensor) -> Tensor:
        """(B,) entropies → (B,) logits of P(wrong)."""
        return self.weight * entropy + self.bias

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = F.binary_cross_entropy_with_logits(self(batch["entropy"]), batch["wrong"])
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        entropy, wrong = batch["entropy"], batch["wrong"]
        self.log("val/loss", F.binary_cross_entropy_with_logits(self(entropy), wrong), prog_bar=True)
        above = (entropy > self.threshold).float()
        self.auroc.update(entropy, wrong.long())
        self.accuracy.update(above, wrong.long())
        self.paused.update(above)

    def on_validation_epoch_end(self) -> None:
        for name, metric in (("auroc", self.auroc), ("accuracy", self.accuracy), ("pause_rate", self.paused)):
            self.log(f"val/{name}", metric.compute(), prog_bar=name == "pause_rate")
            metric.reset()
        self.log("val/threshold", self.threshold, prog_bar=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.LBFGS(self.parameters(), lr=self.hparams["lr"], max_iter=self.hparams["max_iter"],
                                 line_search_fn="strong_wolfe")

    def on_fit_start(self) -> None:
        self.fit_started = time.perf_counter()

    def package(self) -> DrafterPackage:
        datamodule = getattr(self.trainer, "datamodule", None)
        if not isinstance(datamodule, EntropyErrorsDataModule) or datamodule.target is None:
            raise ConfigError("the adadec threshold fits on an EntropyErrorsDataModule (configs/controls/adadec.yaml)")
        data = {k: v for k, v in datamodule.hparams.items() if not k.startswith("_")}  # not the CLI's own entries
        training = {"optimizer_steps": self.global_step, **data, **datamodule.stats,
                    "minutes": round((time.perf_counter() - self.fit_started) / 60, 2)}
        training.update(last_logged(self.trainer, VALIDATION_KEYS))
        target = DrafterPackage.describe_target(datamodule.target, datamodule.target_source)
        weights = {"weight": self.weight.detach().reshape(1), "bias": self.bias.detach().reshape(1)}
        return DrafterPackage(KIND, target, {"threshold": self.threshold}, weights, training=training)

    def on_fit_end(self) -> None:
        if not self.trainer.is_global_zero:
            return
        self.package_dir = self.package().save(output_dir(self.trainer, self.hparams["export_dir"], KIND))
        rank_zero_info(f"saved the adadec threshold {self.threshold:.3f} nats to {self.package_dir}")

"""RankGen's contrastive training (Krishna et al. 2022): a prefix encoder and a continuation encoder
trained so that a prefix's vector is closer to its true continuation's than to anything else in the batch.

On `RankGenDataModule`'s examples, the loss is the InfoNCE cross-entropy of each prefix over every
continuation of the batch: its own positive, the other examples' positives (in-batch negatives) and every
example's hard negatives (same-document spans and the target's own continuations). Validation logs the
loss and the contrastive accuracy: how often the true continuation outranks all of its own example's
negatives (`val/accuracy`), only its same-document spans (`val/accuracy_random`) and only the target's
continuations (`val/accuracy_model`). At the end of `fit` the encoder is saved as one small file
(`models/rankgen.py`: weights and metadata, not the target's embeddings) that
`warpdecode generate --method rankgen:path=FILE` reads.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

from warpdecode.datamodules.rankgen_pairs import MODEL, RANDOM, RankGenDataModule
from warpdecode.errors import ConfigError
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.models.rankgen import RankGenConfig, RankGenNet, save_rankgen
from warpdecode.modules.run_outputs import last_logged, output_dir

VALIDATION_KEYS = ("val/loss", "val/accuracy", "val/accuracy_random", "val/accuracy_model")


class RankGenModule(LightningModule):
    def __init__(self, width: int = 128, layers: int = 1, heads: int = 4, temperature: float = 0.05, lr: float = 1e-3,
                 weight_decay: float = 0.01, export_path: str | None = None) -> None:
        """
        Args:
            width: Encoder width and vector size (`RankGenConfig`).
            layers: Transformer layers over the frozen embeddings (0: their projected mean).
            heads: Attention heads.
            temperature: Scores are cosine similarities over this (fixed, as the loss's softmax temperature).
            lr: AdamW learning rate; weight_decay: its decay.
            export_path: The encoder file written at the end of `fit` (default `rankgen.safetensors` in the run).
        """
        super().__init__()
        if not lr > 0 or weight_decay < 0:
            raise ConfigError(f"need lr > 0 and weight_decay >= 0, got {lr} and {weight_decay}")
        RankGenConfig(width, layers, heads, temperature=temperature)  # refuse a bad shape before any data
        self.save_hyperparameters()
        self.net: RankGenNet | None = None
        self.hits: dict[str, list[float]] = {}  # accuracy name -> [examples ranked right, examples], this validation
        self.fit_started = time.perf_counter()
        self.saved_to: str | None = None

    def datamodule(self) -> RankGenDataModule:
        datamodule = getattr(self.trainer, "datamodule", None)
        if not isinstance(datamodule, RankGenDataModule) or datamodule.target is None:
            raise ConfigError("the rankgen encoder trains on a RankGenDataModule (configs/search/rankgen.yaml)")
        return datamodule

    def setup(self, stage: str) -> None:
        if self.net is not None:
            return
        data, h = self.datamodule(), self.hparams
        assert data.target is not None
        config = RankGenConfig(h["width"], h["layers"], h["heads"], data.hparams["prefix_tokens"],
                               data.hparams["continuation_tokens"], h["temperature"])
        torch.manual_seed(0)
        self.net = RankGenNet(config, data.target.config.d_model).attach(data.target)

    def scores(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """(B, B) prefix·positive scores, (B, B, M) prefix·every negative and (B, M) prefix·own negatives."""
        assert self.net is not None
        B, M, K = batch["negatives"].shape
        prefix = self.net.encode(batch["prefix"], batch["prefix_mask"], "prefix")  # (B, W)
        positive = self.net.encode(batch["positive"], batch["positive_mask"], "continuation")  # (B, W)
        negatives = self.net.encode(batch["negatives"].view(B * M, K), batch["negatives_mask"].view(B * M, K),
                                    "continuation").view(B, M, -1)  # (B, M, W)
        t = self.net.config.temperature
        every = torch.einsum("bw,cmw->bcm", prefix, negatives) / t  # (B, B, M)
        return prefix @ positive.T / t, every, every.diagonal().T

    def loss(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        positives, every, own = self.scores(batch)
        B = positives.shape[0]
        logits = torch.cat([positives, every.reshape(B, -1)], dim=1)  # (B, B + B * M)
        return F.cross_entropy(logits, torch.arange(B, device=logits.device)), positives.diagonal(), own

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss, _, _ = self.loss(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch["prefix"]))
        return loss

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        loss, positive, own = self.loss(batch)
        self.log("val/loss", loss, prog_bar=True, batch_size=len(batch["prefix"]))
        kind = batch["negative_kind"]  # (B, M)
        for name, mask in (("accuracy", torch.ones_like(kind, dtype=torch.bool)), ("accuracy_random", kind == RANDOM),
                           ("accuracy_model", kind == MODEL)):
            has = mask.any(-1)  # (B,)
            if has.any():
                best = own.masked_fill(~mask, float("-inf")).amax(-1)  # (B,)
                right, seen = self.hits.setdefault(name, [0.0, 0.0])
                self.hits[name] = [right + float((positive > best)[has].sum()), seen + float(has.sum())]

    def on_validation_epoch_end(self) -> None:
        for name, (right, seen) in self.hits.items():
            self.log(f"val/{name}", right / seen, prog_bar=name == "accuracy")
        self.hits = {}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        assert self.net is not None
        return torch.optim.AdamW(self.net.parameters(), lr=self.hparams["lr"], weight_decay=self.hparams["weight_decay"])

    def on_fit_start(self) -> None:
        self.fit_started = time.perf_counter()

    def on_fit_end(self) -> None:
        if not self.trainer.is_global_zero:
            return
        data = self.datamodule()
        assert self.net is not None and data.target is not None
        training = {"optimizer_steps": self.global_step, **{k: v for k, v in data.hparams.items() if not k.startswith("_")},
                    **data.stats, "minutes": round((time.perf_counter() - self.fit_started) / 60, 2)}
        training.update(last_logged(self.trainer, VALIDATION_KEYS))
        path = self.hparams["export_path"] or output_dir(self.trainer, None, "rankgen.safetensors")
        target = DrafterPackage.describe_target(data.target, data.target_source)
        self.saved_to = str(save_rankgen(self.net, target, path, training))
        rank_zero_info(f"saved the rankgen encoder to {self.saved_to}")

"""Samples computed along the target's own greedy answers, cached on disk: the data of the small
heads that judge drafted tokens (SpecDec++'s acceptance head, Judge decoding's judge).

The answers are the drafter recipes' self-distillation cache (`SelfDistillDataModule`, regenerated
when missing). A subclass says how one split's answers become samples (`make_samples`: a dict of
equally long tensors, one row per sample); this class caches them next to the answers, keyed by the
answers and the subclass's `cache_key`, and serves them as shuffled batches of the same keys, every
tensor as float32.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from warpdecode.datamodules.self_distill import Example, SelfDistillDataModule
from warpdecode.errors import ConfigError
from warpdecode.io import content_key
from warpdecode.models.backbone import Backbone
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.models.transformer import Transformer


class AnswerSamplesDataModule(LightningDataModule):
    cache_name: ClassVar[str]
    """Folder of the sample cache under the self-distillation cache directory."""
    sample_keys: ClassVar[tuple[str, ...]]
    """The tensors of each sample, in batch order."""

    def __init__(
        self,
        target: str,
        prompts: list[str] | None,
        max_prompts: int,
        max_new_tokens: int,
        max_length: int,
        val_fraction: float,
        max_train_answers: int,
        max_val_answers: int,
        batch_size: int,
        cache_dir: str | None,
    ) -> None:
        super().__init__()
        for name, value in (("max_train_answers", max_train_answers), ("max_val_answers", max_val_answers),
                            ("batch_size", batch_size)):
            if value < 1:
                raise ConfigError(f"{name} must be positive, got {value}")
        self.target_source, self.batch_size = target, batch_size
        self.max_answers = {"train": max_train_answers, "val": max_val_answers}
        distill: dict[str, Any] = {"target": target, "max_prompts": max_prompts, "max_new_tokens": max_new_tokens,
                                   "max_length": max_length, "val_fraction": val_fraction, "cache_dir": cache_dir,
                                   "features": True}  # the features flag keys the cache: True shares the drafter recipes' one
        if prompts is not None:
            distill["prompts"] = prompts
        self.distill = SelfDistillDataModule(**distill)
        self.datasets: dict[str, TensorDataset] = {}
        self.target: Backbone | None = None
        """The target model, after `setup` (its fingerprint names the trained head's target)."""
        self.stats: dict[str, float] = {}

    def cache_key(self) -> dict[str, Any]:
        """What, besides the answers, decides the samples (the labelling settings)."""
        return {}

    @abstractmethod
    def make_samples(self, target: Transformer, examples: list[Example], desc: str) -> dict[str, Tensor]:
        """The samples of one split's answers: `sample_keys` → (N, ...) tensors."""

    def summarize(self, splits: dict[str, Any]) -> dict[str, float]:
        """Figures of the samples for the log and the trained package (`stats`)."""
        labels = splits["train"]["labels"].float()
        return {"train_samples": len(labels), "val_samples": len(splits["val"]["labels"]),
                "positive_rate": round(float(labels.mean()), 4)}

    def _cache_path(self, manifest: Path) -> Path:
        key = content_key({"data": f"{manifest.parent.name}/{manifest.name}", "answers": self.max_answers, **self.cache_key()})
        return self.distill.cache_dir / self.cache_name / f"{key}.pt"

    def prepare_data(self) -> None:
        self.distill.prepare_data()

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        self.distill.setup(stage)
        target, _ = load_pretrained(self.target_source)
        self.target = target
        path = self._cache_path(self.distill.data_manifest())
        if path.is_file():
            splits = torch.load(path)
            rank_zero_info(f"{self.cache_name} samples: reusing {path}")
        else:
            started = time.perf_counter()
            splits = {split: self.make_samples(target, self.distill.datasets[split].examples[: self.max_answers[split]],
                                               f"{self.cache_name} samples ({split})")
                      for split in ("train", "val")}
            splits["minutes"] = round((time.perf_counter() - started) / 60, 2)  # what making them cost
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            torch.save(splits, tmp)
            tmp.replace(path)
        self.datasets = {split: TensorDataset(*(splits[split][k] for k in self.sample_keys)) for split in ("train", "val")}
        self.stats = self.summarize(splits) | ({"sample_minutes": splits["minutes"]} if "minutes" in splits else {})
        rank_zero_info(f"{self.cache_name} samples: " + ", ".join(f"{k} {v}" for k, v in self.stats.items()))

    def _loader(self, split: str) -> DataLoader:
        if not self.datasets:
            raise RuntimeError("call setup() before asking for a dataloader")
        keys = self.sample_keys

        def collate(rows: list[tuple[Tensor, ...]]) -> dict[str, Tensor]:
            return {k: torch.stack(column).float() for k, column in zip(keys, zip(*rows, strict=True), strict=True)}

        return DataLoader(self.datasets[split], batch_size=self.batch_size, shuffle=split == "train", collate_fn=collate)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

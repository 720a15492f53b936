"""Acceptance labels for SpecDec++: where would the target accept the drafter's token?

For greedy speculative decoding the target accepts a drafted token exactly when it equals the
target's own greedy token, given that every earlier token of the step was accepted, i.e. given a
prefix that *is* the target's greedy output. So running the drafter teacher-forced along the
target's greedy answers (`SelfDistillDataModule`'s cache) labels every position of a real rollout
with the acceptance the verifier would decide, in one drafter forward per answer instead of a
speculative decode: label[t] = (drafter's argmax after tokens[:t+1] == tokens[t+1]).

The drafter is the target's own weight-only quantised copy (`int4_self` / `int8_self`). Each sample is
(the drafter's final normed hidden state (C,), `draft_signals` (2,), label); batches are
`features` (B, C) float32, `signals` (B, 2) float32, `labels` (B,) float32. The samples are cached
on disk next to the self-distillation data, keyed by it and by the drafter.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset
from tqdm.auto import tqdm

from warpdecode.datamodules.self_distill import Example, SelfDistillDataModule
from warpdecode.errors import ConfigError
from warpdecode.models.acceptance_head import draft_signals
from warpdecode.models.backbone import Backbone
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.models.quantized import Bits, quantized_copy
from warpdecode.models.transformer import Transformer

CACHE_VERSION = 1


@torch.inference_mode()
def label_examples(draft: Transformer, examples: list[Example], desc: str) -> dict[str, Tensor]:
    """`features` (N, C) float16, `signals` (N, 2) float32 and `labels` (N,) bool of every answer
    position of `examples` (positions prompt_length - 1 .. T - 2, each predicting the next token)."""
    L = draft.config.n_layer
    features, signals, labels = [], [], []
    for example in tqdm(examples, desc=desc, unit="answer", disable=None):
        tokens = torch.from_numpy(example.tokens.astype("int64"))
        start, end = example.prompt_length - 1, len(tokens) - 1
        if end <= start:
            continue
        out = draft(tokens[None], hidden_layers=(L,), logits_slice=slice(start, end))
        logits = out.logits[0]  # (T_answer, V)
        features.append(out.hidden_states[L][0, start:end].to(torch.float16))
        signals.append(draft_signals(logits))
        labels.append(logits.argmax(-1) == tokens[start + 1 : end + 1])
    if not labels:
        raise ConfigError(f"{desc}: no answer token to label (the split holds no answer)")
    return {"features": torch.cat(features), "signals": torch.cat(signals), "labels": torch.cat(labels)}


class AcceptanceDataModule(LightningDataModule):
    def __init__(
        self,
        target: str = "smollm2-135m-instruct",
        bits: Bits = 4,
        prompts: list[str] | None = None,
        max_prompts: int = 2048,
        max_new_tokens: int = 192,
        max_length: int = 512,
        val_fraction: float = 0.05,
        max_train_answers: int = 384,
        max_val_answers: int = 64,
        batch_size: int = 512,
        cache_dir: str | None = None,
    ) -> None:
        """
        Args:
            target: The model to draft for (the drafter is its quantised copy).
            bits: 4 (`int4_self`) or 8 (`int8_self`).
            prompts, max_prompts, max_new_tokens, max_length, val_fraction, cache_dir: the self-distillation data
                (`SelfDistillDataModule`; the defaults reuse the drafter recipes' cache).
            max_train_answers: Label at most this many answers of the train split (one drafter
                forward each).
            max_val_answers: ... and of the val split.
            batch_size: Samples (answer positions) per batch.
        """
        super().__init__()
        for name, value in (("max_train_answers", max_train_answers), ("max_val_answers", max_val_answers),
                            ("batch_size", batch_size)):
            if value < 1:
                raise ConfigError(f"{name} must be positive, got {value}")
        self.save_hyperparameters()
        self.target_source, self.bits, self.batch_size = target, bits, batch_size
        self.max_answers = {"train": max_train_answers, "val": max_val_answers}
        distill: dict[str, Any] = {"target": target, "max_prompts": max_prompts, "max_new_tokens": max_new_tokens,
                                   "max_length": max_length, "val_fraction": val_fraction, "cache_dir": cache_dir,
                                   "features": True}  # the features flag keys the cache: True shares the drafter recipes' one
        if prompts is not None:
            distill["prompts"] = prompts
        self.distill = SelfDistillDataModule(**distill)
        self.datasets: dict[str, TensorDataset] = {}
        self.target: Backbone | None = None
        """The target model, after `setup` (its fingerprint names the acceptance head's target)."""
        self.stats: dict[str, float] = {}

    def _cache_path(self, data_dir: Path) -> Path:
        key = hashlib.sha256(json.dumps({"version": CACHE_VERSION, "data": data_dir.name, "bits": self.bits,
                                         "answers": self.max_answers}, sort_keys=True).encode()).hexdigest()[:24]
        return self.distill.cache_dir / "acceptance" / f"{key}.pt"

    def prepare_data(self) -> None:
        self.distill.prepare_data()

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        self.distill.setup(stage)
        target, _ = load_pretrained(self.target_source)
        self.target = target
        path = self._cache_path(self.distill.data_dir())
        if path.is_file():
            splits = torch.load(path)
            rank_zero_info(f"acceptance labels: reusing {path}")
        else:
            draft = quantized_copy(target, self.bits)
            splits = {split: label_examples(draft, self.distill.datasets[split].examples[: self.max_answers[split]],
                                            f"acceptance labels ({split})")
                      for split in ("train", "val")}
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            torch.save(splits, tmp)
            tmp.replace(path)
        self.datasets = {split: TensorDataset(s["features"], s["signals"], s["labels"]) for split, s in splits.items()}
        self.stats = {"train_samples": len(splits["train"]["labels"]),
                      "accept_rate": round(float(splits["train"]["labels"].float().mean()), 4)}
        rank_zero_info(f"acceptance samples: train {self.stats['train_samples']}, val {len(splits['val']['labels'])}, "
                       f"accepted {self.stats['accept_rate']:.1%}")

    def _loader(self, split: str) -> DataLoader:
        if not self.datasets:
            raise RuntimeError("call setup() before asking for a dataloader")
        return DataLoader(self.datasets[split], batch_size=self.batch_size, shuffle=split == "train",
                          collate_fn=collate)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")


def collate(rows: list[tuple[Tensor, Tensor, Tensor]]) -> dict[str, Tensor]:
    features, signals, labels = zip(*rows, strict=True)
    return {"features": torch.stack(features).float(), "signals": torch.stack(signals),
            "labels": torch.stack(labels).float()}

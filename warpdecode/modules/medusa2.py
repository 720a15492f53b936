"""Train Medusa-2: Medusa heads jointly with LoRA adapters on the target (Cai et al. 2024).

Medusa-1 keeps the target frozen, so its heads must guess from features that were never trained
for guessing. Medusa-2 also adapts the backbone (here LoRA adapters, `models/lora.py`) with the
heads' losses flowing into it, and keeps the backbone's own next-token predictions with a
backbone-preserving loss: the cross-entropy of its LM head against the data's tokens, which are the
original target's greedy answers (the self-distillation of the recipe). The loss is

    lm_weight * CE(backbone next token, original greedy token; answer positions)
    + sum_k head_decay**(k-1) * soft-CE(head k, the adapted target's own distribution)

The adapted model is a new target: `fit` saves it merged (`<export_dir>-target/`, a model
directory) and binds the heads' package to it, so `--model <export_dir>-target --method
medusa:path=<export_dir>` decodes it losslessly with respect to itself. How far
it moved from the original is logged as `lm_agreement` (share of answer positions where its greedy
choice is still the original's) and measured end to end in docs/benchmarks.md.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

from warpdecode.errors import ConfigError
from warpdecode.models.checkpoint import resolve, save_pretrained
from warpdecode.models.lora import ATTENTION, attach_lora, merged
from warpdecode.models.medusa import HeadsConfig
from warpdecode.models.tokenizer import Tokenizer
from warpdecode.modules.medusa import MedusaModule

ADAPTED = "adapted_features"
"""Batch key of the adapted target's features within one step (never the datamodule's cached `features`)."""


class Medusa2Module(MedusaModule):
    """Medusa heads and LoRA adapters on the target, trained together; the heads' package is of kind
    `medusa`, for the merged target."""

    aliases = ("warpdecode.modules.medusa2.Medusa2Drafter",)  # former class path (old recipes)

    def __init__(
        self,
        lora_rank: int = 8,
        lora_alpha: float = 16.0,
        lora_targets: list[str] | None = None,
        lora_lr: float = 2e-4,
        lm_weight: float = 1.0,
        heads_backbone_weight: float = 0.2,
        **kwargs: Any,
    ) -> None:
        """
        Args:
            lora_rank: Rank r of every adapter.
            lora_alpha: Adapter scale alpha (updates are multiplied by alpha / r).
            lora_targets: Linear layers that get an adapter (default: q_proj, k_proj, v_proj, o_proj;
                also gate_proj, up_proj, down_proj).
            lora_lr: Peak learning rate of the adapters (the heads train at `lr`).
            lm_weight: Weight of the backbone-preserving loss.
            heads_backbone_weight: Scale of the heads' gradient where it enters the backbone (the
                paper's lambda_0; the heads themselves get all of it). At 1 the heads' losses,
                several nats each, outweigh the preserving loss and the adapted model drifts.
            **kwargs: `MedusaModule`'s arguments (target, heads, optimizer, tree, export_dir: the
                heads' package; the merged target goes to `<export_dir>-target`).
        """
        if lm_weight < 0 or lora_lr <= 0 or not 0 <= heads_backbone_weight <= 1:
            raise ConfigError(f"need lm_weight >= 0, lora_lr > 0 and 0 <= heads_backbone_weight <= 1, got "
                              f"{lm_weight}, {lora_lr}, {heads_backbone_weight}")
        super().__init__(**kwargs)
        self.lora = attach_lora(self.target, lora_rank, lora_alpha, lora_targets or list(ATTENTION))

    def features(self, batch: dict[str, Tensor]) -> Tensor:
        """(B, T, C) final features of the adapted target (with gradients while training); computed
        once per batch (`ADAPTED` carries them from the loss to the ranks). Cached `features` of a
        datamodule are the original target's and are never read."""
        if ADAPTED in batch:
            return batch[ADAPTED]
        L = self.target.config.n_layer
        return self.target(batch["tokens"], hidden_layers=(L,), logits_slice=slice(0, 0)).hidden_states[L]

    def _logits(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """The heads read the features with their gradient into the backbone scaled by
        `heads_backbone_weight` (same values)."""
        features = self.features(batch)
        w = self.hparams["heads_backbone_weight"]
        scaled = features * w + features.detach() * (1 - w)
        return super()._logits({**batch, ADAPTED: scaled})

    def loss(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        batch = batch if ADAPTED in batch else {**batch, ADAPTED: self.features(batch)}
        heads, parts = super().loss(batch)
        scored = batch["answer_mask"][:, 1:]  # (B, T-1): the next token is an answer token
        logits = self.target.head(batch[ADAPTED][:, :-1][scored]).float()  # (M, V)
        labels = batch["tokens"][:, 1:][scored]  # (M,) the original target's greedy choices
        lm = F.cross_entropy(logits, labels)
        parts["lm_loss"] = lm.detach()
        parts["lm_agreement"] = (logits.argmax(-1) == labels).float().mean().detach()
        return heads + self.hparams["lm_weight"] * lm, parts

    def evaluate(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        batch = {**batch, ADAPTED: self.features(batch)}  # one target forward for the loss and the ranks
        loss, parts = self.loss(batch)
        self.log("val/lm_agreement", parts["lm_agreement"], batch_size=batch["tokens"].shape[0])
        return loss, self.ranks(batch)

    def param_groups(self) -> list[dict[str, Any]]:
        """The heads' groups at `lr`, and the adapters' at `lora_lr` (no weight decay)."""
        adapters = {id(p) for p in self.lora.parameters()}
        heads = [group | {"params": [p for p in group["params"] if id(p) not in adapters]}
                 for group in super().param_groups()]
        return heads + [{"params": list(self.lora.parameters()), "weight_decay": 0.0, "lr": self.hparams["lora_lr"]}]

    def target_export_path(self) -> Path:
        drafter = self.export_path()
        return drafter.with_name(drafter.name + "-target")

    def on_fit_end(self) -> None:
        if not self.trainer.is_global_zero:
            return
        model = merged(self.target, self.lora)
        model_dir = self.target_export_path()
        save_pretrained(model, Tokenizer.load(resolve(self.training_args.target)), model_dir)
        directory = self.save_package(self.package(model, str(model_dir)))
        rank_zero_info(f"saved the adapted target to {model_dir} and its medusa heads to {directory}")

    def package_config(self) -> HeadsConfig:
        return dataclasses.replace(super().package_config(), medusa2={
            "lora_rank": self.hparams["lora_rank"], "lora_targets": self.hparams["lora_targets"] or list(ATTENTION)})

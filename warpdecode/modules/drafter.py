"""What every learned-drafter LightningModule shares: the frozen target, its features, the reduced
draft vocabulary, the optimizer, validation ranks and the drafter package written at the end of `fit`.

Batches come from `SelfDistillDataModule`: `tokens` (B, T), `answer_mask` (B, T), `lengths` (B,)
and, when the data module cached them, the target's final features `features` (B, T, C). Without
cached features they are computed online by the frozen target under `no_grad` (no feature store
that grows with the data; the cost is one target forward per batch).

The target is held outside the module's parameters: checkpoints hold only the drafter, and the
target is reloaded from `target` (its fingerprint must match the one recorded in the checkpoint).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.types import OptimizerLRSchedulerConfig
from torch import Tensor

from warpdecode.decoding.tree_shapes import chain
from warpdecode.errors import ConfigError
from warpdecode.metrics.drafting import DraftRanks, label_ranks, simulated_tau, tree_from_ranks
from warpdecode.metrics.plots import plot_acceptance
from warpdecode.models.draft_head import DraftVocabNet
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.models.eagle import shift_left
from warpdecode.models.named import DEFAULT_MODEL
from warpdecode.models.net_config import NetConfig
from warpdecode.models.transformer import Transformer
from warpdecode.modules.causal_lm import warmup_cosine
from warpdecode.modules.frozen_target import FrozenTarget
from warpdecode.modules.run_outputs import output_dir


def frequent_tokens(counts: Tensor, size: int, always: list[int]) -> Tensor:
    """The `size` most frequent token ids of `counts` (V,), `always` included, sorted by id (FR-Spec's
    frequency-ranked draft vocabulary). Ties go to the smaller id."""
    size = min(size, counts.numel())
    if size < len(always):
        raise ConfigError(f"draft vocabulary of {size} cannot hold the {len(always)} stop tokens")
    scores = counts.double().clone()
    scores[always] = float("inf")
    order = torch.argsort(-scores, stable=True)
    return order[:size].sort().values


def valid_starts(lengths: Tensor, m: int, ahead: int) -> Tensor:
    """(B, m) float mask of the starts i < m whose token x_{i+1+ahead} exists (i + 1 + ahead < length)."""
    return (torch.arange(m, device=lengths.device)[None] + 1 + ahead < lengths[:, None]).float()


def distillation_loss(logits: Tensor, target_probs: Tensor, lengths: Tensor, ahead: int) -> Tensor:
    """Mean soft cross-entropy of the drafts against the target's distribution `ahead` positions on.

    Args:
        logits: (B, n, N) draft logits; entry i drafts x_{i+1+ahead}.
        target_probs: (B, T, N) the target's distributions; entry j is that of x_{j+1}.
        lengths: (B,) tokens per row; entry i counts where x_{i+1+ahead} exists (i + 1 + ahead < length).
    Only the starts whose target entry lies inside `target_probs` are read (no padded copy).
    """
    m = min(logits.shape[1], target_probs.shape[1] - ahead)
    valid = valid_starts(lengths, m, ahead)
    ce = -(target_probs[:, ahead : ahead + m] * logits[:, :m].float().log_softmax(-1)).sum(-1)  # (B, m)
    return (ce * valid).sum() / valid.sum().clamp_min(1)


def vocab_index(draft_vocab: Tensor, vocab_size: int) -> Tensor:
    """(V,) int64 map from target token id to draft-vocabulary index, -1 outside it."""
    index = torch.full((vocab_size,), -1, dtype=torch.int64, device=draft_vocab.device)
    index[draft_vocab] = torch.arange(draft_vocab.numel(), device=draft_vocab.device)
    return index


@dataclass(frozen=True, kw_only=True)
class DrafterTraining:
    """What every learned-drafter module is trained with besides its network's own arguments.

    A module's `__init__` takes these as keywords (`**training`) and builds this from them, so a recipe
    names them beside the network's (`init_args: {lr: 1e-3, num_heads: 4}`) and `--help` shows the
    docstrings below.
    """

    target: str = DEFAULT_MODEL
    """The frozen target model (name, directory or .gguf) the drafter is trained for."""
    draft_vocab_size: int = 8192
    """Tokens the drafter can propose: the most frequent ones in the training answers (stop tokens
    always included); its frozen head is the target's LM-head rows of them."""
    lr: float = 1e-3
    """Peak AdamW learning rate (linear warmup, cosine decay to `min_lr_ratio * lr`)."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of `lr`."""
    warmup_steps: int = 50
    """Optimizer steps of warmup."""
    weight_decay: float = 0.0
    """AdamW weight decay on the trainable matrices."""
    tree_nodes: int = 16
    """Nodes of the static draft tree built from validation ranks and stored with the drafter."""
    max_rank: int = 8
    """Candidates per node considered when building the tree."""
    export_dir: str | None = None
    """Where the drafter package is written at the end of `fit` (default `drafter/` next to the run's
    checkpoints)."""

    def __post_init__(self) -> None:
        if self.draft_vocab_size < 2 or self.tree_nodes < 1 or self.max_rank < 1:
            raise ConfigError(f"need draft_vocab_size >= 2, tree_nodes >= 1 and max_rank >= 1, got "
                              f"{self.draft_vocab_size}, {self.tree_nodes}, {self.max_rank}")


class DrafterModule(FrozenTarget, LightningModule):
    """Base class: subclasses set `self.net` (a `DraftVocabNet`) and implement `init_drafter`, `loss`,
    `ranks` and `package_config`; their `__init__` takes its own arguments and `**training`, the
    keywords of `DrafterTraining`."""

    kind: str = ""
    net: DraftVocabNet

    def __init__(self, training: DrafterTraining) -> None:
        super().__init__()
        # The arguments of every __init__ on the way here (the subclasses' own), and all of `training`
        # with its defaults: a subclass passes on only the training keywords it was given.
        self.save_hyperparameters(ignore=["training"])
        self.hparams.update(dataclasses.asdict(training))
        self.training_args = training
        """The shared training arguments (`self.hparams` holds them too, as checkpoints record them)."""
        self.hold_target(training.target)  # not a submodule: checkpoints hold only the drafter
        self.val_ranks = DraftRanks(training.max_rank)
        self.last_val_ranks: Tensor | None = None
        self.fit_started = 0.0
        self.tokens_seen = 0
        self.package_dir: Path | None = None
        self.index: Tensor | None = None

    # ---- data -------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        self.check_data_target(datamodule)
        if stage == "fit" and not self.drafter_initialised():
            counts = datamodule.token_counts() if datamodule is not None else torch.ones(self.target.config.vocab_size)
            vocab = frequent_tokens(torch.as_tensor(counts), self.training_args.draft_vocab_size,
                                    list(self.target.config.eos_token_ids))
            self.init_drafter(vocab)

    def drafter_initialised(self) -> bool:
        """Whether the drafter already holds trained or restored weights (then setup keeps them)."""
        return bool(getattr(self, "_initialised", False))

    def init_drafter(self, draft_vocab: Tensor) -> None:
        """Initialise the network for `draft_vocab` (N,) target token ids."""
        raise NotImplementedError

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._initialised = True
        self.net.draft_vocab.copy_(checkpoint["state_dict"]["net.draft_vocab"])
        self.net.tie_head(self.target)
        checkpoint["state_dict"][f"net.{self.net.head_key}"] = self.net.frozen_head().weight.detach().clone()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["state_dict"].pop(f"net.{self.net.head_key}", None)  # rebuilt from the target

    def features(self, batch: dict[str, Tensor]) -> Tensor:
        """(B, T, C) target features of the batch: cached, or computed now by the frozen target."""
        L = self.target.config.n_layer
        return self.hidden_states(batch, (L,))[L]

    def hidden_states(self, batch: dict[str, Tensor], layers: tuple[int, ...]) -> dict[int, Tensor]:
        """The frozen target's (B, T, C) hidden states `layers` of the batch: the final one from the
        datamodule's feature cache when it is the only one asked for, else one forward now."""
        L = self.target.config.n_layer
        if layers == (L,) and "features" in batch:
            return {L: batch["features"]}
        with torch.no_grad():
            hidden = self.target(batch["tokens"], hidden_layers=layers, logits_slice=slice(0, 0)).hidden_states
        return {j: h.detach() for j, h in hidden.items()}

    # ---- training ---------------------------------------------------------------------------
    def loss(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """The training loss and named parts to log."""
        raise NotImplementedError

    def ranks(self, batch: dict[str, Tensor]) -> Tensor:
        """(M, D) ranks of the true continuation at depths 1..D from every start position inside an answer."""
        raise NotImplementedError

    def ranks_of(self, logits: Tensor, batch: dict[str, Tensor], ahead: int) -> Tensor:
        """(B, n) rank of x_{i+ahead} among `logits` (B, n, N) at each start i (n = T - 1)."""
        tokens, lengths = batch["tokens"], batch["lengths"]
        B, n = logits.shape[:2]
        position = torch.arange(n, device=tokens.device)[None] + ahead  # (1, n)
        labels = torch.where(position < lengths[:, None], self.draft_labels(shift_left(tokens, ahead, n)), -1)  # (B, n)
        return label_ranks(logits.flatten(0, 1).float(), labels.flatten(), self.training_args.max_rank).view(B, n)

    def draft_labels(self, tokens: Tensor) -> Tensor:
        """Draft-vocabulary index of each target token id of `tokens` (any shape), -1 outside it."""
        if self.index is None or self.index.device != tokens.device:
            self.index = vocab_index(self.net.draft_vocab, self.target.config.vocab_size)
        return self.index[tokens]

    def evaluate(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Validation: the loss and the (M, D) ranks (`ranks`) of one batch."""
        return self.loss(batch)[0], self.ranks(batch)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss, parts = self.loss(batch)
        self.tokens_seen += int(batch["lengths"].sum())
        self.log("train/loss", loss, prog_bar=True)
        for name, value in parts.items():
            self.log(f"train/{name}", value)
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        return loss

    def on_fit_start(self) -> None:
        self.fit_started = time.perf_counter()

    def on_validation_epoch_start(self) -> None:
        with torch.inference_mode(False):
            self.val_ranks.reset()

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        loss, ranks = self.evaluate(batch)
        self.log("val/loss", loss, prog_bar=True, batch_size=batch["tokens"].shape[0])
        self.val_ranks.update(ranks)

    def on_validation_epoch_end(self) -> None:
        ranks = self.val_ranks.matrix().cpu()
        if ranks.numel() == 0:
            return
        self.last_val_ranks = ranks
        for name, value in self.val_ranks.compute().items():
            self.log(f"val/{name}", value.float(), prog_bar=name == "tau/chain")
        tree = tree_from_ranks(ranks, self.training_args.tree_nodes, self.training_args.max_rank)
        self.log("val/tau/tree", simulated_tau(ranks, tree), prog_bar=True)

    def param_groups(self) -> list[dict[str, Any]]:
        """AdamW parameter groups: weight decay on the trainable matrices only (a group may set its own `lr`)."""
        params = [p for p in self.parameters() if p.requires_grad]
        return [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": self.training_args.weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]

    def configure_optimizers(self) -> OptimizerLRSchedulerConfig:
        groups = [group for group in self.param_groups() if group["params"]]
        optimizer = torch.optim.AdamW(groups, lr=self.training_args.lr, betas=(0.9, 0.95))
        schedule = partial(warmup_cosine, warmup_steps=self.training_args.warmup_steps,
                           total_steps=int(self.trainer.estimated_stepping_batches),
                           min_ratio=self.training_args.min_lr_ratio)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ---- the package ------------------------------------------------------------------------
    def package_config(self) -> NetConfig:
        """The network's typed configuration, written into the package (`drafter.json`'s `config`)."""
        raise NotImplementedError

    def package_weights(self) -> dict[str, Tensor]:
        return {k: v.float() if v.is_floating_point() else v for k, v in self.net.trainable_state().items()}

    def export_path(self) -> Path:
        return output_dir(self.trainer, self.training_args.export_dir, "drafter")

    def package(self, target: Transformer | None = None, source: str | None = None) -> DrafterPackage:
        """The trained drafter with its data-built tree and what training cost and measured, bound to
        `target` named `source` (default: the frozen target and its `target` hyper-parameter)."""
        training: dict[str, Any] = {"tokens_seen": self.tokens_seen, "optimizer_steps": self.global_step,
                                    "minutes": round((time.perf_counter() - self.fit_started) / 60, 2)}
        tree: dict[str, Any] = {}
        ranks = self.last_val_ranks
        paths = [] if ranks is None else tree_from_ranks(ranks, self.training_args.tree_nodes, self.training_args.max_rank)
        if ranks is not None and not paths:
            rank_zero_warn(f"no validation token ranked within the drafter's top {self.training_args.max_rank}: "
                           "the package stores no draft tree (generate with tree=chain) and no acceptance.png is drawn")
        if ranks is not None and paths:
            tree = {"rank_paths": [list(p) for p in paths]}
            training["val_tau_tree"] = round(simulated_tau(ranks, paths), 4)
            # The first n paths are the best n-node tree: the curve a node budget is chosen from.
            training["val_tau_by_nodes"] = [round(simulated_tau(ranks, paths[:n]), 4) for n in range(1, len(paths) + 1)]
            training["val_tau_chain"] = round(simulated_tau(ranks, chain(ranks.shape[1])), 4)
            training["val_starts"] = int(ranks.shape[0])
        described = DrafterPackage.describe_target(target or self.target, source or self.training_args.target)
        return DrafterPackage(self.kind, described, self.package_config().to_dict(), self.package_weights(), tree,
                              training)

    def save_package(self, package: DrafterPackage) -> Path:
        """Write `package` to the export path, with `acceptance.png` (`metrics.plots`) when validated,
        which a W&B run also gets as the image `val/acceptance`."""
        self.package_dir = package.save(self.export_path())
        if self.last_val_ranks is not None and "val_tau_by_nodes" in package.training:
            plot = plot_acceptance(self.package_dir / "acceptance.png", self.last_val_ranks,
                                   package.training["val_tau_by_nodes"], package.training["val_tau_chain"],
                                   f"{self.kind} drafter")
            rank_zero_info(f"validation acceptance (τ by tree size, accuracy by depth): {plot}")
            for logger in self.loggers:
                if isinstance(logger, WandbLogger):
                    logger.log_image("val/acceptance", [str(plot)])
        return self.package_dir

    def on_fit_end(self) -> None:
        if not self.trainer.is_global_zero:
            return
        directory = self.save_package(self.package())
        rank_zero_info(f"saved the trained {self.kind} drafter to {directory}")

"""Causal language modelling: pretrain a backbone from scratch or finetune an imported one.

Next-token cross-entropy, AdamW (weight decay on matrices only) with linear warmup and cosine
decay. Held-out perplexity is exp of the mean token loss over the whole split, aggregated by a
token-weighted torchmetrics mean (so it is exact under DDP and with a ragged last batch). At the
end of `fit` the trained backbone is written as a model directory that `load_pretrained` reads.
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.types import OptimizerLRSchedulerConfig
from torch import Tensor
from torchmetrics import MeanMetric

from warpdecode.errors import ConfigError
from warpdecode.models.checkpoint import load_pretrained, save_pretrained
from warpdecode.models.config import ModelConfig
from warpdecode.models.tokenizer import Tokenizer
from warpdecode.models.transformer import Transformer
from warpdecode.modules.run_outputs import output_dir

# Lightning checkpoints are read with torch.load(weights_only=True); the config in the saved
# hyper-parameters is a plain dataclass of numbers and strings, safe to rebuild.
torch.serialization.add_safe_globals([ModelConfig])


def warmup_cosine(step: int, *, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """LR multiplier: linear from 1/warmup_steps to 1 over `warmup_steps`, then cosine to `min_ratio`."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class CausalLMModule(LightningModule):
    """Next-token prediction on batches of (B, T + 1) token blocks."""

    aliases = ("warpdecode.modules.causal_lm.CausalLM",)  # former class path (old recipes)

    def __init__(
        self,
        model: ModelConfig | None = None,
        pretrained: str | None = None,
        lr: float = 3e-4,
        min_lr_ratio: float = 0.1,
        warmup_steps: int = 100,
        weight_decay: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.95),
        init_std: float = 0.02,
        export_dir: str | None = None,
    ) -> None:
        """
        Args:
            model: Architecture of a backbone trained from scratch (randomly initialised).
            pretrained: A model directory, `.gguf` file or model name to finetune instead.
            lr: Peak learning rate.
            min_lr_ratio: Final learning rate as a fraction of `lr` after the cosine decay.
            warmup_steps: Optimizer steps of linear warmup.
            weight_decay: AdamW weight decay, applied to matrices (embeddings included) only.
            betas: AdamW betas.
            init_std: Standard deviation of the random initialisation (from scratch only).
            export_dir: Where the trained model directory is written at the end of `fit`; default
                `model/` next to the checkpoint folder of the run.
        """
        super().__init__()
        if (model is None) == (pretrained is None):
            raise ConfigError("give exactly one of model (train from scratch) or pretrained (finetune)")
        if warmup_steps < 0 or not 0 <= min_lr_ratio <= 1:
            raise ConfigError(f"need warmup_steps >= 0 and 0 <= min_lr_ratio <= 1, got {warmup_steps}, {min_lr_ratio}")
        self.save_hyperparameters()
        # LightningCLI records only the arguments of the class it instantiates: a subclass that fixes
        # some of these would leave them out, so every argument read later is recorded here.
        for key, value in {"model": model, "pretrained": pretrained, "lr": lr, "min_lr_ratio": min_lr_ratio,
                           "warmup_steps": warmup_steps, "weight_decay": weight_decay, "betas": betas,
                           "init_std": init_std, "export_dir": export_dir}.items():
            self.hparams.setdefault(key, value)
        self.tokenizer: Tokenizer | None = None
        """The tokenizer the model is trained with: the datamodule's, or the pretrained one's."""
        if pretrained is not None:
            self.backbone, self.tokenizer = load_pretrained(pretrained)
            self.backbone.train()
        else:
            assert model is not None
            self.backbone = Transformer(model)
            self.backbone.init_weights(init_std)
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()
        for metric in (self.val_loss, self.test_loss):
            metric.set_dtype(torch.float64)  # sums of token losses over a whole split
        self.exported_to: Path | None = None

    @property
    def config(self) -> ModelConfig:
        return self.backbone.config

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        tokenizer: Tokenizer | None = getattr(datamodule, "tokenizer", None)
        if tokenizer is None:
            return
        if tokenizer.vocab_size > self.config.vocab_size:
            raise ConfigError(
                f"the data tokenizer has {tokenizer.vocab_size} tokens but the model only "
                f"{self.config.vocab_size} embeddings; raise the model's vocab_size or lower the tokenizer's"
            )
        if self.tokenizer is not None and tokenizer.backend.get_vocab() != self.tokenizer.backend.get_vocab():
            raise ConfigError(
                f"finetuning {self.hparams['pretrained']!r} needs the data tokenized with its own tokenizer; "
                f"set data.tokenizer to {self.hparams['pretrained']!r}"
            )
        block_size = getattr(datamodule, "block_size", 0)
        if block_size > self.config.max_seq_len:
            raise ConfigError(f"block_size={block_size} exceeds the model's max_seq_len={self.config.max_seq_len}")
        if not self.config.eos_token_ids and tokenizer.eos_token_id is not None:
            self.config.eos_token_ids = [tokenizer.eos_token_id]  # an empty default, filled for generation
        self.tokenizer = tokenizer

    def on_train_start(self) -> None:
        # configure_optimizers reads estimated_stepping_batches, which builds the train loader before
        # the checkpoint is restored, and Lightning then never hands the saved loader position to it
        # (Lightning-AI/pytorch-lightning#20550). Hand it over now, before the first batch is drawn.
        self.trainer.fit_loop._load_combined_loader_states()

    def forward(self, tokens: Tensor) -> Tensor:
        """(B, T) int64 token ids → (B, T, V) logits."""
        return self.backbone(tokens).logits

    def _loss(self, batch: Tensor) -> Tensor:
        """Mean next-token cross-entropy of a (B, T + 1) batch of blocks, computed in fp32."""
        logits = self(batch[:, :-1])  # (B, T, V)
        with torch.autocast(device_type=logits.device.type, enabled=False):
            return F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())

    def training_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        loss = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        return loss

    def validation_step(self, batch: Tensor, batch_idx: int) -> None:
        self.val_loss.update(self._loss(batch), weight=batch[:, 1:].numel())

    def test_step(self, batch: Tensor, batch_idx: int) -> None:
        self.test_loss.update(self._loss(batch), weight=batch[:, 1:].numel())

    @staticmethod
    def _reset(metric: MeanMetric) -> None:
        # `validate`/`test` run under inference mode; states created there could not be updated
        # in place by a later `fit` (inference tensors), so they are always created outside it.
        with torch.inference_mode(False):
            metric.reset()

    def _log_split(self, split: str, metric: MeanMetric) -> None:
        mean = metric.compute()  # token-weighted mean over the split, synced across processes
        self.log(f"{split}/loss", mean.float(), prog_bar=True, sync_dist=True)
        self.log(f"{split}/ppl", mean.exp().float(), prog_bar=True, sync_dist=True)

    def on_validation_epoch_start(self) -> None:
        self._reset(self.val_loss)

    def on_validation_epoch_end(self) -> None:
        self._log_split("val", self.val_loss)

    def on_test_epoch_start(self) -> None:
        self._reset(self.test_loss)

    def on_test_epoch_end(self) -> None:
        self._log_split("test", self.test_loss)

    def configure_optimizers(self) -> OptimizerLRSchedulerConfig:
        params = [p for p in self.backbone.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": self.hparams["weight_decay"]},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        optimizer = torch.optim.AdamW(groups, lr=self.hparams["lr"], betas=tuple(self.hparams["betas"]))
        schedule = partial(
            warmup_cosine,
            warmup_steps=self.hparams["warmup_steps"],
            total_steps=int(self.trainer.estimated_stepping_batches),
            min_ratio=self.hparams["min_lr_ratio"],
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def export_path(self) -> Path:
        return output_dir(self.trainer, self.hparams["export_dir"], "model")

    def on_fit_end(self) -> None:
        if not self.trainer.is_global_zero:
            return
        if self.tokenizer is None:
            rank_zero_warn("no tokenizer known (the datamodule has none): the exported model cannot be loaded")
        directory = self.export_path()
        save_pretrained(self.backbone, self.tokenizer, directory)
        self.exported_to = directory
        rank_zero_info(f"exported the trained model to {directory}")

"""Masked diffusion language modelling (LLaDA), conditioned on a prompt.

Per row a masking ratio t ~ U(eps, 1) is drawn and every answer token is replaced by the mask token
with probability t; the bidirectional backbone predicts the masked tokens. The loss is LLaDA's
supervised objective, an upper bound on the answer's negative log-likelihood
(`decoding/diffusion/likelihood.py`):

    loss = mean over rows of  Σ_{masked i} CE_i / t  /  answer length

The prompt is never masked and carries no loss. Validation logs what a user of the model will get,
measured by the decoders in `decoding/diffusion/`: exact-match accuracy of one-token-per-step
decoding and of confidence-threshold decoding with its mean number of steps, next to the loss.

Shares optimiser, schedule, tokenizer checks and the export of the trained model directory with
`CausalLMModule`; the backbone is always bidirectional and its config records the mask token.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics import MeanMetric

from warpdecode.decoding.diffusion.decoder import diffusion_generate
from warpdecode.decoding.diffusion.likelihood import answer_nll_bound
from warpdecode.decoding.diffusion.policies.fixed import FixedCommit
from warpdecode.decoding.diffusion.policies.threshold import ThresholdCommit
from warpdecode.errors import ConfigError
from warpdecode.models.config import ModelConfig
from warpdecode.models.mask_token import add_mask_token
from warpdecode.models.tokenizer import MASK
from warpdecode.modules.causal_lm import CausalLMModule


class MaskedDiffusionModule(CausalLMModule):
    """Masked diffusion LM on batches {tokens (B, L), prompt_lengths (B,), lengths (B,)}."""

    aliases = ("warpdecode.modules.masked_diffusion.MaskedDiffusionLM",)  # former class path (old recipes)

    def __init__(
        self,
        model: ModelConfig | None = None,
        pretrained: str | None = None,
        lr: float = 1e-3,
        min_lr_ratio: float = 0.1,
        warmup_steps: int = 100,
        weight_decay: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.95),
        init_std: float = 0.02,
        export_dir: str | None = None,
        mask_token: str = MASK,
        min_mask_ratio: float = 1e-3,
        eval_block_length: int = 8,
        eval_threshold: float = 0.9,
        stratified_t: bool = False,
        eval_decode_batches: int | None = None,
    ) -> None:
        """
        Args:
            model: Architecture of a backbone trained from scratch (made bidirectional).
            pretrained: A model directory or name to adapt instead (AR → diffusion): its attention
                becomes bidirectional, and a tokenizer without `mask_token` gets it as an added
                special token with a new embedding row (`models/mask_token.py`).
            lr: Peak learning rate.
            min_lr_ratio: Final learning rate as a fraction of `lr` after the cosine decay.
            warmup_steps: Optimizer steps of linear warmup.
            weight_decay: AdamW weight decay, applied to matrices only.
            betas: AdamW betas.
            init_std: Standard deviation of the random initialisation (from scratch only).
            export_dir: Where the trained model directory is written at the end of `fit`.
            mask_token: The tokenizer's mask token.
            min_mask_ratio: Smallest masking ratio t drawn (the loss divides by t).
            eval_block_length: Block length of the decoders run at validation.
            eval_threshold: Confidence threshold of the parallel decoder run at validation.
            stratified_t: Draw a batch's masking ratios one per stratum of (0, 1) (lower variance
                of the 1/t-weighted loss) instead of independently.
            eval_decode_batches: Decode only the first this many validation batches (the loss uses
                all); decoding long answers one token per step is the slow part of validation.
        """
        super().__init__(model, pretrained, lr, min_lr_ratio, warmup_steps, weight_decay, betas, init_std, export_dir)
        if not 0 < min_mask_ratio < 1:
            raise ConfigError(f"min_mask_ratio must be in (0, 1), got {min_mask_ratio}")
        for key, value in {"mask_token": mask_token, "min_mask_ratio": min_mask_ratio,
                           "eval_block_length": eval_block_length, "eval_threshold": eval_threshold,
                           "stratified_t": stratified_t, "eval_decode_batches": eval_decode_batches}.items():
            self.hparams.setdefault(key, value)  # see CausalLMModule: recorded for subclasses built by LightningCLI
        self.config.causal = False
        self.exact_static, self.exact_parallel, self.steps_parallel = MeanMetric(), MeanMetric(), MeanMetric()

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if self.tokenizer is None:
            return
        if self.hparams["pretrained"] is not None:  # adaptation: add the mask token where it is missing
            add_mask_token(self.backbone, self.tokenizer, self.hparams["mask_token"])
        mask_id = self.tokenizer.backend.token_to_id(self.hparams["mask_token"])
        if mask_id is None:
            raise ConfigError(f"the tokenizer has no mask token {self.hparams['mask_token']!r}")
        if mask_id >= self.config.vocab_size:
            raise ConfigError(f"mask token id {mask_id} is beyond the model's {self.config.vocab_size} embeddings")
        self.config.mask_token_id = mask_id

    @property
    def mask_token_id(self) -> int:
        if self.config.mask_token_id is None:
            raise ConfigError("no mask token known: train with a datamodule whose tokenizer has one")
        return self.config.mask_token_id

    def diffusion_loss(self, batch: dict[str, Tensor], generator: torch.Generator | None = None) -> Tensor:
        """(B,) per-row LLaDA loss of one draw of the forward process, in fp32."""
        return answer_nll_bound(self.backbone, batch["tokens"], batch["prompt_lengths"], batch["lengths"],
                                self.mask_token_id, self.hparams["min_mask_ratio"], generator,
                                stratified=self.hparams.get("stratified_t", False))

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:  # type: ignore[override]
        loss = self.diffusion_loss(batch).mean()
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        return loss

    def _evaluate(self, batch: dict[str, Tensor], batch_idx: int, loss_metric: MeanMetric) -> None:
        # One fixed draw per batch, so losses of successive validations compare.
        generator = torch.Generator(device=batch["tokens"].device).manual_seed(batch_idx)
        losses = self.diffusion_loss(batch, generator)
        loss_metric.update(losses.mean(), weight=losses.numel())
        limit = self.hparams.get("eval_decode_batches")
        if limit is not None and batch_idx >= limit:
            return
        prompts = [row[:p].tolist() for row, p in zip(batch["tokens"], batch["prompt_lengths"].tolist())]
        gen_length = int((batch["lengths"] - batch["prompt_lengths"]).max())
        eos = self.config.eos_token_ids[0]
        references = [row[p:n].tolist() for row, p, n in zip(batch["tokens"], batch["prompt_lengths"].tolist(),
                                                               batch["lengths"].tolist())]
        block = self.hparams["eval_block_length"]
        for policy, exact, steps in ((FixedCommit(1), self.exact_static, None),
                                     (ThresholdCommit(self.hparams["eval_threshold"]), self.exact_parallel,
                                      self.steps_parallel)):
            out = diffusion_generate(self.backbone, prompts, policy, gen_length=gen_length, block_length=block,
                                     eos_token_id=eos, eot_stop=steps is not None)
            right = [out.sequences[row, len(p) : len(p) + len(ref)].tolist() == ref
                     for row, (p, ref) in enumerate(zip(prompts, references))]
            exact.update(torch.tensor(right, dtype=torch.float32).mean(), weight=len(right))
            if steps is not None:
                steps.update(torch.tensor(out.stats.steps, dtype=torch.float32).mean(), weight=len(right))

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:  # type: ignore[override]
        self._evaluate(batch, batch_idx, self.val_loss)

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:  # type: ignore[override]
        self._evaluate(batch, batch_idx, self.test_loss)

    def _decode_metrics(self) -> list[MeanMetric]:
        return [self.exact_static, self.exact_parallel, self.steps_parallel]

    def on_validation_epoch_start(self) -> None:
        super().on_validation_epoch_start()
        for metric in self._decode_metrics():
            self._reset(metric)

    def on_test_epoch_start(self) -> None:
        super().on_test_epoch_start()
        for metric in self._decode_metrics():
            self._reset(metric)

    def _log_decoding(self, split: str) -> None:
        values: dict[str, Any] = {
            f"{split}/exact_static": self.exact_static.compute(),
            f"{split}/exact_threshold": self.exact_parallel.compute(),
            f"{split}/steps_threshold": self.steps_parallel.compute(),
        }
        self.log_dict({k: v.float() for k, v in values.items()}, prog_bar=True, sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        self._log_decoding("val")

    def on_test_epoch_end(self) -> None:
        super().on_test_epoch_end()
        self._log_decoding("test")

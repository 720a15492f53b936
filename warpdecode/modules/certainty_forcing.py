"""dParallel's certainty-forcing distillation: a diffusion LM learns to be sure sooner, on its own answers.

Masked tokens of a diffusion LM reach high confidence one after the other ("sequential certainty
convergence"), which is what stops a threshold decoder from committing many per step. Fine-tuning
on the model's own one-token-per-step answers (`SelfDecodedTasksDataModule`) with:

* semi-autoregressive block masking: per row a random answer block b; earlier blocks clean, later
  blocks masked, block b masked at 50 % (mask M) and, in a second view, at the complement of M, so
  every position of the block is predicted once;
* loss = CE over the masked positions of both views
  + `entropy_weight` × the entropy, at `entropy_temperature`, of the masked positions the model
  already predicts correctly (pushing right predictions to certainty).

The trajectory stays the model's own (the targets are its answers), while its confidence rises, so
a threshold decoder commits more per step at the same output. Full fine-tuning here (dParallel uses
LoRA on 8B models). Validation is `MaskedDiffusionModule`'s: loss, exact match static and threshold.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from warpdecode.decoding.diffusion.layout import answer_blocks, answer_region
from warpdecode.errors import ConfigError
from warpdecode.modules.masked_diffusion import MaskedDiffusionModule


def block_masks(answer: Tensor, block_length: int, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Two complementary semi-autoregressive masks, (B, L) bool each (see the module docstring)."""
    B, L = answer.shape
    blocks = answer_blocks(answer, block_length, -1)  # (B, L)
    count = blocks.amax(1) + 1  # (B,) blocks per answer
    chosen = (torch.rand(B, generator=generator, device=answer.device) * count).long()[:, None]  # (B, 1)
    later = answer & (blocks > chosen)
    in_block = answer & (blocks == chosen)
    coin = torch.rand(B, L, generator=generator, device=answer.device) < 0.5
    return later | (in_block & coin), later | (in_block & ~coin)


class CertaintyForcingModule(MaskedDiffusionModule):
    aliases = ("warpdecode.modules.certainty_forcing.CertaintyForcingLM",)  # former class path (old recipes)

    def __init__(self, pretrained: str | None = None, lr: float = 2e-4, min_lr_ratio: float = 0.1,
                 warmup_steps: int = 20, weight_decay: float = 0.0, block_length: int = 8,
                 entropy_weight: float = 2.0, entropy_temperature: float = 0.5, eval_block_length: int = 8,
                 eval_threshold: float = 0.9, export_dir: str | None = None) -> None:
        """
        Args:
            pretrained: The diffusion LM (model directory) to distill into itself.
            lr: Peak learning rate.
            min_lr_ratio: Final learning rate as a fraction of `lr` after the cosine decay.
            warmup_steps: Optimizer steps of linear warmup.
            weight_decay: AdamW weight decay on matrices.
            block_length: Block length of the semi-autoregressive masks.
            entropy_weight: Weight of the certainty (entropy) term.
            entropy_temperature: Temperature of the distribution whose entropy is minimised.
            eval_block_length: Block length of the decoders run at validation.
            eval_threshold: Confidence threshold of the parallel decoder run at validation.
            export_dir: Where the distilled model directory is written at the end of `fit`.
        """
        if pretrained is None:
            raise ConfigError("certainty forcing fine-tunes a trained diffusion LM: set model.init_args.pretrained")
        if block_length < 1 or entropy_weight < 0 or entropy_temperature <= 0:
            raise ConfigError(f"need block_length >= 1, entropy_weight >= 0, entropy_temperature > 0; got "
                              f"{block_length}, {entropy_weight}, {entropy_temperature}")
        super().__init__(pretrained=pretrained, lr=lr, min_lr_ratio=min_lr_ratio, warmup_steps=warmup_steps,
                         weight_decay=weight_decay, export_dir=export_dir, eval_block_length=eval_block_length,
                         eval_threshold=eval_threshold)  # its save_hyperparameters() records these arguments too

    def certainty_loss(self, batch: dict[str, Tensor], generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """(cross-entropy over both views' masked positions, mean entropy of their correct predictions)."""
        tokens = batch["tokens"]
        answer, attention = answer_region(batch["prompt_lengths"], batch["lengths"], tokens.shape[1])
        ce_total, entropy_total = tokens.new_zeros((), dtype=torch.float32), tokens.new_zeros((), dtype=torch.float32)
        for masked in block_masks(answer, self.hparams["block_length"], generator):
            logits = self.backbone(tokens.masked_fill(masked, self.mask_token_id), attention_mask=attention).logits
            with torch.autocast(device_type=logits.device.type, enabled=False):
                logits = logits.float()[masked]  # (N, V)
                targets = tokens[masked]
                if len(targets):
                    ce_total = ce_total + F.cross_entropy(logits, targets)
                right = logits.argmax(-1) == targets
                if right.any():
                    sharpened = (logits[right] / self.hparams["entropy_temperature"]).log_softmax(-1)
                    entropy_total = entropy_total - (sharpened.exp() * sharpened).sum(-1).mean()
        return ce_total, entropy_total / 2

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:  # type: ignore[override]
        ce, entropy = self.certainty_loss(batch)
        loss = ce + self.hparams["entropy_weight"] * entropy
        self.log_dict({"train/loss": loss, "train/ce": ce, "train/entropy": entropy}, prog_bar=True)
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        return loss

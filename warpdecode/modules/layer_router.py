"""FiRST: train per-layer routers that pick, from the prompt, which blocks of the frozen target to run.

Data: `SelfDistillDataModule` (the target's greedy answers to the drafter recipes' prompts). Per
batch, the frozen target runs once in full (no grad) for its answer-position distributions and the
block inputs over the prompt; the routers turn the prompt means into soft gates, and the target runs
again with the hard decisions decoding will take (gate below `threshold` skips, at most `max_skip`)
through a straight-through estimator (`Transformer.forward(layer_gates=...)`: the forward skips
exactly those blocks, the gradient reaches the soft gates, and only the routers learn). The loss is
the KL divergence from the full model to the skipping one on the answer tokens plus `skip_weight`
times the mean soft gate of the routable blocks: a block is worth skipping when the KL it costs is
below about `skip_weight / (L - 2)`.

Validation reports what decoding will see, with hard decisions (`threshold`, `max_skip`): the mean
number of skipped blocks, the KL and the top-1 agreement of the skipping model with the full one on
the answer tokens (the quality cost: a greedy decode with these blocks skipped writes its own tokens
where they disagree). The routers save in the drafter-package format (kind `layer_router`) naming
the target; `warpdecode bench --methods first:router=DIR` runs them (`decoding/drafters/first.py`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from torchmetrics import MeanMetric

from warpdecode.errors import ConfigError
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.models.layer_router import LayerRouter, LayerRouterConfig, prompt_means, skipped_layers
from warpdecode.modules.frozen_target import FrozenTarget
from warpdecode.modules.run_outputs import last_logged, output_dir

KIND = "layer_router"


def answer_kl(full: Tensor, gated: Tensor, mask: Tensor) -> Tensor:
    """Mean KL(full || gated) over the masked positions.

    Args:
        full, gated: (B, T, V) logits.
        mask: (B, T) bool, the positions to score.
    """
    p_log = full[mask].float().log_softmax(-1)  # (N, V)
    q_log = gated[mask].float().log_softmax(-1)
    return (p_log.exp() * (p_log - q_log)).sum(-1).mean()


def crop_answers(batch: dict[str, Tensor], answer_tokens: int) -> dict[str, Tensor]:
    """The batch cut `answer_tokens` past its latest-starting answer: prompts whole, answers' first tokens."""
    answer = batch["answer_mask"]
    starts = (answer.cumsum(-1) == 0).sum(-1)  # (B,) prompt lengths
    end = min(answer.shape[1], int(starts.max()) + answer_tokens)
    tokens, answer = batch["tokens"][:, :end], answer[:, :end].clone()
    answer &= torch.arange(end)[None, :].to(answer.device) < (starts[:, None] + answer_tokens)
    return {"tokens": tokens, "answer_mask": answer}


def hard_gates(gates: Tensor, threshold: float, max_skip: int | None) -> Tensor:
    """(B, L) soft gates → (B, L) 0/1 gates of the blocks decoding runs."""
    out = torch.ones_like(gates)
    for b in range(gates.shape[0]):
        out[b, skipped_layers(gates[b], threshold, max_skip)] = 0.0
    return out


class LayerRouterModule(FrozenTarget, LightningModule):
    def __init__(self, target: str = "smollm2-135m-instruct", skip_weight: float = 0.05, lr: float = 1e-2,
                 init_bias: float = 3.0, threshold: float = 0.5, max_skip: int | None = None,
                 answer_tokens: int = 64, cost_init: bool = True, export_dir: str | None = None) -> None:
        """
        Args:
            target: The model whose blocks to route (name, directory or `.gguf`); frozen.
            skip_weight: Weight of the mean gate in the loss: larger skips more blocks.
            lr: AdamW learning rate of the routers (constant).
            init_bias: Initial gate logit of every block (3.0: every block runs at first).
            threshold: A block is skipped when its gate is below this (validation and the package's default).
            max_skip: Skip at most this many blocks per request (None: no limit).
            answer_tokens: Score the first this many answer tokens of each example (the cost of a step
                grows with them: two target forwards and one backward).
            cost_init: Before the first step, start each gate from the KL of skipping its block alone
                on the first batch (`init_from_costs`; L - 2 extra forwards once).
            export_dir: Where the router package is written at the end of `fit` (default `layer_router/` in the run).
        """
        super().__init__()
        if (skip_weight < 0 or lr <= 0 or not 0 < threshold <= 1 or (max_skip is not None and max_skip < 0)
                or answer_tokens < 1):
            raise ConfigError(f"need skip_weight >= 0, lr > 0, 0 < threshold <= 1, max_skip >= 0 and answer_tokens >= 1; "
                              f"got {skip_weight}, {lr}, {threshold}, {max_skip}, {answer_tokens}")
        self.save_hyperparameters()
        model = self.hold_target(target)  # not a submodule: checkpoints hold only the routers
        self.router = LayerRouter(model.config.n_layer, model.config.d_model, init_bias)
        self.initialised: Tensor
        self.register_buffer("initialised", torch.tensor(False))
        self.metrics = nn.ModuleDict({name: MeanMetric() for name in ("skipped", "kl_hard", "agreement_hard", "kl_soft")})
        self.fit_started = time.perf_counter()
        self.package_dir: Path | None = None

    def setup(self, stage: str) -> None:
        self.check_data_target(getattr(self.trainer, "datamodule", None))

    def on_fit_start(self) -> None:
        self.fit_started = time.perf_counter()

    def full_pass(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """The frozen target in full: (B, T, V) logits and (B, L, C) prompt means."""
        tokens, answer = batch["tokens"], batch["answer_mask"]
        L = self.target.config.n_layer
        with torch.no_grad():
            out = self.target(tokens, hidden_layers=range(L))
        prompt = answer.cumsum(-1) == 0  # (B, T) positions before the first answer token
        hidden = torch.stack([out.hidden_states[layer] for layer in range(L)], dim=1)  # (B, L, T, C)
        return out.logits, prompt_means(hidden, prompt)

    def scored(self, batch: dict[str, Tensor]) -> Tensor:
        """(B, T) positions whose next-token distribution is scored: those predicting an answer token."""
        answer = batch["answer_mask"]
        return torch.cat([answer[:, 1:], torch.zeros_like(answer[:, :1])], dim=1)

    @torch.no_grad()
    def init_from_costs(self, batch: dict[str, Tensor], full: Tensor) -> None:
        """Start each routable block's gate logit at `init_bias` x (the KL of skipping that block alone
        on `batch`) / (the largest such KL): cheap blocks start near the threshold, costly ones far
        above it, so the search starts in the right order instead of with every gate equal."""
        L = self.router.n_layer
        costs = torch.zeros(L)
        for layer in range(1, L - 1):
            gates = torch.ones(batch["tokens"].shape[0], L, device=full.device)
            gates[:, layer] = 0.0
            costs[layer] = answer_kl(full, self.target(batch["tokens"], layer_gates=gates).logits, self.scored(batch))
        self.router.bias[1:-1] = self.hparams["init_bias"] * costs[1:-1] / costs[1:-1].max().clamp_min(1e-6)
        self.initialised.fill_(True)
        rank_zero_info("layer routers start from the single-block skip costs (nats): "
                       + ", ".join(f"{layer}: {float(costs[layer]):.2f}" for layer in range(1, L - 1)))

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        batch = crop_answers(batch, self.hparams["answer_tokens"])
        full, means = self.full_pass(batch)
        if self.hparams["cost_init"] and not bool(self.initialised):
            self.init_from_costs(batch, full)
        gates = self.router(means)  # (B, L)
        hard = hard_gates(gates.detach(), self.hparams["threshold"], self.hparams["max_skip"])
        straight_through = hard + gates - gates.detach()  # the forward skips as decoding will; gradients reach the soft gates
        gated = self.target(batch["tokens"], layer_gates=straight_through).logits
        kl = answer_kl(full, gated, self.scored(batch))
        mean_gate = gates[:, 1:-1].mean()
        loss = kl + self.hparams["skip_weight"] * mean_gate
        self.log_dict({"train/loss": loss, "train/kl": kl, "train/mean_gate": mean_gate}, prog_bar=True)
        return loss

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        batch = crop_answers(batch, self.hparams["answer_tokens"])
        full, means = self.full_pass(batch)
        scored = self.scored(batch)
        gates = self.router(means)
        hard = hard_gates(gates, self.hparams["threshold"], self.hparams["max_skip"])
        with torch.no_grad():
            soft_logits = self.target(batch["tokens"], layer_gates=gates).logits
            hard_logits = self.target(batch["tokens"], layer_gates=hard).logits
        agree = (hard_logits[scored].argmax(-1) == full[scored].argmax(-1)).float().mean()
        for name, value in (("skipped", (hard == 0).float().sum(-1).mean()), ("kl_hard", answer_kl(full, hard_logits, scored)),
                            ("agreement_hard", agree), ("kl_soft", answer_kl(full, soft_logits, scored))):
            self.metric(name).update(value)

    def on_validation_epoch_end(self) -> None:
        for name in self.metrics:
            metric = self.metric(name)
            self.log(f"val/{name}", metric.compute(), prog_bar=name in ("skipped", "agreement_hard"))
            metric.reset()

    def metric(self, name: str) -> MeanMetric:
        return cast(MeanMetric, self.metrics[name])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.router.parameters(), lr=self.hparams["lr"], weight_decay=0.0)

    def package(self) -> DrafterPackage:
        datamodule = self.trainer.datamodule  # type: ignore[attr-defined]
        training: dict[str, Any] = {"optimizer_steps": self.global_step, **getattr(datamodule, "stats", {}),
                                    "minutes": round((time.perf_counter() - self.fit_started) / 60, 2)}
        training.update(last_logged(self.trainer, ("val/skipped", "val/kl_hard", "val/agreement_hard", "val/kl_soft")))
        config = LayerRouterConfig(n_layer=self.router.n_layer, d_model=self.router.d_model,
                                   threshold=self.hparams["threshold"], max_skip=self.hparams["max_skip"]).to_dict()
        weights = {k: v.detach().float() for k, v in self.router.state_dict().items()}
        return DrafterPackage(KIND, DrafterPackage.describe_target(self.target, self.hparams["target"]), config,
                              weights, training=training)

    def on_fit_end(self) -> None:
        if not self.trainer.is_global_zero:
            return
        self.package_dir = self.package().save(output_dir(self.trainer, self.hparams["export_dir"], KIND))
        rank_zero_info(f"saved the layer routers to {self.package_dir}")

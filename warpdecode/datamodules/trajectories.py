"""Decoding trajectories of a diffusion LM, labelled for Learn2PD's filter.

`prepare` decodes training prompts with one-token-per-step decoding (the reference the filter
learns to anticipate) and records, at every step, each row's current block: the top-1 confidence
of every position, which positions are still masked, and whether the current top-1 prediction
already equals the token finally written there (the label). Prompts come from the verifiable
tasks' training examples (never the evaluation or validation prompts). Decoding runs in batches
with a progress bar; the samples stay in memory (K floats per step and row).
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset
from tqdm.auto import tqdm

from warpdecode.datamodules.parallel_tasks import ParallelTasksDataModule, TaskExamples
from warpdecode.decoding.diffusion.decoder import diffusion_generate
from warpdecode.decoding.diffusion.policies.fixed import FixedCommit
from warpdecode.decoding.diffusion.protocols import Commit, CommitPolicy, StatelessPolicy, StepView
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.models.parallel_filter import block_inputs


class RecordingPolicy(StatelessPolicy):
    """Runs `inner` and keeps each step's block inputs and predictions."""

    def __init__(self, inner: CommitPolicy) -> None:
        self.inner = inner
        self.lossless = inner.lossless
        self.steps: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []
        """Per step: confidence (B, K), masked (B, K), predicted tokens (B, K), block (B, L) bool."""

    def select(self, view: StepView) -> Commit:
        confidence, masked = block_inputs(view.confidence, view.masked, view.block)
        tokens = view.tokens[view.block].view_as(confidence)
        self.steps.append((confidence, masked, tokens, view.block))
        return self.inner.select(view)


def record_trajectories(model: Backbone, prompts: list[list[int]], *, gen_length: int, block_length: int,
                        eos_token_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """Decode `prompts` one token per step; (confidence (N, K), masked (N, K) bool, final (N, K) bool)
    with one sample per row and step while the row is decoding."""
    recorder = RecordingPolicy(FixedCommit(1))
    out = diffusion_generate(model, prompts, recorder, gen_length=gen_length, block_length=block_length,
                             eos_token_id=eos_token_id)
    samples = []
    for confidence, masked, tokens, block in recorder.steps:
        final = out.sequences[block.cpu()].view_as(tokens).to(tokens.device)
        running = masked.any(1)  # rows whose answer is not complete yet
        samples.append((confidence[running], masked[running], (tokens == final)[running]))
    return tuple(torch.cat(parts) for parts in zip(*samples))  # type: ignore[return-value]


class TrajectoryDataModule(LightningDataModule):
    def __init__(
        self,
        model: str | None = None,
        tasks: str = "all",
        examples: int = 4096,
        val_fraction: float = 0.1,
        gen_length: int = 16,
        block_length: int = 8,
        decode_batch_size: int = 256,
        batch_size: int = 512,
        seed: int = 0,
    ) -> None:
        """
        Args:
            model: The diffusion LM (model directory) whose trajectories are recorded.
            tasks: Comma-separated tasks whose training prompts are decoded, or all.
            examples: Prompts decoded (one trajectory each).
            val_fraction: Share of the prompts held out for validation.
            gen_length: Answer region in tokens, as the diffusion LM will be run.
            block_length: Block length the filter is trained for (divides gen_length).
            decode_batch_size: Prompts decoded together.
            batch_size: Filter training samples per batch.
            seed: Seed of the training prompts.
        """
        super().__init__()
        if model is None:
            raise ConfigError("set data.init_args.model to the diffusion LM whose trajectories train the filter")
        if gen_length % block_length:
            raise ConfigError(f"gen_length {gen_length} must be a multiple of block_length {block_length}")
        if not 0 < val_fraction < 1 or examples < 2:
            raise ConfigError(f"need 0 < val_fraction < 1 and examples >= 2, got {val_fraction}, {examples}")
        self.model_source = model
        self.tasks = ParallelTasksDataModule(tasks=tasks, train_examples=examples, val_examples=1, gen_length=gen_length,
                                             seed=seed)
        self.examples, self.val_fraction = examples, val_fraction
        self.gen_length, self.block_length = gen_length, block_length
        self.decode_batch_size, self.batch_size = decode_batch_size, batch_size
        self.data: dict[str, TensorDataset] = {}
        self.target: Backbone | None = None
        """The diffusion LM the trajectories came from (its fingerprint goes into the filter package)."""
        self.stats: dict[str, Any] = {}

    def setup(self, stage: str) -> None:
        if self.data:
            return
        model, _ = load_pretrained(self.model_source)
        self.target = model
        self.tasks.setup("fit")
        train = self.tasks.train
        assert isinstance(train, TaskExamples)
        eos = self.tasks.tokenizer.eos_token_id
        assert eos is not None
        prompts = train.prompt_ids(self.examples)
        parts = []
        for start in tqdm(range(0, len(prompts), self.decode_batch_size), desc="decoding trajectories", unit="batch"):
            batch = prompts[start : start + self.decode_batch_size]
            parts.append(record_trajectories(model, batch, gen_length=self.gen_length, block_length=self.block_length,
                                             eos_token_id=eos))
        split = int(len(parts) * (1 - self.val_fraction)) if len(parts) > 1 else 1
        for name, chunk in (("train", parts[:split]), ("val", parts[split:] or parts[-1:])):
            self.data[name] = TensorDataset(*(torch.cat(t) for t in zip(*chunk)))
        labels = self.data["train"].tensors[2][self.data["train"].tensors[1]]
        self.stats = {"samples": len(self.data["train"]), "final_share": labels.float().mean().item()}

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.data["train"], batch_size=self.batch_size, shuffle=True,
                          generator=torch.Generator().manual_seed(0))

    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.data["val"], batch_size=self.batch_size)

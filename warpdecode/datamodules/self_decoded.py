"""The tasks' training prompts answered by the diffusion LM itself: dParallel's distillation data.

Certainty-forcing distillation teaches a diffusion LM to reach, in fewer steps, the answers its own
one-token-per-step decoding produces. `setup` decodes the training prompts that way (in batches,
with a progress bar) and serves the results in the layout of `ParallelTasksDataModule`; validation
keeps the tasks' true answers, so it measures real accuracy.
"""

from __future__ import annotations

from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from tqdm.auto import tqdm

from warpdecode.datamodules.parallel_tasks import FixedExamples, ParallelTasksDataModule, TaskExamples
from warpdecode.decoding.diffusion.decoder import diffusion_generate
from warpdecode.decoding.diffusion.policies.fixed import FixedCommit
from warpdecode.errors import ConfigError
from warpdecode.models.checkpoint import load_pretrained


class SelfDecodedTasksDataModule(ParallelTasksDataModule):
    def __init__(
        self,
        model: str | None = None,
        tasks: str = "all",
        train_examples: int = 4096,
        val_examples: int = 512,
        gen_length: int = 16,
        block_length: int = 8,
        decode_batch_size: int = 256,
        batch_size: int = 64,
        seed: int = 0,
        correct_only: bool = False,
    ) -> None:
        """
        Args:
            model: The diffusion LM (model directory) whose own answers are the targets.
            tasks: Comma-separated task names or all.
            train_examples: Training prompts decoded (once, at setup).
            val_examples: Held-out validation examples (true answers).
            gen_length: Answer region in tokens.
            block_length: Block length of the decoding that produces the targets.
            decode_batch_size: Prompts decoded together.
            batch_size: Examples per training batch.
            seed: Seed of the training prompts and their order.
            correct_only: Keep only the answers the task's checker accepts (distil what the model
                gets right, not its mistakes); the kept count is logged.
        """
        if model is None:
            raise ConfigError("set data.init_args.model to the diffusion LM whose own answers are distilled")
        super().__init__(tasks, train_examples, val_examples, gen_length, batch_size, seed)
        self.model_source, self.block_length, self.decode_batch_size = model, block_length, decode_batch_size
        self.correct_only = correct_only
        self.decoded = False

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if stage != "fit" or self.decoded:
            return
        assert isinstance(self.train, TaskExamples) and self.tokenizer.eos_token_id is not None
        model, _ = load_pretrained(self.model_source)
        prompts = self.train.prompt_ids(self.train_examples)
        items: list[tuple[Tensor, int]] = []
        for start in tqdm(range(0, len(prompts), self.decode_batch_size), desc="decoding own answers", unit="batch"):
            batch = prompts[start : start + self.decode_batch_size]
            out = diffusion_generate(model, batch, FixedCommit(1), gen_length=self.gen_length,
                                     block_length=self.block_length, eos_token_id=self.tokenizer.eos_token_id)
            for row, p in enumerate(batch):
                index = start + row
                if self.correct_only and not self.train.example(index).correct(self.tokenizer.decode(out.answers[row])):
                    continue
                items.append((out.sequences[row, : len(p) + self.gen_length].clone(), len(p)))
        if not items:
            raise ConfigError(f"none of the model's {len(prompts)} own answers is correct: nothing to distil "
                              f"(train the model further or set correct_only: false)")
        rank_zero_info(f"distilling {len(items)} of {len(prompts)} own answers"
                       + (" (the correct ones)" if self.correct_only else ""))
        self.train = FixedExamples(items)
        self.decoded = True

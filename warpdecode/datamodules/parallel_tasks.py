"""Prompt/answer pairs of the ParallelBench-style tasks (`data/parallel_tasks.py`) for diffusion LMs.

Each example is `PROMPT ANSWER <eos>...` with the answer padded by `<|endoftext|>` to `gen_length`
tokens, the layout a masked diffusion LM decodes into: the answer region starts fully masked and
the model learns to put the end-of-text padding after the answer itself. Batches are right-padded
to their longest row; `lengths` says how much of each row is real.

Examples are generated from (task, seed, index) on the fly, so the training set costs no disk and
no preparation; the evaluation prompts (`held_out_prompts`) and the validation prompts never appear
in it. The tokenizer is a character vocabulary over the tasks' alphabet.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from warpdecode.data.parallel_tasks import (
    ALPHABET,
    MAX_ITEMS,
    TaskExample,
    example,
    held_out_prompts,
    task_names,
)
from warpdecode.datamodules.blocks import EpochShuffleSampler, ResumableLoader
from warpdecode.errors import ConfigError
from warpdecode.models.tokenizer import Tokenizer, char_tokenizer

VAL_SEED_OFFSET = 7919
"""Validation examples use `seed + VAL_SEED_OFFSET`."""


class TaskExamples(Dataset[tuple[Tensor, int]]):
    """Item i: the (i // T)-th example of task i % T as (prompt + padded answer ids, prompt length)."""

    def __init__(self, tasks: list[str], seed: int, size: int, gen_length: int, tokenizer: Tokenizer,
                 exclude: set[str] | None = None) -> None:
        self.tasks, self.seed, self.size, self.gen_length = tasks, seed, size, gen_length
        self.exclude = exclude or set()
        self.vocab = tokenizer.backend.get_vocab()
        eos = tokenizer.eos_token_id
        assert eos is not None
        self.eos = eos

    def __len__(self) -> int:
        return self.size

    def example(self, index: int) -> TaskExample:
        task, n = self.tasks[index % len(self.tasks)], index // len(self.tasks)
        item = example(task, self.seed, n)
        redraw = 0
        while item.prompt in self.exclude:  # the same prompt as a held-out one: draw another
            redraw += 1
            item = example(task, self.seed, -(n * 1000 + redraw))
        return item

    def prompt_ids(self, count: int) -> list[list[int]]:
        """The token ids of the first `count` prompts (what a model is asked to answer)."""
        return [ids[:n].tolist() for ids, n in (self[i] for i in range(count))]

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        ids, prompt_length = self.example(index).encode(self.vocab, self.eos, self.gen_length)
        return torch.tensor(ids, dtype=torch.int64), prompt_length


class FixedExamples(Dataset[tuple[Tensor, int]]):
    """Examples already encoded: (prompt + answer region ids, prompt length) each."""

    def __init__(self, items: list[tuple[Tensor, int]]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        return self.items[index]


def collate(eos_token_id: int, items: list[tuple[Tensor, int]]) -> dict[str, Tensor]:
    """Right-pad with EOS: tokens (B, L) int64, prompt_lengths (B,), lengths (B,) (real tokens per row)."""
    lengths = torch.tensor([len(ids) for ids, _ in items])
    tokens = torch.full((len(items), int(lengths.max())), eos_token_id, dtype=torch.int64)
    for row, (ids, _) in enumerate(items):
        tokens[row, : len(ids)] = ids
    return {"tokens": tokens, "prompt_lengths": torch.tensor([p for _, p in items]), "lengths": lengths}


class ParallelTasksDataModule(LightningDataModule):
    def __init__(
        self,
        tasks: str = "all",
        train_examples: int = 200_000,
        val_examples: int = 512,
        gen_length: int = 16,
        batch_size: int = 64,
        seed: int = 0,
    ) -> None:
        """
        Args:
            tasks: comma-separated task names (copy, reverse, sort, add, close, fill, perm) or all.
            train_examples: examples per training epoch (generated on the fly).
            val_examples: held-out validation examples (a different seed; never in training).
            gen_length: answer region in tokens (answer + end-of-text padding); at least 13.
            batch_size: examples per batch.
            seed: seed of the training examples and of their order.
        """
        super().__init__()
        if gen_length <= MAX_ITEMS:
            raise ConfigError(f"gen_length must exceed the longest answer ({MAX_ITEMS} tokens), got {gen_length}")
        if train_examples <= 0 or val_examples <= 0 or batch_size <= 0:
            raise ConfigError("train_examples, val_examples and batch_size must be positive")
        self.tasks = task_names(tasks)
        self.tokenizer = char_tokenizer(ALPHABET)
        self.gen_length, self.batch_size, self.seed = gen_length, batch_size, seed
        self.train_examples, self.val_examples = train_examples, val_examples
        longest_prompt = max(len(name) for name in self.tasks) + 2 * MAX_ITEMS + 2
        self.block_size = longest_prompt + gen_length
        """Longest row, checked against the model's max_seq_len."""
        self.train: TaskExamples | FixedExamples | None = None
        self.val: TaskExamples | None = None

    def setup(self, stage: str) -> None:
        if self.val is None:
            self.val = TaskExamples(self.tasks, self.seed + VAL_SEED_OFFSET, self.val_examples, self.gen_length,
                                    self.tokenizer, held_out_prompts(self.tasks))
        if self.train is None and stage == "fit":
            exclude = held_out_prompts(self.tasks) | {self.val.example(i).prompt for i in range(len(self.val))}
            self.train = TaskExamples(self.tasks, self.seed, self.train_examples, self.gen_length, self.tokenizer, exclude)

    def _collate(self, items: list[tuple[Tensor, int]]) -> dict[str, Tensor]:
        assert self.tokenizer.eos_token_id is not None
        return collate(self.tokenizer.eos_token_id, items)

    def train_dataloader(self) -> DataLoader[Any]:
        assert self.train is not None
        return ResumableLoader(self.train, batch_size=self.batch_size, sampler=EpochShuffleSampler(len(self.train), self.seed),
                               collate_fn=self._collate, drop_last=True)

    def val_dataloader(self) -> DataLoader[Any]:
        assert self.val is not None
        return DataLoader(self.val, batch_size=self.batch_size, collate_fn=self._collate)

    def test_dataloader(self) -> DataLoader[Any]:
        return self.val_dataloader()

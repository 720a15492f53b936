"""Prompt/answer batches for diffusion LMs: layout, padding, held-out prompts, resumable order."""

from __future__ import annotations

import pytest

from warpdecode.data.parallel_tasks import held_out_prompts
from warpdecode.datamodules.parallel_tasks import ParallelTasksDataModule
from warpdecode.errors import ConfigError


def module(**overrides) -> ParallelTasksDataModule:  # type: ignore[no-untyped-def]
    args = {"tasks": "copy,add,perm", "train_examples": 300, "val_examples": 30, "gen_length": 14, "batch_size": 8}
    data = ParallelTasksDataModule(**(args | overrides))
    data.setup("fit")
    return data


def test_rows_are_prompt_answer_and_end_of_text_padding() -> None:
    data = module()
    assert data.train is not None
    tokenizer = data.tokenizer
    ids, prompt_length = data.train[4]
    item = data.train.example(4)
    assert tokenizer.decode(ids[:prompt_length].tolist()) == item.prompt
    assert tokenizer.decode(ids[prompt_length:].tolist()) == item.answer  # the padding decodes to nothing
    assert len(ids) == prompt_length + 14
    assert ids[prompt_length + len(item.answer):].tolist() == [tokenizer.eos_token_id] * (14 - len(item.answer))


def test_batches_are_right_padded_with_lengths() -> None:
    data = module()
    batch = next(iter(data.train_dataloader()))
    tokens, prompts, lengths = batch["tokens"], batch["prompt_lengths"], batch["lengths"]
    assert tokens.shape == (8, int(lengths.max()))
    assert ((lengths - prompts) == 14).all()
    for row, n in enumerate(lengths.tolist()):
        assert (tokens[row, n:] == data.tokenizer.eos_token_id).all()


def test_training_never_sees_evaluation_or_validation_prompts() -> None:
    data = module(train_examples=3000)
    assert data.train is not None and data.val is not None
    train = {data.train.example(i).prompt for i in range(len(data.train))}
    val = {data.val.example(i).prompt for i in range(len(data.val))}
    assert not train & held_out_prompts(data.tasks)
    assert not train & val
    assert len(train) > 2500  # examples differ (perm/add/copy spaces are large)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="gen_length"):
        ParallelTasksDataModule(gen_length=12)
    with pytest.raises(ConfigError, match="unknown task"):
        ParallelTasksDataModule(tasks="copy,nope")

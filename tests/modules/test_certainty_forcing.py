"""dParallel certainty forcing: complementary block masks, the loss, and a fit on the model's own answers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer

from warpdecode.datamodules.self_decoded import SelfDecodedTasksDataModule
from warpdecode.decoding.diffusion.decoder import diffusion_generate
from warpdecode.decoding.diffusion.layout import answer_region
from warpdecode.decoding.diffusion.policies.fixed import FixedCommit
from warpdecode.errors import ConfigError
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.modules.certainty_forcing import CertaintyForcingModule, block_masks


def test_block_masks_split_one_block_between_two_views_and_mask_everything_after() -> None:
    prompt_lengths, lengths = torch.tensor([3, 5] * 200), torch.tensor([15, 17] * 200)
    answer, _ = answer_region(prompt_lengths, lengths, 17)
    first, second = block_masks(answer, 4, torch.Generator().manual_seed(0))
    block = torch.where(answer, (torch.arange(17)[None] - prompt_lengths[:, None]) // 4, -1)  # 3 blocks per answer
    chosen = []
    for row in range(400):
        split = (first[row] ^ second[row]).nonzero().flatten()
        if not len(split):
            continue  # the coin gave the whole block to one view (probability 2 / 16)
        (c,) = block[row, split].unique().tolist()  # the views differ inside one block only
        assert torch.equal(first[row] & second[row], block[row] > c)  # later blocks: masked in both
        assert torch.equal(first[row] | second[row], block[row] >= c)  # earlier blocks and the prompt: in neither
        chosen.append(c)
    assert set(chosen) == {0, 1, 2} and len(chosen) > 300


def test_distillation_keeps_the_models_answers_and_exports(dlm_dir: Path, tmp_path: Path) -> None:
    data = SelfDecodedTasksDataModule(str(dlm_dir), tasks="copy,add", train_examples=32, val_examples=8,
                                      gen_length=14, block_length=7, decode_batch_size=16, batch_size=8)
    data.setup("fit")
    model, _ = load_pretrained(dlm_dir)
    ids, prompt_length = data.train[3]  # type: ignore[index]
    own = diffusion_generate(model, [ids[:prompt_length].tolist()], FixedCommit(1), gen_length=14, block_length=7,
                             eos_token_id=0)
    assert torch.equal(ids, own.sequences[0])  # the target is what the model itself decodes
    module = CertaintyForcingModule(pretrained=str(dlm_dir), block_length=7, eval_block_length=7,
                                export_dir=str(tmp_path / "distilled"))
    assert {"mask_token", "block_length", "entropy_weight", "pretrained"} <= set(module.hparams)
    ce, entropy = module.certainty_loss(next(iter(data.train_dataloader())), torch.Generator().manual_seed(0))
    assert ce.item() > 0 and entropy.item() >= 0
    Trainer(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            limit_val_batches=1, default_root_dir=tmp_path).fit(module, data)
    distilled, _ = load_pretrained(tmp_path / "distilled")
    assert distilled.config.causal is False and distilled.config.mask_token_id == model.config.mask_token_id


def test_correct_only_keeps_the_answers_the_checker_accepts(dlm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from warpdecode.data.parallel_tasks import TaskExample

    args = {"tasks": "copy,add", "train_examples": 32, "val_examples": 8, "gen_length": 14, "block_length": 7,
            "decode_batch_size": 16, "correct_only": True}
    with pytest.raises(ConfigError, match="none of the model's 32 own answers is correct"):
        SelfDecodedTasksDataModule(str(dlm_dir), **args).setup("fit")  # an untrained model gets none right
    monkeypatch.setattr(TaskExample, "correct", lambda self, output: self.task == "copy")
    data = SelfDecodedTasksDataModule(str(dlm_dir), **args)
    data.setup("fit")
    assert len(data.train) == 16  # type: ignore[arg-type]
    prompts = {data.tokenizer.decode(ids[:n].tolist()) for ids, n in data.train}  # type: ignore[attr-defined]
    assert all(p.startswith("copy:") for p in prompts)


def test_needs_a_trained_model() -> None:
    with pytest.raises(ConfigError, match="pretrained"):
        CertaintyForcingModule()
    with pytest.raises(ConfigError, match="data.init_args.model"):
        SelfDecodedTasksDataModule()

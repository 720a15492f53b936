"""The masked diffusion LM: forward process, LLaDA loss, validation decoding, fit → export → decode."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from warpdecode.datamodules.parallel_tasks import ParallelTasksDataModule
from warpdecode.decoding.diffusion.decoder import diffusion_generate
from warpdecode.decoding.diffusion.layout import answer_region
from warpdecode.decoding.diffusion.likelihood import mask_answer
from warpdecode.decoding.diffusion.policies.fixed import FixedCommit
from warpdecode.errors import ConfigError
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.models.config import ModelConfig
from warpdecode.modules.lightning_cli import main
from warpdecode.modules.masked_diffusion import MaskedDiffusionModule

TINY = {"vocab_size": 48, "n_layer": 2, "n_head": 4, "d_model": 64, "d_ff": 172, "max_seq_len": 64}


def batch_of(data: ParallelTasksDataModule) -> dict[str, torch.Tensor]:
    data.setup("fit")
    return next(iter(data.train_dataloader()))


def test_forward_process_masks_only_the_answer_at_ratio_t() -> None:
    tokens = torch.arange(40).repeat(2000, 1)
    prompt_lengths, lengths = torch.full((2000,), 10), torch.full((2000,), 30)
    answer, attention = answer_region(prompt_lengths, lengths, 40)
    noisy, masked, t = mask_answer(tokens, answer, 99, 0.001, torch.Generator().manual_seed(0))
    assert not (masked & ~answer).any()
    assert torch.equal(noisy == 99, masked)
    assert ((t >= 0.001) & (t <= 1)).all()
    assert (masked.sum(1).float() / 20 - t).abs().mean() < 0.1  # each row masks about a fraction t
    assert not attention[0, 0, 30:].any() and attention[0, 0, :30].all()


def test_stratified_ratios_cover_every_stratum_once() -> None:
    tokens = torch.zeros(8, 20, dtype=torch.int64)
    answer = torch.ones(8, 20, dtype=torch.bool)
    draws = [mask_answer(tokens, answer, 99, 0.0, torch.Generator().manual_seed(seed), stratified=True)[2]
             for seed in range(200)]
    for t in draws:
        assert sorted(((t * 8).floor().long()).tolist()) == list(range(8))  # one ratio per eighth of (0, 1)
    assert torch.stack(draws).mean().item() == pytest.approx(0.5, abs=0.02)  # still uniform on average


def test_loss_is_an_unbiased_estimate_of_the_answers_cross_entropy() -> None:
    """With uniform predictions every masked token costs log V; dividing by t and the answer length
    makes the expected loss exactly log V whatever the masking ratio."""
    module = MaskedDiffusionModule(model=ModelConfig(**TINY))
    torch.nn.init.zeros_(module.backbone.embed.weight)  # tied head: all-zero logits
    module.config.mask_token_id = 1
    data = ParallelTasksDataModule(tasks="copy", batch_size=512, train_examples=512, gen_length=16)
    batch = batch_of(data)
    losses = module.diffusion_loss(batch, torch.Generator().manual_seed(0))
    assert losses.shape == (512,)
    assert losses.mean().item() == pytest.approx(math.log(48), rel=0.03)
    module.hparams["stratified_t"] = True
    stratified = module.diffusion_loss(batch, torch.Generator().manual_seed(0))
    assert stratified.mean().item() == pytest.approx(math.log(48), rel=0.03)


def test_the_backbone_is_bidirectional_and_the_mask_token_must_exist() -> None:
    module = MaskedDiffusionModule(model=ModelConfig(**TINY))
    assert module.config.causal is False
    with pytest.raises(ConfigError, match="no mask token known"):
        _ = module.mask_token_id
    with pytest.raises(ConfigError, match="min_mask_ratio"):
        MaskedDiffusionModule(model=ModelConfig(**TINY), min_mask_ratio=0.0)


@pytest.fixture
def diffusion_recipe(tmp_path: Path) -> Path:
    config: dict[str, Any] = {
        "seed_everything": 3,
        "trainer": {"max_steps": 120, "val_check_interval": 60, "check_val_every_n_epoch": None, "precision": "bf16-mixed",
                    "log_every_n_steps": 20, "enable_progress_bar": False, "enable_model_summary": False},
        "model": {"class_path": "MaskedDiffusionModule",
                  "init_args": {"model": TINY, "lr": 3e-3, "warmup_steps": 10, "eval_block_length": 4}},
        "data": {"class_path": "ParallelTasksDataModule",
                 "init_args": {"tasks": "copy", "train_examples": 20000, "val_examples": 64, "gen_length": 13,
                               "batch_size": 32}},
    }
    path = tmp_path / "dlm.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_fit_logs_decoding_metrics_and_exports_a_loadable_diffusion_lm(tmp_path: Path, diffusion_recipe: Path) -> None:
    main(["fit", "--config", str(diffusion_recipe)])
    (run,) = [p for p in (tmp_path / "runs" / "warpdecode").iterdir() if p.is_dir()]
    (offline,) = (tmp_path / "runs" / "wandb").glob("offline-run-*")
    records = (offline / f"run-{run.name}.wandb").read_bytes()
    for key in (b"val/loss", b"val/exact_static", b"val/exact_threshold", b"val/steps_threshold"):
        assert key in records, key
    model, tokenizer = load_pretrained(run / "model")
    assert model.config.causal is False and model.config.mask_token_id == tokenizer.backend.token_to_id("<|mask|>")
    evaluator = MaskedDiffusionModule(model=model.config)
    evaluator.backbone = model
    data = ParallelTasksDataModule(tasks="copy", batch_size=256, train_examples=256, val_examples=256, gen_length=13)
    data.setup("validate")
    assert data.val is not None
    with torch.no_grad():
        loss = evaluator.diffusion_loss(data._collate([data.val[i] for i in range(256)]), torch.Generator().manual_seed(0))
    assert loss.mean().item() < 0.75 * math.log(48)  # uniform guessing costs log V per answer token
    out = diffusion_generate(model, [tokenizer.encode("copy:ab12cd=")], FixedCommit(1), gen_length=13, block_length=4,
                             eos_token_id=0)
    assert out.stats.steps == [13]


def test_the_diffusion_recipes_parse_and_build(dlm_dir: Path) -> None:
    from warpdecode.modules.lightning_cli import build_cli

    recipes = Path(__file__).parents[2] / "configs" / "diffusion"
    cli = build_cli(["--config", str(recipes / "parallel-tasks.yaml")], run=False)
    assert isinstance(cli.model, MaskedDiffusionModule) and cli.model.config.causal is False
    assert cli.datamodule.block_size <= cli.model.config.max_seq_len
    assert cli.model.config.vocab_size == cli.datamodule.tokenizer.vocab_size
    learn2pd = build_cli(["--config", str(recipes / "learn2pd.yaml"), "--data.init_args.model", str(dlm_dir)], run=False)
    assert learn2pd.model.filter.block_length == learn2pd.datamodule.block_length
    distill = build_cli(["--config", str(recipes / "certainty-forcing.yaml"), "--model.init_args.pretrained", str(dlm_dir),
                         "--data.init_args.model", str(dlm_dir)], run=False)
    assert distill.model.config.mask_token_id is not None
    # LightningCLI records only the subclass's own arguments; the ones the parents read must be there too
    assert {"mask_token", "min_mask_ratio", "betas", "init_std"} <= set(distill.model.hparams)
    adapt = build_cli(["--config", str(recipes / "smollm2-diffuspec.yaml"), "--model.init_args.pretrained", str(dlm_dir),
                       "--data.init_args.target", str(dlm_dir)], run=False)
    assert adapt.datamodule.draft_region == 8 and adapt.datamodule.max_prompts == 2048
    assert adapt.model.hparams["pretrained"] == str(dlm_dir) and adapt.model.hparams["eval_decode_batches"] == 4

"""What every drafter module shares at the end of `fit`: the package and its acceptance picture, logged to W&B."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import WandbLogger

from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.models.eagle import shift_left
from warpdecode.modules.drafter import distillation_loss
from warpdecode.modules.medusa import MedusaModule

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.mark.parametrize(("n", "ahead"), [(9, 1), (9, 3), (10, 2)])
def test_distillation_loss_equals_the_zero_padded_reference(n, ahead):
    torch.manual_seed(ahead)
    B, T, N = 3, 10, 7
    logits = torch.randn(B, n, N)
    target_probs = torch.randn(B, T, N).softmax(-1)
    lengths = torch.tensor([10, 6, 3])
    valid = (torch.arange(n)[None] + 1 + ahead < lengths[:, None]).float()  # every start, the invalid masked out
    ce = -(shift_left(target_probs, ahead, n) * logits.log_softmax(-1)).sum(-1)
    torch.testing.assert_close(distillation_loss(logits, target_probs, lengths, ahead), (ce * valid).sum() / valid.sum())


def test_fit_saves_the_package_with_its_acceptance_plot_and_logs_it_to_wandb(tiny_model_dir, self_distill_data,
                                                                           tmp_path: Path, monkeypatch):
    """What reaches W&B is read from what its run was given, not from the offline record file, which
    the W&B service writes in the background (right after `finish()` it may hold its header alone)."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    logger = WandbLogger(project="warpdecode", save_dir=str(tmp_path), offline=True)
    run = logger.experiment
    logged: list[dict[str, Any]] = []
    log = run.log

    def record(data: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        logged.append(dict(data))
        log(data, *args, **kwargs)

    monkeypatch.setattr(run, "log", record)
    module = MedusaModule(target=str(tiny_model_dir), draft_vocab_size=64, num_heads=2, tree_nodes=4,
                           export_dir=str(tmp_path / "drafter"))
    trainer = Trainer(max_epochs=1, logger=logger, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=str(tmp_path), num_sanity_val_steps=0)
    trainer.fit(module, datamodule=self_distill_data)
    run_dir = Path(run.dir)
    run.finish()

    package = DrafterPackage.load(tmp_path / "drafter", "medusa")
    assert len(package.training["val_tau_by_nodes"]) == 4
    plot = (tmp_path / "drafter" / "acceptance.png").read_bytes()
    assert plot.startswith(b"\x89PNG")
    (images,) = [entry["val/acceptance"] for entry in logged if "val/acceptance" in entry]  # logged once
    assert len(images) == 1 and isinstance(images[0], wandb.Image)
    # Logging an image copies it into the run's media folder before `log` returns (no background writer).
    (copied,) = (run_dir / "media" / "images").glob("val/acceptance*.png")
    assert copied.read_bytes() == plot


def test_a_drafter_that_ranks_no_validation_token_high_enough_saves_without_a_tree(tiny_model_dir, self_distill_data,
                                                                                 tmp_path: Path):
    module = MedusaModule(target=str(tiny_model_dir), draft_vocab_size=64, num_heads=2, tree_nodes=4, max_rank=2,
                           export_dir=str(tmp_path / "drafter"))
    trainer = Trainer(max_epochs=1, limit_train_batches=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=str(tmp_path), num_sanity_val_steps=0)
    trainer.fit(module, datamodule=self_distill_data)
    assert module.last_val_ranks is not None
    module.last_val_ranks = module.last_val_ranks.clamp(min=2)  # every validation token ranks beyond max_rank
    with pytest.warns(UserWarning, match="stores no draft tree"):
        directory = module.save_package(module.package())

    package = DrafterPackage.load(directory, "medusa")
    assert package.tree == {} and "val_tau_by_nodes" not in package.training
    assert not (directory / "acceptance.png").exists()

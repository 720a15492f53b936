"""Learn2PD end to end: trajectories → filter fit → package → the learn2pd commit policy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer
from oracle_dlm import EOS, OracleDLM

from warpdecode.datamodules.trajectories import TrajectoryDataModule
from warpdecode.decoding.diffusion.decoder import diffusion_generate
from warpdecode.decoding.diffusion.policies.learn2pd import Learn2PDCommit
from warpdecode.errors import CheckpointError, ConfigError
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.models.parallel_filter import ParallelFilter
from warpdecode.modules.parallel_filter import ParallelFilterModule


def fitted_filter(dlm_dir: Path, tmp_path: Path) -> Path:
    data = TrajectoryDataModule(str(dlm_dir), tasks="copy", examples=48, decode_batch_size=16, gen_length=14,
                                block_length=7, batch_size=64)
    module = ParallelFilterModule(block_length=7, hidden=16, export_dir=str(tmp_path / "filter"))
    Trainer(max_epochs=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, default_root_dir=tmp_path).fit(module, data)
    assert module.package_dir is not None
    return module.package_dir


def test_the_fitted_filter_is_a_package_for_its_diffusion_lm(dlm_dir: Path, tmp_path: Path) -> None:
    directory = fitted_filter(dlm_dir, tmp_path)
    package = DrafterPackage.load(directory, kind="learn2pd")
    assert package.config == {"block_length": 7, "hidden": 16}
    assert package.training["optimizer_steps"] == 3 * 7 and package.training["samples"] == 32 * 14  # 448 samples in batches of 64
    assert {"precision", "recall", "loss"} <= set(package.training)
    model, tokenizer = load_pretrained(dlm_dir)
    policy = Learn2PDCommit(str(directory))
    out = diffusion_generate(model, [tokenizer.encode("copy:abc=")], policy, gen_length=14, block_length=7,
                             eos_token_id=EOS)
    assert 2 <= out.stats.steps[0] <= 14
    other = load_pretrained(dlm_dir)[0]
    torch.nn.init.zeros_(other.norm.weight)
    with pytest.raises(CheckpointError, match="trained for"):
        diffusion_generate(other, [[5]], policy, gen_length=14, block_length=7, eos_token_id=EOS)


def constant_filter(tmp_path: Path, model: OracleDLM, logit: float) -> Learn2PDCommit:
    """A filter package that returns `logit` for every position."""
    net = ParallelFilter(block_length=4, hidden=2)
    state = {k: torch.zeros_like(v) for k, v in net.state_dict().items()}
    state["net.4.bias"] = torch.full((4,), logit)
    target = {"source": "oracle", "fingerprint": "f", "vocab_size": 16, "d_model": 8, "n_layer": 1}
    DrafterPackage("learn2pd", target, {"block_length": 4, "hidden": 2}, state).save(tmp_path / f"f{logit}")
    policy = Learn2PDCommit(str(tmp_path / f"f{logit}"), accept_threshold=0.9)
    policy.package.check_target = lambda target: None  # type: ignore[method-assign]  # the oracle has no weights
    return policy


@pytest.mark.parametrize(("logit", "steps"), [(5.0, 2), (-5.0, 8)])
def test_the_policy_commits_what_the_filter_accepts_and_at_least_the_minimum(tmp_path: Path, logit: float,
                                                                            steps: int) -> None:
    truth = torch.tensor([[5, 6, 9, 10, 11, 12, 13, 14, 15, 9]])
    model = OracleDLM(truth, torch.full(truth.shape, 0.5))
    out = diffusion_generate(model, [[5, 6]], constant_filter(tmp_path, model, logit), gen_length=8, block_length=4,
                             eos_token_id=EOS)
    assert out.stats.steps == [steps] and out.answers == [truth[0, 2:].tolist()]


def test_block_length_must_match_the_trajectories(dlm_dir: Path) -> None:
    module = ParallelFilterModule(block_length=8)
    data = TrajectoryDataModule(str(dlm_dir), gen_length=14, block_length=7)
    trainer = Trainer(max_epochs=1, logger=False)
    module.trainer = trainer
    trainer.datamodule = data  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="blocks of 8"):
        module.setup("fit")

"""AdaDec's threshold fit: the logistic fit recovers a known threshold, the data are the target's
teacher-forced errors, and the package runs as `adadec:path=DIR` on its own model only."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer
from tiny_models import greedy_target

from warpdecode.datamodules.entropy_errors import EntropyErrorsDataModule, entropy_errors
from warpdecode.decoding import registry
from warpdecode.decoding.generate import generate
from warpdecode.decoding.rules.adadec import entropy
from warpdecode.errors import CheckpointError, ConfigError
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.modules.entropy_threshold import EntropyThresholdModule

pytestmark = pytest.mark.usefixtures("single_thread")


class Synthetic(EntropyErrorsDataModule):
    """Positions whose errors follow P(wrong | H) = sigmoid(3 (H - 2.5)): the fit must find 2.5."""

    def make_samples(self, model, tokenizer, split):
        g = torch.Generator().manual_seed(0 if split == "train" else 1)
        h = torch.rand(20_000, generator=g) * 6
        wrong = torch.rand(20_000, generator=g) < torch.sigmoid(3 * (h - 2.5))
        return {"entropy": h, "wrong": wrong}


def fit(datamodule, directory: Path) -> EntropyThresholdModule:
    module = EntropyThresholdModule(export_dir=str(directory))
    Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, default_root_dir=directory.parent).fit(module, datamodule)
    return module


def test_the_fit_recovers_a_known_threshold(tiny_model_dir, tmp_path):
    module = fit(Synthetic(str(tiny_model_dir)), tmp_path / "adadec")
    assert module.threshold == pytest.approx(2.5, abs=0.1)
    assert float(module.weight) == pytest.approx(3.0, rel=0.15)
    rule = registry.build("rule", "adadec", path=str(tmp_path / "adadec"))
    assert rule.threshold == pytest.approx(module.threshold)
    model, _ = load_pretrained(tiny_model_dir)
    out = generate(model, None, [5, 9, 12], max_new_tokens=6, stop_at_eos=False, rule=rule)
    assert len(out.token_ids) == 6
    with pytest.raises(CheckpointError, match="trained for"):  # another model
        generate(greedy_target(), None, [5, 9, 12], max_new_tokens=6, stop_at_eos=False, rule=rule)


def test_samples_are_the_teacher_forced_errors(tiny_model_dir):
    model, _ = load_pretrained(tiny_model_dir)
    block = [5, 9, 12, 40, 7, 7, 3]
    samples = entropy_errors(model, [block, [4]])  # a one-token block has no next token
    with torch.inference_mode():
        logits = model(torch.tensor([block])).logits[0, :-1]
    assert samples["wrong"].tolist() == (logits.argmax(-1) != torch.tensor(block[1:])).tolist()
    torch.testing.assert_close(samples["entropy"], entropy(logits))


def test_fit_on_text_folders(tiny_model_dir, tmp_path):
    for split in ("train", "val"):
        (tmp_path / "text" / split).mkdir(parents=True)
        for i in range(3):
            (tmp_path / "text" / split / f"{i}.py").write_text(f"for i in range({i + 3}):\n    print('hello world', i)\n")
    data = EntropyErrorsDataModule(str(tiny_model_dir), source=str(tmp_path / "text"), max_documents=3,
                                   max_val_documents=2, block_size=16)
    module = fit(data, tmp_path / "adadec")
    assert data.stats["train_positions"] == 3 * 15 and 0 <= data.stats["wrong_rate"] <= 1
    package_threshold = registry.build("rule", "adadec", path=str(tmp_path / "adadec")).threshold
    assert package_threshold == pytest.approx(module.threshold)
    with pytest.raises(ConfigError, match="not a folder"):
        EntropyErrorsDataModule(str(tiny_model_dir), source=str(tmp_path / "missing")).setup("fit")

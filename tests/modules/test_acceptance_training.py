"""SpecDec++ end to end on the tiny model: labels from the target's greedy answers → head fit →
package → the int8_self drafter stops its chains with it, greedy-identical."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer
from tiny_models import prompt_file

from warpdecode.datamodules.acceptance import AcceptanceDataModule, label_examples
from warpdecode.datamodules.self_distill import Example
from warpdecode.decoding.generate import build_method, generate
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.models.quantized import quantized_copy
from warpdecode.modules.acceptance import AcceptanceHeadModule

pytestmark = pytest.mark.usefixtures("single_thread")


def data(tiny_model_dir: Path, tmp_path: Path) -> AcceptanceDataModule:
    prompts = prompt_file(tmp_path)
    return AcceptanceDataModule(str(tiny_model_dir), bits=8, prompts=[prompts], max_prompts=8,
                                max_new_tokens=16, val_fraction=0.4, max_train_answers=8, max_val_answers=8, batch_size=16,
                                cache_dir=str(tmp_path / "cache"))


def test_labels_are_the_greedy_verifiers_decisions(tiny_model_dir):
    model, _ = load_pretrained(tiny_model_dir)
    prompt = [5, 9, 12]
    answer = generate(model, None, prompt, max_new_tokens=10, stop_at_eos=False).token_ids
    example = Example(torch.tensor(prompt + answer).numpy().astype("int32"), len(prompt), None)
    # The target drafting for itself is always accepted along its own greedy answer.
    assert label_examples(model, [example], "test")["labels"].all()
    draft = quantized_copy(model, 8)
    labels = label_examples(draft, [example], "test")
    with torch.inference_mode():
        expected = draft(torch.tensor([prompt + answer])).logits[0, len(prompt) - 1 : -1].argmax(-1)
    assert labels["labels"].tolist() == (expected == torch.tensor(answer)).tolist()
    assert labels["features"].shape == (10, model.config.d_model) and labels["signals"].shape == (10, 2)


def test_fit_saves_a_head_the_drafter_runs_losslessly(tiny_model_dir, tmp_path):
    datamodule = data(tiny_model_dir, tmp_path)
    module = AcceptanceHeadModule(d_model=32, hidden=16, export_dir=str(tmp_path / "head"))
    Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, default_root_dir=tmp_path).fit(module, datamodule)
    package = DrafterPackage.load(tmp_path / "head", kind="acceptance_head")
    assert package.config == {"d_model": 32, "hidden": 16}
    assert {"auroc", "accuracy", "predicted_positive", "measured_positive", "train_samples", "accept_rate"} <= set(package.training)
    assert package.training["bits"] == 8 and 0 <= package.training["accept_rate"] <= 1
    model, _ = load_pretrained(tiny_model_dir)
    method = build_method("int8_self", do_sample=False, options={"num_tokens": 6, "acceptance_head": str(tmp_path / "head")})
    prompt = [5, 9, 12, 40]
    out = generate(model, None, prompt, max_new_tokens=24, stop_at_eos=False, method=method)
    assert out.token_ids == generate(model, None, prompt, max_new_tokens=24, stop_at_eos=False).token_ids
    # A second setup reuses the cached labels instead of running the drafter again.
    again = data(tiny_model_dir, tmp_path)
    again.setup("fit")
    assert len(again.datasets["train"]) == datamodule.stats["train_samples"]
    assert len(list((tmp_path / "cache" / "acceptance").glob("*.pt"))) == 1

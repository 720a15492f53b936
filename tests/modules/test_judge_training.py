"""Judge decoding end to end on the tiny model: substitute labels from the target's own rollouts →
judge fit → package → the `judge` verifier decodes with it."""

from __future__ import annotations

from pathlib import Path

import pytest
from lightning.pytorch import Trainer
from tiny_models import naive_greedy, prompt_file

from warpdecode.datamodules.judge import JudgeDataModule
from warpdecode.decoding.generate import build_method, generate
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.modules.judge import JudgeModule

pytestmark = pytest.mark.usefixtures("single_thread")


def data(tiny_model_dir: Path, tmp_path: Path) -> JudgeDataModule:
    prompts = prompt_file(tmp_path)
    return JudgeDataModule(str(tiny_model_dir), prompts=[prompts], max_prompts=8, max_new_tokens=32,
                           val_fraction=0.4, max_train_answers=8, max_val_answers=8, substitutes_per_answer=6,
                           window=6, slack=3, min_match=2, batch_size=16, cache_dir=str(tmp_path / "cache"))


def test_fit_saves_a_judge_the_verifier_runs(tiny_model_dir, tmp_path):
    datamodule = data(tiny_model_dir, tmp_path)
    module = JudgeModule(d_model=32, export_dir=str(tmp_path / "judge"))
    Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, default_root_dir=tmp_path).fit(module, datamodule)
    package = DrafterPackage.load(tmp_path / "judge", kind="judge")
    assert package.config == {"d_model": 32}
    assert {"auroc", "accuracy", "predicted_positive", "measured_positive", "train_samples", "positive_rate",
            "window", "min_match"} <= set(package.training)
    assert package.training["train_samples"] > 0 and 0 <= package.training["positive_rate"] <= 1

    model, _ = load_pretrained(tiny_model_dir)
    prompt = [5, 9, 12, 40]
    kwargs = {"max_new_tokens": 24, "stop_at_eos": False}
    strict = build_method("draft_model", do_sample=False, options={"layers": 1, "num_tokens": 4}, verifier="judge",
                          verifier_options={"path": str(tmp_path / "judge"), "threshold": 1.0})
    assert generate(model, None, prompt, **kwargs, method=strict).token_ids == naive_greedy(model, prompt, 24)
    loose = build_method("draft_model", do_sample=False, options={"layers": 1, "num_tokens": 4}, verifier="judge",
                         verifier_options={"path": str(tmp_path / "judge"), "threshold": 0.0})
    out = generate(model, None, prompt, **kwargs, method=loose)  # approves every draft token
    assert out.stats.accepted_per_step == out.stats.proposed_per_step[: len(out.stats.accepted_per_step)]
    # A second setup reuses the cached samples instead of running the rollouts again.
    again = data(tiny_model_dir, tmp_path)
    again.setup("fit")
    assert len(again.datasets["train"]) == datamodule.stats["train_samples"]
    assert len(list((tmp_path / "cache" / "judge").glob("*.pt"))) == 1

"""Training the EAGLE-style drafter end to end on the tiny target's self-distilled data."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Trainer

from warpdecode.decoding.generate import build_method, generate
from warpdecode.errors import ConfigError
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.modules.drafter import frequent_tokens
from warpdecode.modules.eagle import EagleDrafter

pytestmark = pytest.mark.usefixtures("single_thread")

def test_frequent_tokens_keep_stop_tokens_and_sort_by_id():
    counts = torch.tensor([5, 0, 9, 1, 7, 0])
    assert frequent_tokens(counts, 3, always=[5]).tolist() == [2, 4, 5]
    assert frequent_tokens(counts, 10, always=[]).tolist() == [0, 1, 2, 3, 4, 5]
    with pytest.raises(ConfigError, match="stop tokens"):
        frequent_tokens(counts, 1, always=[1, 5])


def test_fit_improves_simulated_acceptance_and_writes_a_runnable_package(tiny_model_dir, self_distill_data, tmp_path):
    """The tiny random target's answers are hard to predict from 21 examples, so acceptance is
    measured on the training answers (what the drafter could learn), before and after `fit`."""
    module = EagleDrafter(target=str(tiny_model_dir), draft_vocab_size=200, steps=3, lr=1e-2, warmup_steps=5,
                          token_weight=1.0, tree_nodes=6, export_dir=str(tmp_path / "drafter"))
    trainer = Trainer(max_epochs=40, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=str(tmp_path), num_sanity_val_steps=0)
    data = self_distill_data
    data.prepare_data()
    data.setup("fit")
    module.trainer = trainer
    module.setup("fit")  # the draft vocabulary and initial weights, so "before" scores the initial drafter
    trainer.validate(module, dataloaders=data.train_dataloader())
    before = trainer.callback_metrics["val/tau/chain"].item()
    trainer.fit(module, datamodule=data)
    trainer.validate(module, dataloaders=data.train_dataloader())
    after = trainer.callback_metrics["val/tau/chain"].item()
    assert after > before + 0.15, (before, after)
    assert trainer.callback_metrics["val/tau/tree"].item() >= after - 1e-6  # the data-built tree beats the chain

    package = DrafterPackage.load(tmp_path / "drafter", "eagle")
    assert len(package.tree["rank_paths"]) == 6
    assert package.training["tokens_seen"] > 0 and package.training["val_tau_tree"] >= package.training["val_tau_chain"]
    curve = package.training["val_tau_by_nodes"]
    assert len(curve) == 6 and curve == sorted(curve) and curve[-1] == package.training["val_tau_tree"]
    counts = torch.as_tensor(data.token_counts())
    assert set(package.weights["draft_vocab"].tolist()) >= set(counts.nonzero().flatten().tolist()[:1])

    model, _ = load_pretrained(tiny_model_dir)
    method = build_method("eagle", options={"path": str(tmp_path / "drafter")})
    accepted = 0
    for example in data.datasets["train"].examples[:4]:
        prompt = example.tokens[: example.prompt_length].tolist()
        plain = generate(model, None, prompt, max_new_tokens=16, stop_at_eos=False)
        out = generate(model, None, prompt, max_new_tokens=16, stop_at_eos=False, method=method)
        assert out.token_ids == plain.token_ids
        accepted += sum(out.stats.accepted_per_step)
    assert accepted > 0  # the trained drafter's drafts get accepted on prompts it was trained on

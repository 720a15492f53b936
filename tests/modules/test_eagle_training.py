"""Training the EAGLE-style drafter end to end on the tiny target's self-distilled data."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from warpdecode.errors import ConfigError
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.models.eagle import shift_left
from warpdecode.modules.drafter import frequent_tokens
from warpdecode.modules.eagle import EagleModule

pytestmark = pytest.mark.usefixtures("single_thread")


def naive_loss(module: EagleModule, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The loss written over every start position, targets zero-padded past the sequence and masked out."""
    outputs, features = module._unroll(batch)
    n = batch["tokens"].shape[1] - 1
    target_probs = module.net.frozen_head()(features).softmax(-1)
    total = torch.zeros(())
    for k, (predicted, logits) in enumerate(outputs):
        valid = (torch.arange(n)[None] + 2 + k < batch["lengths"][:, None]).float()
        feature_loss = (F.smooth_l1_loss(predicted, shift_left(features, 1 + k, n), reduction="none").mean(-1) * valid).sum()
        token_loss = (-(shift_left(target_probs, 1 + k, n) * logits.log_softmax(-1)).sum(-1) * valid).sum()
        weight = module.hparams["step_decay"] ** k / valid.sum().clamp_min(1)
        total = total + weight * (module.hparams["feature_weight"] * feature_loss + module.hparams["token_weight"] * token_loss)
    return total


def test_the_loss_equals_its_naive_reference(tiny_model_dir, self_distill_data):
    self_distill_data.prepare_data()
    self_distill_data.setup("fit")
    module = EagleModule(target=str(tiny_model_dir), draft_vocab_size=200, steps=3, token_weight=0.5)
    module.init_drafter(frequent_tokens(torch.as_tensor(self_distill_data.token_counts()), 200, []))
    batch = next(iter(self_distill_data.train_dataloader()))
    assert (batch["lengths"] < batch["tokens"].shape[1]).any()  # padded rows: the masking is exercised
    torch.testing.assert_close(module.loss(batch)[0], naive_loss(module, batch))


def test_eagle3_layout_has_no_feature_loss(tiny_model_dir, self_distill_data):
    """EAGLE-3's shape feeds back unnormed block outputs: no target feature to regress on, so the loss is the
    token loss alone (its naive reference with the feature weight 0) and a feature weight is refused."""
    self_distill_data.prepare_data()
    self_distill_data.setup("fit")
    module = EagleModule(target=str(tiny_model_dir), draft_vocab_size=200, steps=2, layout="eagle3",
                         feature_layers=[0, 1, 2])
    module.init_drafter(frequent_tokens(torch.as_tensor(self_distill_data.token_counts()), 200, []))
    batch = next(iter(self_distill_data.train_dataloader()))
    assert module.hparams["feature_weight"] == 0.0
    torch.testing.assert_close(module.loss(batch)[0], naive_loss(module, batch))
    with pytest.raises(ConfigError, match="set feature_weight: 0"):
        EagleModule(target=str(tiny_model_dir), draft_vocab_size=200, layout="eagle3", feature_layers=[0, 1, 2],
                    feature_weight=1.0)


def test_frequent_tokens_keep_stop_tokens_and_sort_by_id():
    counts = torch.tensor([5, 0, 9, 1, 7, 0])
    assert frequent_tokens(counts, 3, always=[5]).tolist() == [2, 4, 5]
    assert frequent_tokens(counts, 10, always=[]).tolist() == [0, 1, 2, 3, 4, 5]
    with pytest.raises(ConfigError, match="stop tokens"):
        frequent_tokens(counts, 1, always=[1, 5])


@pytest.mark.parametrize(("feature_layers", "feature_weight", "layout"),
                         [(None, 1.0, None), ([1, 2], 0.0, None), (None, 1.0, "eagle"), ([0, 1, 2], None, "eagle3")],
                         ids=["final-feature", "fused-features-token-loss", "eagle1-layout", "eagle3-layout"])
def test_fit_improves_simulated_acceptance_and_writes_a_runnable_package(tiny_model_dir, self_distill_data, tmp_path,
                                                                        fit_drafter, accepted_on_training_prompts,
                                                                        feature_layers, feature_weight, layout):
    """EAGLE, EAGLE-3's variant (hidden states 1 and 2, the final one, fused, computed by the frozen
    target while training, and no feature loss), EAGLE-1's shape (`layout="eagle"`, exportable) and
    EAGLE-3's (`layout="eagle3"`: its feature loss off by default)."""
    module = EagleModule(target=str(tiny_model_dir), draft_vocab_size=200, steps=3, lr=1e-2, warmup_steps=5,
                          feature_layers=feature_layers, feature_weight=feature_weight, token_weight=1.0,
                          layout=layout, tree_nodes=6, export_dir=str(tmp_path / "drafter"))
    trainer, before, after = fit_drafter(module, epochs=40)
    assert after > before + 0.15, (before, after)
    assert trainer.callback_metrics["val/tau/tree"].item() >= after - 1e-6  # the data-built tree beats the chain

    package = DrafterPackage.load(tmp_path / "drafter", "eagle")
    assert package.config["feature_layers"] == (feature_layers or [2])
    assert package.config.get("layout") == layout
    assert module.hparams["feature_weight"] == (0.0 if layout == "eagle3" else feature_weight)
    assert len(package.tree["rank_paths"]) == 6
    assert package.training["tokens_seen"] > 0 and package.training["val_tau_tree"] >= package.training["val_tau_chain"]
    curve = package.training["val_tau_by_nodes"]
    assert len(curve) == 6 and curve == sorted(curve) and curve[-1] == package.training["val_tau_tree"]
    assert (tmp_path / "drafter" / "acceptance.png").read_bytes().startswith(b"\x89PNG")  # the curve, drawn
    counts = torch.as_tensor(self_distill_data.token_counts())
    assert set(package.weights["draft_vocab"].tolist()) >= set(counts.nonzero().flatten().tolist()[:1])
    # the trained drafter's drafts get accepted on prompts it was trained on, losslessly
    assert accepted_on_training_prompts("eagle", {"path": str(tmp_path / "drafter")}, prompts=4) > 0


@pytest.mark.parametrize(("name", "fused"), [("eagle", False), ("eagle_gpu", False), ("eagle3", True)])
def test_recipes_name_the_drafter_and_its_arguments(name, fused, drafter_recipe):
    overrides = {"feature_layers": [1, 2]} if fused else {}  # the tiny target has 2 blocks
    recipe, module = drafter_recipe(name, **overrides)
    assert type(module) is EagleModule
    assert (module.net.fuse is not None) == fused
    assert (module.hparams["feature_weight"] == 0.0) == fused  # EAGLE-3 trains on the token loss alone
    assert recipe["data"]["init_args"]["features"]  # one self-distillation cache for every recipe

"""Training Medusa-2: heads and LoRA adapters learn together, the backbone-preserving loss starts at
the original target's own greedy answers, and `fit` writes the merged target with heads bound to it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_models import initialised_drafter, pattern_batch

from warpdecode.decoding.generate import build_method, generate
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.modules.medusa2 import Medusa2Module

pytestmark = pytest.mark.usefixtures("single_thread")


def drafter(target: Path, **kwargs) -> Medusa2Module:
    return initialised_drafter(Medusa2Module(target=str(target), draft_vocab_size=64, num_heads=3, lora_rank=4,
                                              **kwargs))


def test_the_preserving_loss_starts_at_the_original_answers(tiny_model_dir, self_distill_data):
    module = drafter(tiny_model_dir)
    self_distill_data.prepare_data()
    self_distill_data.setup("fit")
    batch = next(iter(self_distill_data.train_dataloader()))
    loss, parts = module.loss(batch)
    assert set(parts) == {"token_loss/d1", "token_loss/d2", "token_loss/d3", "lm_loss", "lm_agreement"}
    assert parts["lm_agreement"].item() == 1.0  # adapters start at zero: the answers are its own greedy choices
    loss.backward()
    assert all(p.grad is not None for p in module.lora.parameters())  # the heads' losses reach the backbone too
    assert all(p.grad is None for p in module.target.parameters())
    batch["features"] = torch.zeros_like(batch["features"])  # the original's cached features: never read
    torch.testing.assert_close(module.loss(batch)[0], loss)


def test_heads_backbone_weight_scales_only_what_reaches_the_backbone(tiny_model_dir):
    batch = pattern_batch(64)
    grads = {}
    for weight in (0.0, 0.5, 1.0):
        torch.manual_seed(0)
        module = drafter(tiny_model_dir, lm_weight=0.0, heads_backbone_weight=weight)
        for adapter in module.lora.values():  # B = 0 would leave A without gradient
            torch.nn.init.normal_(adapter.B, std=0.1)
        module.loss(batch)[0].backward()
        grads[weight] = (torch.cat([p.grad.flatten() for p in module.lora.parameters()]),
                         torch.cat([p.grad.flatten() for p in module.net.parameters() if p.grad is not None]))
    assert not grads[0.0][0].any()  # no preserving loss and no heads' gradient: the adapters stay
    torch.testing.assert_close(grads[0.5][0], grads[1.0][0] * 0.5)
    torch.testing.assert_close(grads[0.5][1], grads[1.0][1])  # the heads learn at full strength


def test_adapters_train_at_their_own_rate(tiny_model_dir):
    module = drafter(tiny_model_dir, lora_lr=3e-4)
    groups = module.param_groups()
    adapters = {id(p) for p in module.lora.parameters()}
    assert groups[-1]["lr"] == 3e-4 and {id(p) for p in groups[-1]["params"]} == adapters
    assert not any(id(p) in adapters for group in groups[:-1] for p in group["params"])


def test_fit_writes_the_merged_target_and_heads_bound_to_it(tiny_model_dir, tmp_path, fit_drafter):
    module = drafter(tiny_model_dir, export_dir=str(tmp_path / "m2"), lr=1e-2, lora_lr=1e-2)
    _, before, after = fit_drafter(module, epochs=8)
    assert after > before
    assert any(float(p.abs().max()) > 0 for name, p in module.lora.named_parameters() if name.endswith(".B"))
    target_dir = tmp_path / "m2-target"
    adapted, tokenizer = load_pretrained(target_dir)
    original, _ = load_pretrained(tiny_model_dir)
    assert adapted.fingerprint() != original.fingerprint()
    package = DrafterPackage.load(tmp_path / "m2", "medusa")
    package.check_target(adapted)
    assert package.target["source"] == str(target_dir) and package.config["medusa2"]["lora_rank"] == 4
    prompt = "Write a story about a cat."
    plain = generate(adapted, tokenizer, prompt, max_new_tokens=12, stop_at_eos=False)
    out = generate(adapted, tokenizer, prompt, max_new_tokens=12, stop_at_eos=False,
                   method=build_method("medusa", options={"path": str(tmp_path / "m2")}))
    assert out.token_ids == plain.token_ids


def test_recipe_builds_medusa2(drafter_recipe):
    recipe, module = drafter_recipe("medusa2")
    assert type(module) is Medusa2Module and module.net.num_heads == 4
    assert len(module.lora) == module.target.config.n_layer * 4
    assert recipe["trainer"]["precision"] == "32-true"

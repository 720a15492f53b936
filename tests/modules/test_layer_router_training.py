"""FiRST end to end on a tiny 4-block model: the target's greedy answers → router fit → package →
the `first` drafter skips what the routers decide, greedy-identical."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer
from tiny_models import prompt_file, save_tiny_model

from warpdecode.datamodules.self_distill import SelfDistillDataModule
from warpdecode.decoding.generate import build_method, generate
from warpdecode.errors import ConfigError
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.modules.layer_router import LayerRouterModule, answer_kl, crop_answers, hard_gates

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def four_blocks(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("four-blocks"), n_layer=4)


def data(model_dir: Path, tmp_path: Path) -> SelfDistillDataModule:
    prompts = prompt_file(tmp_path)
    return SelfDistillDataModule(str(model_dir), prompts=[prompts], max_prompts=8, max_new_tokens=12,
                                 features=False, batch_size=4, val_fraction=0.4, cache_dir=str(tmp_path / "cache"))


def test_crop_keeps_prompts_and_the_first_answer_tokens():
    tokens = torch.arange(20).reshape(2, 10)
    answer = torch.zeros(2, 10, dtype=torch.bool)
    answer[0, 2:9] = True  # prompt of 2, answer of 7
    answer[1, 4:10] = True  # prompt of 4, answer of 6
    out = crop_answers({"tokens": tokens, "answer_mask": answer}, 3)
    assert out["tokens"].shape == (2, 7)
    assert out["answer_mask"].tolist() == [[False, False, True, True, True, False, False],
                                           [False, False, False, False, True, True, True]]


def test_kl_and_hard_gates():
    logits = torch.randn(2, 3, 5)
    mask = torch.tensor([[True, False, True], [False, False, True]])
    assert answer_kl(logits, logits, mask).abs() < 1e-6
    assert answer_kl(logits, torch.zeros_like(logits), mask) > 0
    gates = torch.tensor([[1.0, 0.2, 0.7, 1.0], [1.0, 0.9, 0.1, 1.0]])
    assert hard_gates(gates, 0.5, None).tolist() == [[1, 0, 1, 1], [1, 1, 0, 1]]
    assert hard_gates(gates, 0.95, 1).tolist() == [[1, 0, 1, 1], [1, 1, 0, 1]]


def test_the_skip_weight_pulls_the_gates_down_and_the_kl_pushes_back(four_blocks, tmp_path):
    datamodule = data(four_blocks, tmp_path)
    datamodule.prepare_data()
    datamodule.setup("fit")
    batch = next(iter(datamodule.train_dataloader()))
    moved = {}
    for weight, start in ((0.0, -1.0), (10.0, 1.0)):  # from every block skipped / every block running
        module = LayerRouterModule(target=str(four_blocks), skip_weight=weight, lr=0.1, init_bias=start)
        optimizer = torch.optim.Adam(module.router.parameters(), lr=0.1)
        for _ in range(20):
            optimizer.zero_grad()
            module.training_step(batch, 0).backward()
            optimizer.step()
        assert all(p.grad is None for p in module.target.parameters())
        with torch.no_grad():
            _, means = module.full_pass(crop_answers(batch, 64))
            moved[weight] = float((hard_gates(module.router(means), 0.5, None) == 0).float().mean())
    assert moved[0.0] < 0.25 and moved[10.0] > 0.25  # KL alone brings the skipped blocks back; a large weight skips them


def test_fit_saves_routers_the_drafter_runs_losslessly(four_blocks, tmp_path):
    module = LayerRouterModule(target=str(four_blocks), skip_weight=2.0, lr=0.05, init_bias=1.0,
                               export_dir=str(tmp_path / "router"))
    Trainer(max_steps=6, logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, default_root_dir=tmp_path).fit(module, data(four_blocks, tmp_path))
    package = DrafterPackage.load(tmp_path / "router", kind="layer_router")
    assert package.config == {"n_layer": 4, "d_model": 32, "threshold": 0.5, "max_skip": None}
    assert {"skipped", "kl_hard", "agreement_hard", "kl_soft", "minutes", "optimizer_steps"} <= set(package.training)
    assert 0 <= package.training["skipped"] <= 2 and 0 <= package.training["agreement_hard"] <= 1
    model, tokenizer = load_pretrained(four_blocks)
    method = build_method("first", do_sample=False, options={"router": str(tmp_path / "router"), "num_tokens": 3})
    for prompt in ("Write a story about a cat.", "print(i)"):
        out = generate(model, tokenizer, prompt, max_new_tokens=16, stop_at_eos=False, method=method)
        assert out.token_ids == generate(model, tokenizer, prompt, max_new_tokens=16, stop_at_eos=False).token_ids


def test_bad_settings_are_refused(four_blocks):
    with pytest.raises(ConfigError, match="threshold"):
        LayerRouterModule(target=str(four_blocks), threshold=0.0)
    with pytest.raises(ConfigError, match="answer_tokens"):
        LayerRouterModule(target=str(four_blocks), answer_tokens=0)


def test_gates_start_from_the_single_block_skip_costs(four_blocks, tmp_path):
    datamodule = data(four_blocks, tmp_path)
    datamodule.prepare_data()
    datamodule.setup("fit")
    batch = crop_answers(next(iter(datamodule.train_dataloader())), 64)
    module = LayerRouterModule(target=str(four_blocks), init_bias=2.0)
    full, _ = module.full_pass(batch)
    module.training_step(batch, 0)
    assert bool(module.initialised)
    costs = []
    for layer in (1, 2):
        gates = torch.ones(batch["tokens"].shape[0], 4)
        gates[:, layer] = 0.0
        with torch.no_grad():
            costs.append(float(answer_kl(full, module.target(batch["tokens"], layer_gates=gates).logits,
                                         module.scored(batch))))
    expected = torch.tensor(costs) / max(costs) * 2.0
    torch.testing.assert_close(module.router.bias[1:3].detach(), expected, rtol=1e-4, atol=1e-4)
    before = module.router.bias.detach().clone()
    module.training_step(batch, 1)  # once only
    torch.testing.assert_close(module.router.bias.detach(), before)

"""Training the distilled draft model: its loss floor is the target's entropy, validation ranks are the
teacher-forced ranks at every depth, and `fit` raises acceptance and writes a package that decodes
losslessly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_models import initialised_drafter
from torch import Tensor

from warpdecode.errors import ConfigError
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.modules.distilled_draft import DistilledDraftModule

pytestmark = pytest.mark.usefixtures("single_thread")


def drafter(target: Path, **kwargs) -> DistilledDraftModule:
    return initialised_drafter(DistilledDraftModule(target=str(target), num_layers=1, draft_vocab_size=300, **kwargs))


def batch_of(module: DistilledDraftModule) -> dict[str, Tensor]:
    """Two right-padded sequences (lengths 12 and 8), answers after 3 tokens, with the target's features."""
    torch.manual_seed(1)
    tokens = torch.randint(0, module.target.config.vocab_size, (2, 12))
    tokens[1, 8:] = 0
    lengths = torch.tensor([12, 8])
    answer = (torch.arange(12)[None] >= 3) & (torch.arange(12)[None] < lengths[:, None])
    batch = {"tokens": tokens, "answer_mask": answer, "lengths": lengths}
    return batch | {"features": module.features(batch)}


def test_the_target_itself_scores_the_loss_floor_and_training_approaches_it(tiny_model_dir):
    """Every block of the target and its full vocabulary: the loss is the target's own entropy, and a
    one-block draft trained on the batch falls toward it."""
    exact = DistilledDraftModule(target=str(tiny_model_dir), num_layers=2, draft_vocab_size=300)
    exact.init_drafter(torch.arange(300))
    batch = batch_of(exact)
    with torch.no_grad():
        floor, parts = exact.loss(batch)
    assert parts["top1_agreement"] == 1.0
    module = drafter(tiny_model_dir, lr=1e-2)
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-2)
    before, _ = module.loss(batch)
    for _ in range(40):
        optimizer.zero_grad()
        loss, _ = module.loss(batch)
        loss.backward()
        optimizer.step()
    after, _ = module.loss(batch)
    assert floor < after < before
    assert after - floor < 0.5 * (before - floor), (floor.item(), before.item(), after.item())


@torch.no_grad()
def test_ranks_at_every_depth_are_the_teacher_forced_ranks(tiny_model_dir):
    module = drafter(tiny_model_dir, depth=3, max_rank=100)
    batch = batch_of(module)
    ranks = module.ranks(batch)
    logits = module.draft_logits(batch)
    index = module.index
    assert index is not None
    expected = []
    for b, i in batch["answer_mask"][:, 1:].nonzero().tolist():  # start i: x_{i+1} was just emitted
        row = []
        for k in range(3):  # depth k+1 drafts x_{i+2+k} after the true x_0..x_{i+1+k}
            j = i + 1 + k
            column = int(index[batch["tokens"][b, j + 1]]) if j + 1 < batch["lengths"][b] else -1
            row.append(100 if column < 0 else min(100, int((logits[b, j] > logits[b, j, column]).sum())))
        expected.append(row)
    assert ranks.tolist() == expected
    assert (ranks < 100).any() and (ranks == 100).any()


def test_fit_raises_simulated_acceptance_and_writes_a_runnable_package(tiny_model_dir, tmp_path, fit_drafter,
                                                                      accepted_on_training_prompts):
    module = DistilledDraftModule(target=str(tiny_model_dir), num_layers=1, draft_vocab_size=200, depth=4, lr=1e-2,
                                   warmup_steps=5, tree_nodes=6, export_dir=str(tmp_path / "drafter"))
    _, before, after = fit_drafter(module, epochs=30)
    assert after > before + 0.3, (before, after)

    package = DrafterPackage.load(tmp_path / "drafter", "distilled")
    assert package.config == {"draft_vocab_size": 200, "num_layers": 1, "init_layers": [0]}
    assert len(package.tree["rank_paths"]) == 6 and package.training["tokens_seen"] > 0
    path = str(tmp_path / "drafter")
    accepted = sum(accepted_on_training_prompts("distilled", {"path": path} | options, prompts=3)
                   for options in ({"num_tokens": 4}, {"num_tokens": 3, "top_k": 2}))
    assert accepted > 0


def test_bad_hyperparameters_are_refused(tiny_model_dir):
    with pytest.raises(ConfigError, match="depth must be >= 1"):
        DistilledDraftModule(target=str(tiny_model_dir), depth=0)
    with pytest.raises(ConfigError, match="init_layers names 1 blocks but num_layers is 2"):
        DistilledDraftModule(target=str(tiny_model_dir), num_layers=2, init_layers=[1])
    with pytest.raises(ConfigError, match="strictly increasing"):
        DistilledDraftModule(target=str(tiny_model_dir), num_layers=2, init_layers=[1, 1])
    with pytest.raises(ConfigError, match="cannot be taken"):
        DistilledDraftModule(target=str(tiny_model_dir), num_layers=3)


def test_the_recipe_names_the_drafter_and_its_arguments(drafter_recipe):
    recipe, module = drafter_recipe("distilled", num_layers=2)  # the tiny target has 2 blocks
    assert type(module) is DistilledDraftModule
    assert module.init_layers == [0, 1] and module.net.config.n_layer == 2
    assert recipe["data"]["init_args"]["features"]

"""Training Clover's network: validation ranks score step k with the true earlier tokens, and `fit`
raises acceptance and writes a package that decodes losslessly."""

from __future__ import annotations

import pytest
import torch

from warpdecode.errors import ConfigError
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.modules.clover import CloverModule
from warpdecode.modules.drafter import frequent_tokens

pytestmark = pytest.mark.usefixtures("single_thread")


@torch.no_grad()
def test_ranks_score_every_step_with_the_true_earlier_tokens(tiny_model_dir):
    module = CloverModule(target=str(tiny_model_dir), draft_vocab_size=300, steps=3, max_rank=100)
    module.init_drafter(frequent_tokens(torch.ones(module.target.config.vocab_size), 300, [0]))
    torch.manual_seed(1)
    tokens = torch.randint(0, module.target.config.vocab_size, (2, 11))
    lengths = torch.tensor([11, 7])
    answer = (torch.arange(11)[None] >= 3) & (torch.arange(11)[None] < lengths[:, None])
    batch = {"tokens": tokens, "answer_mask": answer, "lengths": lengths}
    batch["features"] = module.features(batch)
    ranks = module.ranks(batch)
    outputs, _ = module._unroll(batch)
    index = module.index
    assert index is not None
    expected = []
    for b, i in answer[:, 1:].nonzero().tolist():  # start i: x_{i+1} was just emitted
        row = []
        for k in (1, 2, 3):  # step k scores x_{i+1+k}
            column = int(index[tokens[b, i + 1 + k]]) if i + 1 + k < lengths[b] else -1
            logits = outputs[k - 1][b, i]
            row.append(100 if column < 0 else min(100, int((logits > logits[column]).sum())))
        expected.append(row)
    assert ranks.tolist() == expected
    assert (ranks < 100).any() and (ranks == 100).any()


def test_fit_raises_simulated_acceptance_and_writes_a_runnable_package(tiny_model_dir, tmp_path, fit_drafter,
                                                                      accepted_on_training_prompts):
    module = CloverModule(target=str(tiny_model_dir), draft_vocab_size=200, steps=3, lr=1e-2, warmup_steps=5,
                           tree_nodes=6, export_dir=str(tmp_path / "drafter"))
    _, before, after = fit_drafter(module, epochs=30)
    assert after > before + 0.15, (before, after)

    package = DrafterPackage.load(tmp_path / "drafter", "clover")
    assert len(package.tree["rank_paths"]) == 6 and package.training["tokens_seen"] > 0
    path = str(tmp_path / "drafter")
    accepted = sum(accepted_on_training_prompts("clover", {"path": path} | options, prompts=3)
                   for options in ({}, {"tree": "chain", "num_tokens": 5}))
    assert accepted > 0


def test_bad_hyperparameters_are_refused(tiny_model_dir):
    with pytest.raises(ConfigError, match="steps >= 1"):
        CloverModule(target=str(tiny_model_dir), steps=0)


def test_the_recipe_names_the_drafter_and_its_arguments(drafter_recipe):
    recipe, module = drafter_recipe("clover")
    assert type(module) is CloverModule and module.hparams["steps"] == 4
    assert recipe["data"]["init_args"]["features"]

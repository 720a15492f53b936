"""Training PPD prompt tokens: the distillation loss falls towards the target's own entropy, only the
prompts learn, validation ranks score the right tokens with prompts run after the true context, and
checkpoints, packages and the recipe round-trip."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_models import initialised_drafter, pattern_batch
from torch import Tensor

from warpdecode.errors import ConfigError
from warpdecode.models.cache import KVCache
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.modules.ppd import PPDModule

pytestmark = pytest.mark.usefixtures("single_thread")


def drafter(target: Path, **kwargs) -> PPDModule:
    return initialised_drafter(PPDModule(target=str(target), draft_vocab_size=64, num_prompts=3, starts_per_sequence=4,
                                          **kwargs))


def test_starts_are_answer_positions_with_a_token_two_ahead(tiny_model_dir):
    module = drafter(tiny_model_dir, max_rank=4)
    batch = pattern_batch(64)
    starts, real = module.sample_starts(batch, torch.Generator().manual_seed(0))
    assert starts.shape == real.shape == (2, 4) and bool(real.all())
    for b, length in enumerate(batch["lengths"].tolist()):
        for t in starts[b].tolist():
            assert batch["answer_mask"][b, t + 1] and t + 2 < length
    few = dict(batch, answer_mask=batch["answer_mask"] & (torch.arange(14)[None] >= 11))  # row 0: starts 10, 11
    starts, real = module.sample_starts(few, torch.Generator().manual_seed(0))
    assert real.sum(1).tolist() == [2, 0] and sorted(starts[0][real[0]].tolist()) == [10, 11]


def test_loss_falls_towards_the_target_entropy_and_only_the_prompts_learn(tiny_model_dir):
    module = drafter(tiny_model_dir)
    batch = pattern_batch(64)
    generator = torch.Generator().manual_seed(0)
    starts, real = module.sample_starts(batch, generator)
    valid = module.labelled(batch, starts, real)

    def loss() -> Tensor:
        logits, teacher = module.prompt_logits(batch, starts)
        return module.distillation_loss(logits, teacher, valid)[0]

    with torch.no_grad():
        _, teacher = module.prompt_logits(batch, starts)
        floor, _ = module.distillation_loss(teacher.clamp_min(1e-30).log(), teacher, valid)  # the teacher's entropy
    trainable = [p for p in module.parameters() if p.requires_grad]
    assert trainable == [module.net.prompts]
    optimizer = torch.optim.AdamW(trainable, lr=5e-2)
    before = loss().item()
    for _ in range(40):
        optimizer.zero_grad()
        value = loss()
        value.backward()
        optimizer.step()
    after = loss().item()
    assert floor < after < before
    assert after - floor < 0.7 * (before - floor), (floor.item(), before, after)
    _, parts = module.loss(batch)
    assert set(parts) == {"token_loss/d1", "token_loss/d2", "token_loss/d3"}


@torch.no_grad()
def test_ranks_score_each_prompt_row_after_the_true_context(tiny_model_dir):
    module = drafter(tiny_model_dir, max_rank=8)
    module.net.prompts.add_(torch.randn_like(module.net.prompts))
    batch = pattern_batch(64)
    _, ranks = module.evaluate(batch)
    _, again = module.evaluate(batch)
    assert torch.equal(ranks, again)  # validation starts are the same every time
    starts, real = module.sample_starts(batch, torch.Generator().manual_seed(int(batch["tokens"][:, :8].sum())))
    target, net = module.target, module.net
    index = module.draft_labels(torch.arange(target.config.vocab_size))
    expected = []
    for b, t in [(row, t) for row in range(2) for s, t in enumerate(starts[row].tolist()) if real[row, s]]:
        cache = KVCache.for_model(target.config, 1, t + 1 + 3)
        target(batch["tokens"][b : b + 1, : t + 1], cache=cache)
        h = target(torch.zeros(1, 3, dtype=torch.int64), cache=cache, inputs_embeds=net.prompts[None],
                   hidden_layers=(target.config.n_layer,)).hidden_states[target.config.n_layer][0]
        logits = net.head(h)  # (3, N)
        row = []
        for j in (1, 2, 3):
            ahead = t + 1 + j
            column = int(index[batch["tokens"][b, ahead]]) if ahead < batch["lengths"][b] else -1
            row.append(8 if column < 0 else min(8, int((logits[j - 1] > logits[j - 1, column]).sum())))
        expected.append(row)
    assert ranks.tolist() == expected
    assert (ranks < 8).any()


def test_fit_lowers_the_validation_loss_and_writes_a_runnable_package(tiny_model_dir, tmp_path, fit_drafter,
                                                                      accepted_on_training_prompts):
    module = PPDModule(target=str(tiny_model_dir), draft_vocab_size=200, num_prompts=3, starts_per_sequence=8,
                        lr=0.2, warmup_steps=5, tree_nodes=6, export_dir=str(tmp_path / "drafter"))
    losses: list[float] = []
    evaluate = module.evaluate

    def recorded(batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        loss, ranks = evaluate(batch)
        losses.append(loss.item())
        return loss, ranks

    module.evaluate = recorded  # type: ignore[method-assign]
    fit_drafter(module, epochs=30)
    # 3 × 32 prompt values steering a random 2-layer target, whose answers they barely predict: the
    # same (seeded) starts of the 3 training batches score lower after fit than before
    before, after = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert after < 0.98 * before, (before, after)
    package = DrafterPackage.load(tmp_path / "drafter", "ppd")
    assert package.config == {"draft_vocab_size": 200, "num_prompts": 3}
    assert len(package.tree["rank_paths"]) == 6 and package.training["tokens_seen"] > 0
    path = str(tmp_path / "drafter")
    # 16 new tokens leave little room beside the prompt rows: groups after the pending token only
    accepted = sum(accepted_on_training_prompts("ppd", {"path": path, "attach": 0} | options, prompts=6)
                   for options in ({}, {"tree": "chain"}))
    assert accepted > 0


def test_checkpoints_leave_out_the_frozen_head(tiny_model_dir):
    module = drafter(tiny_model_dir)
    checkpoint = {"state_dict": module.state_dict()}
    module.on_save_checkpoint(checkpoint)
    assert set(checkpoint["state_dict"]) == {"net.prompts", "net.draft_vocab"}
    restored = PPDModule(target=str(tiny_model_dir), draft_vocab_size=64, num_prompts=3)
    restored.on_load_checkpoint(checkpoint)
    restored.load_state_dict(checkpoint["state_dict"])
    assert restored.drafter_initialised() and torch.equal(restored.net.prompts, module.net.prompts)


def test_bad_hyperparameters_are_refused(tiny_model_dir):
    with pytest.raises(ConfigError, match="num_prompts >= 1"):
        PPDModule(target=str(tiny_model_dir), num_prompts=0)
    with pytest.raises(ConfigError, match="depth_decay"):
        PPDModule(target=str(tiny_model_dir), depth_decay=1.5)


def test_the_recipe_names_the_drafter_and_its_arguments(drafter_recipe):
    recipe, module = drafter_recipe("ppd")
    assert type(module) is PPDModule and module.net.num_prompts == 3
    assert recipe["data"]["init_args"]["features"]  # shares the other recipes' cached answers

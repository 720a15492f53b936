"""Training Medusa and Hydra heads: the distillation loss falls, validation ranks index the right tokens
(Hydra's with the true earlier tokens as inputs), checkpoints, packages and recipes round-trip."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_models import initialised_drafter, pattern_batch
from torch import Tensor

from warpdecode.decoding.generate import build_method, generate
from warpdecode.errors import ConfigError
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.models.eagle import shift_left
from warpdecode.modules.medusa import FutureHeadsModule, HydraModule, MedusaModule

pytestmark = pytest.mark.usefixtures("single_thread")

DRAFTERS = {"medusa": MedusaModule, "hydra": HydraModule}


def make_batch(vocab_size: int, with_features_of: FutureHeadsModule | None = None) -> dict[str, Tensor]:
    """`pattern_batch`, with the target features of `with_features_of` when given."""
    batch = pattern_batch(vocab_size)
    if with_features_of is not None:
        batch["features"] = with_features_of.features(batch)
    return batch


def drafter(kind: str, target: Path, **kwargs) -> FutureHeadsModule:
    return initialised_drafter(DRAFTERS[kind](target=str(target), draft_vocab_size=64, num_heads=3, **kwargs))


@torch.no_grad()
def teacher_loss(module: FutureHeadsModule, batch: dict[str, Tensor]) -> Tensor:
    """The loss of heads that output the target's own logits of the token they predict (head k at i:
    the frozen head on f_{i+k}), the least the loss can be."""
    T = batch["tokens"].shape[1]

    def perfect(batch: dict[str, Tensor], features: Tensor) -> Tensor:
        logits = module.net.head(features)  # (B, T, N): x_{i+1}'s
        return torch.stack([shift_left(logits, k, T) for k in range(1, module.net.num_heads + 1)], dim=2)

    module.logits = perfect  # type: ignore[method-assign]
    try:
        return module.loss(batch)[0]
    finally:
        del module.logits


@pytest.mark.parametrize("kind", DRAFTERS)
def test_loss_falls_and_the_trained_package_decodes_losslessly(kind, tiny_model_dir, tmp_path):
    module = drafter(kind, tiny_model_dir)
    batch = make_batch(64)
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-2)
    before, parts = module.loss(batch)
    assert set(parts) == {"token_loss/d1", "token_loss/d2", "token_loss/d3"}
    for _ in range(30):
        optimizer.zero_grad()
        loss, _ = module.loss(batch)
        loss.backward()
        optimizer.step()
    after, _ = module.loss(batch)
    floor = teacher_loss(module, batch)  # the target's entropy: what a perfect head scores
    assert floor < after < before
    assert after - floor < 0.4 * (before - floor), (floor.item(), before.item(), after.item())
    assert not module.net.head.weight.requires_grad

    path = module.package().save(tmp_path / "drafter")
    model, tokenizer = load_pretrained(tiny_model_dir)
    prompt = "Write a story about a cat."
    plain = generate(model, tokenizer, prompt, max_new_tokens=12, stop_at_eos=False)
    out = generate(model, tokenizer, prompt, max_new_tokens=12, stop_at_eos=False,
                   method=build_method(kind, options={"path": str(path), "tree": "chain"}))
    assert out.token_ids == plain.token_ids


def test_cached_features_give_the_online_loss(tiny_model_dir):
    module = drafter("hydra", tiny_model_dir)
    with torch.no_grad():
        online, _ = module.loss(make_batch(64))
        cached, _ = module.loss(make_batch(64, with_features_of=module))
    torch.testing.assert_close(online, cached)


def test_ranks_on_a_hand_made_case(tiny_model_dir):
    """Scores -n for draft-vocabulary entry n, so a label's rank is its entry (capped at max_rank = 4)."""
    module = MedusaModule(target=str(tiny_model_dir), draft_vocab_size=8, num_heads=2, max_rank=4)
    module.init_drafter(torch.arange(10, 18))
    tokens = torch.tensor([[1, 10, 12, 11, 13, 10, 0], [2, 17, 3, 12, 0, 0, 0]])
    lengths = torch.tensor([6, 4])
    answer = torch.tensor([[0, 0, 1, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    batch = {"tokens": tokens, "answer_mask": answer, "lengths": lengths, "features": torch.zeros(2, 7, 32)}
    module.logits = lambda batch, features: -torch.arange(8.0).expand(2, 7, 2, 8)  # type: ignore[method-assign]
    # Row 0 starts 1..4 (x_2..x_5 are answer tokens): depth 1 ranks x_{i+2}, depth 2 x_{i+3}; past the
    # length is 4. Row 1 starts 0..2: 3 is outside the draft vocabulary (4), 17 is entry 7 (capped to 4).
    assert module.ranks(batch).tolist() == [[1, 3], [3, 0], [0, 4], [4, 4], [4, 2], [2, 4], [4, 4]]


@pytest.mark.parametrize("kind", DRAFTERS)
@torch.no_grad()
def test_ranks_score_every_depth_with_the_true_earlier_tokens(kind, tiny_model_dir):
    module = drafter(kind, tiny_model_dir, max_rank=8)
    for p in module.net.parameters():
        if p.requires_grad:
            p.add_(torch.randn_like(p) * 0.3)
    batch = make_batch(64, with_features_of=module)
    ranks = module.ranks(batch)
    net, embed, index = module.net, module.target.embed, module.index
    assert index is not None
    expected = []
    for b, i in batch["answer_mask"][:, 1:].nonzero().tolist():  # start i: x_{i+1} was just emitted
        feature = batch["features"][b, i]
        row = []
        for k in (1, 2, 3):
            column = int(index[batch["tokens"][b, i + 1 + k]]) if i + 1 + k < batch["lengths"][b] else -1
            if column < 0:  # past the end, or outside the draft vocabulary
                row.append(8)
                continue
            if kind == "medusa":
                logits = net.head(net.hidden(k, feature))
            else:
                logits = net.step(k, feature[None], embed(batch["tokens"][b, i + 1 : i + 1 + k][None]))[0]
            row.append(min(8, int((logits > logits[column]).sum())))
        expected.append(row)
    assert ranks.tolist() == expected
    assert (ranks < 8).any()


@pytest.mark.parametrize("kind", DRAFTERS)
def test_checkpoints_leave_out_the_frozen_head(kind, tiny_model_dir):
    module = drafter(kind, tiny_model_dir)
    checkpoint = {"state_dict": module.state_dict()}
    module.on_save_checkpoint(checkpoint)
    assert "net.head.weight" not in checkpoint["state_dict"]
    restored = DRAFTERS[kind](target=str(tiny_model_dir), draft_vocab_size=64, num_heads=3)
    restored.on_load_checkpoint(checkpoint)
    restored.load_state_dict(checkpoint["state_dict"])
    assert restored.drafter_initialised()
    assert torch.equal(restored.net.head.weight, module.net.head.weight)
    assert restored.package_config().to_dict() == {"draft_vocab_size": 64, "num_heads": 3,
                                                   "num_layers": {"medusa": 1, "hydra": 2}[kind]}


def test_bad_hyperparameters_are_refused(tiny_model_dir):
    with pytest.raises(ConfigError, match="num_heads >= 1"):
        MedusaModule(target=str(tiny_model_dir), num_heads=0)
    with pytest.raises(ConfigError, match="head_decay"):
        HydraModule(target=str(tiny_model_dir), head_decay=0.0)


@pytest.mark.parametrize("kind", DRAFTERS)
def test_recipes_name_the_drafter_and_its_arguments(kind, drafter_recipe):
    recipe, module = drafter_recipe(kind)
    assert type(module) is DRAFTERS[kind]
    assert module.net.num_heads == 4 and module.net.num_layers == {"medusa": 1, "hydra": 2}[kind]
    assert recipe["data"]["init_args"]["features"]

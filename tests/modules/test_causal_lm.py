from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import Trainer

from warpdecode.datamodules.corpus import CorpusDataModule
from warpdecode.errors import ConfigError
from warpdecode.models.checkpoint import load_pretrained, save_pretrained
from warpdecode.models.config import ModelConfig
from warpdecode.models.tokenizer import train_bpe
from warpdecode.models.transformer import Transformer
from warpdecode.modules.causal_lm import CausalLMModule, warmup_cosine


def trainer(tmp_path: Path, **kwargs: Any) -> Trainer:
    defaults: dict[str, Any] = {
        "logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
        "enable_model_summary": False, "default_root_dir": str(tmp_path), "precision": "bf16-mixed",
    }
    return Trainer(**(defaults | kwargs))


def tiny_lm(fields: dict[str, Any], **kwargs: Any) -> CausalLMModule:
    return CausalLMModule(model=ModelConfig(**fields), lr=3e-3, warmup_steps=5, **kwargs)


def test_warmup_cosine_schedule() -> None:
    lr = [warmup_cosine(s, warmup_steps=4, total_steps=14, min_ratio=0.1) for s in range(16)]
    assert lr[:4] == [0.25, 0.5, 0.75, 1.0]
    assert lr[9] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr[14] == lr[15] == pytest.approx(0.1)


def test_needs_exactly_one_of_model_or_pretrained(tiny_model: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="exactly one of model"):
        CausalLMModule()
    with pytest.raises(ConfigError, match="exactly one of model"):
        CausalLMModule(model=ModelConfig(**tiny_model), pretrained="smollm2-135m-instruct")


def test_weight_decay_applies_to_matrices_only(tmp_path: Path, tiny_model: dict[str, Any]) -> None:
    lm = tiny_lm(tiny_model, weight_decay=0.05)
    lm.trainer = trainer(tmp_path, max_steps=10)
    config = lm.configure_optimizers()
    decayed, plain = config["optimizer"].param_groups
    assert decayed["weight_decay"] == 0.05 and plain["weight_decay"] == 0.0
    # embeddings (tied with the LM head) + 7 projections per block; norms: 2 per block + final
    assert len(decayed["params"]) == 1 + 7 * 2 and all(p.dim() == 2 for p in decayed["params"])
    assert len(plain["params"]) == 2 * 2 + 1 and all(p.dim() == 1 for p in plain["params"])
    scheduler = config["lr_scheduler"]["scheduler"]  # type: ignore[index]
    assert scheduler.get_last_lr() == [3e-3 / 5, 3e-3 / 5]


def test_training_lowers_the_validation_loss(tmp_path: Path, tiny_model: dict[str, Any], data_args: dict[str, Any]) -> None:
    data, lm = CorpusDataModule(**data_args), tiny_lm(tiny_model)
    run = trainer(tmp_path, max_steps=150)
    before = run.validate(lm, data)[0]
    run.fit(lm, data)
    after = run.validate(lm, data)[0]
    assert before["val/loss"] == pytest.approx(math.log(512), abs=0.1)
    assert after["val/loss"] < before["val/loss"] - 1.0
    assert after["val/ppl"] == pytest.approx(math.exp(after["val/loss"]), rel=1e-5)


def test_perplexity_is_over_all_tokens_not_a_mean_of_batches(tmp_path: Path, tiny_model: dict[str, Any], data_args: dict[str, Any]) -> None:
    data, lm = CorpusDataModule(**data_args), tiny_lm(tiny_model)
    data.setup()
    val = data.datasets["val"]
    data.batch_size = len(val) - 1  # a big batch and a ragged one-block batch
    blocks = torch.stack([val[i] for i in range(len(val))])
    with torch.no_grad():
        logits = lm.backbone(blocks[:, :-1]).logits
        token_losses = F.cross_entropy(logits.flatten(0, 1), blocks[:, 1:].flatten(), reduction="none")
        per_batch = [token_losses[: -32].mean(), token_losses[-32:].mean()]
    result = trainer(tmp_path, precision="32-true").validate(lm, data)[0]
    assert result["val/loss"] == pytest.approx(token_losses.mean().item(), rel=1e-5)
    assert result["val/ppl"] == pytest.approx(token_losses.mean().exp().item(), rel=1e-5)
    assert abs(result["val/loss"] - torch.stack(per_batch).mean().item()) > 1e-4

    test = trainer(tmp_path, precision="32-true").test(lm, data)[0]
    assert set(test) == {"test/loss", "test/ppl"}
    assert test["test/ppl"] == pytest.approx(math.exp(test["test/loss"]), rel=1e-5)


def test_fit_exports_a_loadable_model(tmp_path: Path, tiny_model: dict[str, Any], data_args: dict[str, Any]) -> None:
    data, lm = CorpusDataModule(**data_args), tiny_lm(tiny_model, export_dir=str(tmp_path / "exported"))
    trainer(tmp_path, max_steps=3).fit(lm, data)
    assert lm.exported_to == tmp_path / "exported"
    loaded, tokenizer = load_pretrained(tmp_path / "exported")
    assert data.tokenizer is not None
    assert loaded.config.eos_token_ids == [data.tokenizer.eos_token_id]
    assert tokenizer.encode("def f(x): return x") == data.tokenizer.encode("def f(x): return x")
    tokens = torch.randint(0, 512, (2, 16))
    lm.backbone.eval()
    with torch.no_grad():
        assert torch.equal(loaded(tokens).logits, lm.backbone(tokens).logits)


def test_tokenizer_must_fit_the_model(tmp_path: Path, tiny_model: dict[str, Any], data_args: dict[str, Any]) -> None:
    small = CausalLMModule(model=ModelConfig(**(tiny_model | {"vocab_size": 300})))
    with pytest.raises(ConfigError, match="512 tokens but the model only 300 embeddings"):
        trainer(tmp_path, max_steps=1).fit(small, CorpusDataModule(**data_args))
    short = CausalLMModule(model=ModelConfig(**(tiny_model | {"max_seq_len": 16})))
    with pytest.raises(ConfigError, match="block_size=32 exceeds the model's max_seq_len=16"):
        trainer(tmp_path, max_steps=1).fit(short, CorpusDataModule(**data_args))


def test_finetuning_needs_the_pretrained_tokenizer(tmp_path: Path, tiny_model: dict[str, Any], data_args: dict[str, Any]) -> None:
    other = train_bpe(["completely different text " * 50, "another document here " * 50], 300)
    model = Transformer(ModelConfig(**tiny_model))
    model.init_weights()
    save_pretrained(model, other, tmp_path / "pretrained")
    lm = CausalLMModule(pretrained=str(tmp_path / "pretrained"))
    with pytest.raises(ConfigError, match="set data.tokenizer to"):
        trainer(tmp_path, max_steps=1).fit(lm, CorpusDataModule(**data_args))

    # the same run with the pretrained tokenizer trains and keeps its vocabulary
    data = CorpusDataModule(**(data_args | {"tokenizer": str(tmp_path / "pretrained"), "block_size": 16}))
    lm = CausalLMModule(pretrained=str(tmp_path / "pretrained"), export_dir=str(tmp_path / "tuned"))
    trainer(tmp_path, max_steps=2).fit(lm, data)
    assert data.vocab_size == other.vocab_size < 300
    _, tokenizer = load_pretrained(tmp_path / "tuned")
    assert tokenizer.backend.get_vocab() == other.backend.get_vocab()

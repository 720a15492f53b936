"""Tiny models, a small code corpus and an isolated W&B/cache environment for the module tests."""

from __future__ import annotations

import json
import shutil
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonargparse import ArgumentParser
from lightning.pytorch import LightningModule, Trainer

from warpdecode.datamodules.self_distill import SelfDistillDataModule
from warpdecode.decoding.generate import build_method, generate
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.modules.drafter import DrafterModule


@pytest.fixture
def tiny_model() -> dict[str, Any]:
    """ModelConfig fields of a 0.1M-parameter Llama-style model over a 512-token BPE."""
    return {"vocab_size": 512, "n_layer": 2, "n_head": 4, "d_model": 64, "d_ff": 172, "max_seq_len": 64}


@pytest.fixture(scope="session")
def code_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 small top-level stdlib modules (3-8 kB each) copied into a folder."""
    root = Path(sysconfig.get_paths()["stdlib"])
    folder = tmp_path_factory.mktemp("code")
    for path in [p for p in sorted(root.glob("*.py")) if 3000 <= p.stat().st_size <= 8000][:24]:
        shutil.copyfile(path, folder / path.name)
    return folder


@pytest.fixture(scope="session")
def corpus_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shared across tests so the tiny BPE is trained once per session."""
    return tmp_path_factory.mktemp("corpus-cache")


@pytest.fixture
def data_args(code_corpus: Path, corpus_cache: Path) -> dict[str, Any]:
    return {
        "source": str(code_corpus), "glob": "*.py", "bpe_vocab_size": 512, "block_size": 32, "batch_size": 8,
        "val_fraction": 0.15, "test_fraction": 0.1, "max_chars": 60_000, "cache_dir": str(corpus_cache),
    }


@pytest.fixture(autouse=True)
def _isolated_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Offline W&B into tmp_path, no API key, and the working directory in tmp_path."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.chdir(tmp_path)
    yield
    if "wandb" in sys.modules:
        import wandb

        wandb.finish()


@pytest.fixture
def tiny_recipe(tmp_path: Path, tiny_model: dict[str, Any], data_args: dict[str, Any]) -> Path:
    """A LightningCLI config like configs/causal_lm/tiny-code.yaml, at unit-test size."""
    config = {
        "seed_everything": 7,
        "trainer": {
            "max_epochs": 2, "precision": "bf16-mixed", "log_every_n_steps": 5,
            "enable_progress_bar": False, "enable_model_summary": False,
        },
        "model": {
            "class_path": "CausalLMModule",
            "init_args": {"model": tiny_model, "lr": 3e-3, "warmup_steps": 5},
        },
        "data": {"class_path": "CorpusDataModule", "init_args": data_args},
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


DISTILL_TEXTS = ["print('hello world')", "Write a story about a cat.", "for i in range(10):", "hello cat",
                 "Write a story about a dog.", "print(i)", "for cat in range(3): print(cat)", "a story", "range(10)",
                 "Write hello world in Python.", "print('cat')", "a dog", "for dog in range(7):", "Write a cat"] * 2


@pytest.fixture
def self_distill_data(tiny_model_dir: Path, tmp_path: Path) -> SelfDistillDataModule:
    """The tiny target's own answers to 28 short prompts (21 train, 7 validation), with features."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"{t} {i}"}) + "\n" for i, t in enumerate(DISTILL_TEXTS)))
    return SelfDistillDataModule(target=str(tiny_model_dir), prompts=[str(prompts)], max_prompts=len(DISTILL_TEXTS),
                                 max_new_tokens=24, generation_batch_size=14, batch_size=7, val_fraction=0.25,
                                 cache_dir=str(tmp_path / "cache"))


@pytest.fixture
def fit_drafter(self_distill_data: SelfDistillDataModule, tmp_path: Path):
    """`fit(module, epochs)`: train a drafter module on `self_distill_data` and return the trainer and
    its simulated chain τ on the *training* answers before and after `fit` (the tiny random target's
    answers are hard to predict from 21 examples, so this measures what the drafter could learn)."""

    def fit(module: LightningModule, epochs: int) -> tuple[Trainer, float, float]:
        trainer = Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
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
        return trainer, before, trainer.callback_metrics["val/tau/chain"].item()

    return fit


@pytest.fixture
def accepted_on_training_prompts(tiny_model_dir: Path, self_distill_data: SelfDistillDataModule):
    """`accepted(name, options, prompts)`: decode the first `prompts` training prompts with a drafter
    method, assert each output equals plain greedy decoding, and return the draft tokens accepted."""
    model, _ = load_pretrained(tiny_model_dir)

    def accepted(name: str, options: dict[str, Any], prompts: int) -> int:
        method = build_method(name, options=options)
        total = 0
        for example in self_distill_data.datasets["train"].examples[:prompts]:
            prompt = example.tokens[: example.prompt_length].tolist()
            plain = generate(model, None, prompt, max_new_tokens=16, stop_at_eos=False)
            out = generate(model, None, prompt, max_new_tokens=16, stop_at_eos=False, method=method)
            assert out.token_ids == plain.token_ids
            total += sum(out.stats.accepted_per_step)
        return total

    return accepted


@pytest.fixture
def drafter_recipe(tiny_model_dir: Path):
    """`recipe(name, **init_args)`: configs/drafters/<name>.yaml and its model, built by jsonargparse as
    `warpdecode fit` builds it, for the tiny target (`init_args` override the recipe's)."""

    def recipe(name: str, **init_args: Any) -> tuple[dict[str, Any], DrafterModule]:
        config = yaml.safe_load((Path(__file__).parents[2] / "configs" / "drafters" / f"{name}.yaml").read_text())
        model = config["model"]
        model["init_args"] |= {"target": str(tiny_model_dir)} | init_args
        parser = ArgumentParser()
        parser.add_subclass_arguments(DrafterModule, "model")
        return config, parser.instantiate_classes(parser.parse_object({"model": model})).model

    return recipe

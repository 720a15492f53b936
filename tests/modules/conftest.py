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

from warpdecode.datamodules.self_distill import SelfDistillDataModule


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
            "class_path": "CausalLM",
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

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from warpdecode.datamodules.corpus import CorpusDataModule
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.models.config import ModelConfig
from warpdecode.models.transformer import Transformer
from warpdecode.modules import lightning_cli
from warpdecode.modules.lightning_cli import build_cli, main, precision_for_this_machine, wandb_offline

REPO = Path(__file__).resolve().parents[2]
TINY_CODE = REPO / "configs" / "causal_lm" / "tiny-code.yaml"
FINETUNE = REPO / "configs" / "causal_lm" / "finetune-smollm2.yaml"


def run_dirs(tmp_path: Path) -> list[Path]:
    """`<WANDB_DIR>/warpdecode/<run id>` folders, oldest first."""
    return sorted((tmp_path / "runs" / "warpdecode").iterdir(), key=lambda p: p.stat().st_mtime_ns)


def backbone_from_checkpoint(path: Path) -> Transformer:
    checkpoint = torch.load(path, weights_only=True)
    model = Transformer(ModelConfig.from_dict(checkpoint["hyper_parameters"]["model"]))  # as parsed by the CLI
    model.load_state_dict({k.removeprefix("backbone."): v for k, v in checkpoint["state_dict"].items()
                           if k.startswith("backbone.")})
    return model.eval()


@pytest.mark.parametrize(("native", "precision", "accelerator", "expected"), [
    (False, "bf16-mixed", "cpu", "32-true"),
    (False, "bf16-true", "cpu", "32-true"),
    (False, "16-mixed", "cpu", "16-mixed"),
    (False, "bf16-mixed", "gpu", "bf16-mixed"),
    (True, "bf16-mixed", "cpu", "bf16-mixed"),
])
def test_bf16_falls_back_on_a_cpu_that_emulates_it(monkeypatch, native, precision, accelerator, expected) -> None:
    monkeypatch.setattr(lightning_cli, "cpu_has_native_bf16", lambda: native)
    assert precision_for_this_machine(precision, accelerator) == expected


def test_the_fallback_is_applied_said_and_can_be_refused(monkeypatch, capsys) -> None:
    monkeypatch.setattr(lightning_cli, "cpu_has_native_bf16", lambda: False)
    cli = build_cli(["--config", str(TINY_CODE), "--trainer.accelerator=cpu"], run=False)
    assert cli.config.trainer.precision == "32-true" and cli.trainer.precision == "32-true"
    assert "precision bf16-mixed -> 32-true" in capsys.readouterr().err
    kept = build_cli(["--config", str(TINY_CODE), "--trainer.accelerator=cpu", "--precision_fallback=false"], run=False)
    assert kept.trainer.precision == "bf16-mixed"


def test_tiny_code_recipe_round_trips(tmp_path: Path) -> None:
    cli = build_cli(["--config", str(TINY_CODE)], run=False)
    config = cli.config
    assert config.model.class_path == "warpdecode.modules.causal_lm.CausalLMModule"
    assert (config.data.init_args.source, config.data.init_args.bpe_vocab_size) == ("stdlib", 8192)
    assert config.trainer.precision == precision_for_this_machine("bf16-mixed", "auto")
    assert config.trainer.logger.class_path == "lightning.pytorch.loggers.WandbLogger"
    assert config.trainer.logger.init_args.offline is True
    # V*d embeddings (tied) + 6 blocks of attention 4*d*d, SwiGLU 3*d*864, two norms; final norm
    assert sum(p.numel() for p in cli.model.parameters()) == 8192 * 320 + 6 * (4 * 320**2 + 3 * 320 * 864 + 640) + 320

    dumped = tmp_path / "dumped.yaml"
    dumped.write_text(cli.parser.dump(config, skip_unset=False))
    again = cli.parser.parse_args(["--config", str(dumped)])
    assert cli.parser.dump(again, skip_unset=False) == dumped.read_text()

    finetune = cli.parser.parse_args(["--config", str(FINETUNE)])
    assert finetune.model.init_args.pretrained == finetune.data.init_args.tokenizer == "smollm2-135m-instruct"
    assert finetune.model.init_args.model is None


@pytest.mark.parametrize("former", ["warpdecode.modules.causal_lm.CausalLM", "CausalLM"])
def test_a_recipe_naming_a_former_class_still_fits_and_says_the_new_path(
    tmp_path: Path, tiny_recipe: Path, former: str, capsys: pytest.CaptureFixture[str]
) -> None:
    old = tmp_path / "old.yaml"
    old.write_text(tiny_recipe.read_text().replace("class_path: CausalLMModule", f"class_path: {former}"))
    main(["fit", "--config", str(old), "--trainer.fast_dev_run=true"])
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("deprecated:")]
    new = "warpdecode.modules.causal_lm.CausalLMModule"
    assert said == [f"deprecated: {former} is now {new}; the old name will stop working in a later release"]
    cli = build_cli(["--config", str(TINY_CODE), f"--model={former}"], run=False)
    assert type(cli.model).__name__ == "CausalLMModule"


def test_every_renamed_class_is_found_by_its_former_path_and_short_name() -> None:
    renamed = lightning_cli.former_class_paths()
    assert renamed["warpdecode.modules.medusa.MedusaDrafter"] == "warpdecode.modules.medusa.MedusaModule"
    assert renamed["MedusaDrafter"] == "warpdecode.modules.medusa.MedusaModule"
    assert renamed["warpdecode.modules.medusa2.Medusa2Drafter"] == "warpdecode.modules.medusa2.Medusa2Module"
    assert renamed["MaskedDiffusionLM"] == "warpdecode.modules.masked_diffusion.MaskedDiffusionModule"
    assert len(renamed) == 2 * 10
    names = {cls.__name__ for cls in lightning_cli.training_classes()}
    assert {"CausalLMModule", "EagleModule", "LayerRouterModule", "CorpusDataModule"} <= names


def test_every_recipe_parses() -> None:
    """Each `configs/**/*.yaml` recipe names existing classes and init_args (parsed, not instantiated)."""
    parser = build_cli(["--config", str(TINY_CODE)], run=False).parser
    for recipe in sorted((REPO / "configs").rglob("*.yaml")):
        config = parser.parse_args(["--config", str(recipe)])
        assert config.model.class_path.startswith("warpdecode.modules."), recipe


def test_wandb_is_offline_unless_a_key_is_configured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_MODE")
    assert wandb_offline() is True
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password abc123\n")
    monkeypatch.setenv("NETRC", str(netrc))
    assert wandb_offline() is False
    monkeypatch.setenv("NETRC", str(tmp_path / "missing"))
    monkeypatch.setenv("WANDB_API_KEY", "abc123")
    assert wandb_offline() is False
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert wandb_offline() is True
    monkeypatch.setenv("WANDB_MODE", "disabled")  # wandb itself reads WANDB_MODE=disabled
    assert wandb_offline() is False


def test_fit_logs_an_offline_wandb_run_and_exports_the_model(
    tmp_path: Path, tiny_recipe: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["fit", "--config", str(tiny_recipe), "--trainer.max_epochs=1"])
    err = capsys.readouterr().err  # not a terminal: progress and validation come as lines
    assert "fit: 81/81 optimizer steps (100 %)" in err and "epoch 1/1, train/loss " in err
    assert "validation after 81 optimizer steps: val/loss " in err and "val/ppl " in err
    (run,) = run_dirs(tmp_path)
    (offline,) = (tmp_path / "runs" / "wandb").glob("offline-run-*")
    assert offline.name.endswith(run.name)
    records = (offline / f"run-{run.name}.wandb").read_bytes()  # protobuf records: the metric keys are plain text
    assert all(key in records for key in (b"train/loss", b"train/lr", b"val/loss", b"val/ppl")), [records.count(k) for k in (b"train/loss", b"train/lr", b"val/loss", b"val/ppl")]
    assert "CorpusDataModule" in (run / "config.yaml").read_text()

    exported, tokenizer = load_pretrained(run / "model")
    trained = backbone_from_checkpoint(run / "checkpoints" / "last.ckpt")
    tokens = torch.tensor([tokenizer.encode("def main(argv):\n    return 0\n")])
    with torch.no_grad():
        assert torch.equal(exported(tokens).logits, trained(tokens).logits)


@pytest.mark.parametrize(
    ("keep", "resume_from"),
    [
        ("--checkpoint.every_n_epochs=1", "epoch=0-step=81.ckpt"),  # end of the first of two 81-batch epochs
        ("--checkpoint.every_n_train_steps=50", "epoch=1-step=100.ckpt"),  # 19 batches into the second
    ],
)
def test_resume_from_a_checkpoint_is_exact(tmp_path: Path, tiny_recipe: Path, keep: str, resume_from: str) -> None:
    main(["fit", "--config", str(tiny_recipe), "--checkpoint.save_top_k=-1", keep])
    (straight,) = run_dirs(tmp_path)
    halfway = straight / "checkpoints" / resume_from
    main(["fit", "--config", str(tiny_recipe), f"--ckpt_path={halfway}"])
    resumed = run_dirs(tmp_path)[1]

    final = load_file(str(straight / "model" / "model.safetensors"))
    again = load_file(str(resumed / "model" / "model.safetensors"))
    assert final.keys() == again.keys()
    assert all(torch.equal(final[k], again[k]) for k in final)
    assert not torch.equal(backbone_from_checkpoint(halfway).embed.weight, final["model.embed_tokens.weight"])


def test_usage_errors_exit_2_without_a_traceback(
    tmp_path: Path, tiny_recipe: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    malformed = tmp_path / "malformed.yaml"
    malformed.write_text("trainer:\n  max_epochs: [1\nmodel: {\n")
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(tiny_recipe.read_text() + "\nfoo: 1\n")
    cases = [
        (["fit", "--config", str(malformed)], "error: Problems parsing config"),
        (["fit", "--config", str(unknown)], "foo"),
        (["fit", "--config", str(tiny_recipe), "--trainer.max_epochz=1"], "max_epochz"),
        (["fit", "--config", str(tiny_recipe), "--data.init_args.source=/no/such/corpus"], "error: corpus source"),
        (["fit", "--config", str(tiny_recipe), "--model.init_args.pretrained=x"], "error: give exactly one of"),
        (["fit", "--config", str(tiny_recipe), "--data.init_args.block_size=100000"], "error: the train split has no"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2, err
        assert message in err and "Traceback" not in err


@pytest.mark.slow
def test_ddp_on_two_cpu_processes(tmp_path: Path, tiny_recipe: Path, data_args: dict[str, Any]) -> None:
    data = CorpusDataModule(**data_args)
    data.setup()
    train_blocks = len(data.datasets["train"])
    env = os.environ | {"PYTHONPATH": str(REPO)}
    ddp = ["--trainer.strategy=ddp", "--trainer.devices=2", "--trainer.accelerator=cpu", "--trainer.max_epochs=1"]
    result = subprocess.run(
        [sys.executable, "-m", "warpdecode.modules.lightning_cli", "fit", "--config", str(tiny_recipe), *ddp],
        check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    (run,) = run_dirs(tmp_path)
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    # each of the 2 ranks sees half of the training blocks
    assert checkpoint["global_step"] == math.ceil(math.ceil(train_blocks / 2) / data_args["batch_size"])
    exported, _ = load_pretrained(run / "model")
    with torch.no_grad():
        assert torch.equal(exported(torch.arange(16)[None]).logits,
                           backbone_from_checkpoint(run / "checkpoints" / "last.ckpt")(torch.arange(16)[None]).logits)


@pytest.mark.slow
def test_finetune_recipe_runs_and_reports_val_loss(tmp_path: Path, code_corpus: Path) -> None:
    cli = build_cli([
        "fit", "--config", str(FINETUNE),
        "--trainer.max_steps=2", "--trainer.accumulate_grad_batches=1", "--trainer.val_check_interval=2",
        "--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0", "--trainer.enable_progress_bar=false",
        "--checkpoint.save_top_k=0", "--checkpoint.save_last=false",  # 1.6 GB per checkpoint with AdamW state
        f"--data.init_args.source={code_corpus}", "--data.init_args.glob=*.py", "--data.init_args.block_size=64",
        "--data.init_args.batch_size=2", f"--data.init_args.cache_dir={tmp_path / 'cache'}",
        f"--model.init_args.export_dir={tmp_path / 'tuned'}",
    ])
    metrics = cli.trainer.callback_metrics
    assert cli.trainer.global_step == 2
    assert float(metrics["val/loss"]) < 5.0  # an untrained model would be near ln(49152) = 10.8
    assert float(metrics["val/ppl"]) == pytest.approx(math.exp(float(metrics["val/loss"])), rel=1e-5)
    config = json.loads((tmp_path / "tuned" / "config.json").read_text())
    assert config["vocab_size"] == 49152

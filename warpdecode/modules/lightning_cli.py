"""`fit | validate | test` for every LightningModule/LightningDataModule pair, configured from YAML.

Defaults added on top of LightningCLI: flush-denormal on, a fixed seed, a W&B logger (offline
unless an API key is configured or `WANDB_MODE` says otherwise), a `ModelCheckpoint` whose
`last.ckpt` resumes a run exactly through `--ckpt_path`, and, when stderr is not a terminal (nohup,
CI, batch jobs: the progress bar draws nothing there), progress lines every minute and the
validation metrics after each validation (`LogProgress`). Each run writes its config, checkpoints
and (for `fit`) exported model under one run directory, `<save_dir>/<project>/<run id>/`.

The recipes ask for `bf16-mixed`. On a CPU without native bf16 kernels (AVX2-only x86: no
AVX512-BF16 or AMX) autocast emulates them and a SmolLM2-135M training step runs 14x slower than in
fp32, so such a run falls back to `32-true` and says so (`--precision_fallback false` keeps bf16).

Multi-process training (`--trainer.strategy=ddp --trainer.devices=N`) re-executes the current
command line in each worker, so it needs `main` to be reached from that command line (the
`warpdecode` script or `python -m warpdecode.modules.lightning_cli`).

A recipe that names a class by a path it had before a rename (the class's `aliases`) still runs; the
CLI says the current path once.
"""

from __future__ import annotations

import importlib
import netrc
import os
import pkgutil
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from jsonargparse import get_loader, set_loader, set_parsing_settings
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI, SaveConfigCallback
from yaml import YAMLError

import warpdecode.datamodules
import warpdecode.modules
from warpdecode.errors import OneLineArgumentErrors, WarpdecodeError, one_line
from warpdecode.progress import ProgressLines, log_line, no_terminal

SUBCOMMANDS = ("fit", "validate", "test")
DEFAULT_SEED = 0


def training_classes() -> list[type]:
    """Every LightningModule and LightningDataModule of `modules/` and `datamodules/`, after importing
    all their modules: jsonargparse resolves a short class name in YAML (`model: CausalLMModule`)
    among the imported subclasses."""
    for package in (warpdecode.modules, warpdecode.datamodules):
        for module in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{module.name}")

    def subclasses(cls: type) -> Iterator[type]:
        subclass: type
        for subclass in cls.__subclasses__():
            yield subclass
            yield from subclasses(subclass)

    found = {c for base in (LightningModule, LightningDataModule) for c in subclasses(base)}
    return sorted((c for c in found if c.__module__.startswith("warpdecode.")), key=lambda c: c.__qualname__)


@cache
def former_class_paths() -> dict[str, str]:
    """Former class path or short name -> the current class path, from each class's own `aliases`
    (the class paths it had before a rename), so that old recipes keep working."""
    renamed: dict[str, str] = {}
    for cls in training_classes():
        for alias in vars(cls).get("aliases", ()):
            renamed[alias] = renamed[alias.rsplit(".", 1)[-1]] = f"{cls.__module__}.{cls.__qualname__}"
    return renamed


@cache
def say_renamed(former: str, current: str) -> None:
    log_line(f"deprecated: {former} is now {current}; the old name will stop working in a later release")


def renamed(class_path: str) -> str:
    """The current class path of a former one (said once), else `class_path` unchanged."""
    current = former_class_paths().get(class_path, class_path)
    if current != class_path:
        say_renamed(class_path, current)
    return current


def renamed_class_paths(value: object) -> object:
    """A loaded config value with every `class_path` that names a former class replaced by the current one."""
    if isinstance(value, list):
        return [renamed_class_paths(v) for v in value]
    if not isinstance(value, dict):
        return value
    value = {k: renamed_class_paths(v) for k, v in value.items()}
    if isinstance(former := value.get("class_path"), str):
        value["class_path"] = renamed(former)
    return value


def renamed_argument(argument: str) -> str:
    """A command-line argument naming a former class (`--model=CausalLM`, or the value after `--model`)
    with the current class path; any other argument unchanged."""
    key, equals, value = argument.rpartition("=")
    return f"{key}{equals}{renamed(value)}" if value in former_class_paths() else argument


PARSER_MODE = "yaml_renamed"
"""The parser mode of the CLI's parsers: YAML, with former class paths renamed (`renamed_class_paths`)."""


def wandb_api_key_configured() -> bool:
    """Whether W&B could log online: `WANDB_API_KEY`, or a netrc entry for the W&B host."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host or "") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_offline() -> bool:
    """`WANDB_MODE` decides when set; otherwise offline unless an API key is configured."""
    mode = os.environ.get("WANDB_MODE")
    if mode:
        return mode in ("offline", "dryrun")
    return not wandb_api_key_configured()


def run_dir(trainer: Trainer) -> Path:
    """`<save_dir>/<name>/<version>`, the folder ModelCheckpoint puts its `checkpoints/` in."""
    logger = trainer.logger
    if logger is None:
        return Path(trainer.default_root_dir)
    version = logger.version if isinstance(logger.version, str) else f"version_{logger.version}"
    return Path(logger.save_dir or trainer.default_root_dir) / str(logger.name) / version


class SaveRunConfig(SaveConfigCallback):
    """Writes the resolved config as `config.yaml` into the run directory (one per run, never overwritten)."""

    def save_config(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        path = run_dir(trainer) / self.config_filename
        path.parent.mkdir(parents=True, exist_ok=True)
        self.parser.save(self.config, str(path), skip_unset=False, overwrite=True, multifile=False)


class LogProgress(Callback):
    """`fit`'s optimizer steps as progress lines (`ProgressLines`: at most one a minute, with the
    epoch, the last logged `train/loss` and the time left), and the `val/` metrics after every validation."""

    def __init__(self, every: float = 60.0) -> None:
        self.every = every
        self.lines: ProgressLines | None = None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.lines = ProgressLines("fit", float(trainer.estimated_stepping_batches), "optimizer steps",
                                   every=self.every, done=trainer.global_step)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: object, batch: object,
                           batch_idx: int) -> None:
        if self.lines is None or not trainer.is_global_zero:
            return
        epochs = f"/{trainer.max_epochs}" if trainer.max_epochs and trainer.max_epochs > 0 else ""
        extra: dict[str, object] = {"epoch": f"{trainer.current_epoch + 1}{epochs}"}
        if (loss := trainer.callback_metrics.get("train/loss")) is not None:
            extra["train/loss"] = f"{float(loss):.4g}"
        self.lines.update(trainer.global_step, **extra)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        metrics = {k: float(v) for k, v in sorted(trainer.callback_metrics.items()) if k.startswith("val/")}
        if metrics:
            log_line(f"validation after {trainer.global_step} optimizer steps: "
                     + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()))


def runs_on_cpu(accelerator: object) -> bool:
    """Whether a Trainer with this `accelerator` setting trains on the CPU."""
    if isinstance(accelerator, str):
        return accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available()
                                        and not torch.backends.mps.is_available())
    return False  # an Accelerator instance: the user chose the hardware


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN runs bf16 matmuls natively here (AVX512-BF16 or AMX), rather than emulated."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def precision_for_this_machine(precision: object, accelerator: object) -> object:
    """`precision`, or `32-true` where it asks for bf16 on a CPU that only emulates bf16."""
    if (isinstance(precision, str) and precision.startswith("bf16") and runs_on_cpu(accelerator)
            and not cpu_has_native_bf16()):
        return "32-true"
    return precision


class OneLineErrorParser(OneLineArgumentErrors, LightningArgumentParser):
    """LightningCLI's parser, reporting a parsing error in one line (`errors.OneLineArgumentErrors`)."""


class WarpdecodeCLI(LightningCLI):
    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        kwargs.setdefault("parser_mode", PARSER_MODE)  # the subcommands' parsers too
        return super().init_parser(**kwargs)

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        """LightningCLI's, with former class names among command-line arguments renamed (config files
        get theirs renamed by the parser mode's loader)."""
        if args is None or isinstance(args, list):
            self.config = parser.parse_args([renamed_argument(a) for a in (sys.argv[1:] if args is None else args)])
        else:
            super().parse_arguments(parser, args)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.add_argument("--precision_fallback", type=bool, default=True,
                            help="train in 32-true where --trainer.precision asks for bf16 on a CPU without "
                                 "native bf16 kernels (emulated bf16 is many times slower)")
        parser.set_defaults(
            {
                "checkpoint.save_last": True,
                "trainer.logger": {
                    "class_path": "lightning.pytorch.loggers.WandbLogger",
                    "init_args": {
                        "project": "warpdecode",
                        "save_dir": os.environ.get("WANDB_DIR") or "runs",
                        "offline": wandb_offline(),
                    },
                },
            }
        )

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        if not config.get("precision_fallback", True):
            return
        asked = config.trainer.precision
        chosen = precision_for_this_machine(asked, config.trainer.accelerator)
        if chosen != asked:
            config.trainer.precision = chosen
            log_line(f"precision {asked} -> {chosen}: this CPU has no native bf16 kernels "
                     "(--precision_fallback false keeps bf16)")


def build_cli(argv: list[str], *, run: bool = True) -> WarpdecodeCLI:
    """Parse `argv` and instantiate trainer, model and data; with `run`, argv starts with a subcommand."""
    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    yaml = get_loader("yaml")
    set_loader(PARSER_MODE, lambda text: renamed_class_paths(yaml(text)), (YAMLError,))
    training_classes()
    return WarpdecodeCLI(
        args=None if argv == sys.argv[1:] else argv,  # LightningCLI warns when both are given
        run=run,
        save_config_callback=SaveRunConfig,
        save_config_kwargs={"save_to_log_dir": False},
        trainer_defaults={"callbacks": [LogProgress()]} if no_terminal() else None,
        seed_everything_default=DEFAULT_SEED,
        parser_kwargs={"description": __doc__.splitlines()[0]},
        parser_class=OneLineErrorParser,
    )


def finish_wandb_run() -> None:
    """Close the W&B run this process opened and wait until its data is on disk.

    A later run in the same process then starts a new W&B run. `finish` alone can return before
    the wandb-core writer has flushed the run file; `teardown` waits for it.
    """
    if "wandb" in sys.modules:
        import wandb

        if wandb.run is not None:
            wandb.finish()
            wandb.teardown()


def user_error(error: BaseException) -> WarpdecodeError | None:
    """The `WarpdecodeError` behind `error`, if any: jsonargparse wraps errors raised while building classes."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, WarpdecodeError):
            return seen
        seen = seen.__cause__
    return None


def main(argv: list[str]) -> None:
    """Run `fit`, `validate` or `test` (`argv[0]`) with LightningCLI arguments, e.g. `--config recipe.yaml`."""
    torch.set_flush_denormal(True)
    try:
        build_cli(argv)
    except Exception as e:
        cause = user_error(e)
        if cause is None:
            raise
        print(f"error: {one_line(cause, 2000)}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    finally:
        finish_wandb_run()


if __name__ == "__main__":
    main(sys.argv[1:])

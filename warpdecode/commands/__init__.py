"""The non-training subcommands: typed functions whose signatures and docstrings are the CLI (one module
per group; `cli.command_functions` lists them in `--help` order)."""

from warpdecode.commands.artifacts import convert, convert_drafter, export, regress
from warpdecode.commands.data import prompts, self_chat
from warpdecode.commands.evaluate import bench, eval, methods
from warpdecode.commands.generate import generate
from warpdecode.commands.serve import serve

__all__ = ["bench", "convert", "convert_drafter", "eval", "export", "generate", "methods", "prompts", "regress", "self_chat",
           "serve"]

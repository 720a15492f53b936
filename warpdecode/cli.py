"""`warpdecode` entry point: fit|validate|test through LightningCLI, the rest through jsonargparse."""

from __future__ import annotations

import sys
from collections.abc import Callable

LIGHTNING_SUBCOMMANDS = ("fit", "validate", "test")
FLAG_ALIASES = {
    "generate": {"backends": "backend", "methods": "method"},
    "regress": {"backends": "backend", "method": "methods"},
    "bench": {"backend": "backends", "method": "methods"},
    "eval": {"backends": "backend", "methods": "method"},
}
"""A command that runs one backend or method names its flag in the singular, one that runs a list in the
plural; each also takes the other spelling (a list flag then reads a list of one)."""


def _normalise_flags(argv: list[str]) -> list[str]:
    """Accept `--max-new-tokens` as well as `--max_new_tokens` (and `self-chat` as well as `self_chat`),
    and `FLAG_ALIASES`; a bare `--json` means `--json_output=true`."""
    if argv and not argv[0].startswith("-"):
        argv = [argv[0].replace("-", "_"), *argv[1:]]
    aliases = FLAG_ALIASES.get(argv[0], {}) if argv else {}
    out = []
    for i, arg in enumerate(argv):
        if arg.startswith("--"):
            name, sep, value = arg[2:].partition("=")
            if name == "json":
                following = argv[i + 1].lower() if i + 1 < len(argv) else ""
                name = "json_output"
                if not sep and following not in ("true", "false"):
                    sep, value = "=", "true"
            name = name.replace("-", "_")
            arg = f"--{aliases.get(name, name)}{sep}{value}"
        out.append(arg)
    return out


def command_functions() -> list[Callable[..., None]]:
    """The commands besides fit/validate/test, in `--help` order: each function's signature and docstring
    are its flags and their help."""
    from warpdecode import commands

    return [commands.convert, commands.convert_drafter, commands.export, commands.generate, commands.methods, commands.bench,
            commands.eval, commands.regress, commands.prompts, commands.self_chat, commands.serve]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    import torch

    torch.set_flush_denormal(True)
    if argv and argv[0] in LIGHTNING_SUBCOMMANDS:
        from warpdecode.modules.lightning_cli import main as lightning_main

        lightning_main(argv)
        return

    from jsonargparse import CLI, ArgumentParser, set_parsing_settings

    from warpdecode.errors import OneLineArgumentErrors, WarpdecodeError, one_line

    class Parser(OneLineArgumentErrors, ArgumentParser):
        """jsonargparse's parser, reporting a parsing error in one line."""

    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    try:
        CLI(command_functions(), args=_normalise_flags(argv), as_positional=True, parser_class=Parser)
    except WarpdecodeError as e:
        print(f"error: {one_line(e, 2000)}", file=sys.stderr)  # one line, whatever the message holds
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()


if __name__ == "__main__":
    main()

"""Every flag of every command has help text (a docstring paragraph inside `Args:` once ended the section
and left the flags after it without any)."""

from __future__ import annotations

import pytest
from jsonargparse import CLI, capture_parser, set_parsing_settings

from warpdecode.cli import command_functions


def test_every_flag_of_every_command_has_help():
    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    parser = capture_parser(lambda: CLI(command_functions(), args=[], as_positional=True))
    subcommands = parser._subcommands_action._name_parser_map  # jsonargparse keeps the subparsers here
    assert set(subcommands) == {f.__name__ for f in command_functions()}
    missing = [f"{name} --{action.dest}" for name, sub in subcommands.items() for action in sub._actions
               if action.dest not in ("help", "config", "print_config") and not (action.help or "").strip()]
    assert missing == []


@pytest.mark.parametrize("flag", ["--verifier", "--threads", "--dtype"])
def test_generate_help_describes_its_late_flags(flag, capsys):
    from warpdecode.cli import main

    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    lines = capsys.readouterr().out.splitlines()
    line = next(i for i, text in enumerate(lines) if text.lstrip().startswith(flag + " "))
    assert not " ".join(lines[line:line + 2]).split(flag, 1)[1].split(maxsplit=1)[1].startswith("(type:")

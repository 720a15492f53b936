"""The few exception types warpdecode raises at its boundaries.

The CLI turns any `WarpdecodeError` into a one-line message and a non-zero exit code.
"""

from __future__ import annotations

import re
import sys
from typing import NoReturn


class WarpdecodeError(Exception):
    """Base class of every error meant for the user rather than a traceback."""


class ConfigError(WarpdecodeError, ValueError):
    """A configuration, argument or input value is invalid."""


class CheckpointError(WarpdecodeError):
    """A checkpoint or model directory is missing, incomplete or corrupt."""


class CapabilityError(WarpdecodeError):
    """A requested combination is not supported (e.g. a backend cannot provide hidden states)."""


class PackageIntegrityError(WarpdecodeError):
    """An exported package failed its hash or version check."""


def argument_error_line(message: str) -> str:
    """One line for a (multi-line) command-line parsing error of jsonargparse's.

    `Parser key "top_k":\\n  Does not validate ...\\n    - Expected a <class 'int'>. Got value: abc ...` becomes
    `--top_k: expected int, got 'abc'`; anything else has its lines joined.
    """
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return "invalid arguments"
    key = re.match(r'Parser key "([^"]+)":?\s*(.*)', lines[0])
    if key is None:
        return one_line(" ".join(lines), 400)
    flag = f"--{key.group(1)}"
    lines[0] = key.group(2)
    types = list(dict.fromkeys(t for t in re.findall(r"Expected a <class '([\w.]+)'>", message) if t != "NoneType"))
    value = re.search(r"(?:Given|Got) value: (.*)", message)
    if types and value is not None:
        return one_line(f"{flag}: expected {' or '.join(types)}, got {value.group(1).strip()!r}", 400)
    return one_line(f"{flag}: " + " ".join(line.removeprefix("- ") for line in lines if line), 400)


def one_line(error: BaseException | str, limit: int = 500) -> str:
    """An exception's message on one line (whitespace runs collapsed), at most `limit` characters:
    a third-party message can span many lines, and the CLI prints one."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


class OneLineArgumentErrors:
    """Mixin for jsonargparse parsers (`class P(OneLineArgumentErrors, ArgumentParser)`): a parsing error
    ends the program with one `error: ...` line and exit status 2 instead of the usage text."""

    exit_on_error: bool
    prog: str

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:  # jsonargparse's internal parsers raise, and their caller reports
            super().error(message, ex)  # type: ignore[misc]
        command = self.prog.replace(" [options]", "")
        print(f"error: {argument_error_line(message)} (see `{command} --help`)", file=sys.stderr)
        sys.exit(2)

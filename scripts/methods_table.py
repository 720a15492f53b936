"""Write README.md's methods table from `warpdecode methods --json`, so the registry stays its one source.

    python scripts/methods_table.py           # rewrite the table between the two markers in README.md
    python scripts/methods_table.py --check   # exit 1 when README.md's table differs from the registry

tests/test_readme.py runs the same comparison, so a registered, renamed or re-described component
that is not in the README fails the tests.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parent.parent / "README.md"
BEGIN = "<!-- methods table: written by scripts/methods_table.py from `warpdecode methods --json`; do not edit -->"
END = "<!-- end of methods table -->"

KIND_NAMES = {"drafter": "drafter", "verifier": "verifier", "controller": "controller",
              "commit_policy": "diffusion commit policy", "search": "search strategy", "rule": "decoding rule"}
"""How each registry kind reads in the table's `kind` column (an unknown kind is printed as it is)."""

LOSSLESS = {True: "yes", False: "**no**", None: "–"}
"""`lossless` is None for a controller (it sets the draft budget and never decides a token) and for a search
strategy (it chooses other sequences than greedy decoding by design)."""


def methods_json() -> list[dict[str, Any]]:
    """The rows `warpdecode methods --json` prints, run in this process."""
    from warpdecode.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["methods", "--json"])
    return json.loads(out.getvalue())


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of `rows` (in their order: grouped by kind, then by name)."""
    lines = ["| name | kind | lossless | trained | what it does | options |", "|---|---|---|---|---|---|"]
    for row in rows:
        options = ", ".join(f"`{name}`" for name in row["options"]) or "–"
        lines.append(f"| `{row['name']}` | {KIND_NAMES.get(row['kind'], row['kind'])} | {LOSSLESS[row['lossless']]} | "
                     f"{'yes' if row['needs_training'] else 'no'} | {_cell(row['summary'])} | {options} |")
    return "\n".join(lines)


def _bounds(text: str) -> tuple[int, int]:
    """Where the table between the markers starts and ends in `text`; ValueError without both markers."""
    begin, end = text.find(BEGIN), text.find(END)
    if begin < 0 or end < begin:
        raise ValueError(f"the README needs the lines {BEGIN!r} and then {END!r}")
    return begin + len(BEGIN) + 1, end


def current_table(text: str) -> str:
    """The table now between the markers of `text`."""
    start, stop = _bounds(text)
    return text[start:stop].rstrip("\n")


def with_table(text: str, new: str) -> str:
    """`text` with `new` between its markers."""
    start, stop = _bounds(text)
    return f"{text[:start]}{new}\n{text[stop:]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the README's table is stale; write nothing")
    parser.add_argument("--readme", type=Path, default=README, help="the README to read and write (default: %(default)s)")
    args = parser.parse_args(argv)
    text = args.readme.read_text(encoding="utf-8")
    new = table(methods_json())
    if current_table(text) == new:
        return 0
    if args.check:
        print(f"{args.readme}: the methods table is stale; run python scripts/methods_table.py", file=sys.stderr)
        return 1
    args.readme.write_text(with_table(text, new), encoding="utf-8")
    print(f"{args.readme}: methods table rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One line for jsonargparse's multi-line parsing errors."""

from __future__ import annotations

import pytest

from warpdecode.errors import argument_error_line

OPTIONAL_INT = """Parser key "top_k":
  Does not validate against any of the types in typing.Optional[int]:
    - Expected a <class 'int'>. Got value: abc
    - Expected a <class 'NoneType'>. Got value: abc
  Given value: abc"""


@pytest.mark.parametrize(("message", "line"), [
    ("Parser key \"max_new_tokens\":\n  Expected a <class 'int'>. Got value: 1.5", "--max_new_tokens: expected int, got '1.5'"),
    (OPTIONAL_INT, "--top_k: expected int, got 'abc'"),
    ("Parser key \"config\": File does not exist: '/x.yaml'", "--config: File does not exist: '/x.yaml'"),
    ("Problems parsing config:\n  while parsing a flow sequence\n  in \"<unicode string>\", line 1",
     "Problems parsing config: while parsing a flow sequence in \"<unicode string>\", line 1"),
    ("unrecognized arguments: --bogus 1", "unrecognized arguments: --bogus 1"),
    ("", "invalid arguments"),
])
def test_argument_error_line(message, line):
    assert argument_error_line(message) == line


def test_a_long_message_is_clipped():
    line = argument_error_line("x " * 1000)
    assert len(line) == 400 and line.endswith("...") and "\n" not in line

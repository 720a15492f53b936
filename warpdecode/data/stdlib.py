"""The stdlib corpus's Python files read with `ast`: one split's files as text, and the functions and
docstrings in them.

Three kinds of prompts are mined from these files, and read them here: the self-distillation sources'
"Write a Python function ..." prompts and docstring passages (`train` split) and the benchmark's
`stdlib_code` prompts (`test` split). A file that does not parse (written for another Python version)
gives nothing.
"""

from __future__ import annotations

import ast
import sys
import sysconfig
from collections.abc import Iterator

from warpdecode.data.corpus import stdlib_split_files

Function = ast.FunctionDef | ast.AsyncFunctionDef


def split_sources(split: str) -> Iterator[tuple[str, str]]:
    """(relative path, text) of the stdlib corpus files of `split`, sorted by path; bytes that are not
    UTF-8 are replaced."""
    for key, path in stdlib_split_files(split):
        yield key, path.read_text(encoding="utf-8", errors="replace")


def stdlib_stamp() -> list[str]:
    """What the stdlib files depend on, without reading them: the interpreter's version and its stdlib folder."""
    return [sys.version, sysconfig.get_paths()["stdlib"]]


def parse(source: str) -> ast.Module:
    """The syntax tree of one file's text; an empty module when it does not parse."""
    try:
        return ast.parse(source)
    except SyntaxError:
        return ast.Module(body=[], type_ignores=[])


def functions(tree: ast.AST) -> Iterator[Function]:
    """Every function and method of `tree` at any depth, in `ast.walk` order (breadth first)."""
    return (node for node in ast.walk(tree) if isinstance(node, Function))


def api_functions(tree: ast.Module) -> Iterator[tuple[Function, str | None]]:
    """(function, class name or None) of the module-level functions and of the methods of module-level
    classes whose names do not start with `_`, in file order."""
    for node in tree.body:
        if isinstance(node, Function):
            yield node, None
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            yield from ((item, node.name) for item in node.body if isinstance(item, Function))


def docstrings(tree: ast.AST) -> Iterator[str]:
    """The non-empty docstrings of the module, its classes and its functions, in `ast.walk` order."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                and (docstring := ast.get_docstring(node))):
            yield docstring

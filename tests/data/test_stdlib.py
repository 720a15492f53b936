"""Python files read with `ast`: functions, the public API and docstrings, in a fixed order."""

from __future__ import annotations

from warpdecode.data.stdlib import api_functions, docstrings, functions, parse, split_sources

SOURCE = '''"""Module docstring."""

def top(a, b=1):
    """Top-level function."""
    def inner():
        pass

class Public:
    """A class."""
    def method(self):
        """A method."""

class _Private:
    def hidden(self):
        pass

async def later():
    pass
'''


def test_functions_are_walked_breadth_first_and_the_api_in_file_order():
    tree = parse(SOURCE)
    assert [f.name for f in functions(tree)] == ["top", "later", "inner", "method", "hidden"]
    assert [(f.name, owner) for f, owner in api_functions(tree)] == [
        ("top", None), ("method", "Public"), ("later", None)]
    assert list(docstrings(tree)) == ["Module docstring.", "Top-level function.", "A class.", "A method."]


def test_a_file_that_does_not_parse_gives_nothing():
    tree = parse("def broken(:\n")
    assert not list(functions(tree)) and not list(api_functions(tree)) and not list(docstrings(tree))


def test_split_sources_are_the_files_of_one_split_as_text():
    train = dict(split_sources("train"))
    test = dict(split_sources("test"))
    assert train and test and not train.keys() & test.keys()
    assert all(isinstance(text, str) for text in test.values())

"""Helpers for the tests that restate a framework's functions (tests/test_openrlhf.py, test_areal.py,
test_slime.py, test_skyrl.py): where ``ROLLBUF_ORACLE_SOURCES`` names a folder holding the framework's source
tree as shipped (an unpacked wheel, a checkout), each restated function is compared with the shipped
one, statement for statement (their ASTs, docstrings included)."""

from __future__ import annotations

import ast
import inspect
import os
from pathlib import Path

import pytest

ROOT = os.environ.get("ROLLBUF_ORACLE_SOURCES")
needs_sources = pytest.mark.skipif(not ROOT, reason="ROLLBUF_ORACLE_SOURCES names no folder of shipped sources")


def _dump(node) -> str:
    return ast.dump(node, include_attributes=False)


def _parsed(fn):
    """``fn``'s definition parsed as written (a method's indentation kept: its docstring's lines too)."""
    src = inspect.getsource(fn)
    return ast.parse(src).body[0] if not src[0].isspace() else ast.parse("if True:\n" + src).body[0].body[0]


def assert_verbatim(restated: dict) -> None:
    """``restated``: ``{path of a shipped file under ROLLBUF_ORACLE_SOURCES: [restated functions]}``; a
    method is looked up by its class's name and its own, a function by its name."""
    for rel, fns in restated.items():
        tree = ast.parse((Path(ROOT) / rel).read_text())
        shipped = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            shipped |= {f"{cls.name}.{n.name}": n for n in cls.body if isinstance(n, ast.FunctionDef)}
        for fn in fns:
            name = fn.__qualname__
            assert name in shipped, f"{rel} has no {name}"
            assert _dump(_parsed(fn)) == _dump(shipped[name]), f"{rel}: {name} differs from the shipped one"

"""Functions that fit a screen: no function in iosim/, algorithms/ or memory_model/ runs over LIMIT lines.

A function's length is counted as Python's ``ast`` reports it: from its ``def`` line to its last line
(``end_lineno - lineno + 1``, decorators not counted, nested functions counted inside the function that holds them
and on their own). ALLOWED names the functions still over the limit while they are being split (each entry must
still be over: a function that was split leaves the list in the same change).
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("iosim", "algorithms", "memory_model")
LIMIT = 100

# "path/to/module.py:Qualified.name" of each function still over LIMIT lines (being split elsewhere)
ALLOWED: set[str] = set()


def function_lengths(source: str, path: str) -> dict[str, int]:
    """'path:qualified name' -> lines of every function and method in ``source`` (nested ones included)."""
    out: dict[str, int] = {}

    def visit(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                out[f"{path}:{name}"] = child.end_lineno - child.lineno + 1
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return out


def all_lengths() -> dict[str, int]:
    out: dict[str, int] = {}
    for package in PACKAGES:
        for file in sorted((ROOT / package).rglob("*.py")):
            out.update(function_lengths(file.read_text(encoding="utf-8"), file.relative_to(ROOT).as_posix()))
    return out


def test_the_counter_measures_def_to_last_line():
    src = textwrap.dedent(
        """
        def a():
            def b():
                return 1

            return b


        class C:
            @staticmethod
            def m():
                pass
        """
    )
    assert function_lengths(src, "x.py") == {"x.py:a": 5, "x.py:a.b": 2, "x.py:C.m": 2}
    long = "def f():\n" + "    x = 1\n" * LIMIT  # a def line and LIMIT body lines: one over
    assert function_lengths(long, "y.py") == {"y.py:f": LIMIT + 1}


def test_no_function_over_the_limit_outside_the_allow_list():
    lengths = all_lengths()
    over = {name: n for name, n in lengths.items() if n > LIMIT}
    assert sorted(set(over) - ALLOWED) == [], f"functions over {LIMIT} lines: {over}"


def test_the_allow_list_names_only_functions_still_over():
    lengths = all_lengths()
    stale = sorted(name for name in ALLOWED if lengths.get(name, 0) <= LIMIT)
    assert stale == [], f"split (or gone): remove from ALLOWED: {stale}"

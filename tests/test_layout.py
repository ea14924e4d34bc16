"""Imports flow one way: memory_model -> algorithms -> iosim -> experiments (design.md)."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "memory_model": {"algorithms", "iosim", "experiments"},
    "algorithms": {"iosim", "experiments"},
    "iosim": {"experiments"},
}


def _imports(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module.split(".")[0]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_flow_one_way(package):
    for path in (ROOT / package).rglob("*.py"):
        bad = set(_imports(path)) & FORBIDDEN[package]
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"

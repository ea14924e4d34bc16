"""No import cycle anywhere in the package: the graph of explicit imports between iosim's modules (function-level
imports included: a lazy import that dodges a cycle at load time still makes one) has no strongly connected
component of more than one module, and no module imports itself. Importing ``a.b.c`` runs ``a/__init__`` first, but
that implicit step is not an edge: only what a file names counts.

The modules are the installed ones: iosim/ as ``iosim``, algorithms/, memory_model/ and experiments/ as
``iosim.algorithms``, ``iosim.memory_model`` and ``iosim.experiments`` (pyproject.toml's package-dir)."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLDERS = {"iosim": "iosim", "algorithms": "iosim.algorithms", "memory_model": "iosim.memory_model"}
FOLDERS["experiments"] = "iosim.experiments"


def modules() -> dict[str, pathlib.Path]:
    found = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if folder == "iosim" and parts and parts[0] in ("algorithms", "memory_model", "experiments"):
                continue  # not a folder of iosim/ on disk, but be safe
            if "bench" in parts:
                continue  # benchmark scripts: not installed, run by path
            found[".".join([package, *parts])] = path
    return found


def edges(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in known and t != name or t == name}
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, or a module importing itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph[v]:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_graph_is_read():
    mods = modules()
    graph = {m: edges(m, p, set(mods)) for m, p in mods.items()}
    assert "iosim.cli.run" in graph and "iosim.theory.io_model" in graph and "iosim.experiments" in graph
    assert "iosim.theory.io_model" in graph["iosim.runner.registry"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}}) == [["a"]]


def test_no_import_cycle():
    mods = modules()
    graph = {m: edges(m, p, set(mods)) for m, p in mods.items()}
    assert cycles(graph) == []


def test_only_the_command_line_imports_the_command_line():
    mods = modules()
    for m, p in mods.items():
        if m == "iosim.cli" or m.startswith("iosim.cli."):
            continue
        bad = {t for t in edges(m, p, set(mods)) if t == "iosim.cli" or t.startswith("iosim.cli.")}
        assert not bad, f"{m} imports the command line: {sorted(bad)}"


def test_options_module_imports_no_subcommand():
    mods = modules()
    bad = {t for t in edges("iosim.cli.options", mods["iosim.cli.options"], set(mods)) if t.startswith("iosim.cli")}
    assert not bad

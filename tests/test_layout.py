"""Imports flow one way: memory_model -> algorithms -> iosim -> experiments (README, "Layout"), and iosim installs one
top-level package."""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The folder on disk -> the import names its files may not use (every folder installs under ``iosim``).
FORBIDDEN = {
    "memory_model": {"iosim.algorithms", "iosim.runner.api", "iosim.cli", "iosim.experiments", "experiments"},
    "algorithms": {
        "iosim.runner.api",
        "iosim.cli",
        "iosim.runner.registry",
        "iosim.theory",
        "iosim.experiments",
        "experiments",
    },
    "iosim": {"iosim.experiments", "experiments"},  # iosim/cli/experiments.py alone runs them (see below)
}
FRONT = {"iosim"}  # the bare package name: importing it runs iosim/__init__.py, i.e. everything


def _imports(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names)


def _inside(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_imports_flow_one_way(folder):
    own = "iosim" if folder == "iosim" else f"iosim.{folder}"
    for path in (ROOT / folder).rglob("*.py"):
        if path == ROOT / "iosim" / "cli" / "experiments.py":
            continue  # the command that runs the experiments: a leaf nothing imports
        names = set(_imports(path))
        bad = {n for n in names for f in FORBIDDEN[folder] if _inside(n, f)}
        if folder != "iosim":
            bad |= names & FRONT  # `from iosim import x` would pull in the front door
            # only iosim.<own folder> and the lower layers may be imported from iosim.*
            lower = {"memory_model": (), "algorithms": ("iosim.memory_model",)}[folder]
            bad |= {
                n
                for n in names
                if _inside(n, "iosim") and not _inside(n, own) and not any(_inside(n, p) for p in lower)
            }
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_no_generic_top_level_imports():
    """No file imports the folders by their bare names: they install only under iosim."""
    for path in [*ROOT.glob("*/**/*.py")]:
        if ".venv" in path.parts or ".ci-venv" in path.parts:
            continue
        tops = {n.split(".")[0] for n in _imports(path)}
        bare = tops & {"algorithms", "memory_model", "experiments"}
        assert not bare, f"{path.relative_to(ROOT)} imports a bare folder name"


def test_one_top_level_package():
    text = (ROOT / "pyproject.toml").read_text()
    listed = re.search(r"^packages = \[(.*?)\]", text, flags=re.M | re.S).group(1)
    assert {p.strip(' "\n').split(".")[0] for p in listed.split(",") if p.strip()} == {"iosim"}


def test_every_package_folder_is_installed():
    """A wheel holds only the packages pyproject.toml lists: every folder with an __init__.py is among them."""
    text = (ROOT / "pyproject.toml").read_text()
    listed = {p.strip(' "\n') for p in re.search(r"^packages = \[(.*?)\]", text, flags=re.M | re.S).group(1).split(",")}
    roots = {"iosim": "iosim", "algorithms": "iosim.algorithms", "memory_model": "iosim.memory_model"}
    roots["experiments"] = "iosim.experiments"
    for folder, package in roots.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            if "bench" in rel:
                continue
            name = ".".join([package, *rel])
            assert name in listed, f"{name} ({init.parent.relative_to(ROOT)}) is not in pyproject.toml's packages"

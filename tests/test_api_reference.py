"""The API reference (docs/api.md) names what imports, and holds what the pages tell users to import.

Every ``::: name`` entry resolves: under the name its heading shows (the ``heading:`` option where the docstring
lives under another path, e.g. ``memory_model.core.InputError`` shown as ``iosim.InputError``), which must be the same
object. Every ``from iosim... import X``, ``import iosim...`` and ``iosim.a.b`` in a Python block of the README or a
docs page, and every ``iosim.a.b`` in the pages' inline code, resolves too; the Python blocks' names and the calls
the prose shows (``iosim.x.y(``) are in the reference."""

from __future__ import annotations

import importlib
import pathlib
import re
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
API = ROOT / "docs" / "api.md"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# top-level folders that install as iosim.<name> (pyproject.toml's package-dir): the docstrings' paths in the repository
INSTALLED_AS = {"memory_model": "iosim.memory_model", "algorithms": "iosim.algorithms"}
DOTTED = r"\biosim(?:\.[A-Za-z_]\w*)+"


def resolve(name: str):
    """The object ``name`` names, as Python finds it: attributes from ``import iosim`` on (``iosim.sweep`` is the
    function), or, where an attribute is missing (a subpackage that a function of its name shadows, as
    ``iosim.hierarchy``), as ``from <the longest importable module> import <the rest>`` does. AttributeError or
    ImportError when it does not resolve."""
    head, _, tail = name.partition(".")
    name = f"{INSTALLED_AS[head]}.{tail}" if head in INSTALLED_AS else name
    parts = name.split(".")
    obj = importlib.import_module(parts[0])
    try:
        for part in parts[1:]:
            obj = getattr(obj, part)
        return obj
    except AttributeError:
        pass
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(name)


def entries() -> list[tuple[str, str, list[str] | None]]:
    """(identifier, the name its heading shows, the members it lists or None for all) of each ``:::`` entry."""
    found = []
    for m in re.finditer(r"^::: (\S+)\n((?:    .*\n)*)", API.read_text(), flags=re.M):
        options = m.group(2)
        heading = re.search(r"^\s+heading: (\S+)$", options, flags=re.M)
        members = re.search(r"^\s+members: \[(.*)\]$", options, flags=re.M)
        listed = [x.strip() for x in members.group(1).split(",")] if members else None
        found.append((m.group(1), heading.group(1) if heading else m.group(1), listed))
    return found


ENTRIES = entries()


def python_blocks(page: pathlib.Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)


def told_to_import() -> dict[str, str]:
    """Every name a Python block imports or uses, and every call the prose shows: {name: page}."""
    names: dict[str, str] = {}
    for page in PAGES:
        where = str(page.relative_to(ROOT))
        for code in python_blocks(page):
            for module, what in re.findall(r"^\s*from (iosim[\w.]*) import \(?([^\n)]*)", code, flags=re.M):
                for x in what.split(","):
                    if x.split("#")[0].strip():
                        names.setdefault(f"{module}.{x.split(' as ')[0].strip()}", where)
            for module in re.findall(r"^\s*import (iosim[\w.]*)", code, flags=re.M):
                names.setdefault(module, where)
            for dotted in re.findall(DOTTED, code):
                names.setdefault(dotted, where)
        for span in re.findall(r"`([^`\n]+)`", page.read_text()):
            for dotted in re.findall(DOTTED + r"\(", span):
                names.setdefault(dotted[:-1], where)
    names.pop("iosim", None)
    return names


def named_in_prose() -> dict[str, str]:
    """Every ``iosim.a.b`` in the pages' inline code: {name: page}."""
    names: dict[str, str] = {}
    for page in PAGES:
        for span in re.findall(r"`([^`\n]+)`", page.read_text()):
            for dotted in re.findall(DOTTED, span):
                if not span.startswith(("iosim ", "python ")):  # a command line's words are not Python names
                    names.setdefault(dotted, str(page.relative_to(ROOT)))
    return names


TOLD = told_to_import()
PROSE = named_in_prose()


def test_the_reference_and_the_pages_name_enough():
    assert len(ENTRIES) >= 50 and len(TOLD) >= 40 and len(PROSE) >= 40
    shown = {heading for _, heading, _ in ENTRIES}
    wanted = "show Trace kernels.count_file kernels.compare kernels.AccessError pebble theory.io_model views.html"
    for name in [f"iosim.{x}" for x in wanted.split()] + ["iosim.InputError"]:
        assert name in shown, f"docs/api.md lacks {name}"


@pytest.mark.parametrize("ident, heading, members", ENTRIES, ids=[h for _, h, _ in ENTRIES])
def test_every_entry_imports_under_its_heading(ident, heading, members):
    assert heading.startswith("iosim"), f"{heading}: a heading names the path users import, under iosim"
    obj = resolve(heading)
    assert resolve(ident) is obj, f"{ident} (the docstring's path) is not {heading}"
    for member in members or []:
        resolve(f"{heading}.{member}")


def covered(name: str, shown: dict[str, object]) -> bool:
    """In the reference: an entry's heading, the same object as one, a member a module entry lists (all its public
    members, or the ones its ``members:`` option names), or a module whose functions or classes have entries."""
    if name in shown:
        return True
    obj = resolve(name)
    if any(obj is other for other in shown.values()):
        return True
    parent, _, leaf = name.rpartition(".")
    if any(h == parent and leaf in (members or []) for _, h, members in ENTRIES):
        return True
    full_modules = {h for _, h, members in ENTRIES if members is None and isinstance(shown[h], types.ModuleType)}
    if parent in full_modules and not leaf.startswith("_"):
        return True
    if not isinstance(obj, types.ModuleType):
        return False
    return any(h.startswith(name + ".") or getattr(o, "__module__", None) == obj.__name__ for h, o in shown.items())


@pytest.mark.parametrize("name", sorted(TOLD), ids=sorted(TOLD))
def test_what_the_pages_import_imports_and_is_in_the_reference(name):
    resolve(name)  # raises where the pages name something that does not import
    if name == "iosim.__version__":
        return
    shown = {heading: resolve(heading) for _, heading, _ in ENTRIES}
    assert covered(name, shown), f"{TOLD[name]} tells users to use {name}: docs/api.md has no entry for it"


@pytest.mark.parametrize("name", sorted(PROSE), ids=sorted(PROSE))
def test_what_the_prose_names_resolves(name):
    try:
        resolve(name)
    except (ImportError, AttributeError) as e:
        pytest.fail(f"{PROSE[name]} names {name}, which does not import ({e})")


def test_the_python_blocks_import_as_written():
    """Each import statement of a Python block, executed alone."""
    for page in PAGES:
        for code in python_blocks(page):
            for line in re.findall(r"^(?:from iosim[\w.]* import [^\n(]+|import iosim[\w.]*(?: as \w+)?)$", code,
                                   flags=re.M):  # fmt: skip
                exec(line, {})


def test_the_resolver_refuses_what_does_not_import():
    with pytest.raises((ImportError, AttributeError)):
        resolve("iosim.runner.sweep.sweep.sweep")
    with pytest.raises((ImportError, AttributeError)):
        resolve("memory_model.core.NoSuchError")
    assert resolve("iosim.sweep") is importlib.import_module("iosim.runner.sweep").sweep  # the function, not a module
    assert resolve("memory_model.core.InputError") is resolve("iosim.InputError")

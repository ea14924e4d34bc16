"""Every file the README, the docs or the command output cites exists, every docs/theory*.md#anchor cited
anywhere is a heading of that theory page, every label a docstring cites as "docs/theory.md F1" is defined on the
page the overview's label table names, and nothing cites a file the repository lacks (the design notes the theory
was restated from are not part of it)."""

from __future__ import annotations

import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]
GENERATED = ("results/", "flash2.", "f2.", "x.", "out.", "trace.")  # files the README's commands write


def tracked() -> list[pathlib.Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:  # not a git checkout (an sdist): every file below the root
        return [p for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts]
    return [ROOT / line for line in out.stdout.splitlines() if (ROOT / line).is_file()]


def anchors(md: pathlib.Path) -> set[str]:
    heads = re.findall(r"^#+ (.*)$", md.read_text(), flags=re.M)
    return {re.sub(r"[^a-z0-9 _-]", "", h.lower()).strip().replace(" ", "-") for h in heads}


def test_no_file_cites_the_design_notes():
    for path in tracked():
        if path.suffix in (".py", ".md", ".toml", ".txt") and path != pathlib.Path(__file__):
            text = path.read_text()
            for outside in ("papers.md", "design.md", "shared/spec", "spec section"):
                assert outside not in text, f"{path.relative_to(ROOT)} cites {outside}, which the repository lacks"


def test_theory_anchors_exist():
    """A theory page's anchor, cited anywhere (a docstring, a message, a page), is a heading of that page."""
    pages = {p.name: anchors(p) for p in (ROOT / "docs").glob("theory*.md")}
    assert {"theory.md", "theory-model.md", "theory-bounds.md"} <= set(pages)
    cited = 0
    for path in tracked():
        if path.suffix not in (".py", ".md") or path == pathlib.Path(__file__):
            continue
        for page, a in re.findall(r"(theory(?:-[a-z]+)?\.md)#([a-z0-9_-]+)", path.read_text()):
            assert page in pages, f"{path.relative_to(ROOT)} cites docs/{page}, which does not exist"
            assert a in pages[page], f"{path.relative_to(ROOT)} cites docs/{page}#{a}, not a heading"
            cited += 1
    assert cited >= 20, "the bounds' messages and the overview cite theory pages by anchor"


def test_theory_labels_are_where_the_overview_says():
    """The overview (docs/theory.md) maps each label (F1, B2, L6, ...) to a page; the label is defined there (in bold,
    or in brackets as a printed bound's name), and every label cited as "docs/theory.md X" or "docs/theory.md, X" is
    in the map, so a citation of the one-page theory still finds its form."""
    overview = (ROOT / "docs" / "theory.md").read_text()
    table = dict(re.findall(r"^\| ([FSBL]\d) \| .*?\]\((theory-[a-z]+\.md)#", overview, flags=re.M))
    assert set(table) == {"F0", "F1", "F2", "S0", "S1", "B0", "B1", "B2", "B3", "L0", "L1", "L2", "L3", "L6"}
    for label, page in table.items():
        text = (ROOT / "docs" / page).read_text()
        assert re.search(rf"\*\*{label}\b|\({label}\)", text), f"{label} is not defined on {page}"
    for path in tracked():
        if path.suffix not in (".py", ".md") or path == pathlib.Path(__file__):
            continue
        for label in re.findall(r"docs/theory\.md,? ([FSBL]\d)\b", path.read_text()):
            assert label in table, f"{path.relative_to(ROOT)} cites docs/theory.md {label}, not in the label table"


def test_the_theory_overview_links_every_theory_page():
    overview = (ROOT / "docs" / "theory.md").read_text()
    for page in sorted((ROOT / "docs").glob("theory-*.md")):
        assert f"]({page.name})" in overview, f"docs/theory.md does not list {page.name}"
        assert "](theory.md)" in page.read_text(), f"{page.name} does not link back to the overview"


def test_markdown_links_and_cited_paths_exist():
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = md.read_text()
        links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
        paths = re.findall(r"`((?:[\w.-]+/)+[\w.-]+\.(?:py|md|csv|png|gif|txt|toml))`", text)
        for target in links + paths:
            if target.startswith(("http://", "https://", "mailto:")) or target.startswith(GENERATED):
                continue
            where = (md.parent / target) if md.parent != ROOT and not (ROOT / target).exists() else ROOT / target
            assert where.exists(), f"{md.relative_to(ROOT)} cites {target}, which does not exist"

"""Every file the README, the docs or the command output cites exists, every docs/theory.md#anchor cited
anywhere is a heading of docs/theory.md, and nothing cites a file the repository lacks (the design notes the
theory was restated from are not part of it)."""

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
    known = anchors(ROOT / "docs" / "theory.md")
    for path in tracked():
        if path.suffix not in (".py", ".md") or path == pathlib.Path(__file__):
            continue
        for a in re.findall(r"theory\.md#([a-z0-9_-]+)", path.read_text()):
            assert a in known, f"{path.relative_to(ROOT)} cites docs/theory.md#{a}, not a heading"


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

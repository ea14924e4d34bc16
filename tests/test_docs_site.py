"""The docs site (mkdocs.yml, the pages in docs/) builds with warnings as errors: every page is in the navigation,
every link between pages resolves, and the API reference finds every object it names."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_page_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert pages and all(f": {page}" in nav for page in pages), "a docs page missing from mkdocs.yml's nav"


def test_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra (mkdocs) is not installed")
    pytest.importorskip("material", reason="the docs extra (mkdocs-material) is not installed")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "api" / "index.html").read_text().count("iosim.run") > 0
    assert (tmp_path / "site" / "search" / "search_index.json").exists()

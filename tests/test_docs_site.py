"""The docs site (mkdocs.yml, the pages in docs/) builds with warnings as errors (every page in the navigation, every
link between pages resolves, the API reference finds every object it names), and the built site works opened from
disk as well as served: its links name .html files (a link ending in "/" opens a directory listing from file://),
its search index is embedded in a script the pages load (a browser refuses to fetch the JSON index from file://),
and the Web Worker shim search needs there comes from the site itself, not from a CDN."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CONFIG = ROOT / "mkdocs.yml"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def test_every_page_is_in_the_navigation():
    nav = CONFIG.read_text()
    pages = sorted(p.name for p in DOCS.glob("*.md"))
    assert pages and all(f": {page}" in nav for page in pages), "a docs page missing from mkdocs.yml's nav"


def test_the_settings_read_from_disk():
    """Fast (no build): the settings the from-disk site needs, and no page links a folder."""
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load(CONFIG.read_text())
    assert config["use_directory_urls"] is False
    plugins = [p if isinstance(p, str) else next(iter(p)) for p in config["plugins"]]
    assert "search" in plugins and "offline" in plugins
    kernels = next(s["Kernels"] for s in config["nav"] if isinstance(s, dict) and "Kernels" in s)
    assert next(iter(kernels[0].values())) == "kernel-first.md", "a kernel author's first page leads the section"
    shims = [s for s in config["extra"]["polyfills"] if "iframe-worker" in s]
    assert shims and all((DOCS / s).is_file() for s in shims), "the offline plugin's shim must come from docs/"
    for page in [*DOCS.rglob("*.md"), ROOT / "README.md"]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            path = target.split("#")[0]
            if path and not re.match(r"[a-z]+:", path):
                assert not path.endswith("/"), f"{page.name} links the folder {target}"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs", reason="the docs extra (mkdocs) is not installed")
    pytest.importorskip("material", reason="the docs extra (mkdocs-material) is not installed")
    out = tmp_path_factory.mktemp("docs") / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    start = time.perf_counter()
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    print(f"mkdocs build --strict: {time.perf_counter() - start:.1f} s")
    return out


def test_site_builds_strict(site):
    assert "iosim.run" in (site / "api.html").read_text()
    assert "iosim.kernels.count_file" in (site / "api.html").read_text()
    assert not (site / "usage").is_dir(), "a page built as a folder (use_directory_urls)"


def test_every_internal_link_names_a_file(site):
    pages = sorted(p for p in site.rglob("*.html") if p.name != "404.html")  # 404.html: a server's, root-relative
    assert len(pages) >= len(list(DOCS.glob("*.md")))
    for page in pages:
        text = page.read_text()
        for href in re.findall(r'(?:href|src)="([^"]+)"', text):
            if re.match(r"[a-z]+:|//|#", href):
                continue
            path = href.split("#")[0].split("?")[0]
            where = f"{page.relative_to(site)} links {href}"
            assert path and not path.endswith("/"), f"{where}: a folder (a directory listing from disk)"
            assert (page.parent / path).is_file(), f"{where}: no such file"
        scripts = re.findall(r'<script src="([^"]+)"', text)
        assert not [s for s in scripts if re.match(r"https?:", s)], f"{page.name} loads a script from the network"


def test_the_search_index_is_embedded(site):
    script = (site / "search" / "search_index.js").read_text()
    assert script.startswith("var __index = ")
    index = json.loads(script.removeprefix("var __index = "))
    locations = {d["location"].split("#")[0] for d in index["docs"]}
    assert {"index.html", "usage.html", "api.html"} <= locations
    assert not [loc for loc in locations if loc.endswith("/")]


@pytest.mark.slow  # a browser's start and the search worker's index load: 10-40 s on 2 shared cores
@pytest.mark.skipif(not CHROMIUM, reason="chromium is not installed")
def test_search_works_from_file_urls(site, tmp_path):
    """A headless chromium opens usage.html from disk with a query: the search answers with matching pages."""
    url = (site / "usage.html").as_uri() + "?q=hierarchy"
    out = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path}",
         "--virtual-time-budget=10000", "--dump-dom", url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    found = re.search(r'md-search-result__meta">(\d+) matching documents?<', out.stdout)
    assert found and int(found.group(1)) >= 3, out.stdout[-2000:] + out.stderr[-2000:]

"""CITATION.cff and CHANGELOG.md say what the repository holds: the citation is valid CFF 1.2.0 for the version in
iosim/base/version.py, and every commit the changelog names is in this checkout's history, on the date it gives and
under the date heading it sits beneath (docs/versions.md states the policy they record)."""

from __future__ import annotations

import datetime
import pathlib
import re
import subprocess

import pytest

from iosim.base.version import __version__

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHANGELOG = ROOT / "CHANGELOG.md"
CFF_REQUIRED = ("cff-version", "message", "title", "authors")  # the keys CFF 1.2.0 requires
HASH = re.compile(r"`([0-9a-f]{7,40})`")  # a commit as the changelog writes it: `abc1234`
DATED = re.compile(r"`([0-9a-f]{7,40})` \((\d{4}-\d{2}-\d{2})\)")  # `abc1234` (2026-11-21)
PAPERS = {"2205.14135": "FlashAttention", "2402.07443": "I/O Complexity of Attention", "2410.09397": "Backward"}


def citation() -> dict:
    yaml = pytest.importorskip("yaml", reason="PyYAML (installed with the docs extra) reads CITATION.cff")
    with open(ROOT / "CITATION.cff", encoding="utf-8") as f:
        return yaml.safe_load(f)


def version_section(version: str) -> str:
    """The text of ``## [version]`` up to the next version heading."""
    text = CHANGELOG.read_text(encoding="utf-8")
    m = re.search(rf"^## \[{re.escape(version)}\][^\n]*\n(.*?)(?=^## \[|\Z)", text, flags=re.M | re.S)
    assert m, f"CHANGELOG.md has no section ## [{version}]"
    return m.group(0)


def history() -> dict[str, str]:
    """Every commit reachable from HEAD: full hash -> author date (YYYY-MM-DD). Skips outside a full git checkout."""

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)

    if git("rev-parse", "--is-inside-work-tree").stdout.strip() != "true":
        pytest.skip("not a git checkout (an sdist): the changelog's commits cannot be looked up")
    if git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip("a shallow clone holds only the newest commits of the history")
    out = git("log", "--format=%H %ad", "--date=short", "HEAD")
    assert out.returncode == 0, out.stderr
    return dict(line.split() for line in out.stdout.splitlines())


def resolve(short: str, commits: dict[str, str]) -> str:
    """The one commit of the history whose hash starts with ``short``."""
    hits = [h for h in commits if h.startswith(short)]
    assert len(hits) == 1, f"CHANGELOG.md names {short}: {len(hits)} commits of HEAD's history start with it"
    return hits[0]


def test_citation_is_cff_for_this_version():
    cff = citation()
    missing = [k for k in CFF_REQUIRED if k not in cff]
    assert not missing, f"CITATION.cff lacks {missing}"
    assert cff["cff-version"] == "1.2.0"
    assert cff["type"] == "software"
    assert str(cff["version"]) == __version__, "CITATION.cff's version is not iosim/base/version.py's"
    assert datetime.date.fromisoformat(str(cff["date-released"]))
    assert all(isinstance(a, dict) and ("name" in a or "family-names" in a) for a in cff["authors"])
    license_text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert license_text.startswith(f"{cff['license']} License"), "CITATION.cff's license is not LICENSE's"
    assert cff["abstract"].strip() and len(cff["keywords"]) >= 3


def test_citation_references_the_three_papers():
    refs = citation()["references"]
    for arxiv, words in PAPERS.items():
        found = [r for r in refs if any(arxiv in str(i["value"]) for i in r.get("identifiers", []))]
        assert len(found) == 1, f"CITATION.cff cites arXiv:{arxiv} {len(found)} times"
        ref = found[0]
        assert words in ref["title"] and ref["url"] == f"https://arxiv.org/abs/{arxiv}"
        assert ref["authors"] and all("family-names" in a for a in ref["authors"]) and int(ref["year"]) >= 2022


def test_citation_release_date_is_the_changelogs():
    heading = version_section(__version__).splitlines()[0]
    m = re.fullmatch(rf"## \[{re.escape(__version__)}\] - (\d{{4}}-\d{{2}}-\d{{2}})", heading)
    assert m, f"CHANGELOG.md's heading {heading!r} gives no release date"
    assert str(citation()["date-released"]) == m.group(1)


def test_changelog_has_the_current_version_and_its_changed_counts():
    section = version_section(__version__)
    assert "\n### Changed counts\n" in section
    text = CHANGELOG.read_text(encoding="utf-8")
    versions = re.findall(r"^## \[([^\]]+)\]", text, flags=re.M)
    released = [v for v in versions if v != "Unreleased"]
    assert released and released[0] == __version__, f"the newest version in CHANGELOG.md is not {__version__}"


def test_changelog_commits_are_in_the_history_on_their_dates():
    commits = history()
    text = CHANGELOG.read_text(encoding="utf-8")
    named = set(HASH.findall(text))
    assert len(named) >= 50, "CHANGELOG.md names too few commits to record the history"
    for short in sorted(named):
        resolve(short, commits)
    for short, date in DATED.findall(text):
        assert commits[resolve(short, commits)] == date, f"CHANGELOG.md dates {short} {date}"


def test_changelog_commits_sit_under_their_date_heading():
    commits = history()
    heading = None
    for line in CHANGELOG.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            m = re.fullmatch(r"#### (\d{4}-\d{2}-\d{2})", line)
            heading = m.group(1) if m else None
            continue
        if heading is not None:
            for short in HASH.findall(line):
                assert commits[resolve(short, commits)] == heading, f"{short} is listed under {heading}"

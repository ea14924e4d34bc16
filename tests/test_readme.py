"""The README and the docs pages say what the commands do today: every sample output block (marked
``<!-- sample: iosim ... -->``) is what the command prints, every Python block runs as written (a page's blocks in
order, in one namespace), and the README's first screen holds the two commands. docs/tutorial.md's blocks are run by
tests/test_tutorial.py, step by step."""

import pathlib
import re
import shlex

import pytest

from iosim.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
SAMPLE = re.compile(r"<!-- sample: (iosim [^>]*?) -->\n```[a-z]*\n(.*?)```", flags=re.S)
SAMPLES = [(page, cmd, block) for page in PAGES for cmd, block in SAMPLE.findall(page.read_text())]
PYTHON_PAGES = [p for p in PAGES if p.name != "tutorial.md" and "```python\n" in p.read_text()]
ERR = re.compile(r"\d\.\d\de[-+]\d\d")  # floating-point errors: their digits vary with the BLAS build
# A printed error matches the page's within this tolerance: both at float64 rounding level (below NOISE), or
# within a factor of FACTOR of each other (a float32 error's digits vary too; its order of magnitude does not).
NOISE, FACTOR = 1e-9, 10.0


def close(got: float, want: float) -> bool:
    if got == want or (got <= NOISE and want <= NOISE):
        return True
    return min(got, want) > 0 and max(got, want) / min(got, want) <= FACTOR


def name(page: pathlib.Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=[name(p) for p in PYTHON_PAGES])
def test_python_blocks_run(page, monkeypatch):
    monkeypatch.chdir(ROOT)  # the pages' paths (examples, docs/pebble) are the repository's, as the commands' are
    namespace: dict = {}
    for code in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S):
        exec(compile(code, name(page), "exec"), namespace)


def test_readme_has_python():
    assert README in PYTHON_PAGES


def test_first_screen_has_the_two_commands():
    first = "\n".join(README.read_text().splitlines()[:30])
    assert "iosim compare" in first
    assert "pytest" in first


def test_readme_is_short():
    assert len(README.read_text().splitlines()) <= 400  # a newcomer reads it in ten minutes; the rest is in docs/


def test_readme_has_samples():
    assert any(page == README and cmd == "iosim compare" for page, cmd, _ in SAMPLES)


@pytest.mark.parametrize(("page", "command", "block"), SAMPLES, ids=[f"{name(p)}: {c}" for p, c, _ in SAMPLES])
def test_sample_is_current(page, command, block, capsys):
    assert main(shlex.split(command)[1:]) == 0
    out = capsys.readouterr().out
    assert ERR.sub("<err>", out.strip()) == ERR.sub("<err>", block.strip())  # everything but the errors, exactly
    got, want = [float(x) for x in ERR.findall(out)], [float(x) for x in ERR.findall(block)]
    bad = [(g, w) for g, w in zip(got, want, strict=True) if not close(g, w)]
    assert not bad, f"errors beyond the tolerance (printed, {name(page)}): {bad}"


def test_error_tolerance():
    assert close(1.23e-16, 1.24e-16) and close(0.0, 2e-16) and close(3.1e-4, 2.9e-4)
    assert not close(1e-3, 0.0) and not close(3e-2, 1e-4)


def test_no_page_speaks_of_issue_numbers():
    for page in PAGES:
        hits = re.findall(r"\b[Ii]ssues? #?\d+", page.read_text())
        assert not hits, f"{name(page)} names {hits}: readers cannot see the tracker; name the claim or kernel"

"""The README's Python example runs as written, its first screen holds the two commands, and every sample output
block (marked ``<!-- sample: iosim ... -->``) is what the command prints today."""

import pathlib
import re
import shlex

import pytest

from iosim.cli import main

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
SAMPLES = re.findall(r"<!-- sample: (iosim [^>]*?) -->\n```[a-z]*\n(.*?)```", README.read_text(), flags=re.S)
ERR = re.compile(r"\d\.\d\de[-+]\d\d")  # floating-point errors: their digits vary with the BLAS build
# A printed error matches the README's within this tolerance: both at float64 rounding level (below NOISE), or
# within a factor of FACTOR of each other (a float32 error's digits vary too; its order of magnitude does not).
NOISE, FACTOR = 1e-9, 10.0


def close(got: float, want: float) -> bool:
    if got == want or (got <= NOISE and want <= NOISE):
        return True
    return min(got, want) > 0 and max(got, want) / min(got, want) <= FACTOR


def test_readme_python_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python example"
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})


def test_first_screen_has_the_two_commands():
    first = "\n".join(README.read_text().splitlines()[:30])
    assert "iosim compare" in first
    assert "pytest" in first


def test_readme_has_samples():
    assert any(cmd == "iosim compare" for cmd, _ in SAMPLES)


@pytest.mark.parametrize(("command", "block"), SAMPLES, ids=[c for c, _ in SAMPLES])
def test_readme_sample_is_current(command, block, capsys):
    assert main(shlex.split(command)[1:]) == 0
    out = capsys.readouterr().out
    assert ERR.sub("<err>", out.strip()) == ERR.sub("<err>", block.strip())  # everything but the errors, exactly
    got, want = [float(x) for x in ERR.findall(out)], [float(x) for x in ERR.findall(block)]
    bad = [(g, w) for g, w in zip(got, want, strict=True) if not close(g, w)]
    assert not bad, f"errors beyond the tolerance (printed, README): {bad}"


def test_error_tolerance():
    assert close(1.23e-16, 1.24e-16) and close(0.0, 2e-16) and close(3.1e-4, 2.9e-4)
    assert not close(1e-3, 0.0) and not close(3e-2, 1e-4)

"""The README's Python example runs as written, its first screen holds the two commands, and every sample output
block (marked ``<!-- sample: iosim ... -->``) is what the command prints today."""

import pathlib
import re
import shlex

import pytest

from iosim.cli import main

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
SAMPLES = re.findall(r"<!-- sample: (iosim [^>]*?) -->\n```[a-z]*\n(.*?)```", README.read_text(), flags=re.S)
ERR = re.compile(r"\d\.\d\de[-+]\d\d")  # floating-point error digits vary with the BLAS build: compared as a shape


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
    assert ERR.sub("<err>", out.strip()) == ERR.sub("<err>", block.strip())

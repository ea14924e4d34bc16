"""The README's Python example runs as written, and its first screen holds the two commands."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python example"
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})


def test_first_screen_has_the_two_commands():
    first = "\n".join(README.read_text().splitlines()[:30])
    assert "iosim compare" in first
    assert "pytest" in first

"""Output blocks under commands are what the commands print. A ``bash`` block holding one ``iosim`` command,
followed directly (blank lines only) by a ``text`` block, shows that command's output: it is run here in a fresh
folder (the repository's files by their path from the root) and the output compared line by line. Only what changes
from run to run is normalised: the seconds a count took, Numba's first-compile notice, the folders' paths, and
floating-point errors (their digits vary with the BLAS build: within
a factor of 10, as tests/test_readme.py has it). A command shown failing (``# exit N``) is compared on stdout and
its stderr together, with that exit code.

Pages checked elsewhere are left out: ``<!-- sample: ... -->`` blocks (tests/test_readme.py), docs/sparse-indices.md
(tests/test_sparse_indices_doc.py) and docs/kv-cache.md's ``console`` blocks (tests/test_kernels_views.py). A kernel
counted under its interpreter takes 5-25 s on 2 cores: the first-kernel page's runs in the default suite, the
others under ``-m slow`` (tests/test_doc_commands.py marks the same commands slow)."""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import subprocess
import sys
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
ELSEWHERE = {"sparse-indices.md"}
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in ELSEWHERE)]
PAIR = re.compile(r"```bash\n([^`]*?)```\n\n+```text\n(.*?)```", flags=re.S)
FAST = {"iosim kernel iosim/kernels/examples/first_kernel.py --N 256 --d 64 --like flash2"}
INTERPRETED = ("iosim kernel ", "iosim check ")
ERR = re.compile(r"\d+(?:\.\d+)?e[-+]\d\d|(?<=max error )\d+\.\d+")  # an error's digits; its magnitude is compared
SECONDS = re.compile(r"(?:(?<=\bin )|(?<=\btook ))\d+(?:\.\d+)? ?(?:s|ms)\b")


def pairs() -> list[tuple[str, str, str]]:
    """(page, command, printed) for each bash block of one iosim command with a text block right under it."""
    found = []
    for page in PAGES:
        for block, printed in PAIR.findall(page.read_text()):
            lines = [x for x in block.replace("\\\n", " ").splitlines() if x.strip() and not x.startswith("#")]
            seen = {(cmd, text) for _, cmd, text in found}  # a command shown on two pages alike runs once
            if len(lines) == 1 and lines[0].startswith("iosim ") and (lines[0].strip(), printed) not in seen:
                found.append((str(page.relative_to(ROOT)), lines[0].strip(), printed))
    return found


PAIRS = pairs()


def normal(text: str) -> str:
    lines = [x.rstrip() for x in text.strip("\n").splitlines() if not x.startswith("iosim: compiling Numba kernels")]
    return ERR.sub("<err>", SECONDS.sub("<seconds>", "\n".join(lines)))


def close(got: float, want: float) -> bool:
    if got == want or max(got, want) <= 1e-9:
        return True
    return min(got, want) > 0 and max(got, want) / min(got, want) <= 10.0


def test_the_pages_show_outputs():
    assert len(PAIRS) >= 20
    assert any(cmd in FAST for _, cmd, _ in PAIRS), "the first-kernel page's command and table"
    assert {page for page, _, _ in PAIRS} >= {"docs/kernel-first.md", "docs/usage.md", "docs/mask-efficiency.md"}


def test_normalising_keeps_the_counts():
    timed = "triton: 1 launch(es), 4 programs, counted in 2.05 s\n"
    assert normal(timed) == "triton: 1 launch(es), 4 programs, counted in <seconds>"
    assert normal("Q   16,384  0\nmax error 0.000191, bound 0.0252") == "Q   16,384  0\nmax error <err>, bound 0.0252"
    assert normal("K 65,536") != normal("K 65,537")


def params():
    out = []
    for page, cmd, printed in PAIRS:
        slow = cmd.split("  #")[0].strip() not in FAST and cmd.startswith(INTERPRETED)
        out.append(pytest.param(cmd, printed, id=f"{page}: {cmd[:100]}", marks=[pytest.mark.slow] if slow else []))
    return out


def run_alone(args: list[str], cwd: pathlib.Path):
    """The command in a fresh process, without pytest's variables: the Triton tutorial's file (flash-mlm's copy)
    keeps a single autotune config when ``PYTEST_VERSION`` is set, and its launch line then reads "its one config"
    where the reader's command prints "config 25 of 36"."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run([sys.executable, "-m", "iosim.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=1800, stdin=subprocess.DEVNULL, env=env)  # fmt: skip
    return done.returncode, types.SimpleNamespace(out=done.stdout, err=done.stderr)


def arguments(line: str) -> list[str]:
    """The command's words, a repository file among them by its path from the root (the command runs in a fresh
    folder, where whatever it writes lands)."""
    return [str(ROOT / a) if "/" in a and (ROOT / a).is_file() else a for a in shlex.split(line)[1:]]


@pytest.mark.parametrize("cmd, printed", params())
def test_the_output_under_a_command_is_what_it_prints(cmd, printed, capsys, tmp_path):
    from iosim.cli import main

    if cmd.startswith(INTERPRETED):
        pytest.importorskip("triton" if "pallas" not in cmd else "jax")
    line, _, comment = cmd.partition("  #")
    said = re.search(r"\bexit (\d)\b", comment)
    if cmd.startswith(INTERPRETED):  # as the reader runs it, from the root: a process of its own (see run_alone)
        rc, out = run_alone(shlex.split(line)[1:], ROOT)
    else:
        old = os.getcwd()
        os.chdir(tmp_path)
        try:
            rc = main(arguments(line))
        finally:
            os.chdir(old)
        out = capsys.readouterr()
    assert rc == (int(said.group(1)) if said else 0), out.out + out.err
    got = (out.out if rc == 0 else out.out + out.err).replace(f"{ROOT}/", "").replace(f"{tmp_path}/", "")
    assert normal(got) == normal(printed), f"{cmd}\nprinted today:\n{got}"
    errors = [(float(g), float(w)) for g, w in zip(ERR.findall(got), ERR.findall(printed), strict=True)]
    assert all(close(g, w) for g, w in errors), f"errors beyond a factor of 10: {errors}"


def test_the_first_kernel_page_shows_the_whole_file():
    """docs/kernel-first.md's code block is iosim/kernels/examples/first_kernel.py, every line of it."""
    page = (ROOT / "docs" / "kernel-first.md").read_text()
    blocks = re.findall(r"```py\n(.*?)```", page, flags=re.S)
    source = (ROOT / "iosim" / "kernels" / "examples" / "first_kernel.py").read_text()
    assert blocks == [source]
    kernel = source[source.index("@triton.jit") : source.index("\ndef launch")].strip().splitlines()
    assert len(kernel) <= 30 and len(source.splitlines()) <= 60  # a kernel and launcher read on one screen

"""docs/sparse-indices.md shows each command's real output: every ``bash`` block of one ``iosim`` command followed
by a ``text`` block is run here from the repository root and its output (stdout; a command shown failing: its
error line on stderr, and the exit code it says) compared line by line with the pasted text."""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import re
import shlex

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "sparse-indices.md"
PAIRS = re.findall(r"```bash\n(iosim [^\n]*)\n```\n\n```text\n(.*?)\n```", PAGE.read_text(), flags=re.S)


def test_the_page_pastes_outputs():
    assert len(PAIRS) >= 9
    policies = " ".join(cmd for cmd, _ in PAIRS)
    for word in ("per-query", "group:4", "gqa", "gather", "--q-block", "--kv-format fp8_ds_mla", "exit 2"):
        assert word in policies


@pytest.mark.parametrize("cmd, pasted", PAIRS, ids=[c[:100] for c, _ in PAIRS])
def test_pasted_output_is_what_the_command_prints(cmd, pasted):
    from iosim.cli import main

    line, _, comment = cmd.partition("  #")
    want_rc = int(re.search(r"exit (\d)", comment).group(1)) if "exit" in comment else 0
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(shlex.split(line)[1:])
    finally:
        os.chdir(old)
    assert rc == want_rc
    got = out.getvalue() if rc == 0 else err.getvalue().strip().splitlines()[-1]
    assert [x.rstrip() for x in got.rstrip("\n").splitlines()] == pasted.splitlines()

"""``iosim show --html`` and ``iosim compare`` options that would say nothing: refused in one line naming them.

The --html page steps through every event and shows every view itself, so a picture's options (--view, --step) and
--text's (--text itself, --limit) say nothing to it: each is refused with --html, in one line saying where it
applies (exit 2, nothing written, nothing on stdout; tests/test_hostile.py's harness). Without --html they keep
their meaning (--text's default of 200 events included). ``compare --Br`` above M names --Br.
"""

from __future__ import annotations

import re

import pytest
from test_hostile import ids, run_cli
from test_pebble_options import assert_refused_quietly

SIZES = ["--N", "16", "--d", "4", "--M", "256"]
PAGE = ["show", "flash2", *SIZES, "--html", "-o", "{tmp}/p.html"]
NOT_ON_A_PAGE = [
    (["--text"], ["--text", "choose one"]),
    (["--view", "tiles"], ["--view", "every view"]),
    (["--view", "step"], ["--view", "every view"]),
    (["--view", "all"], ["--view", "every view"]),
    (["--step", "0"], ["--step", "every event"]),
    (["--step", "3"], ["--step", "every event"]),
    (["--limit", "0"], ["--limit", "--text"]),
    (["--limit", "5"], ["--limit", "--text"]),
]
CASES = [([*PAGE, *option], words) for option, words in NOT_ON_A_PAGE]
CASES += [  # the grid page too, and the option given before --html
    ([*PAGE, "--grid-N", "8,16", "--view", "step"], ["--view"]),
    (["show", "flash2", *SIZES, "--limit", "5", "--html", "-o", "{tmp}/p.html"], ["--limit"]),
]


@pytest.mark.parametrize(("argv", "words"), CASES, ids=ids(CASES))
def test_the_page_refuses_the_options_of_a_picture_or_of_text(argv, words, tmp_path, monkeypatch, capsys):
    assert_refused_quietly(argv, words, tmp_path, monkeypatch, capsys)


def test_text_keeps_its_limit_and_its_default(tmp_path, monkeypatch, capsys):
    """Without --html, --limit still bounds --text (default 200 events): counted from the printed lines."""
    argv = ["show", "flash2", "--N", "64", "--d", "4", "--M", "200", "--text"]
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()  # run_cli's folders: one per run
    rc, lines, _, out = run_cli(argv, tmp_path / "a", monkeypatch, capsys)
    assert rc == 0, lines
    n = int(re.search(r"; ([\d,]+) events", out).group(1).replace(",", ""))
    assert n > 200  # so that the default limit shows
    steps = [x for x in out.splitlines() if x.startswith("step ")]
    assert len(steps) == 200 and f"... {n - 200:,} more events" in out
    rc, lines, _, out = run_cli([*argv, "--limit", "7"], tmp_path / "b", monkeypatch, capsys)
    assert rc == 0 and len([x for x in out.splitlines() if x.startswith("step ")]) == 7
    assert f"... {n - 7:,} more events" in out


def test_compare_names_a_row_block_above_M(tmp_path, monkeypatch, capsys):
    """A --Br whose working set is above M in every schedule: the line names --Br (not M)."""
    argv = ["compare", "--N", "64", "--d", "8", "--M", "100", "--Br", "1000", "--count-only"]
    assert_refused_quietly(argv, ["--Br", "above M"], tmp_path, monkeypatch, capsys)

"""``iosim pebble`` options that would say nothing: each is refused in one line naming it, never ignored.

A named graph (matmul:2x2x2, attention:4x2, ...) is built from its name alone (iosim.pebble.graph), so the options of
an iosim run (--causal, --backward, --mask, --kv-policy, --Br, --Bc, --B, --gqa) apply with --from-run only: on a
graph game, whichever way it is played (a schedule, --greedy, --picture, --html, a folder of exercises), each is
refused. A folder that does not exist is named, and a folder of exercises with a misnamed, unknown or binary file
names that file. Every case: exit 2, one line on stderr naming the option, no traceback, nothing written, nothing
on stdout (tests/test_hostile.py's harness).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_hostile import ids, run_cli

DOCS = Path(__file__).resolve().parent.parent / "docs" / "pebble"
SCHEDULE = str(DOCS / "matmul-2x2x2-M4.txt")

# every way a named graph is played, and a folder of exercises
GAMES = {
    "play": ["pebble", "matmul:2x2x2", "--M", "4", SCHEDULE],
    "greedy": ["pebble", "matmul:2x2x2", "--M", "4", "--greedy"],
    "picture": ["pebble", "matmul:2x2x2", "--M", "4", "--greedy", "--picture", "{tmp}/p.png"],
    "html": ["pebble", "matmul:2x2x2", "--M", "4", SCHEDULE, "--html", "{tmp}/p.html"],
    "folder": ["pebble", str(DOCS), "--html", "{tmp}/p.html"],
}
# the options of a run, each with a value it takes under --from-run (the defaults given explicitly among them)
RUN_OPTIONS = [
    ["--causal"],
    ["--backward"],
    ["--mask", "causal"],
    ["--mask", "window:1"],
    ["--kv-policy", "skip"],
    ["--Br", "2"],
    ["--Bc", "2"],
    ["--B", "2"],
    ["--gqa", "packed"],
    ["--gqa", "per-head"],
]
CASES = [
    ([*game, *option], [option[0], "applies with --from-run"]) for game in GAMES.values() for option in RUN_OPTIONS
]


def assert_refused_quietly(argv, words, tmp_path, monkeypatch, capsys):
    """Exit 2, one stderr line holding ``words``, no traceback, no file left, nothing on stdout."""
    rc, lines, left, out = run_cli(argv, tmp_path, monkeypatch, capsys)
    assert rc == 2, lines
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert not left, f"left behind: {sorted(map(str, left))}"
    assert out == "", out


@pytest.mark.parametrize(("argv", "words"), CASES, ids=ids(CASES))
def test_a_graph_game_refuses_the_options_of_a_run(argv, words, tmp_path, monkeypatch, capsys):
    assert_refused_quietly(argv, words, tmp_path, monkeypatch, capsys)


def test_the_same_games_play_without_them(tmp_path, monkeypatch, capsys):
    """The control: the games above, without the option, are played (exit 0); the pages are tests/test_html_page.py's
    (each searches the optimum: seconds)."""
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()  # run_cli's folders: one per run
    rc, lines, _, out = run_cli(GAMES["play"], tmp_path / "a", monkeypatch, capsys)
    assert rc == 0 and "legal: yes" in out, (lines, out)
    rc, lines, _, out = run_cli(GAMES["greedy"], tmp_path / "b", monkeypatch, capsys)
    assert rc == 0 and "greedy schedule with M = 4" in out, (lines, out)


def test_from_run_still_takes_them(tmp_path, monkeypatch, capsys):
    """--gqa per-head (now refused on a graph, its default unset) is still the default of a problem's pebbling."""
    argv = ["pebble", "--from-run", "all", "--heads", "2", "--kv-heads", "1", "--Nq", "2", "--Nk", "2", "--d", "2"]
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()  # run_cli's folders: one per run
    rc, lines, _, out = run_cli([*argv, "--M", "60"], tmp_path / "a", monkeypatch, capsys)
    assert rc == 0, (lines, out)
    assert "gqa=per-head" in out.splitlines()[0], out
    rc, lines, _, out = run_cli([*argv, "--M", "60", "--gqa", "packed"], tmp_path / "b", monkeypatch, capsys)
    assert rc == 0 and "gqa=packed" in out.splitlines()[0], (lines, out)


# a graph or folder that is not there, or a folder that is not a page's
FOLDERS = [
    (["pebble", "{tmp}/no-such-folder", "--html", "{tmp}/p.html"], ["graph", "no-such-folder", "folder"]),
    (["pebble", "{tmp}/no-such-folder", "--M", "4", "--greedy"], ["graph", "no-such-folder", "folder"]),
    (["pebble", "{tmp}/no-such-folder"], ["graph", "no-such-folder", "folder"]),
    (["pebble", "{tmp}/adir", "--M", "4", "--greedy"], ["graph", "adir", "--html"]),
    (["pebble", "conv:2x2", "--M", "4", "--greedy"], ["graph", "conv:2x2"]),
]


@pytest.mark.parametrize(("argv", "words"), FOLDERS, ids=ids(FOLDERS))
def test_a_missing_folder_is_named(argv, words, tmp_path, monkeypatch, capsys):
    assert_refused_quietly(argv, words, tmp_path, monkeypatch, capsys)


GOOD = (DOCS / "matmul-2x2x2-M4.txt").read_text()
BAD_FILES = [  # (file name, its bytes, what the line says)
    ("foo-M4.txt", GOOD.encode(), ["foo-M4.txt", "GRAPH-SIZES-MM.txt"]),
    ("matmul-2x2x2-Mx.txt", GOOD.encode(), ["matmul-2x2x2-Mx.txt", "GRAPH-SIZES-MM.txt"]),
    ("matmul-2x2x2-M.txt", GOOD.encode(), ["matmul-2x2x2-M.txt", "GRAPH-SIZES-MM.txt"]),
    ("conv-2x2-M4.txt", GOOD.encode(), ["conv-2x2-M4.txt", "graph"]),
    ("matmul-2x2x2-M3.txt", bytes(range(128, 256)) * 4, ["matmul-2x2x2-M3.txt", "text"]),
]


@pytest.mark.parametrize(("name", "data", "words"), BAD_FILES, ids=[c[0] for c in BAD_FILES])
def test_a_folder_of_exercises_with_a_bad_file_names_it(name, data, words, tmp_path, monkeypatch, capsys):
    folder = tmp_path / "ex"
    folder.mkdir()
    (folder / "matmul-2x2x2-M4.txt").write_text(GOOD)  # one good exercise beside the bad one
    (folder / name).write_bytes(data)
    assert_refused_quietly(["pebble", str(folder), "--html", "{tmp}/p.html"], ["graph", *words], tmp_path,
                           monkeypatch, capsys)  # fmt: skip

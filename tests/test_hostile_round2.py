"""Hostile inputs, round 2: the classes found against the problem options, the output paths as root, the pebble
graphs and the Python API, each tried on every command or function it applies to. A command-line case asserts exit
code 2, one line on stderr naming the parameter, no traceback and no file left behind (tests/test_hostile.py's
harness)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from iosim.memory_model import Memory
from test_hostile import assert_refused, ids, run_cli

import iosim
from iosim import InputError

S = ["--d", "4", "--M", "400"]
# every command that takes a problem's shape, with what else it needs
PROBLEM_COMMANDS = {
    "run": ["run", "flash2", "--count-only"],
    "compare": ["compare", "--count-only"],
    "trace": ["trace", "flash2", "--count-only", "-o", "{tmp}/t.csv"],
    "show": ["show", "flash2", "--text"],
    "replay": ["replay", "flash2", "--policy", "lru"],
    "bounds": ["bounds"],
    "pebble": ["pebble", "--from-run", "flash2"],
}

# 1. a zero or a negative problem size is refused alike on every command (bounds turned a zero into a default)
SHAPE_CASES = []
for cmd in PROBLEM_COMMANDS.values():
    for option in ("--batch", "--heads", "--kv-heads", "--Nq", "--Nk", "--dqk", "--dv"):
        for value in ("0", "-3"):
            rest = ["--Nq", "4", "--Nk", "8"] if option not in ("--Nq", "--Nk") else ["--Nq", "4", "--Nk", "8"]
            rest = [a for i, a in enumerate(rest) if not (a == option or (i and rest[i - 1] == option))]
            SHAPE_CASES.append(([*cmd, *rest, *S, option, value], [option, "must be an integer from 1"]))


for option in ("--batch", "--heads", "--kv-heads", "--Nq", "--Nk", "--dv", "--N", "--d"):
    for value in ("0", "-3"):
        base = {"--N": "64", "--d": "8"}
        argv = ["hierarchy", "flash2", "--P", "2", "--C", "1024", "--M", "600"]
        argv += [x for k, v in base.items() if k != option for x in (k, v)]
        SHAPE_CASES.append(([*argv, option, value], [option, "must be"]))


@pytest.mark.parametrize(("argv", "words"), SHAPE_CASES, ids=ids(SHAPE_CASES))
def test_problem_sizes_are_positive_on_every_command(argv, words, tmp_path, monkeypatch, capsys):
    assert_refused(argv, words, tmp_path, monkeypatch, capsys)


# 2. contradictions: --N is N_q = N_k and --d is d_qk, so each is refused beside the options it would contradict
HIER = ["hierarchy", "flash2", "--d", "8", "--P", "2", "--C", "1024", "--M", "600"]
CONTRADICTIONS = [
    ([*HIER, "--N", "64", "--Nq", "8"], ["--N", "not both"]),
    ([*HIER, "--N", "64", "--Nk", "8"], ["--N", "not both"]),
]
for cmd in PROBLEM_COMMANDS.values():
    CONTRADICTIONS += [
        ([*cmd, "--N", "8", "--Nq", "4", *S], ["--N", "not both"]),
        ([*cmd, "--N", "8", "--Nk", "16", *S], ["--N", "not both"]),
        ([*cmd, "--N", "8", "--d", "4", "--dqk", "8", "--M", "400"], ["--d", "not both"]),
    ]


@pytest.mark.parametrize(("argv", "words"), CONTRADICTIONS, ids=ids(CONTRADICTIONS))
def test_contradicting_sizes_are_refused(argv, words, tmp_path, monkeypatch, capsys):
    assert_refused(argv, words, tmp_path, monkeypatch, capsys)


# 3. output paths where root passes os.access but no file can be made (/proc, /sys): refused before any work
WRITERS = [
    ["trace", "flash2", "--N", "16", *S, "-o", "{dir}/x.csv"],
    ["show", "flash2", "--N", "16", *S, "-o", "{dir}/x.png"],
    ["show", "flash2", "--N", "16", *S, "--html", "-o", "{dir}/x.html"],
    ["compare", "--N", "16", *S, "--count-only", "--html", "{dir}/x.html"],
    ["sweep", "--algorithm", "flash2", "--N", "16", *S, "--out", "{dir}/x.csv"],
    ["sweep", "--algorithm", "flash2", "--N", "16", *S, "--cache", "{dir}/x.jsonl"],
    ["experiments", "run", "crossover", "--quick", "--out", "{dir}/results"],
    ["pebble", "matmul:2x2x2", "--M", "4", "--greedy", "--picture", "{dir}/p.png"],
    ["pebble", "matmul:2x2x2", "--M", "4", "--html", "{dir}/p.html"],
]
ROOT_PATHS = [
    ([a.replace("{dir}", d) for a in argv], ["files can be written"])
    for argv in WRITERS
    for d in ("/proc", "/sys")
    if os.path.isdir(d)
]


@pytest.mark.parametrize(("argv", "words"), ROOT_PATHS, ids=ids(ROOT_PATHS))
def test_output_paths_that_no_file_can_be_made_in(argv, words, tmp_path, monkeypatch, capsys):
    assert_refused(argv, words, tmp_path, monkeypatch, capsys)


# 4. the pebble game: a named graph has its sizes in its name; --greedy --picture draws what it found
GRAPH_OPTIONS = [
    (["pebble", "matmul:2x2x2", "--M", "4", "--greedy", option, "2"], [option, "applies with --from-run"])
    for option in ("--N", "--d", "--batch", "--heads", "--kv-heads", "--Nq", "--Nk", "--dqk", "--dv")
]
SMALL = [
    (
        ["hierarchy", "flash2", "--N", "1", "--d", "1", "--batch", "65536", "--heads", "65536", "--device", "H100"],
        ["limit is 1 hour"],
    ),  # refused before the layout of 4 billion thread blocks is allocated (it took 40 GiB)
    (["experiments", "list", "extra"], ["experiments list", "takes no name"]),
    (
        [
            "bounds",
            "--Nq",
            "1048576",
            "--Nk",
            "1048576",
            "--d",
            "64",
            "--M",
            "65536",
            "--heads",
            "8",
            "--mask",
            "random:1e-9",
        ],
        ["allow_long", "--yes"],
    ),  # fmt: skip
]


@pytest.mark.parametrize(("argv", "words"), GRAPH_OPTIONS + SMALL, ids=ids(GRAPH_OPTIONS + SMALL))
def test_options_that_would_be_ignored_are_refused(argv, words, tmp_path, monkeypatch, capsys):
    assert_refused(argv, words, tmp_path, monkeypatch, capsys)


@pytest.mark.parametrize("search", ["--greedy", pytest.param("--optimum", marks=pytest.mark.slow)])  # optimum: 11 s
def test_a_search_draws_the_picture_it_was_asked_for(search, tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")
    rc, lines, left, out = run_cli(
        ["pebble", "matmul:2x2x2", "--M", "4", search, "--picture", "{tmp}/p.png"], tmp_path, monkeypatch, capsys
    )
    assert rc == 0 and (tmp_path / "p.png").stat().st_size > 1000 and "wrote" in out


# 5. the Python API: each mistake one InputError naming the parameter
def _tile_data():
    m = Memory(1000)
    A = m.slow("A", np.ones((4, 4)))
    m.load(A, (0, 2), (0, 2)).data = np.zeros((3, 3))


def _alloc(fill):
    m = Memory(1000)
    m.alloc(m.slow("B", shape=(4, 4)), (0, 2), (0, 2), fill=fill)


API = [
    (lambda: iosim.sweep({"algorithm": "flash2", "N": 8, "d": 4, "M": 200}, chunk_size=0), "chunk_size"),
    (lambda: iosim.sweep({"algorithm": "flash2", "N": 8, "d": 4, "M": 200}, chunk_size=-2), "chunk_size"),
    (lambda: iosim.sweep({"algorithm": "flash2", "N": 8, "d": 4, "M": 200}, chunk_size=True), "chunk_size"),
    (lambda: iosim.sweep({"algorithm": "flash2", "N": 8, "d": 4, "M": 200}, chunk_size=2.5), "chunk_size"),
    (_tile_data, "A tile data"),
    (lambda: _alloc("x"), "fill"),
    (lambda: _alloc(None), "fill"),
    (lambda: _alloc(True), "fill"),
    (lambda: iosim.run("flash2", N=8, d=4), "M"),
    (lambda: iosim.run("flash2", 1000, N=8, d=4), "schedule"),
]


@pytest.mark.parametrize(("call", "parameter"), API, ids=[str(i) for i in range(len(API))])
def test_api_mistakes_are_one_input_error(call, parameter):
    with pytest.raises(InputError) as e:
        call()
    assert str(e.value).startswith(parameter + " ") and "\n" not in str(e.value)


@pytest.mark.parametrize("suffix", [".csv", ".npy"])
@pytest.mark.parametrize("damage", ["header", "rows"])
def test_a_corrupt_trace_names_the_file(suffix, damage, tmp_path):
    from iosim.views.trace_io import read_trace, write_trace

    t = iosim.run("flash2", N=16, d=4, M=200, trace=True).trace
    path = tmp_path / f"t{suffix}"
    write_trace(t, path)
    if suffix == ".csv":
        lines = path.read_text().splitlines()
        if damage == "header":
            lines[0] = "# iosim trace {not json"
        else:
            lines[3] = "load,Q,not-a-number"
        path.write_text("\n".join(lines) + "\n")
    elif damage == "header":
        path.with_suffix(".json").write_text("{broken")
    else:
        path.write_bytes(b"not a numpy file")
    with pytest.raises(InputError, match=r"^trace must be a trace iosim wrote") as e:
        read_trace(path)
    assert str(path) in str(e.value)


# 6. the memory guard reads every limit the process lives under, not only MemAvailable
def test_available_memory_heeds_ulimit_v():
    import subprocess
    import sys

    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, resource.RLIM_INFINITY)); "
        "from iosim.memory_model.core import available_bytes; print(available_bytes())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert 0 < int(out.stdout) < 3 * 2**30


def test_available_memory_heeds_a_cgroup_limit(tmp_path, monkeypatch):
    from iosim.memory_model import core

    (tmp_path / "memory.max").write_text("1073741824\n")
    (tmp_path / "memory.current").write_text("268435456\n")
    real_open = open

    def fake_open(path, *args, **kwargs):
        path = str(path)
        if path == "/proc/self/cgroup":
            return real_open(tmp_path / "cgroup", *args, **kwargs)
        if path.startswith("/sys/fs/cgroup/jail/"):
            return real_open(tmp_path / path.rsplit("/", 1)[1], *args, **kwargs)
        return real_open(path, *args, **kwargs)

    (tmp_path / "cgroup").write_text("0::/jail\n")
    monkeypatch.setattr("builtins.open", fake_open)
    assert core._cgroup_available() == 1073741824 - 268435456
    assert core.available_bytes() <= 1073741824 - 268435456


def test_a_count_only_trace_too_large_is_named_as_a_trace(tmp_path, monkeypatch, capsys):
    argv = ["trace", "flash2", "--N", "1000000", "--d", "64", "--M", "20000", "--count-only", "-o", "{tmp}/x.csv"]
    rc, lines, left, _ = run_cli(argv, tmp_path, monkeypatch, capsys)
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("iosim: error: trace needs about") and not left
    assert "count_only" not in lines[0] and "numeric" not in lines[0]


@pytest.mark.parametrize(
    "argv",
    [
        [
            "compare",
            "--heads",
            "4",
            "--kv-heads",
            "2",
            "--Nq",
            "10",
            "--Nk",
            "40",
            "--d",
            "4",
            "--M",
            "1000",
            "--count-only",
        ],  # compare's default N is not typed: no contradiction with --Nq, --Nk
        ["compare", "--dqk", "8", "--Nq", "40", "--Nk", "40", "--M", "1000", "--count-only"],  # one head, by --dqk
        ["compare", "--dqk", "8", "--Nq", "40", "--Nk", "40", "--M", "1000", "--count-only", "--backward"],
    ],  # fmt: skip
    ids=["default N", "one head by dqk", "one head by dqk, backward"],
)
def test_compare_problems_that_are_one_head_or_use_defaults(argv, tmp_path, monkeypatch, capsys):
    rc, lines, _, out = run_cli(argv, tmp_path, monkeypatch, capsys)
    assert rc == 0 and not lines and "flash2" in out  # a KeyError ('thread_blocks') ended the one-head ones


# 3b. a FIFO, a device or a socket as an output path: refused before any work (a FIFO blocked every writer forever:
# the path check opened it to append; a cache linked to /dev/full was read until memory ran out)
def _special(path: str, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    else:  # a link to a character device that never ends when read
        os.symlink("/dev/zero", path)


SPECIAL = [
    ([a.replace("{dir}", "{tmp}") for a in argv], kind)
    for argv in WRITERS
    if not any("results" in a for a in argv)  # experiments --out is a folder (a FIFO there: "must be a folder")
    for kind in ("fifo", "device")
]


@pytest.mark.parametrize(("argv", "kind"), SPECIAL, ids=[f"{k} {' '.join(a[:2])} {a[-2]}" for a, k in SPECIAL])
def test_a_fifo_or_device_as_output_is_refused_before_any_work(argv, kind, tmp_path, monkeypatch, capsys):
    import signal

    target = next(a for a in argv if "{tmp}" in a).replace("{tmp}", str(tmp_path))
    _special(target, kind)
    old = signal.signal(signal.SIGALRM, lambda *_: pytest.fail(f"blocked on {target}"))
    signal.alarm(120)
    try:
        rc, lines, left, out = run_cli(argv, tmp_path, monkeypatch, capsys)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert rc == 2 and len(lines) == 1 and "FIFO, device or socket" in lines[0], lines
    assert not left and out == "", (left, out)

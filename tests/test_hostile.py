"""Issue 21: every class of hostile input, tried on every command and API function it applies to.

Each command-line case asserts exit code 2, exactly one line on stderr naming the parameter (and the accepted range
or formats where there is one), and that no file was left behind; each API case asserts the documented
InputError (or ScheduleError / ValueError of the memory model) naming the parameter. The classes:

1. the long-run rule (iosim.runner.estimate): over a minute needs --yes / allow_long=True, over an hour is refused;
2. masks whose pattern would not fit in memory: refused up front with the mask and the size;
3. output paths (iosim.base.outputs, options.output_file): checked before any work;
4. user algorithms (iosim.register): checked at registration and at first use;
5. the cross-check's arguments (iosim.check / iosim check);
6. integer ranges;
7. silent coercions (booleans are booleans, counts are non-negative, enumerations one of their values);
8. the pebble game.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from iosim.memory_model import Memory

import iosim
from iosim import InputError, ScheduleError
from iosim.cli import main

S = ["--N", "32", "--d", "4", "--M", "200"]  # small sizes: a case that slipped through would still be quick
BIG = str(2**41)
HUGE = str(2**70)


# --------------------------------------------------------------------------------------------- the CLI harness
def run_cli(argv, tmp_path, monkeypatch, capsys):
    """Run ``iosim argv`` in-process in an empty folder (with a file and a folder to aim at): exit code, the
    stderr lines (the compile notice aside) and the files it left behind."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile.txt").write_text("x")
    (tmp_path / "adir").mkdir()
    for suffix in (".csv", ".png", ".gif", ".jsonl"):
        (tmp_path / f"d{suffix}").mkdir()
    before = set(tmp_path.rglob("*"))
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    captured = capsys.readouterr()
    lines = [x for x in captured.err.splitlines() if x.strip() and not x.startswith("iosim: compiling")]
    return rc, lines, set(tmp_path.rglob("*")) - before, captured.out


def assert_refused(argv, words, tmp_path, monkeypatch, capsys):
    rc, lines, left, _ = run_cli(argv, tmp_path, monkeypatch, capsys)
    assert rc == 2, lines
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert not left, f"left behind: {sorted(map(str, left))}"


def ids(cases):
    return [" ".join(c[0])[:90] for c in cases]


# ---------------------------------------------------------------------------------------------- 3. output paths
MISSING, IN_FILE = "{tmp}/missing/x", "{tmp}/afile.txt/x"
PATH_CASES = []
SWEEP = ["sweep", "--algorithm", "flash2", "--N", "32", "--d", "4", "--M", "200"]
# (command, option, a good suffix, a bad one, whether missing folders are created: sweep creates them)
for cmd, option, good, bad_ext, creates in [
    (["trace", "flash2", *S], "-o", ".csv", ".txt", False),
    (["show", "flash2", *S], "-o", ".png", ".txt", False),
    (["show", "flash2", *S, "--view", "animate"], "-o", ".gif", ".png", False),
    (["pebble", "matmul:2x2x2", "--M", "4"], "--picture", ".png", ".gif", False),
    (SWEEP, "--out", ".csv", ".xlsx", True),
    (SWEEP, "--cache", ".jsonl", ".csv", True),
]:
    name = "--output" if option == "-o" else option
    PATH_CASES += [
        ([*cmd, option, IN_FILE + good], [name, "is a file"]),
        ([*cmd, option, "{tmp}/d" + good], [name, "not an existing folder"]),
        ([*cmd, option, "{tmp}/x" + bad_ext], [name, "must end in", good]),
        ([*cmd, option, "{tmp}/noext"], [name, "must end in"]),
    ]
    if not creates:
        PATH_CASES.append(([*cmd, option, MISSING + good], [name, "existing folder"]))
PATH_CASES += [
    (["show", "flash2", *S, "--view", "all", "-o", "{tmp}/x.txt"], ["--output", "stem"]),
    (["show", "flash2", *S, "--view", "all", "-o", "{tmp}/missing/x"], ["--output", "existing folder"]),
    (["experiments", "run", "01", "--out", "{tmp}/afile.txt"], ["--out", "not an existing file"]),
    (["experiments", "run", "01", "--out", "{tmp}/afile.txt/sub"], ["--out", "is a file"]),
]


@pytest.mark.parametrize(("argv", "words"), PATH_CASES, ids=ids(PATH_CASES))
def test_output_paths_checked_before_any_work(argv, words, tmp_path, monkeypatch, capsys):
    assert_refused(argv, words, tmp_path, monkeypatch, capsys)


def test_show_writes_the_file_it_names(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    rc, _, left, out = run_cli(["show", "flash2", *S, "-o", "{tmp}/x.png"], tmp_path, monkeypatch, capsys)
    assert rc == 0 and {p.name for p in left} == {"x.png"} and f"wrote {tmp_path / 'x.png'}" in out


def _traced():
    return iosim.run("flash2", N=16, d=4, M=200, count_only=True, trace=True)


def _write_trace(path):
    from iosim.views.trace_io import write_trace

    return write_trace(_traced().trace, path)


def _draw(name, path):
    from iosim.views import show

    return getattr(show, name)(_traced(), path)


@pytest.mark.parametrize(
    ("call", "parameter"),
    [
        (lambda t: _write_trace(t / "x.txt"), "output"),
        (lambda t: _write_trace(t / "adir"), "output"),
        (lambda t: _write_trace(t / "m/x.csv"), "output"),
        (lambda t: _draw("draw_tiles", t / "x"), "path"),
        (lambda t: _draw("draw_timeline", t / "afile.txt/x.png"), "path"),
        (lambda t: _draw("draw_animation", t / "x.png"), "path"),
        (lambda t: iosim.sweep({"N": 32, "d": 4, "M": 200}, executor="serial", out=t / "afile.txt/x.csv"), "out"),
        (lambda t: iosim.sweep({"N": 32, "d": 4, "M": 200}, executor="serial", out=t / "adir.csv"), "out"),
        (lambda t: iosim.sweep({"N": 32, "d": 4, "M": 200}, executor="serial", cache=t / "c.csv"), "cache"),
        (lambda t: iosim.sweep({"N": 32, "d": 4, "M": 200}, executor="serial", cache=t / "afile.txt/c.jsonl"), "cache"),
    ],
)  # fmt: skip
def test_api_output_paths(call, parameter, tmp_path):
    (tmp_path / "afile.txt").write_text("x")
    (tmp_path / "adir").mkdir()
    (tmp_path / "adir.csv").mkdir()
    before = set(tmp_path.rglob("*"))
    with pytest.raises(InputError) as e:
        call(tmp_path)
    assert e.value.parameter == parameter
    assert set(tmp_path.rglob("*")) == before


# ------------------------------------------------------------------------------------------- 1. the long-run rule
LONG_CASES = [
    (["run", "flash2", "--N", "524288", "--d", "64", "--M", "100000"], ["N gives", "hour", "numeric run"]),
    (["run", "flash2", "--N", "50000", "--d", "64", "--M", "100000"], ["allow_long", "--yes", "numeric run"]),
    (["run", "flash2", "--N", "40000", "--d", "64", "--M", "100000", "--backward"], ["allow_long", "minutes"]),
    (["run", "flash2", "--N", "300000", "--d", "64", "--M", "100000", "--backward"], ["N gives", "hours"]),
    (["run", "flash2", "--N", "30000000", "--d", "64", "--M", "100000", "--count-only"], ["allow_long", "count-only"]),
    (["trace", "flash2", "--N", "50000", "--d", "64", "--M", "100000", "-o", "t.csv"], ["allow_long", "--yes"]),
    (["compare", "--N", "30000000", "--d", "64", "--M", "100000", "--count-only"], ["allow_long", "count-only"]),
    (["check", "--kernel", "flash2", "--N", "100000"], ["--N", "simulator", "hour"]),
    (["check", "--kernel", "flash2", "--N", "300", "--d", "16"], ["allow_long", "--yes", "simulator"]),
    (["pebble", "matmul:2x2x2", "--M", "4", "--optimum", "--max-states", "1000000000"], ["max_states", "hour"]),
    (["pebble", "matmul:2x2x2", "--M", "4", "--optimum", "--max-states", "10000000"], ["allow_long", "--yes"]),
    (["replay", "flash2", "--N", "8192", "--d", "64", "--M", "16384"], ["allow_long", "replay"]),
    (["replay", "flash2", "--N", "16384", "--d", "64", "--M", "16384", "--policy", "lru"], ["allow_long", "replay"]),
    (["sweep", "--algorithm", "flash2", "--N", "30000000", "--d", "64", "--M", "100000", "--jobs", "1", "--no-cache"],
     ["allow_long", "sweep"]),
    (["sweep", "--algorithm", "flash2", "--N", *(str(30_000_000 + i) for i in range(60)), "--d", "64", "--M", "100000",
      "--jobs", "1", "--no-cache", "--yes"], ["grid", "hour"]),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "words"), LONG_CASES, ids=ids(LONG_CASES))
def test_long_runs_need_consent_and_very_long_ones_are_refused(argv, words, tmp_path, monkeypatch, capsys):
    assert_refused(argv, words, tmp_path, monkeypatch, capsys)


@pytest.mark.parametrize(
    ("call", "parameter"),
    [
        (lambda: iosim.run("flash2", N=524288, d=64, M=100000), "N"),
        (lambda: iosim.run("flash1", N=50000, d=64, M=100000), "allow_long"),
        (lambda: iosim.run("flash2", N=30_000_000, d=64, M=100000, count_only=True), "allow_long"),
        (lambda: iosim.replay("flash2", N=8192, d=64, M=16384), "allow_long"),
        (lambda: iosim.sweep({"N": 30_000_000, "d": 64, "M": 100000, "algorithm": "flash2"}, executor="serial"),
         "allow_long"),
        (lambda: _opt(max_states=10**9), "max_states"),
        (lambda: _opt(max_states=10**7), "allow_long"),
    ],
)  # fmt: skip
def test_api_long_runs(call, parameter):
    import iosim.pebble.search  # noqa: F401

    with pytest.raises(InputError) as e:
        call()
    assert e.value.parameter == parameter
    assert "about" in str(e.value)  # the estimate is in the message


def test_estimate_rule():
    from iosim.runner import estimate

    assert estimate.check(30, "x", allow_long=False, parameter="N") == 30
    assert estimate.check(600, "x", allow_long=True, parameter="N") == 600
    with pytest.raises(InputError, match="allow_long must be True"):
        estimate.check(61, "x", allow_long=False, parameter="N")
    with pytest.raises(InputError, match="N gives x of about"):
        estimate.check(3601, "x", allow_long=True, parameter="N")
    with pytest.raises(InputError, match="allow_long must be True or False"):
        estimate.check(1, "x", allow_long="yes", parameter="N")


# ------------------------------------------------------------------------------------------ 2. masks too large
# A random mask holds no table (a counter-based generator answers per tile), so nothing of N x N is allocated; at
# N = 2^22 with one-element blocks counting it takes hours, which the long-run rule refuses up front.
BIG_MASKS = ["random:0.5", "bigbird:1:1:1:1", "random-blocks:0.5:1x1"]
BIGN = ["--N", "4194304", "--d", "64", "--M", "65536"]
MASK_SIZE_CASES = [
    (["bounds", *BIGN, "--mask", m], ["mask", m.split(":")[0], "generator draws", "limit is 1 hour"]) for m in BIG_MASKS
] + [
    (["run", "flash2", *BIGN, "--count-only", "--mask", m], ["mask", "generator draws", "hour"]) for m in BIG_MASKS
] + [
    (["compare", *BIGN, "--count-only", "--mask", m], ["mask", "generator draws", "hour"]) for m in BIG_MASKS
]  # fmt: skip


@pytest.mark.parametrize(("argv", "words"), MASK_SIZE_CASES, ids=ids(MASK_SIZE_CASES))
def test_masks_too_long_to_count_are_refused_up_front(argv, words, tmp_path, monkeypatch, capsys):
    assert_refused(argv, words, tmp_path, monkeypatch, capsys)


@pytest.mark.parametrize("N", [None, "", 0, -1, 2**70, 1.5, math.nan, [], True])
def test_compile_mask_checks_n(N):
    with pytest.raises(InputError) as e:
        iosim.masking.masks.compile_mask("window:3", N)
    assert e.value.parameter == "N"


@pytest.mark.parametrize("mask", BIG_MASKS)
def test_api_masks_too_long_to_count(mask):
    m = iosim.masking.masks.compile_mask(mask, 2**22)  # no table: compiling is O(1)
    assert m.table.size == 1
    with pytest.raises(InputError) as e:
        iosim.run("flash2", N=2**22, d=64, M=65536, mask=mask, count_only=True, allow_long=True)
    assert e.value.parameter == "mask" and "hour" in str(e.value)


@pytest.mark.parametrize("mask", ["random:0.01", "random-blocks:0.1:64x64", "bigbird:64:1:1:3"])
def test_masks_over_a_minute_to_count_ask_first(mask):
    """Counting these once at N = 2^20 takes minutes (random elements) or seconds (blocks): asked, or let run."""
    from iosim.runner import estimate

    m = iosim.masking.masks.compile_mask(mask, 2**20)
    seconds = estimate.mask_seconds(m, passes=1)
    assert seconds < estimate.MAX_SECONDS
    if seconds > estimate.LONG_SECONDS:
        with pytest.raises(InputError) as e:
            estimate.check_mask(m, passes=1, allow_long=False)
        assert e.value.parameter == "allow_long"
        assert estimate.check_mask(m, passes=1, allow_long=True) == seconds
    else:
        assert estimate.check_mask(m, passes=1, allow_long=False) == seconds


# ------------------------------------------------------------------------------------------- 6. integer ranges
RANGE_MASKS = [
    (f"dilated:{2**40}:{2**40}", "mask dilation"),
    (f"window:{BIG}", "mask window"),
    (f"prefix:{HUGE}", "mask prefix"),
    (f"bigbird:{BIG}:1:1:1", "mask block"),
    (f"random-blocks:0.5:{BIG}x1", "mask block shape"),
    (f"random:0.5:{2**64}", "mask seed"),
    (f"random-blocks:0.5:2x2:{HUGE}", "mask seed"),
    (f"blockdiag:{BIG}", "mask document lengths"),
]
RANGE_CASES = []
for mask, name in RANGE_MASKS:
    RANGE_CASES += [
        (["run", "flash2", *S, "--mask", mask], [name]),
        (["bounds", *S, "--mask", mask], [name]),
        (["compare", *S, "--mask", mask], [name]),
        (["trace", "flash2", *S, "--mask", mask, "-o", "t.csv"], [name]),
        (["show", "flash2", *S, "--mask", mask, "--text"], [name]),
        (["replay", "flash2", *S, "--mask", mask], [name]),
    ]
RANGE_CASES += [
    (["run", "flash2", "--N", "32", "--d", "4", "--M", HUGE], ["--M", "1,099,511,627,776"]),
    (["run", "flash2", "--N", HUGE, "--d", "4", "--M", "200"], ["--N", "67,108,864"]),
    (["bounds", "--N", "32", "--d", HUGE, "--M", "200"], ["--d", "65,536"]),
    (["replay", "flash2", *S, "--cache-words", HUGE], ["cache_words", "1,099,511,627,776"]),
    (["replay", "flash2", *S, "--line", HUGE], ["line"]),
    (["check", "--kernel", "flash2", "--heads", HUGE, "--N", "4", "--d", "4"], ["heads"]),
    (["check", "--kernel", "flash2", "--N", HUGE], ["N"]),
    (["check", "--kernel", "flash2", "--quick", "--seed", HUGE], ["--seed", "2^64"]),
    (["run", "flash2", *S, "--seed", HUGE], ["--seed", "2^64"]),
    (["pebble", "--from-run", "flash1", "--N", HUGE, "--d", "2", "--M", "64"], ["--N"]),
    (["sweep", "--N", HUGE, "--d", "4", "--M", "200", "--algorithm", "flash2", "--no-cache", "--executor", "serial"],
     ["N"]),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "words"), RANGE_CASES, ids=ids(RANGE_CASES))
def test_integer_ranges(argv, words, tmp_path, monkeypatch, capsys):
    assert_refused(argv, words, tmp_path, monkeypatch, capsys)


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: Memory(M=2**70), ValueError, "M (fast-memory capacity in words) must be an integer from 1 to"),
        (lambda: Memory(M=0), ValueError, "M (fast-memory capacity in words)"),
        (lambda: Memory(M=True), ValueError, "M (fast-memory capacity in words)"),
        (lambda: iosim.memory_model.TwoLevelMemory(2**63), ValueError, "M (fast-memory"),
        (lambda: iosim.masking.masks.Dilated(2**40, 2**40), InputError, "mask dilation"),
        (lambda: iosim.masking.masks.SlidingWindow(2**41), InputError, "mask window"),
        (lambda: iosim.masking.masks.RandomBlocks(0.5, (2, 2), 2**64), InputError, "mask seed"),
        (lambda: iosim.run("flash2", N=32, d=4, M=2**70), InputError, "M must be an integer from 1 to"),
        (lambda: iosim.run("flash2", N=2**70, d=4, M=200), InputError, "N must be an integer from 1 to"),
        (lambda: iosim.replay("flash2", N=32, d=4, M=200, cache_words=2**70), InputError, "cache_words"),
        (lambda: iosim.check(lambda *a, **k: None, N=[2**30], d=[4]), InputError, "N must be one or more integers"),
        (lambda: iosim.check(lambda *a, **k: None, N=[4], d=[4], heads=2**30), InputError, "heads"),
    ],
)
def test_api_integer_ranges(call, error, words):
    with pytest.raises(error) as e:
        call()
    assert words in str(e.value)


# --------------------------------------------------------------------------------------- 7. silent coercions
COERCION_CASES = [
    (["show", "flash2", *S, "--text", "--limit", "-5"], ["--limit", "from 0"]),
    (["show", "flash2", *S, "--text", "--step", "-1"], ["--step", "from 0"]),
    (["show", "flash2", *S, "--text", "--limit", "x"], ["--limit"]),
    (["pebble", "matmul:2x2x2", "--M", "4", "--picture", "g.png", "--at", "-1"], ["--at", "from 0"]),
    (["replay", "flash2", *S, "--line", "-1"], ["--line"]),
    (["replay", "flash2", *S, "--policy", "None"], ["policy", "lru"]),
    (["sweep", "--N", "32", "--d", "4", "--M", "200", "--jobs", "0"], ["--jobs"]),
    (["sweep", "--N", "32", "--d", "4", "--M", "200", "--causal", "maybe"], ["--causal"]),
    (["check", "--kernel", "flash2", "--quick", "--heads", "0"], ["--heads"]),
    (["check", "--kernel", "flash2", "--quick", "--seed", "-1"], ["--seed", "from 0"]),
    (["check", "--kernel", "flash2", "--quick", "--seed", "x"], ["--seed"]),
    (["check", "--kernel", "flash9", "--quick"], ["--kernel", "flash2"]),
    (["run", "flash2", *S, "--seed", "-1"], ["--seed"]),
    (["pebble", "matmul:2x2x2", "--M", "4", "--optimum", "--max-states", "0"], ["--max-states"]),
    (["pebble", "matmul:2x2x2", "--M", "-4", "--optimum"], ["--M"]),
    (["pebble", "--from-run", "flash1", "--N", "4", "--d", "2", "--M", "64", "--kv-policy", "lazy"], ["--kv-policy"]),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "words"), COERCION_CASES, ids=ids(COERCION_CASES))
def test_no_silent_coercion_on_the_command_line(argv, words, tmp_path, monkeypatch, capsys):
    assert_refused(argv, words, tmp_path, monkeypatch, capsys)


def _opt(**kw):
    from iosim.pebble import graph, search

    return search.optimum(graph.named("matmul:2x2x2"), 4, **kw)


R = dict(N=32, d=4, M=200)
API_COERCIONS = [
    (lambda: iosim.replay("flash2", **R, write_allocate="no"), "write_allocate"),
    (lambda: iosim.replay("flash2", **R, write_allocate=0), "write_allocate"),
    (lambda: iosim.replay("flash2", **R, policy=None), "policy"),
    (lambda: iosim.replay("flash2", **R, policy=[1]), "policy"),
    (lambda: iosim.replay("flash2", **R, policy="lfu"), "policy"),
    (lambda: iosim.replay("flash2", **R, line=True), "line"),
    (lambda: iosim.replay("flash2", **R, opt_limit_bytes=-1), "opt_limit_bytes"),
    (lambda: iosim.replay("flash2", **R, allow_long="yes"), "allow_long"),
    (lambda: iosim.replay(None, **R), "algorithm"),
    (lambda: iosim.run(iosim.Schedule("flash2", kv_policy=3), **R), "kv_policy"),
    (lambda: iosim.run("flash2", **R, count_only="yes"), "count_only"),
    (lambda: iosim.run("flash2", **R, causal=1), "causal"),
    (lambda: iosim.run("flash2", **R, strict="no"), "strict"),
    (lambda: iosim.run("flash2", **R, allow_long=1), "allow_long"),
    (lambda: iosim.sweep(R, executor="serial", allow_long="yes"), "allow_long"),
    (lambda: iosim.sweep(R, executor="serial", jobs=0), "jobs"),
    (lambda: iosim.check(lambda *a, **k: None, N=[4], d=[4], quick="yes"), "quick"),
    (lambda: iosim.check(lambda *a, **k: None, N=[4], d=[4], equal_lengths=1), "equal_lengths"),
    (lambda: iosim.register("x", lambda *a: None, replace="yes"), "replace"),
    (lambda: _opt(max_states=0), "max_states"),
    (lambda: _opt(max_states=True), "max_states"),
    (lambda: _opt(allow_long="yes"), "allow_long"),
]  # fmt: skip


@pytest.mark.parametrize("k", range(len(API_COERCIONS)))
def test_no_silent_coercion_in_the_api(k):
    call, parameter = API_COERCIONS[k]
    with pytest.raises(InputError) as e:
        call()
    assert e.value.parameter == parameter


@pytest.mark.parametrize(
    "call",
    [
        lambda: Memory(M=100, strict="no"),
        lambda: Memory(M=100, count_only=1),
        lambda: Memory(M=100, trace="yes"),
        lambda: iosim.memory_model.TwoLevelMemory(100, fast="no"),
    ],
)
def test_memory_flags_are_booleans(call):
    with pytest.raises(ValueError, match="must be True or False"):
        call()


# ----------------------------------------------------------------------------------- 5. the cross-check's args
def _same(Q, K, V, *, causal, scale):
    return Q


CHECK_CASES = [
    (dict(causal=True), "causal"),
    (dict(causal=False), "causal"),
    (dict(causal=[1]), "causal"),
    (dict(causal="yes"), "causal"),
    (dict(causal=()), "causal"),
    (dict(seed=-1), "seed"),
    (dict(seed=2**64), "seed"),
    (dict(seed=1.5), "seed"),
    (dict(inputs="bogus"), "inputs"),
    (dict(scale=math.inf), "scale"),
    (dict(scale="0.5"), "scale"),
    (dict(scale=True), "scale"),
    (dict(N=[0]), "N"),
    (dict(N="17"), "N"),
    (dict(d=[2.5]), "d"),
    (dict(N=[10**6], d=[4096]), "N"),
    (dict(heads=3, heads_kv=2), "heads_kv"),
    (dict(batch=0), "batch"),
    (dict(backward=5), "backward"),
    (dict(name=5), "name"),
    (dict(dtype="int8"), "dtype"),
    (dict(layout="NHD"), "layout"),
    (dict(distributions=["gauss"]), "distribution"),
    (dict(distributions=[]), "distributions"),
    (dict(causal_align="middle"), "causal_align"),
    (dict(scale=0), "scale"),
    (dict(scale=-0.5), "scale"),
    (dict(scale=2**70 * 1.0 * math.inf), "scale"),
    (dict(inputs=np.array([1, 2])), "inputs"),
    (dict(distributions=5), "distributions"),
]


@pytest.mark.parametrize(("kwargs", "parameter"), CHECK_CASES, ids=[str(k) for k, _ in CHECK_CASES])
def test_check_arguments(kwargs, parameter):
    kw = dict(N=[4], d=[4]) | kwargs
    with pytest.raises(InputError) as e:
        iosim.check(_same, **kw)
    assert e.value.parameter == parameter


def test_check_fn_must_be_callable():
    with pytest.raises(InputError) as e:
        iosim.check("flash2", N=[4], d=[4])
    assert e.value.parameter == "fn"


@pytest.mark.parametrize("package", ["torch", "cupy"])
def test_check_names_a_missing_package(package, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, package, None)  # import now raises ImportError, installed or not
    with pytest.raises(InputError, match=f"needs the package {package}"):
        iosim.check(_same, N=[4], d=[4], inputs=package)


def test_check_string_output_is_a_failed_row():
    report = iosim.check(lambda Q, K, V, *, causal, scale: "abc", N=[4], d=[4], distributions=["normal"])
    assert not report.passed and "not an array of numbers" in report.rows[0].note


def _no_max_subtraction(Q, K, V, *, causal, scale):
    _no_max_subtraction.seen.append((Q.dtype, type(scale)))
    S = scale * (Q @ np.swapaxes(K, -1, -2))
    if causal:
        n_q, n_k = S.shape[-2:]
        S = np.where(np.tril(np.ones((n_q, n_k), bool), n_k - n_q), S, -np.inf)
    with np.errstate(all="ignore"):
        P = np.exp(S)
        P = P / P.sum(-1, keepdims=True)
    out = P @ V
    _no_max_subtraction.seen.append(out.dtype)
    return out


def test_explicit_shapes_keep_large_and_a_float32_kernel_stays_float32():
    _no_max_subtraction.seen = []
    report = iosim.check(_no_max_subtraction, N=[17], d=[16])
    assert {r.distribution for r in report.failures} >= {"large"}  # caught on the user's own shapes
    assert (np.dtype("float32"), float) in _no_max_subtraction.seen  # scale a Python float: no promotion
    assert np.dtype("float64") not in _no_max_subtraction.seen


# ------------------------------------------------------------------------------------------ 4. iosim.register
def _fwd(value):
    return lambda mem, Q, K, V, N, d, t, scale, causal, dtype: value


def _good_forward(model, Q, K, V, N, d, t, scale, causal, dtype):
    """A minimal legal forward: O = V row by row (reads Q, K, V; writes O)."""
    mem = Memory.wrap(model, count_only=Q is None)
    with mem:
        Qs, Ks, Vs = (mem.slow(n, x, shape=(N, d)) for n, x in (("Q", Q), ("K", K), ("V", V)))
        O = mem.slow("O", shape=(N, d))
        for r in range(0, N, 4):
            rows = (r, min(N, r + 4))
            tiles = [mem.load(a, rows) for a in (Qs, Ks, Vs)]
            o = mem.alloc(O, rows)
            if Q is not None:
                o.data[:] = tiles[2].data
            mem.store(o)
            mem.free(*tiles, o)
    return {"O": None if Q is None else O.data}


def _leaky_forward(model, Q, K, V, N, d, t, scale, causal, dtype):
    mem = Memory.wrap(model, count_only=Q is None)
    mem.load(mem.slow("Q", Q, shape=(N, d)), rows=(0, 1))
    return {"O": None if Q is None else np.zeros((N, d))}


REGISTER_CASES = [
    (dict(forward=_fwd(None)), InputError, "forward of algorithm u must return a dict"),
    (dict(forward=_fwd({})), InputError, "without O"),
    (dict(forward=_fwd("O")), InputError, "must return a dict"),
    (dict(forward=_fwd({"O": np.zeros(3)})), InputError, "shape (16, 4)"),
    (dict(forward=lambda mem, Q, K, V: {}), InputError, "must accept (mem, Q, K, V, N, d"),
    (dict(forward=_good_forward, backward=lambda mem: {}), InputError, "backward of algorithm u must accept"),
    (dict(forward=_good_forward, tiling=lambda N, d, M, rule: 5), InputError, "must return an iosim"),
    (dict(forward=_good_forward, tiling=lambda N: 5), InputError, "tiling of algorithm u must accept"),
    (dict(forward=_good_forward, predict=lambda N, d, M, t, c: "x"), InputError, "predict of algorithm u"),
    (dict(forward=_good_forward, predict=5), InputError, "predict of algorithm u must be callable"),
    (dict(forward=_fwd({"O": np.zeros((16, 4))})), ScheduleError, "algorithm u (forward) moved 0 reads"),
    (dict(forward=_leaky_forward), ScheduleError, "left resident"),
    (dict(forward=5), InputError, "forward"),
    (dict(forward=_good_forward, title=5), InputError, "title"),
]


@pytest.mark.parametrize(("kwargs", "error", "words"), REGISTER_CASES, ids=[w for _, _, w in REGISTER_CASES])
def test_register_checks_at_registration_and_first_use(kwargs, error, words):
    forward = kwargs.pop("forward")
    try:
        with pytest.raises(error) as e:
            iosim.register("u", forward, **kwargs)
            iosim.run("u", N=16, d=4, M=200)
        assert words in str(e.value)
    finally:
        iosim.unregister("u")
    assert "u" not in iosim.algorithm_names()


def test_a_good_user_algorithm_runs_count_only_and_numeric():
    iosim.register("u", _good_forward)
    try:
        assert iosim.run("u", N=16, d=4, M=200).stats.reads == 3 * 16 * 4
        assert iosim.run("u", N=16, d=4, M=200, count_only=True).stats.writes == 16 * 4
    finally:
        iosim.unregister("u")


def test_register_replace_then_unregister_restores_the_builtin():
    before = iosim.run("flash2", N=16, d=4, M=200, count_only=True).stats.total
    iosim.register("flash2", _good_forward, replace=True)
    assert not iosim.runner.registry.get("flash2").builtin
    iosim.unregister("flash2")
    assert iosim.runner.registry.get("flash2").builtin
    assert iosim.run("flash2", N=16, d=4, M=200, count_only=True).stats.total == before


# -------------------------------------------------------------------------------------------- 8. the pebble game
def _game():
    from iosim.pebble.game import Game
    from iosim.pebble.graph import named

    return Game(named("matmul:2x2x2"), 4)


PEBBLE_API = [
    (lambda: _game().play("garbage"), "moves"),
    (lambda: _game().play(None), "moves"),
    (lambda: _game().play([1, 2]), "moves"),
    (lambda: _game().play([("R1",)]), "moves"),
    (lambda: _game().play([("R1", 5)]), "moves"),
    (lambda: _game().play([("R1", "nope")]), "vertex"),
    (lambda: _game().play([], stop=-1), "stop"),
    (lambda: _game().move("R1", 10**6), "vertex"),
    (lambda: _game().move("R1", "A[0,0]"), "vertex"),
    (lambda: _game().move("R9", 0), "rule"),
    (lambda: iosim.pebble.game.parse(123, iosim.pebble.graph.named("matmul:2x2x2")), "text"),
    (lambda: iosim.pebble.game.parse("R1 A[0,0]", 123), "graph"),
    (lambda: iosim.pebble.graph.named(123), "graph"),
    (lambda: iosim.pebble.graph.named(None), "graph"),
    (lambda: iosim.pebble.graph.named("matmul:0x1x1"), "graph"),
    (lambda: iosim.pebble.game.Game("matmul:2x2x2", 4), "graph"),
    (lambda: iosim.pebble.game.Game(iosim.pebble.graph.named("matmul:2x2x2"), 4, strict="no"), "strict"),
    (lambda: iosim.pebble.search.optimum("matmul:2x2x2", 4), "graph"),
]


@pytest.mark.parametrize("k", range(len(PEBBLE_API)))
def test_pebble_api_bad_input(k):
    import iosim.pebble.game  # noqa: F401
    import iosim.pebble.search  # noqa: F401

    with pytest.raises(InputError) as e:
        PEBBLE_API[k][0]()
    assert e.value.parameter == PEBBLE_API[k][1]


@pytest.mark.parametrize("seed", [8, 10])
def test_from_run_flash1_with_rows_that_see_no_key(seed, capsys):
    """Seeds 8 and 10 of random-blocks:0.5:2x3 at N = 7 leave a row with no key: the flash1 adapter's logsumexp."""
    mask = f"random-blocks:0.5:2x3:{seed}"
    assert not iosim.masking.masks.compile_mask(mask, 7).dense().any(axis=1).all()
    assert main(["pebble", "--from-run", "flash1", "--N", "7", "--d", "3", "--M", "48", "--mask", mask]) == 0
    out = capsys.readouterr().out
    assert "legal with M = 48" in out and "equal" in out


def test_from_run_says_legal_with_m_prime_when_the_peak_exceeds_m(capsys):
    assert main(["pebble", "--from-run", "flash2", "--N", "4", "--d", "2", "--M", "24"]) == 0
    out = capsys.readouterr().out
    assert "legal: yes" not in out
    r = iosim.pebble.from_run.pebble_run("flash2", 4, 2, 24, "forward", False)
    if r.M_prime > 24:
        assert f"legal with M' = {r.M_prime} red pebbles, not with M = 24" in out
        assert f"exceeds M by {r.M_prime - 24}" in out
    else:
        assert "legal with M = 24" in out


def test_ci_turns_a_skip_for_a_missing_extra_into_a_failure(monkeypatch):
    from conftest import ci_failure

    monkeypatch.setenv("IOSIM_CI", "1")
    assert "pandas" in ci_failure("could not import 'pandas': No module named 'pandas'")
    assert "numba-cuda" in ci_failure("numba-cuda is not installed (pip install -e '.[cuda]')")
    assert "torch" in ci_failure("could not import 'torch': No module named 'torch'")  # CI installs the CPU torch
    assert ci_failure("could not import 'cupy': No module named 'cupy'") is None  # not an extra CI installs
    assert ci_failure("needs a CUDA GPU") is None
    monkeypatch.delenv("IOSIM_CI")
    assert ci_failure("could not import 'pandas'") is None


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"iosim {iosim.__version__}"


@pytest.mark.parametrize(
    "argv",
    [
        ["trace", "flash2", "--N", "2000", "--d", "8", "--M", "400", "--count-only", "-o", "t.npy"],
        ["trace", "flash2", "--heads", "8", "--kv-heads", "2", "--Nq", "300", "--Nk", "2000", "--d", "8", "--M", "400",
         "--count-only", "-o", "t.csv"],
        ["show", "flash1", "--N", "2000", "--d", "8", "--M", "400", "--text"],
        ["replay", "flash2", "--N", "2000", "--d", "8", "--M", "400", "--policy", "lru"],
        ["hierarchy", "flash2", "--N", "2000", "--d", "8", "--M", "400", "--P", "2", "--C", "0"],
    ],
)  # fmt: skip
def test_traces_too_large_for_memory_are_refused_before_allocation(argv, tmp_path, monkeypatch, capsys):
    """A trace is 72 bytes an event (millions of tiles: tens of GB): over half the memory available it is one line,
    exit 2, no file, before the buffer is allocated (available memory shrunk here to 50 kB)."""
    monkeypatch.setattr(iosim.memory_model.core, "available_bytes", lambda: 50_000)
    assert_refused(argv, ["GiB", "events"], tmp_path, monkeypatch, capsys)

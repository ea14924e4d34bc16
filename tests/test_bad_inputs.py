"""Bad input, everywhere a user can give it: the command line exits 2 with one line naming the parameter, the API
raises InputError naming it. Never a traceback, a hang, or a silently wrong result."""

import math
import subprocess
import sys

import numpy as np
import pytest
from iosim.memory_model import CapacityError

import iosim
from iosim import InputError
from iosim.cli import main
from iosim.runner.api import run_keywords

SIZES = ["--N", "64", "--d", "8", "--M", "1000"]
BIG = str(2**41)

# (argv, text the one-line message must contain: the parameter's name)
CLI_CASES = [
    (["run", "flash9", *SIZES], "algorithm"),
    (["run", "flash1", "--N", "0", "--d", "8", "--M", "1000"], "--N"),
    (["run", "flash1", "--N", "-5", "--d", "8", "--M", "1000"], "--N"),
    (["run", "flash1", "--N", "abc", "--d", "8", "--M", "1000"], "--N"),
    (["run", "flash1", "--N", "1e3", "--d", "8", "--M", "1000"], "--N"),
    (["run", "flash1", "--N", "99999999999999999999", "--d", "8", "--M", "1000"], "--N"),
    (["run", "flash2", "--N", "1000000000000", "--d", "8", "--M", "1000", "--count-only"], "--N"),
    (["run", "flash1", "--N", "64", "--d", "0", "--M", "1000"], "--d"),
    (["run", "flash1", "--N", "64", "--d", "70000", "--M", "1000"], "--d"),
    (["run", "flash1", "--N", "64", "--d", "8", "--M", "0"], "--M"),
    (["run", "flash1", "--N", "64", "--d", "8", "--M", BIG], "--M"),
    (["run", "flash1", *SIZES, "--seed", "-1"], "--seed"),
    (["run", "flash1", *SIZES, "--seed", "abc"], "--seed"),
    (["run", "flash1", *SIZES, "--seed", "1.5"], "--seed"),
    (["run", "flash1", *SIZES, "--seed", str(2**64)], "--seed"),
    (["run", "flash1", *SIZES, "--scale", "abc"], "--scale"),
    (["run", "flash1", *SIZES, "--scale", "inf"], "--scale"),
    (["run", "flash1", *SIZES, "--scale", "nan"], "--scale"),
    (["run", "flash1", *SIZES, "--tiling", "tight"], "--tiling"),
    (["run", "flash1", *SIZES, "--dtype", "float16"], "--dtype"),
    (["run", "flash1", *SIZES, "--format", "html"], "--format"),
    (["run", "flash1", "--N", "8", "--d", "64", "--M", "100"], "M must be at least"),
    (["run", "flash1", "--N", "1024", "--d", "64", "--M", "4096", "--tiling", "paper"], "capacity exceeded"),
    (["run", "flash1", "--d", "8", "--M", "1000"], "--N"),
    (["run", *SIZES], "algorithm"),
    (["compare", "--M", "2"], "M is too small for every algorithm"),
    (["compare", "--M", "2", "--backward"], "M is too small for every algorithm"),
    (["compare", "--seed", "-3"], "--seed"),
    (["compare", "--json", "--csv"], "--csv"),
    (["run", "flash2", "--N", "30000000", "--d", "64", "--M", "100000", "--count-only"], "allow_long"),
    (["run", "flash2", "--N", "60000000", "--d", "64", "--M", "1000", "--count-only", "--yes"], "N gives a count-only"),
    (["run", "flash2", "--N", "10000000", "--d", "64", "--M", "100000"], "N needs about"),
    (["trace", "flash2", *SIZES, "-o", "trace.txt"], "output must end in"),
    (["trace", "flash2", *SIZES, "-o", "/nonexistent-folder/trace.csv"], "output must be in an existing folder"),
    (["trace", "flash2", *SIZES], "--output"),
    (["bounds", "--N", "0", "--d", "8", "--M", "1000"], "--N"),
    (["bounds", "--N", "64", "--d", "8"], "--M"),
    (["nonsense"], "invalid choice"),
    (["run", "flash2", *SIZES, "--mask", "window:0"], "mask window"),
    (["run", "flash2", *SIZES, "--mask", "random:1.5"], "mask density"),
    (["run", "flash2", *SIZES, "--mask", "random-blocks:0:4x4"], "mask density"),
    (["run", "flash2", *SIZES, "--mask", "random-blocks:0.5:0x4"], "mask block shape"),
    (["run", "flash2", *SIZES, "--mask", "blockdiag:10,10"], "mask document lengths"),
    (["run", "flash2", *SIZES, "--mask", "file:/nonexistent/mask.npy"], "mask file"),
    (["run", "flash2", *SIZES, "--mask", "causal", "--causal"], "causal"),
    (["run", "flash2", *SIZES, "--mask", "diagonal"], "mask"),
    (["run", "flash2", *SIZES, "--kv-policy", "lazy"], "--kv-policy"),
    (["compare", *SIZES, "--mask", "prefix:65"], "mask prefix"),
    (["bounds", *SIZES, "--mask", "window:-1"], "mask window"),
    (["trace", "flash2", *SIZES, "--mask", "dilated:2:0", "-o", "t.csv"], "mask dilation"),
    (["replay", "flash2", *SIZES, "--policy", "lfu"], "policy must be one or more of lru, opt, fifo"),
    (["replay", "flash2", *SIZES, "--policy", ","], "policy must be one or more"),
    (["replay", "flash2", *SIZES, "--line", "0"], "--line"),
    (["replay", "flash2", *SIZES, "--line", "-8"], "--line"),
    (["replay", "flash2", *SIZES, "--line", "3"], "line must be a power of two"),
    (["replay", "flash2", *SIZES, "--line", "2048"], "line must be a power of two from 1 to the cache size 1,000"),
    (["replay", "flash2", *SIZES, "--cache-words", "0"], "--cache-words"),
    (["replay", "flash2", "--N", "32768", "--d", "64", "--M", "16384"], "over the replay limit"),
    (["replay", "flash9", *SIZES], "algorithm"),
    (["show", "flash2", *SIZES], "--output is needed"),
    (["show", "flash2", *SIZES, "--text", "--step", "99999"], "--step must be an event number"),
    (["show", "flash2", *SIZES, "--view", "movie", "-o", "x.png"], "--view"),
    (["show", "flash2", *SIZES, "--view", "animate", "-o", "x.png"], "must end in .gif"),
    (["show", "flash2", *SIZES, "-o", "/nonexistent-folder/x.png"], "--output must be in an existing folder"),
    (["show", "flash9", *SIZES, "--text"], "algorithm"),
    (["pebble", "conv:2x2", "--M", "4", "--optimum"], "graph"),
    (["pebble", "matmul:2x2x2", "--optimum"], "--M"),
    (["pebble", "attention:4x2", "--M", "8", "--optimum"], "at most 40 vertices"),
    (["pebble", "matmul:2x2x2", "--M", "4", "--optimum", "--max-states", "5"], "gave up"),
    (["pebble", "matmul:2x2x2", "--M", "2", "--optimum"], "M must be at least 3"),
    (["pebble", "matmul:2x2x2", "no-such-schedule.txt", "--M", "4"], "schedule"),
    (["pebble", "--from-run", "flash1", "--N", "64", "--d", "4", "--M", "64"], "--N"),
    (["pebble", "--from-run", "flash9", "--N", "4", "--d", "2", "--M", "64"], "algorithm"),
    (["pebble", "--from-run", "flash1", "--N", "4", "--d", "2", "--M", "2"], "M"),
    (["check", "--kernel", "flash2", "--quick", "--dtype", "int8"], "dtype must be one of float64, float32, float16"),
    (["check", "--kernel", "flash2", "--quick", "--layout", "NHD"], "layout must be one of BHND, BNHD"),
    (["check", "--kernel", "flash2", "--quick", "--distribution", "gauss"], "distribution must be one of normal"),
]


@pytest.mark.parametrize(("argv", "message"), CLI_CASES, ids=[" ".join(a[:1] + a[-2:]) for a, _ in CLI_CASES])
def test_cli_bad_input_exits_2_with_one_line(argv, message, capsys):
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own errors: usage + one error line, exit 2
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2, err
    assert message in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("R1 A[0,0]\nR1 Q[9,9]\n", "schedule.txt line 2: no vertex Q[9,9]"),
        ("R1 A[0,0]\n\nR9 A[0,1]\n", "schedule.txt line 3: the move must start with R1"),
        ("R1A[0,0]\n", "schedule.txt line 1: a move is a rule and a vertex"),
        ('[["R1", "A[0,0]"],\n  ["R2"]]', "schedule.txt move 2"),
    ],
)
def test_pebble_schedule_that_does_not_parse_exits_2_naming_the_line(tmp_path, text, message, capsys):
    path = tmp_path / "schedule.txt"
    path.write_text(text)
    assert main(["pebble", "matmul:2x2x2", str(path), "--M", "4"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "flash1", "--N", "abc", "--d", "8", "--M", "1000"],
        ["compare", "--M", "2"],
        ["run", "flash2", "--N", "10000000", "--d", "64", "--M", "100000"],
        ["trace", "flash2", *SIZES, "-o", "trace.txt"],
    ],
)
def test_cli_bad_input_in_a_fresh_process_has_no_traceback(argv):
    p = subprocess.run([sys.executable, "-m", "iosim.cli", *argv], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1].startswith(("iosim: error:", "iosim ")), p.stderr
    assert "Traceback" not in p.stderr


def _arrays(n=12, d=4, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n, d)) for _ in range(3)]


Q, K, V = _arrays()
OK = dict(N=12, d=4, M=500)

# (keyword arguments of iosim.run beyond the algorithm, the parameter InputError must name)
API_CASES = [
    ({"algorithm": "nope", **OK}, "algorithm"),
    ({"algorithm": 3, **OK}, "algorithm"),
    *(({**OK, "M": m}, "M") for m in (0, -1, 1.5, "16", True, 2**41, None)),
    *(({**OK, "N": n}, "N") for n in (0, -2, 2**27, 1.5, "12")),
    ({"M": 500, "d": 4}, "N and d"),
    *(({**OK, "d": d}, "d") for d in (0, 2**17, 2.0)),
    *(({**OK, "seed": s}, "seed") for s in (-1, "a", 1.5, True, 2**64)),
    *(({**OK, "scale": s}, "scale") for s in ("abc", math.inf, math.nan, True, [1.0])),
    *(({**OK, "dtype": t}, "dtype") for t in ("float16", "int", np.int32, None)),
    *(({**OK, "tiling": t}, "tiling") for t in ("x", None, 1)),
    *(
        ({**OK, flag: value}, flag)
        for flag, value in [
            ("causal", "yes"),
            ("backward", 1),
            ("count_only", "no"),
            ("trace", "t"),
            ("strict", None),
            ("reference", "x"),
            ("allow_long", 2),
        ]
    ),  # fmt: skip
    ({"Q": Q[:, 0], "K": K, "V": V, "M": 500}, "Q"),
    ({"Q": np.where(Q > 1, np.nan, Q), "K": K, "V": V, "M": 500}, "Q"),
    ({"Q": Q, "K": K[:5], "V": V, "M": 500}, "K"),
    ({"Q": Q + 1j, "K": K, "V": V, "M": 500}, "Q"),
    ({"Q": np.full((12, 4), "a"), "K": K, "V": V, "M": 500}, "Q"),
    ({"Q": Q > 0, "K": K, "V": V, "M": 500}, "Q"),
    ({"Q": Q, "K": K, "M": 500}, "V"),
    ({"Q": Q, "K": K, "V": V, "M": 500, "N": 13}, "N"),
    ({"Q": Q, "K": K, "V": V, "M": 500, "d": 5}, "d"),
    ({"Q": Q, "K": K, "V": V, "M": 500, "count_only": True}, "count_only"),
    ({**OK, "dO": Q}, "dO"),
    ({**OK, "backward": True, "dO": Q[:3]}, "dO"),
    ({**OK, "backward": True, "dO": np.full((12, 4), np.inf)}, "dO"),
    ({**OK, "backward": True, "count_only": True, "dO": Q}, "dO"),
    ({"N": 10_000_000, "d": 64, "M": 100_000}, "N"),
    ({"N": 30_000_000, "d": 64, "M": 100_000, "count_only": True}, "allow_long"),
    ({"N": 60_000_000, "d": 64, "M": 1000, "count_only": True, "allow_long": True}, "N"),
    ({"N": 8, "d": 64, "M": 100}, "M"),
    ({**OK, "mask": np.ones((12, 12))}, "mask"),
    ({**OK, "mask": np.ones((12, 11), bool)}, "mask"),
    ({**OK, "mask": np.ones((5, 5), bool)}, "mask"),
    ({**OK, "mask": 3}, "mask"),
    ({**OK, "mask": "window:0"}, "mask window"),
    ({**OK, "mask": "blockdiag:5,5"}, "mask document lengths"),
    ({**OK, "mask": "random:0"}, "mask density"),
    ({**OK, "kv_policy": "lazy"}, "kv_policy"),
    ({**OK, "mask": "causal", "causal": True}, "causal"),
]


# (keyword arguments of iosim.replay beyond the algorithm, the parameter InputError must name)
REPLAY_CASES = [
    ({**OK, "policy": "lfu"}, "policy"),
    ({**OK, "policy": ["lru", "clock"]}, "policy"),
    ({**OK, "policy": ""}, "policy"),
    *(({**OK, "line": x}, "line") for x in (0, -4, 3, 1024, 1.5, True)),
    ({**OK, "cache_words": 0}, "cache_words"),
    ({**OK, "policy": "opt", "opt_limit_bytes": 100}, "policy opt"),
    ({"N": 32768, "d": 64, "M": 16384}, "N"),  # over the replay limit: 6.9e10 operand accesses
    ({**OK, "algorithm": "mine"}, "algorithm"),
    ({**OK, "N": 0}, "N"),
]


@pytest.mark.parametrize(
    ("kwargs", "parameter"), REPLAY_CASES, ids=[f"{p}-{i}" for i, (_, p) in enumerate(REPLAY_CASES)]
)
def test_replay_bad_input_raises_input_error_naming_the_parameter(kwargs, parameter):
    kwargs = dict(kwargs)
    algorithm = kwargs.pop("algorithm", "flash2")
    with pytest.raises(InputError) as e:
        iosim.replay(algorithm, **kwargs)
    assert e.value.parameter == parameter


@pytest.mark.parametrize(("kwargs", "parameter"), API_CASES, ids=[f"{p}-{i}" for i, (_, p) in enumerate(API_CASES)])
def test_api_bad_input_raises_input_error_naming_the_parameter(kwargs, parameter):
    kwargs = dict(kwargs)
    algorithm = kwargs.pop("algorithm", "flash2")
    with pytest.raises(InputError) as e:
        run_keywords(algorithm, **kwargs)
    assert e.value.parameter == parameter
    assert str(e.value).startswith(parameter)


def test_a_tiling_that_does_not_fit_is_a_capacity_error_not_a_crash():
    with pytest.raises(CapacityError, match="capacity exceeded"):
        iosim.run(iosim.Schedule("flash1", tiling="paper"), N=1024, d=64, M=4096, count_only=True)


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"name": "has space", "forward": lambda *a: {}}, "name"),
        ({"name": "flash2", "forward": lambda *a: {}}, "name"),
        ({"name": "mine", "forward": 3}, "forward"),
        ({"name": "mine", "forward": lambda *a: {}, "tiling": "fit"}, "tiling"),
    ],
)
def test_register_bad_input(kwargs, parameter):
    with pytest.raises(InputError) as e:
        iosim.register(**kwargs)
    assert e.value.parameter == parameter


def test_overflowing_scores_are_reported_not_marked_clean():
    """Finite inputs whose scores overflow float64: a warning and finite=False, never a clean run."""
    q = np.random.default_rng(0).standard_normal((40, 8)) * 1e200
    with pytest.warns(RuntimeWarning, match="not finite"):
        r = iosim.run("flash2", Q=q, K=q, V=q, M=2000)
    assert r.finite is False and r.as_dict()["finite"] is False
    assert r.main.exact  # the counts are still exact

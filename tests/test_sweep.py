"""iosim.sweep: grids, per-point reports of invalid points, the cache, outputs, and identical records from every
executor (serial, processes, a local Dask cluster where distributed is installed)."""

import json
import math
import re
import sys

import pytest

import iosim
from iosim.base.errors import install_hint
from iosim.cli import main
from iosim.runner.sweep import DEFAULTS, FIELDS, PROBLEM_KEYS, TILE_KEYS, expand, sweep

GRID = {"algorithm": ["flash2", "square-tiling"], "pass": ["forward", "backward"], "N": [64, 0], "d": 8, "M": [256, 4]}


def _norm(recs):
    """Records comparable with ==: NaN replaced by None."""
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in recs]


def test_expand_is_the_product_in_order():
    pts = expand(GRID)
    assert len(pts) == 2 * 2 * 2 * 2
    assert pts[0] == {
        "algorithm": "flash2",
        "pass": "forward",
        "N": 64,
        "d": 8,
        "M": 256,
        "causal": False,
        "mask": "none",
        "kv_policy": None,
        "tiling": "fit",
        "count_only": True,
        "dtype": "float64",
        "seed": 0,
        **{k: DEFAULTS[k] for k in PROBLEM_KEYS + TILE_KEYS},  # a problem's keys (iosim.Problem) at their defaults
    }
    assert len(expand([GRID, {"N": 32, "d": 4, "M": 100}])) == 16 + len(iosim.algorithm_names())


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        ({"N": 64, "d": 8, "M": 256, "window": 16}, "keys must be among"),
        ({"N": 64, "d": 8}, "must give N, d and M"),
        ({"N": [], "d": 8, "M": 256}, "at least one value"),
        ("N=64", "must be a mapping"),
    ],
)
def test_bad_grids_raise_input_error(grid, message):
    with pytest.raises(iosim.InputError, match=message):
        sweep(grid, executor="serial")


def test_invalid_points_are_reported_per_point_and_the_rest_run():
    recs = sweep(GRID, executor="serial", as_frame=False)
    assert [r["status"] for r in recs].count("ok") == 4  # N=64, M=256: 2 algorithms x 2 passes
    for r in recs:
        if r["status"] == "ok":
            assert r["exact"] and r["total"] == r["reads"] + r["writes"] and r["total"] == r["predicted_total"]
        else:
            assert r["status"] == "invalid" and ("N must be" in r["error"] or "M must be at least" in r["error"])
            assert r["total"] is None
    bad = sweep({"algorithm": ["nope", "flash1"], "pass": ["sideways"], "N": 8, "d": 2, "M": 64}, executor="serial")
    assert all(r["status"] == "invalid" for r in _as_list(bad))


def _as_list(recs):
    return recs.to_dict("records") if hasattr(recs, "to_dict") else recs


def test_processes_give_the_serial_records():
    serial = sweep(GRID, executor="serial", as_frame=False)
    procs = sweep(GRID, executor="processes", jobs=2, as_frame=False, chunk_size=3)
    assert _norm(procs) == _norm(serial)


def test_a_mask_read_from_a_file_is_keyed_by_its_contents(tmp_path, capsys):
    """A mod: (file:) mask's cache key holds a hash of its file: an edited file is counted afresh, not served from
    the cache; a mask file wrong whatever the point is one line for the whole grid (exit 2), before any work."""
    f, cache = tmp_path / "m.py", tmp_path / "c.jsonl"
    grid = {"algorithm": "flash2", "N": 64, "d": 8, "M": 1024, "mask": f"mod:{f}:m"}
    f.write_text("def m(b, h, q_idx, kv_idx):\n    return q_idx >= kv_idx\n")
    st: dict = {}
    causal = sweep(grid, executor="serial", cache=cache, as_frame=False, stats=st)[0]
    assert (
        st["computed"] == 1
        and causal["total"]
        == iosim.run(
            iosim.Schedule("flash2", kv_policy="paper"), N=64, d=8, M=1024, causal=True, count_only=True
        ).stats.total
    )
    assert sweep(grid, executor="serial", cache=cache, as_frame=False, stats=st)[0] == causal and st["cached"] == 1
    f.write_text("def m(b, h, q_idx, kv_idx):\n    return (q_idx >= kv_idx) & (q_idx - kv_idx < 8)\n")
    window = sweep(grid, executor="serial", cache=cache, as_frame=False, stats=st)[0]
    assert st["computed"] == 1 and window["total"] < causal["total"]
    for spec, says in ((f"mod:{f}:other", "mask mod must name a function"), (f"mod:{tmp_path}/x.py:m", "mask file")):
        with pytest.raises(iosim.InputError, match=f"^{says}"):
            sweep({**grid, "mask": ["none", spec]}, executor="serial", as_frame=False)
        capsys.readouterr()
        assert main(["sweep", "--N", "64", "--d", "8", "--M", "1024", "--mask", "none", spec, "--no-cache"]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1 and says in captured.err


def test_cache_computes_only_what_is_new(tmp_path):
    cache = tmp_path / "c.jsonl"
    st: dict = {}
    first = sweep(GRID, executor="serial", cache=cache, as_frame=False, stats=st)
    assert st == {"points": 16, "computed": 16, "cached": 0, "invalid": 12}
    with open(cache, "a") as f:
        f.write('{"key": "torn')  # a killed run's last line is ignored
    grown = {**GRID, "M": [256, 4, 512]}
    again = sweep(grown, executor="serial", cache=cache, as_frame=False, stats=st)
    assert st["computed"] == 8 and st["cached"] == 16
    assert _norm([r for r in again if r["M"] != 512]) == _norm(first)


def test_outputs_csv_and_jsonl(tmp_path):
    recs = sweep(GRID, executor="serial", out=tmp_path / "s.csv", as_frame=False)
    lines = (tmp_path / "s.csv").read_text().splitlines()
    assert lines[0].split(",") == list(FIELDS) and len(lines) == 1 + len(recs)
    sweep(GRID, executor="serial", out=tmp_path / "s.jsonl", as_frame=False)
    got = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert [g["total"] for g in got] == [r["total"] for r in recs]
    with pytest.raises(iosim.InputError, match="must end in one of"):
        sweep(GRID, executor="serial", out=tmp_path / "s.txt")
    assert not (tmp_path / "s.txt").exists()


def test_dataframe_and_parquet(tmp_path):
    pd = pytest.importorskip("pandas")
    df = sweep(GRID, executor="serial")
    assert isinstance(df, pd.DataFrame) and list(df.columns) == list(FIELDS) and len(df) == 16
    pytest.importorskip("pyarrow")
    sweep(GRID, executor="serial", out=tmp_path / "s.parquet")
    back = pd.read_parquet(tmp_path / "s.parquet")
    assert back["total"].dropna().astype(int).tolist() == df["total"].dropna().astype(int).tolist()


def test_missing_extras_name_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now raises ImportError
    assert isinstance(sweep(GRID, executor="serial"), list)  # records as dicts without pandas
    with pytest.raises(iosim.InputError, match=re.escape(install_hint("sweep"))):
        sweep(GRID, executor="serial", as_frame=True)
    with pytest.raises(iosim.InputError, match=re.escape(install_hint("sweep"))):
        sweep(GRID, executor="serial", out=tmp_path / "s.parquet")
    monkeypatch.setitem(sys.modules, "distributed", None)
    with pytest.raises(iosim.InputError, match=re.escape(install_hint("dask"))):
        sweep(GRID, executor="dask:tcp://127.0.0.1:8786")


def test_bad_executor_and_jobs():
    with pytest.raises(iosim.InputError, match="executor"):
        sweep(GRID, executor="gpu-farm")
    with pytest.raises(iosim.InputError, match="jobs"):
        sweep(GRID, jobs=0)


def test_unreachable_dask_scheduler_is_a_clear_error_and_writes_nothing(tmp_path):
    pytest.importorskip("distributed")
    out, cache = tmp_path / "s.csv", tmp_path / "c.jsonl"
    with pytest.raises(iosim.InputError, match="reachable Dask scheduler"):
        sweep(GRID, executor="dask:tcp://127.0.0.1:9", dask_timeout=1, out=out, cache=cache)
    assert not out.exists() and not cache.exists()


def test_local_dask_cluster_gives_the_serial_records():
    distributed = pytest.importorskip("distributed")
    serial = sweep(GRID, executor="serial", as_frame=False)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        dask = sweep(GRID, executor=f"dask:{c.scheduler_address}", as_frame=False, chunk_size=2)
    assert _norm(dask) == _norm(serial)


def test_cli_sweep(tmp_path, capsys):
    out = tmp_path / "s.csv"
    argv = ["sweep", "--algorithm", "flash2", "--N", "64", "--d", "8", "--M", "256", "512", "--no-cache"]
    assert main([*argv, "--out", str(out), "--executor", "serial"]) == 0
    assert "2 points: 2 computed" in capsys.readouterr().out and out.exists()
    assert main(["sweep", "--N", "64", "0", "--d", "8", "--M", "256", "--no-cache", "--jobs", "2"]) == 2
    captured = capsys.readouterr()
    assert "invalid point" in captured.err and "N must be an integer from 1 to" in captured.err
    assert "Traceback" not in captured.err
    assert main(["sweep", "--N", "64", "--d", "8", "--M", "256", "--pass", "sideways", "--no-cache"]) == 2


def test_worker_processes_are_spawned_when_a_threaded_library_is_loaded(monkeypatch):
    """Forking a process that runs JAX's or PyTorch's threads can deadlock the child: the pool spawns then."""
    import sys
    import types

    sweep_mod = sys.modules["iosim.runner.sweep"]  # the module (iosim.sweep, the attribute, is the function)
    pool, close = sweep_mod._open_executor("processes", 2, 4, 60.0)
    expected = "spawn" if any(m in sys.modules for m in ("jax", "torch", "tensorflow")) else "fork"
    assert pool._mp_context.get_start_method() == expected
    close()
    monkeypatch.setitem(sys.modules, "jax", types.ModuleType("jax"))
    pool, close = sweep_mod._open_executor("processes", 2, 4, 60.0)
    assert pool._mp_context.get_start_method() == "spawn"
    close()


def test_sweep_over_a_masked_problem_uses_run_defaults_and_shows_mask_and_policy(capsys):
    """A sweep point over a problem with a mask counts what iosim.run counts (its default policy: skip over a
    problem), its record says which policy ran, and the table names the mask and policy of every row."""
    from iosim.cli import main
    from iosim.spec.problem import Problem

    grid = {"algorithm": "flash1", "N": 40, "N_q": 2, "d": 8, "M": 600, "mask": "blockdiag:30,10"}
    (rec,) = sweep(grid, as_frame=False)
    r = iosim.run("flash1", problem=Problem(N_q=2, N_k=40, d=8), M=600, mask="blockdiag:30,10", count_only=True)
    assert rec["total"] == r.stats.total and rec["kv_policy"] == r.kv_policy == "skip"
    argv = ["sweep", "--algorithm", "flash1", "--N", "40", "--Nq", "2", "--d", "8", "--M", "600", "--mask", "none",
            "blockdiag:30,10", "--kv-policy", "paper", "skip", "--no-cache"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "mask" in out and "kv_policy" in out and out.count("blockdiag:30,10") == 2 and out.count("skip") == 2


def test_sweep_takes_a_problem_as_compare_does_lengths_and_dtypes(capsys):
    """--Nq and --Nk without --N (N stands for N_k), --N beside both refused (it was required and ignored), and the
    problem's dtypes per array: each point's words and bytes equal iosim.run's over the same Problem."""
    from iosim import Problem

    argv = ["sweep", "--algorithm", "flash2", "--Nq", "1", "4", "--Nk", "40", "--d", "8", "--M", "1024",
            "--dtype-q", "bf16", "--dtype-kv", "fp8", "--no-cache", "--executor", "serial"]  # fmt: skip
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    head = lines[0].split()
    rows = [dict(zip(head, x.split(), strict=True)) for x in lines if x.startswith("flash2")]
    assert [r["N_k"] for r in rows] == ["40", "40"] and [r["dtype_kv"] for r in rows] == ["fp8", "fp8"]
    for row, nq in zip(rows, (1, 4), strict=True):
        r = iosim.run("flash2", problem=Problem(N_q=nq, N_k=40, d=8, dtype_q="bf16", dtype_kv="fp8"), M=1024,
                      count_only=True)  # fmt: skip
        assert row["N_q"] == str(nq) and row["total"] == f"{r.main.stats.total:,}", (row, r.main.stats.total)
        assert row["total_bytes"] == f"{r.total_bytes:,}", (row, r.total_bytes)
    for bad, says in (
        (["--N", "40", "--Nq", "1", "--Nk", "40"], "not both"),
        (["--Nq", "1"], "must be given"),
    ):
        assert main(["sweep", "--algorithm", "flash2", *bad, "--d", "8", "--M", "1024", "--no-cache"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--N" in err[0] and says in err[0], err


def test_sweep_latex_is_a_table_a_paper_can_use(capsys):
    """LaTeX: booleans as marks, never True/False; the columns with one value for every row in the caption with
    iosim's version; text escaped; only the table on stdout."""
    from iosim.base.version import __version__

    argv = ["sweep", "--algorithm", "flash2", "flash1", "--N", "64", "--d", "8", "--M", "1024", "2048", "--causal",
            "both", "--no-cache", "--executor", "serial", "--format", "latex"]  # fmt: skip
    assert main(argv) == 0
    cap = capsys.readouterr()
    tex = cap.out
    assert tex.startswith("\\begin{table}") and tex.rstrip().endswith("\\end{table}") and "points" in cap.err
    assert "True" not in tex and "False" not in tex and "\\checkmark" in tex and "--" in tex
    caption = next(x for x in tex.splitlines() if x.startswith("\\caption"))
    assert f"iosim {__version__}" in caption and "N = 64" in caption and "d = 8" in caption
    header = next(x for x in tex.splitlines() if "algorithm" in x)
    assert "causal" in header and "M" in header and " d " not in header and "total\\_over\\_lb" in header


def test_the_files_a_mask_file_reads_are_in_the_cache_key(tmp_path):
    """A mask file that loads a data file (and imports a module of the user's beside it): an edit to either is a
    new point, counted afresh, never a stale total served from the cache (it served 2,752 for 2,240)."""
    import numpy as np

    f, data, helper, cache = tmp_path / "m.py", tmp_path / "w.npy", tmp_path / "helper_w.py", tmp_path / "c.jsonl"
    f.write_text(
        "import sys, numpy as np\nsys.path.insert(0, __file__.rsplit('/', 1)[0])\nimport helper_w\n"
        f"W = int(np.load({str(data)!r})[0]) + helper_w.EXTRA\n\n"
        "def m(b, h, q_idx, kv_idx):\n    return (q_idx >= kv_idx) & (q_idx - kv_idx < W)\n"
    )
    helper.write_text("EXTRA = 0\n")
    grid = {"algorithm": "flash2", "N": 64, "d": 8, "M": 1024, "mask": f"mod:{f}:m"}

    def total(w):
        r = iosim.run(
            iosim.Schedule("flash2", kv_policy="paper"), N=64, d=8, M=1024, mask=f"window:{w}:causal", count_only=True
        )
        return r.stats.total

    st: dict = {}
    np.save(data, np.array([40]))
    assert sweep(grid, executor="serial", cache=cache, as_frame=False, stats=st)[0]["total"] == total(40)
    assert sweep(grid, executor="serial", cache=cache, as_frame=False, stats=st)[0]["total"] == total(40)
    assert st["cached"] == 1
    np.save(data, np.array([8]))
    assert sweep(grid, executor="serial", cache=cache, as_frame=False, stats=st)[0]["total"] == total(8)
    assert st["computed"] == 1
    sys.modules.pop("helper_w", None)
    helper.write_text("EXTRA = 16\n")
    assert sweep(grid, executor="serial", cache=cache, as_frame=False, stats=st)[0]["total"] == total(24)
    assert st["computed"] == 1

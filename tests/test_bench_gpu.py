"""experiments/bench/gpu.py without a GPU: it parses its arguments, refuses to run with a clear message, and its
table code runs end to end on the CUDA simulator at a tiny size (timings there are meaningless)."""

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("numba_cuda", reason="numba-cuda is not installed (pip install -e '.[cuda]')")

from numba import cuda
from numba.core import config

from iosim.gpu import launch as gpu

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "bench" / "gpu.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_help_and_argument_errors():
    p = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0 and "--quick" in p.stdout
    p = subprocess.run([sys.executable, str(SCRIPT), "--case", "1,2,x"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "B,H,N,d" in p.stderr


def test_refuses_without_a_gpu():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    if not config.ENABLE_CUDASIM and cuda.is_available():
        pytest.skip("a GPU is present")
    p = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True, cwd=ROOT, env=env)
    if gpu._driver_sees_a_gpu():
        pytest.skip("a GPU is present")
    assert p.returncode == 1
    assert "no CUDA GPU found" in p.stderr
    p = subprocess.run(
        [sys.executable, str(SCRIPT)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**env, "NUMBA_ENABLE_CUDASIM": "1"},
    )
    assert p.returncode == 1 and "simulator" in p.stderr


@pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="the smoke run is for the CUDA simulator")
def test_tables_run_on_the_simulator(tmp_path, monkeypatch):
    bench = _load()
    monkeypatch.setattr(bench, "max_shared_words", lambda c: 160)
    monkeypatch.setattr(bench, "QUICK_SWEEP_FACTORS", (2,))
    args = bench.build_parser().parse_args(
        [
            "--quick",
            "--M",
            "160",
            "--reps",
            "1",
            "--seconds",
            "0",
            "--no-torch",
            "--threads",
            "8",
            "--kernels",
            "flash2",
            "flash2-backward",
            "--out",
            str(tmp_path),
        ]
    )
    timer = bench.Timer(cuda, args.reps, args.seconds)
    case = (1, 1, 9, 6)
    rows = bench.main_table(cuda, gpu, args, case, timer, False)
    assert [r["kernel"] for r in rows] == ["flash2", "flash2-backward"]
    assert all(r["words"] == bench.simulated_words(gpu, r["kernel"], 9, 6, 160, False, 1) for r in rows)
    sweep = bench.sweep(cuda, gpu, args, case, timer)
    assert [r["M"] for r in sweep] == [72, 160]
    assert all(r["square-tiling words"] for r in sweep)
    text = bench.write(tmp_path, {"device": "CUDA simulator"}, {"kernels": rows, "sweep": sweep, "ncu": []})
    assert "## sweep" in text and (tmp_path / "results.json").exists() and (tmp_path / "kernels.csv").exists()

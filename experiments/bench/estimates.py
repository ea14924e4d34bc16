"""The long-run rule's estimates against the time they stand for: estimate / measured for every guarded path that
runs on a CPU, on a grid of sizes, in this process (iosim/runner/estimate.py's constants; a ratio above 1 errs long).

    python experiments/bench/estimates.py          # about 35 s on 2 cores (2-3 minutes when Numba compiles)
    python experiments/bench/estimates.py --fit    # the same, then the least-squares constants of the grid

Each row's estimate is the one the path itself computes from the sizes before any work: the seconds of the last
:func:`iosim.runner.estimate.check` it makes (recorded, not recomputed here). A path is timed after a warm-up run of the
same kind, so Numba's compile is not part of the estimate. The measured time is CPU time
(:func:`time.process_time`): the runs are single-threaded (Numba, and NumPy's BLAS held to one thread here, as the
runs' float64 reference would otherwise take both cores), so on a quiet machine CPU and wall time agree (both are
printed); on a machine shared with other jobs the wall time grows with the load while the CPU time does not, and
the calibration is based on CPU time. The CUDA simulator's estimate is not on the grid (docs/benchmarks.md says
how it was measured).

``--fit`` solves, by least squares on the relative error (each row weighted by 1 / measured), for the costs that
iosim/runner/estimate.py takes: a count-only tile step; a numeric run's arithmetic (per N_q N_k (d_qk + d_v)), its tile
step and the backward's factor on the arithmetic; a random mask's generator draw.
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # single-threaded, as the calibration
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import io  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from tabulate import tabulate  # noqa: E402

import iosim  # noqa: E402
from iosim.base.errors import InputError  # noqa: E402
from iosim.cli import main as cli  # noqa: E402
from iosim.masking.block_sparse import block_sparse  # noqa: E402
from iosim.pebble.search import optimum  # noqa: E402
from iosim.runner import estimate  # noqa: E402

ROWS: list[dict] = []  # path, size, estimate, cpu, wall and the units the estimate was computed from


@contextlib.contextmanager
def recorded():
    """The seconds of every estimate.check and the arguments of the estimate functions, while a path runs."""
    log = {"check": [], "count_only": [], "numeric": []}
    saved = estimate.check, estimate.count_only_seconds, estimate.numeric_seconds

    def check(seconds, *a, **k):
        log["check"].append(seconds)
        return saved[0](seconds, *a, **k)

    def count_only_seconds(steps, per_step=estimate.COUNT_STEP):
        log["count_only"].append(steps * per_step / estimate.COUNT_STEP)  # in steps of COUNT_STEP
        return saved[1](steps, per_step)

    def numeric_seconds(N, d, steps, backward, heads=1):  # noqa: N803
        log["numeric"].append((N * heads**0.5, d, steps, backward))  # heads x N^2 d as one N^2 d
        return saved[2](N, d, steps, backward, heads)

    estimate.check, estimate.count_only_seconds, estimate.numeric_seconds = check, count_only_seconds, numeric_seconds
    try:
        yield log
    finally:
        estimate.check, estimate.count_only_seconds, estimate.numeric_seconds = saved


WARMED: set = set()


def measure(kind: str, path: str, size: str, fn, warm=None, key=None, checks="last") -> None:
    """Time ``fn`` (CPU and wall) after ``warm`` (once per ``key``) and record the estimate it made: its last check
    (a run's last check holds all its work; a replay's first is a lower bound before the exact count), or with
    ``checks="sum"`` the sum of its checks (each for a piece of work of its own)."""
    if warm is not None and (key is None or key not in WARMED):
        WARMED.add(key)
        with contextlib.redirect_stdout(io.StringIO()):
            warm()
    with recorded() as log:
        c0, w0 = time.process_time(), time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            fn()
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    est = sum(log["check"]) if checks == "sum" else log["check"][-1]
    ROWS.append(dict(kind=kind, path=path, size=size, estimate=est, cpu=cpu, wall=wall, log=log))
    r = ROWS[-1]
    print(f"  {path}, {size}: estimate {r['estimate']:.2f} s, cpu {cpu:.2f} s, wall {wall:.2f} s", flush=True)


def one_head(algo: str, N: int, d: int, M: int, count_only: bool, backward: bool, mask=None) -> None:  # noqa: N803
    kw = dict(d=d, M=M, count_only=count_only, backward=backward, mask=mask)
    what = f"run {algo} {'backward' if backward else 'forward'} {'count-only' if count_only else 'numeric'}"
    kind = "mask" if mask else ("count-only" if count_only else "numeric")
    measure(kind, what + (f" --mask {mask}" if mask else ""), f"N={N}, d={d}, M={M}",
            lambda: iosim.run(algo, N=N, allow_long=True, **kw), warm=lambda: iosim.run(algo, N=256, **kw),
            key=(algo, count_only, backward, mask))  # fmt: skip


def over_problem(algo: str, p: iosim.Problem, M: int, count_only: bool, backward=False, mask=None, **kw) -> None:  # noqa: N803
    opts = dict(M=M, count_only=count_only, backward=backward, mask=mask)
    schedule = iosim.Schedule(algo, **kw)  # the schedule's options (gqa, splits, ...)
    small = iosim.Problem(B=1, H_q=p.H_q, H_kv=p.H_kv, N_q=min(p.N_q, 256), N_k=256, d_qk=p.d_qk)
    what = f"run {algo} {'backward' if backward else 'forward'} {'count-only' if count_only else 'numeric'}"
    extra = "".join(f" {k}={v}" for k, v in kw.items()) + (f" --mask {mask}" if mask else "")
    size = f"H_q={p.H_q}, H_kv={p.H_kv}, N_q={p.N_q}, N_k={p.N_k}, d={p.d_qk}, M={M}"
    kind = "mask" if mask else ("count-only" if count_only else "numeric")
    key = (algo, str(small), count_only, backward, mask)
    measure(kind + " problem", f"{what} over a problem{extra}", size,
            lambda: iosim.run(schedule, problem=p, allow_long=True, **opts),
            warm=lambda: iosim.run(schedule, problem=small, **opts), key=key)  # fmt: skip


# one head: (algorithm, N, d, M, count-only, backward); each count-only run takes about half a second, each
# numeric run (with its float64 reference) 0.2-2 s
ONE_HEAD = [
    *[(algo, N, d, M, True, False) for algo, N, d, M in [("flash2", 524288, 64, 16384), ("flash2", 1048576, 128, 65536),
      ("flash1", 524288, 64, 16384), ("standard", 524288, 64, 16384), ("square-tiling", 524288, 64, 16384)]],
    *[(algo, N, d, M, True, True) for algo, N, d, M in [("flash2", 262144, 64, 16384), ("flash1", 262144, 64, 16384),
      ("standard", 131072, 64, 4096), ("square-tiling", 131072, 64, 16384)]],
    *[(algo, N, d, M, False, False) for algo, N, d, M in [("flash2", 4096, 64, 16384), ("flash2", 8192, 32, 16384),
      ("flash2", 4096, 64, 2048), ("flash1", 4096, 64, 16384), ("flash1", 4096, 128, 4096),
      ("standard", 4096, 64, 16384), ("standard", 2048, 64, 1024), ("square-tiling", 4096, 64, 16384),
      ("square-tiling", 2048, 64, 4096)]],
    *[(algo, 2048, 64, M, False, True) for algo, M in [("flash2", 16384), ("flash2", 2048), ("flash1", 16384),
      ("standard", 16384), ("square-tiling", 16384)]],
]  # fmt: skip


def run_rows() -> None:
    print("runs of one head, count-only and numeric (float64, with the reference)", flush=True)
    for row in ONE_HEAD:
        one_head(*row)
    print("runs over a problem", flush=True)
    P = iosim.Problem
    over_problem("flash2", P(H_q=8, H_kv=2, N=131072, d=64), 16384, True)
    over_problem("flash2", P(B=16, H_q=32, H_kv=8, N_q=16, N_k=4194304, d=128), 16384, True, splits=4)
    over_problem("square-tiling", P(H_q=4, N=131072, d=64), 16384, True)
    over_problem("flash2", P(H_q=4, N=131072, d=64), 16384, True, backward=True)
    over_problem("flash2", P(H_q=4, H_kv=1, N=2048, d=64), 16384, False)
    over_problem("standard", P(H_q=2, N=2048, d=64), 16384, False)
    over_problem("flash2", P(H_q=2, N=2048, d=64), 16384, False, backward=True)


def mask_rows() -> None:
    print("random masks", flush=True)
    one_head("flash2", 32768, 64, 16384, True, False, mask="random:0.01")
    one_head("flash2", 16384, 64, 4096, True, False, mask="random:0.5")
    one_head("flash1", 65536, 64, 16384, True, False, mask="random-blocks:0.1:16x16")
    over_problem("flash2", iosim.Problem(H_q=4, N=32768, d=64), 16384, True, mask="random:0.01")
    p = iosim.Problem(N=32768, d=64)  # the compulsory traffic's count of the mask, then the blocks' classes
    measure("mask", "block_sparse --mask random:0.01 (blocks 128 x 128)", "N=32768, d=64",
            lambda: block_sparse(p, "random:0.01", allow_long=True), checks="sum",
            warm=lambda: block_sparse(iosim.Problem(N=256, d=64), "random:0.01"))  # fmt: skip
    for mask in ("random:0.01", "random:0.0001"):  # the tilings' block counts stop early (dense) or scan (sparse)
        argv = ["bounds", "--d", "64", "--M", "16384", "--mask", mask]
        measure("mask", f"iosim bounds --mask {mask}", "N=32768, d=64, M=16384",
                lambda argv=argv: cli([*argv, "--N", "32768", "--yes"]),
                warm=lambda argv=argv: cli([*argv, "--N", "256"]))  # fmt: skip


def replay_rows() -> None:
    print("cache replays", flush=True)
    for algo in ("flash1", "flash2"):  # warm (each algorithm's traced run compiles)
        iosim.replay(algo, N=64, d=16, M=1024, policy="lru,fifo,opt")
    for algo, N, d, M, policy in [
        ("flash2", 512, 64, 8192, "lru"),
        ("flash2", 512, 64, 8192, "opt"),
        ("flash2", 1024, 64, 16384, "lru"),
        ("flash2", 512, 64, 8192, "fifo"),
        ("flash1", 512, 64, 4096, "lru"),
    ]:
        measure("replay", f"replay {algo} {policy}", f"N={N}, d={d}, M={M}",
                lambda algo=algo, N=N, d=d, M=M, policy=policy: iosim.replay(algo, N=N, d=d, M=M, policy=policy,
                                                                             allow_long=True))  # fmt: skip


def hierarchy_rows() -> None:
    print("shared-L2 launches", flush=True)
    iosim.hierarchy("flash2", N=512, d=64, H_q=2, device="H100")  # warm
    for N, heads in [(16384, 8), (32768, 8)]:
        measure("hierarchy", "hierarchy flash2 (H100 preset)", f"N={N}, d=128, heads={heads}",
                lambda N=N, heads=heads: iosim.hierarchy("flash2", N=N, d=128, H_q=heads, device="H100",
                                                         allow_long=True))  # fmt: skip


def pebble_rows() -> None:
    print("pebble searches (each stops at its --max-states)", flush=True)
    for spec, M, states in [("matmul:2x2x2", 3, 10_000), ("attention:2x1", 3, 10_000), ("matmul:2x2x3", 3, 5_000)]:
        graph = iosim.pebble.named(spec)

        def search(graph=graph, M=M, states=states):  # noqa: N803
            _quiet(lambda: optimum(graph, M, max_states=states, allow_long=True))  # gives up at max_states

        measure("pebble", f"pebble --optimum {spec}", f"M={M}, max_states={states:,}", search,
                warm=lambda graph=graph, M=M: _quiet(lambda: optimum(graph, M, max_states=100)))  # fmt: skip


def _quiet(fn) -> None:
    with contextlib.suppress(InputError):
        fn()


def fit() -> None:
    """Least squares on the relative error (rows divided by the measured CPU time)."""
    co = [r for r in ROWS if r["kind"] == "count-only" and not r["path"].startswith("run square-tiling backward")]
    steps = np.array([sum(r["log"]["count_only"]) for r in co], float)
    t = np.array([r["cpu"] for r in co])
    c = np.linalg.lstsq((steps / t)[:, None], np.ones(len(t)), rcond=None)[0][0]
    print(f"COUNT_STEP = {c:.3g} s (count-only one-head rows but square tiling's backward)")
    nu = [r for r in ROWS if r["kind"] == "numeric"]
    A = []
    for r in nu:
        N, d, steps, backward = r["log"]["numeric"][-1]
        work = N * N * 2 * d
        A.append([0 if backward else work, work if backward else 0, steps])
    t = np.array([r["cpu"] for r in nu])
    x = np.linalg.lstsq(np.array(A, float) / t[:, None], np.ones(len(t)), rcond=None)[0]
    print(
        f"NUMERIC_N2D = {x[0]:.3g} s per N^2 (2 d); NUMERIC_BACKWARD = {x[1] / x[0]:.3g}; NUMERIC_STEP = {x[2]:.3g} s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fit", action="store_true", help="print the least-squares costs of the grid")
    args = ap.parse_args()
    run_rows()
    mask_rows()
    replay_rows()
    hierarchy_rows()
    pebble_rows()
    table = [[r["path"], r["size"], f"{r['estimate']:.2f}", f"{r['cpu']:.2f}", f"{r['wall']:.2f}",
              f"{r['estimate'] / r['cpu']:.2f}"] for r in ROWS]  # fmt: skip
    print(tabulate(table, headers=["path", "size", "estimate s", "cpu s", "wall s", "estimate / cpu"]))
    ratios = [r["estimate"] / r["cpu"] for r in ROWS if r["cpu"] > 0]
    print(f"ratios from {min(ratios):.2f} to {max(ratios):.2f} (the goal is 0.5-2 for every path)")
    if args.fit:
        fit()


if __name__ == "__main__":
    main()

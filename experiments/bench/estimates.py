"""The long-run rule's estimates against the time they stand for: estimate / measured for the guarded paths, on a
small grid, in this process (iosim/estimate.py's constants; a ratio above 1 errs long).

    python experiments/bench/estimates.py            # about a minute on 2 cores when quiet

Each path is timed after a warm-up run of the same kind (Numba's compile is not part of the estimate). The
estimates are the ones the paths themselves compute before any work.
"""

from __future__ import annotations

import time

from tabulate import tabulate

import iosim
from iosim import estimate, registry
from iosim.validate import estimated_steps


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def run_rows() -> list[list]:
    rows = []
    for algo, N, d, M, count_only, backward in [
        ("flash2", 65536, 64, 16384, True, False),
        ("flash1", 65536, 64, 16384, True, False),
        ("flash2", 32768, 64, 16384, True, True),
        ("flash2", 4096, 64, 16384, False, False),
        ("flash1", 4096, 64, 16384, False, False),
        ("square-tiling", 2048, 64, 4096, False, False),
        ("flash2", 2048, 64, 16384, False, True),
    ]:
        a = registry.get(algo)
        kw = dict(N=N, d=d, M=M, count_only=count_only, backward=backward, allow_long=True)
        iosim.run(algo, N=256, d=d, M=M, count_only=count_only, backward=backward)  # warm (compile)
        t = a.backward_tiling(N, d, M, "fit") if backward else a.choose_tiling(N, d, M, "fit")
        steps = estimated_steps(t, N, d, backward)
        est = estimate.count_only_seconds(steps) if count_only else estimate.numeric_seconds(N, d, steps, backward)
        _, took = _timed(lambda kw=kw, algo=algo: iosim.run(algo, **kw))
        what = f"run {algo} {'backward' if backward else 'forward'} {'count-only' if count_only else 'numeric'}"
        rows.append([what, f"N={N}, d={d}, M={M}", est, took])
    return rows


def replay_rows() -> list[list]:
    rows = []
    iosim.replay("flash2", N=64, d=16, M=1024, policy="lru,opt")  # warm
    for N, d, M, policy in [(512, 64, 8192, "lru"), (512, 64, 8192, "opt"), (1024, 64, 16384, "lru")]:
        r, took = _timed(lambda N=N, d=d, M=M, policy=policy: iosim.replay("flash2", N=N, d=d, M=M, policy=policy,
                                                                           allow_long=True))  # fmt: skip
        rows.append([f"replay flash2 {policy}", f"N={N}, d={d}, M={M}", estimate.replay_seconds(r.accesses, [policy]),
                     took])  # fmt: skip
    return rows


def hierarchy_rows() -> list[list]:
    rows = []
    iosim.hierarchy("flash2", N=512, d=64, H_q=2, device="H100")  # warm
    for N, heads in [(8192, 8), (16384, 8)]:
        r, took = _timed(lambda N=N, heads=heads: iosim.hierarchy("flash2", N=N, d=128, H_q=heads, device="H100",
                                                                  allow_long=True))  # fmt: skip
        requests = r.requests
        est = requests * estimate.HIERARCHY_REQUEST if requests else float("nan")
        rows.append(["hierarchy flash2 (H100 preset)", f"N={N}, d=128, heads={heads}", est, took])
    return rows


def main() -> None:
    rows = run_rows() + replay_rows() + hierarchy_rows()
    table = [[w, s, f"{e:.2f}", f"{m:.2f}", f"{e / m:.2f}"] for w, s, e, m in rows]
    print(tabulate(table, headers=["path", "size", "estimate s", "measured s", "estimate / measured"]))
    ratios = [e / m for *_, e, m in rows if m > 0]
    print(f"ratios from {min(ratios):.2f} to {max(ratios):.2f} (the goal is 0.5-2 for every path)")


if __name__ == "__main__":
    main()

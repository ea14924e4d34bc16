"""CPU benchmarks of the simulator, each a ratio against a baseline measured in the same process.

Run: ``python experiments/bench/cpu.py`` (about half a minute on a 2-core machine). Times are the minimum of
several runs after a warm-up run that also compiles (Numba) the code under test. Tests never assert timings.

* flash2 forward, numeric, float64, N=4096, d=64, M=32768, under the memory model, ÷ the plain NumPy float64
  reference (iosim.algorithms.reference.attention_forward) on the same inputs. Target <= 1.5.
* flash2 backward, numeric, float64, N=4096, d=64, M=32768 (backward tiling ``fit``), under the memory model,
  ÷ the NumPy float64 reference backward (iosim.algorithms.reference.attention_backward) on the same inputs. The
  forward that produces O and L runs once, outside the timed region.
* flash1 forward, count-only, N=2^20, d=128, M=65536: wall time (target <= 2 s) and simulated words per second,
  against the numeric flash1 run at N=4096 as the in-process baseline.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from iosim.algorithms.reference import attention_backward, attention_forward, default_scale
from iosim.memory_model import TwoLevelMemory
from tabulate import tabulate

import iosim
from iosim import registry


def best_of(fn, repeat: int) -> float:
    fn()  # warm-up (and Numba compilation)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def inputs(N: int, d: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((N, d)) for _ in range(3))


def bench_flash2_forward(repeat: int) -> list:
    N, d, M = 4096, 64, 32768
    Q, K, V = inputs(N, d)
    t_ref = best_of(lambda: attention_forward(Q, K, V), repeat)
    algo = registry.get("flash2")
    t = algo.choose_tiling(N, d, M, "fit")

    def simulate():  # the driver under the memory model, without run()'s own reference check
        algo.forward(TwoLevelMemory(M), Q, K, V, N, d, t, default_scale(d), False, np.float64)

    t_sim = best_of(simulate, repeat)
    return [
        "flash2 forward numeric ÷ NumPy float64 reference",
        f"N={N}, d={d}, M={M}",
        f"{t_sim * 1e3:.1f} ms",
        f"{t_ref * 1e3:.1f} ms",
        f"{t_sim / t_ref:.2f}",
        "<= 1.5",
    ]


def bench_flash2_backward(repeat: int) -> list:
    N, d, M = 4096, 64, 32768
    Q, K, V = inputs(N, d)
    dO = np.random.default_rng(1).standard_normal((N, d))
    t_ref = best_of(lambda: attention_backward(Q, K, V, dO), repeat)
    algo = registry.get("flash2")
    scale = default_scale(d)
    fwd = algo.forward(TwoLevelMemory(M), Q, K, V, N, d, algo.choose_tiling(N, d, M, "fit"), scale, False, np.float64)
    t = algo.backward_tiling(N, d, M, "fit")

    def simulate():  # the backward driver under the memory model, without run()'s own reference check
        algo.backward(TwoLevelMemory(M), Q, K, V, dO, fwd, N, d, t, scale, False, np.float64)

    t_sim = best_of(simulate, repeat)
    return [
        "flash2 backward numeric ÷ NumPy float64 reference",
        f"N={N}, d={d}, M={M} ({t})",
        f"{t_sim * 1e3:.1f} ms",
        f"{t_ref * 1e3:.1f} ms",
        f"{t_sim / t_ref:.2f}",
        "-",
    ]


def bench_count_only(repeat: int) -> list:
    N, d, M = 2**20, 128, 65536
    r = iosim.run("flash1", N=N, d=d, M=M, count_only=True)
    t_cnt = best_of(lambda: iosim.run("flash1", N=N, d=d, M=M, count_only=True), repeat)
    Nb = 4096
    t_num = best_of(lambda: iosim.run("flash1", N=Nb, d=d, M=M), max(1, repeat // 2))
    return [
        "flash1 forward count-only (wall time; words/s)",
        f"N=2^20, d={d}, M={M}",
        f"{t_cnt:.3f} s; {r.stats.total / t_cnt:.3g} words/s",
        f"numeric N={Nb}: {t_num:.3f} s",
        f"{t_cnt / t_num:.2f}",
        "<= 2 s wall",
    ]


BENCHES = [bench_flash2_forward, bench_flash2_backward, bench_count_only]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per measurement (default 5)")
    args = parser.parse_args(argv)
    rows = [bench(args.repeat) for bench in BENCHES]
    print(tabulate(rows, headers=["benchmark", "sizes", "measured", "baseline", "ratio", "target"]))


if __name__ == "__main__":
    main()

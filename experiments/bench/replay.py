"""Benchmark of the cache replay (iosim.replay): operand accesses per second for LRU, FIFO and OPT, and the
replay the issue names, flash2 forward at N=1024, d=64, M=16384 (cache of M words, 1-word lines).

Run: ``python experiments/bench/replay.py`` (about a minute and a half on the 2-core machine; ``--N 512`` for a
quick one). Each policy runs once after a warm-up on a small trace that compiles its kernels; the time covers the
cache simulation (for OPT: writing the line trace, its next-use array and the simulation), not the count-only run
and the derivation of the compute ops, shown apart. Targets: LRU >= 1e7 accesses/s, OPT >= 1e6/s, LRU and OPT
together under a minute. Tests never assert timings.
"""

from __future__ import annotations

import argparse
import time

from tabulate import tabulate

import iosim
from iosim.views.replay import operand_ops, replay_ops


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--N", type=int, default=1024)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--M", type=int, default=16384)
    p.add_argument("--policy", default="lru,opt,fifo")
    a = p.parse_args()
    iosim.replay("flash2", N=32, d=8, M=512)  # warm-up: compiles every kernel
    t0 = time.perf_counter()
    r = iosim.run("flash2", N=a.N, d=a.d, M=a.M, count_only=True, trace=True, reference=False)
    ops, x = operand_ops(r.trace, "flash2", False, a.N, 1)
    derive = time.perf_counter() - t0
    explicit = r.stats.total
    rows = []
    together = 0.0
    for policy in a.policy.split(","):
        res = replay_ops(ops, x, policy, a.M, 1, True)
        together += res.seconds if policy in ("lru", "opt") else 0.0
        rows.append(
            [
                policy,
                f"{res.accesses:,}",
                f"{res.seconds:.2f} s",
                f"{res.accesses / res.seconds:.3g}",
                f"{res.total:,}",
                f"{res.total / explicit:.3f}",
            ]
        )
    print(f"flash2 forward, N={a.N}, d={a.d}, M={a.M}; cache {a.M} words, 1-word lines, write-allocate")
    print(f"count-only traced run + compute-op derivation: {derive:.2f} s; explicit schedule: {explicit:,} words")
    print(tabulate(rows, headers=["policy", "accesses", "time", "accesses/s", "words moved", "/ explicit"]))
    print(f"LRU + OPT replay: {together:.1f} s (target < 60 s)")


if __name__ == "__main__":
    main()

"""Count-only cost of a decoding batch: B = 64, H_q = 32, H_kv = 8, N_q = 1, N_k = 131,072, d = 128.

Run: ``python experiments/bench/decoding.py [--M 65536]``. Prints, for flash2 (GQA per-head and packed, with and
without split-KV) and flash1, the tiles visited, the wall time of a warm count-only run (minimum of 5 after a
warm-up that compiles) and the nanoseconds per tile: the cost stays proportional to the tiles. Every group of
heads is simulated (nothing is multiplied), and each run is checked exact against iosim.theory.io_model.
Tests never assert timings.
"""

from __future__ import annotations

import argparse
import time

import iosim
from iosim import Problem


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--M", type=int, default=65536, help="fast memory in words (default 65,536: 256 KiB of fp32)")
    ap.add_argument("--Nk", type=int, default=131072)
    args = ap.parse_args()
    p = Problem(B=64, H_q=32, H_kv=8, N_q=1, N_k=args.Nk, d=128)
    print(f"problem: {p}; M = {args.M:,}")
    for algo, gqa, splits in [
        ("flash2", "per-head", 1),
        ("flash2", "packed", 1),
        ("flash2", "packed", 8),
        ("flash1", "packed", 1),
    ]:
        kw = dict(problem=p, M=args.M, count_only=True)
        schedule = iosim.Schedule(algo, gqa=gqa, splits=splits)
        r = iosim.run(schedule, **kw)  # warm-up (compiles on a cold cache)
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            r = iosim.run(schedule, **kw)
            best = min(best, time.perf_counter() - t0)
        G = p.g if gqa == "per-head" else 1
        tiles = p.B * p.H_kv * G * -(-(p.N_q * p.g // G) // r.tiling.Br) * -(-p.N_k // r.tiling.Bc)
        print(
            f"{algo:7s} {gqa:9s} s={splits:<2d} {r.tiling}: {tiles:>9,} tiles, {best * 1e3:8.2f} ms, "
            f"{best / tiles * 1e9:6.1f} ns/tile, total {r.stats.total:,} words, exact {r.main.exact}"
        )


if __name__ == "__main__":
    main()

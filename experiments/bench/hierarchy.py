"""How long an H100-sized launch takes through the hierarchy (iosim.hierarchy): FlashAttention-2 forward at
N = 32k, d = 128, batch x heads = 32, 132 SMs, a 50 MB L2 with 128-byte lines (64 fp16 words), LRU, each block order.
The issue's target: under a minute for LRU.

Run: ``python experiments/bench/hierarchy.py`` (``--repeat 3``; ``--N``, ``--heads``, ``--backward``). The first
call compiles (Numba's cache keeps it for later runs) and runs the single-head schedule with its trace; the table
shows each call's wall time, the part spent in the trace run and the cut (``schedule``), the tile requests the
L2 saw and the requests per second of the L2 part. The 1-minute load average is printed: the development machine
is shared, and timings move with it. Tests never assert timings.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from tabulate import tabulate

import iosim
from iosim.hierarchy import ORDERS, Scheduler, device, hierarchy


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--N", type=int, default=32768)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--device", default="H100")
    ap.add_argument("--backward", action="store_true")
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args(argv)
    t = time.perf_counter()
    hierarchy("flash2", N=256, d=64, device=a.device, backward=a.backward)  # compile (or load from the cache)
    print(f"warm-up (compile or cache load): {time.perf_counter() - t:.1f} s", file=sys.stderr)
    t = time.perf_counter()
    M = device(a.device).smem_per_block_bytes // 2
    iosim.run("flash2", N=a.N, d=a.d, M=M, count_only=True, trace=True, backward=a.backward)
    schedule = time.perf_counter() - t
    rows = []
    for _ in range(a.repeat):
        for order in ORDERS:
            t = time.perf_counter()
            h = hierarchy("flash2", N=a.N, d=a.d, H_q=a.heads, device=a.device, scheduler=Scheduler(order=order),
                          backward=a.backward, allow_long=True)  # fmt: skip
            wall = time.perf_counter() - t
            rows.append(
                [order, f"{wall:.2f}", f"{h.requests:,}", f"{h.requests / max(wall - schedule, 1e-9):,.0f}",
                 f"{h.ratio:.4f}", f"{h.dram_bytes / 1e9:.3f}", f"{os.getloadavg()[0]:.1f}"]
            )  # fmt: skip
    print(
        f"flash2 {'backward' if a.backward else 'forward'}, N={a.N}, d={a.d}, batch x heads = {a.heads}, "
        f"{a.device} (M = {h.M:,} words, {h.tiling}, {h.ctas:,} CTAs, {h.P} SMs x {h.blocks_per_sm}), LRU; "
        f"single-head traced run alone: {schedule:.2f} s"
    )
    print(
        tabulate(
            rows,
            headers=[
                "order",
                "seconds",
                "tile requests",
                "requests/s (L2 part)",
                "DRAM / two-level",
                "DRAM GB",
                "load",
            ],
            disable_numparse=True,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

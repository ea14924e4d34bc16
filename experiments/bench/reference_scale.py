"""The float64 reference at scale: a numeric ``iosim run`` (simulated algorithm + row-block reference check) at long N,
its wall time and peak resident memory, each size in a fresh process.

Run: ``python experiments/bench/reference_scale.py`` (default: flash2 forward, N = 16384, 32768, 65536, d = 64,
M = 16384; about 5 minutes on the 2-core development machine, most of it N = 65536) or
``--N 65536 --backward``. Peak RSS is the child's ``ru_maxrss`` (``resource.getrusage(RUSAGE_CHILDREN)``,
kilobytes on Linux), read after each child exits; each size runs alone in its own process, so the figure is that
run's peak. With ``--split`` the reference's share of the time is measured too, in the
same child after the run, by timing :func:`iosim.algorithms.reference.attention_forward` (or
``attention_backward``) once on inputs of the same size.

Before the row-block reference, N = 16384 took 6.5 GB of RSS and N = 32768 died with a MemoryError
traceback building the 8 GiB N x N score matrix. Tests never assert timings.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from tabulate import tabulate

CHILD = """
import json, resource, sys, time
import numpy as np
import iosim
from iosim.algorithms.reference import attention_backward, attention_forward
N, d, M, backward, split = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5] == "1"
iosim.run("flash2", N=64, d=d, M=M, backward=backward)  # compile (Numba cache) outside the timed region
t0 = time.perf_counter()
r = iosim.run("flash2", N=N, d=d, M=M, backward=backward, allow_long=True)  # asked for by name: no prompt
t_run = time.perf_counter() - t0
t_ref = None
if split:
    rng = np.random.default_rng(0)
    Q, K, V, dO = (rng.standard_normal((N, d)) for _ in range(4))
    t0 = time.perf_counter()
    attention_backward(Q, K, V, dO) if backward else attention_forward(Q, K, V)
    t_ref = time.perf_counter() - t0
print(json.dumps({"run_s": t_run, "ref_s": t_ref, "max_abs_error": r.max_abs_error, "exact": r.main.exact}))
"""


def measure(N: int, d: int, M: int, backward: bool, split: bool) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(N), str(d), str(M), "1" if backward else "0", "1" if split else "0"],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:  # the child's own last line (an InputError, say), not a CalledProcessError traceback
        last = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        sys.exit(f"reference_scale: N={N:,} d={d} M={M:,} {'backward' if backward else 'forward'} failed: {last}")
    wall = time.perf_counter() - t0
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        "N": N,
        "pass": "backward" if backward else "forward",
        "run_s": got["run_s"],
        "reference_s": got["ref_s"],
        "process_s": wall,
        "peak_rss_GiB": peak_kb / 2**20 if peak_kb > before else None,  # None: not above an earlier child's peak
        "max_abs_error": got["max_abs_error"],
        "exact": got["exact"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--N", type=int, nargs="+", default=[16384, 32768, 65536])
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--M", type=int, default=16384)
    p.add_argument("--backward", action="store_true")
    p.add_argument("--split", action="store_true", help="also time the reference alone (after the run, same process)")
    args = p.parse_args(argv)
    rows = []
    for N in sorted(args.N):  # ascending, so each child's peak exceeds the previous ones' and is its own
        r = measure(N, args.d, args.M, args.backward, args.split)
        rows.append(r)
        print(json.dumps(r), flush=True)
    print(tabulate(rows, headers="keys", floatfmt=".3g"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How long ``iosim kernel`` takes to count a FlashAttention-2-style Triton forward under the interpreter, and how
the time grows with N.

Run: ``python experiments/bench/kernel_count.py`` (default N = 512 1024 2048 4096, d = 128, Br = Bc = 64,
float16; ``--N 1024 4096``, ``--d 64``, ``--B 128``, ``--dtype float32`` to change). Each N is counted in a fresh
process (``iosim.kernels.count_file`` on ``iosim/kernels/examples/triton_flash2.py``), every access counted; the time
is the counting's own (``counts.seconds``: the launcher and its kernel under the interpreter with iosim's hooks), not
the import of torch and triton. Each row says whether the counts equal flash2's closed form per array.

``--fast`` also counts each N with ``fast=True`` (``iosim kernel --fast``: the values no address, mask, branch or loop
bound depends on are not computed) in the same run, checks that its per-array counts are identical to the exact
run's, and prints the exact run's time over the fast run's.

Growth: the interpreter runs the programs one after another, and each program steps over its Tc = N / Bc column
blocks with Br x Bc numpy operations, so the work is Tr x Tc = N^2 / (Br Bc) block steps: the time grows as N^2
(the ratio column, time at N over time at N / 2, tends to 4). The 1-minute load average is printed beside the
table: the development machine is shared, and the timings move with it. Tests never assert timings.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[2]
KERNEL = ROOT / "iosim" / "kernels" / "examples" / "triton_flash2.py"


def _per_array(counts) -> dict:
    return {k: (a.reads, a.writes, a.distinct_reads, a.distinct_writes) for k, a in counts.per_array.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--N", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--B", type=int, default=64, help="Br = Bc")
    ap.add_argument("--dtype", default="float16", help="the inputs' dtype (float16, float32)")
    ap.add_argument("--fast", action="store_true", help="also count with --fast and compare")
    args = ap.parse_args(argv)

    from iosim.kernels import compare, count_file

    rows, last = [], None
    for N in args.N:
        params = dict(N=N, d=args.d, Br=args.B, Bc=args.B, dtype=args.dtype)
        counts, _, _ = count_file(str(KERNEL), params=params, arrays=False, timeout=3600)
        cmp = compare(counts, "flash2", N, args.d, args.B, args.B)
        ratio = f"{counts.seconds / last[1]:.2f} (N x {N / last[0]:g})" if last else ""
        row = [N, counts.programs, f"{counts.total:,}", "yes" if cmp.equal else "NO", f"{counts.seconds:.1f}", ratio]
        if args.fast:
            fast, _, _ = count_file(str(KERNEL), params=params, arrays=False, timeout=3600, fast=True)
            row += [f"{fast.seconds:.1f}", "yes" if _per_array(fast) == _per_array(counts) else "NO",
                    f"{counts.seconds / fast.seconds:.2f}"]  # fmt: skip
        rows.append(row)
        last = (N, counts.seconds)
    print(f"flash2-style Triton forward, d={args.d}, Br=Bc={args.B}, {args.dtype}, counted under TRITON_INTERPRET=1")
    head = ["N", "programs", "words counted", "equal to flash2", "seconds", "time ratio"]
    if args.fast:
        head += ["--fast seconds", "identical", "exact / fast"]
    print(tabulate(rows, head))
    print(f"load average (1 min): {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())

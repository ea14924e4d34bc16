"""How long ``iosim kernel`` takes to count a FlashAttention-2-style Triton forward under the interpreter, and how
the time grows with N.

Run: ``python experiments/bench/kernel_count.py`` (default N = 512 1024 2048 4096, d = 128, Br = Bc = 64,
float16; ``--N 1024 4096``, ``--d 64`` to change). Each N is counted in a fresh process (``iosim.kernels.count_file``
on ``iosim/kernels/examples/triton_flash2.py``), every access counted exactly (no mode skips work); the time is the
counting's own (``counts.seconds``: the launcher and its kernel under the interpreter with iosim's hooks), not the
import of torch and triton. Each row says whether the counts equal flash2's closed form per array.

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--N", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--B", type=int, default=64, help="Br = Bc")
    args = ap.parse_args(argv)

    from iosim.kernels import compare, count_file

    rows, last = [], None
    for N in args.N:
        params = dict(N=N, d=args.d, Br=args.B, Bc=args.B, dtype="float16")
        counts, _, _ = count_file(str(KERNEL), params=params, arrays=False, timeout=3600)
        cmp = compare(counts, "flash2", N, args.d, args.B, args.B)
        ratio = f"{counts.seconds / last[1]:.2f} (N x {N / last[0]:g})" if last else ""
        rows.append([N, counts.programs, f"{counts.total:,}", "yes" if cmp.equal else "NO", f"{counts.seconds:.1f}",
                     ratio])  # fmt: skip
        last = (N, counts.seconds)
    print(f"flash2-style Triton forward, d={args.d}, Br=Bc={args.B}, float16, counted under TRITON_INTERPRET=1")
    print(tabulate(rows, ["N", "programs", "words counted", "equal to flash2", "seconds", "time ratio"]))
    print(f"load average (1 min): {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())

"""The long-run rule's estimate of ``iosim check`` on the CUDA simulator against its CPU time: estimate / measured for
each built-in kernel at small N and d (iosim/runner/estimate.py's SIMULATOR_N2D; a ratio above 1 errs long).

    python experiments/bench/simulator.py          # about a minute of CPU on 2 cores

The simulator runs each thread of a block as a Python thread, and on entering a device function it swaps the
``cuda`` global of that function's module for its fake module and swaps it back on leaving: two threads in device
functions of one module race (the second finds no ``cuda`` to swap, the first restores it while the second still
runs); iosim counts that swap per module (:mod:`iosim.gpu.simulator`), so every check runs to its end and can be
timed. The estimate is the
one ``iosim check`` computes before any work (its cases, heads and the backward's factor).
"""

from __future__ import annotations

import contextlib
import io
import os
import time

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # before numba.cuda is imported
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # BLAS's idle threads spin on CPU time
    os.environ.setdefault(_var, "1")

from tabulate import tabulate  # noqa: E402

from iosim.cli import main as cli  # noqa: E402
from iosim.gpu import launch as gpu  # noqa: E402
from iosim.kernels.check import planned_cases  # noqa: E402
from iosim.runner import estimate  # noqa: E402

GRID = [("flash2", 64, 16), ("flash2", 32, 32), ("flash1", 64, 16), ("standard", 64, 16), ("square-tiling", 32, 16)]
HEADS = 2


def main() -> None:
    rows = []
    for kernel, N, d in GRID:
        cases = planned_cases([N], [d], False, None)
        est = estimate.simulator_seconds(cases, HEADS, backward=kernel in gpu.BACKWARD_KERNELS)
        argv = ["check", "--kernel", kernel, "--N", str(N), "--d", str(d), "--heads", str(HEADS), "--yes"]
        c0, w0 = time.process_time(), time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            rc = cli(argv)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        print(f"  {kernel}, N={N}, d={d}: exit {rc}, estimate {est:.1f} s, cpu {cpu:.1f} s", flush=True)
        size = f"N={N}, d={d}, heads={HEADS}, {len(cases)} cases"
        rows.append([f"iosim check --kernel {kernel}", size, f"{est:.1f}", f"{cpu:.1f}", f"{wall:.1f}",
                     f"{est / cpu:.2f}", "passed" if rc == 0 else "FAILED"])  # fmt: skip
    print(tabulate(rows, headers=["path", "size", "estimate s", "cpu s", "wall s", "estimate / cpu", "check"]))


if __name__ == "__main__":
    main()

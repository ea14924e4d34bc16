"""FlashAttention's backward loop nests of two commits in one process, run by run in turn: the new/old time ratio
of each, free of the machine's load drifting between two separate runs.

Run: ``python experiments/bench/nest_ab.py [--rev 74d3586] [--repeat 15] [--bench-sizes]`` (about four minutes of
CPU on the shared 2-core machine at the default sizes, most of it compiling the old nest). The old nest is
``algorithms/flash.py`` as commit ``--rev`` has it (``git show``), loaded as a module of its own beside the installed
one; it imports the current ``iosim.algorithms._tiles``, ``tile_masks`` and ``memory_model``, so ``--rev`` must be a
commit whose flash.py takes those as they are now. Both nests run the same one-head backward (flash1_backward,
flash2_backward) on the same memory model and inputs, their counts asserted equal first; each repetition times the
old then the new (CPU time, ``time.process_time``), and the table gives the minimum and median of each and the
ratios new/old. Default sizes: count-only N=2^16, d=64, M=16384 (counters-only memory, without and with the causal
mask) and numeric N=2048; ``--bench-sizes``: the numeric backward of ``cpu.py`` (N=4096, d=64, M=32768, fit tiles),
without and with the causal mask. Tests never assert timings.
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # one BLAS thread, as cpu.py
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import pathlib  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from iosim.algorithms import flash  # noqa: E402
from iosim.algorithms.reference import default_scale  # noqa: E402
from iosim.memory_model import TwoLevelMemory  # noqa: E402
from tabulate import tabulate  # noqa: E402

from iosim.runner import registry  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


def old_flash(rev: str):
    """algorithms/flash.py at commit ``rev``, imported as the module ``flash_at_<rev>`` from a file in the temporary
    folder that keeps its name (and is left as it is when it holds that text), so Numba's cache serves a rerun."""
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:algorithms/flash.py"], check=True,
                          capture_output=True, text=True).stdout  # fmt: skip
    name = f"flash_at_{rev}"
    path = pathlib.Path(tempfile.gettempdir()) / "iosim-nest-ab" / f"{name}.py"
    path.parent.mkdir(exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the module runs
    spec.loader.exec_module(module)
    return module


def backward(module, alg: str, numeric: bool, causal: bool, N: int, d: int, M: int):  # noqa: N803
    """A function running ``module``'s one-head backward of ``alg`` (fit tiles) and returning its counts."""
    t = registry.get(alg).backward_tiling(N, d, M, "fit")
    Q = K = V = dO = O = l = m = L = None  # noqa: E741
    scale = 1.0
    if numeric:
        rng = np.random.default_rng(0)
        Q, K, V, dO = (rng.standard_normal((N, d)) for _ in range(4))
        scale = default_scale(d)
        sizes = dict(N=N, d=d, Br=t.Br, Bc=t.Bc, scale=scale, causal=causal)
        if alg == "flash1":
            O, l, m = flash.flash1_forward(TwoLevelMemory(M), Q, K, V, **sizes)[:3]  # noqa: E741
        else:
            O, L = flash.flash2_forward(TwoLevelMemory(M), Q, K, V, **sizes)[:2]

    def run():
        mem = TwoLevelMemory(M, fast=not numeric)
        sizes = dict(N=N, d=d, Br=t.Br, Bc=t.Bc, scale=scale, causal=causal)
        if alg == "flash1":
            module.flash1_backward(mem, Q, K, V, O, dO, l, m, **sizes)
        else:
            module.flash2_backward(mem, Q, K, V, O, dO, L, **sizes)
        return mem.stats()

    return run, t


def interleaved(f_old, f_new, repeat: int) -> tuple[list, list]:
    """CPU seconds of ``repeat`` runs of each, the old then the new in every repetition."""
    times: tuple[list, list] = ([], [])
    for _ in range(repeat):
        for f, ts in zip((f_old, f_new), times, strict=True):
            t0 = time.process_time()
            f()
            ts.append(time.process_time() - t0)
    return times


def _ms(ts: list) -> str:
    return f"{min(ts) * 1e3:.1f} / {statistics.median(ts) * 1e3:.1f}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rev", default="74d3586", help="the old commit (default 74d3586, before the nest's split)")
    p.add_argument("--repeat", type=int, default=15, help="timed runs of each (numeric: half as many, at least 3)")
    p.add_argument("--bench-sizes", action="store_true", help="cpu.py's numeric backward sizes instead")
    args = p.parse_args(argv)
    grid = [(False, False, 2**16, 16384), (False, True, 2**16, 16384), (True, False, 2048, 16384)]
    if args.bench_sizes:
        grid = [(True, False, 4096, 32768), (True, True, 4096, 32768)]
    rows = []
    old = old_flash(args.rev)
    for alg in ("flash1", "flash2"):
        for numeric, causal, N, M in grid:
            (f_old, t), (f_new, _) = (backward(mod, alg, numeric, causal, N, 64, M) for mod in (old, flash))
            assert f_old() == f_new()  # the same counts (and the warm-up, Numba's compile included)
            o, n = interleaved(f_old, f_new, max(3, args.repeat // 2) if numeric else args.repeat)
            what = f"{alg} backward {'numeric' if numeric else 'count-only'}{', causal' if causal else ''}"
            ratios = [f"{min(n) / min(o):.2f}", f"{statistics.median(n) / statistics.median(o):.2f}"]
            rows.append([what, f"N={N}, d=64, M={M} ({t})", _ms(o), _ms(n), *ratios])
            print(*rows[-1], sep="  |  ", flush=True)
    heads = ["backward", "sizes", f"{args.rev} min / median ms", "this tree min / median ms", "new/old min",
             "new/old median"]  # fmt: skip
    print(tabulate(rows, headers=heads))


if __name__ == "__main__":
    main()

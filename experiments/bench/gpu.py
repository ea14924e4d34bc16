"""GPU benchmark of the numba.cuda kernels, against PyTorch's scaled_dot_product_attention where installed.

Run on a machine with an NVIDIA GPU and the ``cuda`` extra (``pip install -e ".[cuda]"``; PyTorch optional):

    python experiments/bench/gpu.py                 # the full run (tables on stdout and in results/bench_gpu/)
    python experiments/bench/gpu.py --quick         # smaller shapes and a shorter sweep, a few minutes

Without a GPU it stops at once with a message (use ``iosim check --kernel NAME --quick`` for the simulator).

What it measures, all float32 on CUDA cores (numba-cuda has no tensor-core intrinsics; PyTorch is run in float32
too, so both sides use the same precision; PyTorch's float32 SDPA picks its own backend, and on recent GPUs may use
TF32 tensor cores only if ``torch.backends.cuda.matmul.allow_tf32`` is on, which is off by default):

1. For (B, H, N, d) = (4, 16, 4096, 64) and (1, 8, 8192, 128), fast memory M words of shared memory per block
   (default 16384 words = 64 KiB, as ``iosim compare``): each kernel's median time over repeated launches after a
   warm-up (CUDA events), its achieved TFLOP/s (4 B H N^2 d flops forward, 10 B H N^2 d backward; about half of
   that with --causal) and GB/s of its *scheduled* traffic (the simulator's exact words for this (N, d, M, tiling),
   times B H, times 4 bytes, divided by the time). With PyTorch: SDPA forward and backward on the same inputs and
   the ratio ours / theirs.
2. An M sweep on each shape: M from d^2/16 to the largest shared memory one block may use on this device, timing
   square-tiling (Saha & Ye, the small-cache algorithm) against flash2, next to their simulated I/O: the measured
   GPU answer to whether the small-cache algorithm wins when the cache is small.
3. Where Nsight Compute (``ncu``) is on the PATH and --no-ncu is not given: per kernel, at B = H = 1, the DRAM bytes,
   L2 bytes and global load/store bytes the hardware counted, next to the simulated words x 4 bytes.

Timings are printed and written with the device name; tests never assert timings.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
CASES = ((4, 16, 4096, 64), (1, 8, 8192, 128))
QUICK_CASES = ((2, 8, 2048, 64), (1, 4, 2048, 128))
FORWARD = ("flash2", "flash1", "standard", "square-tiling")
DEFAULT_M = 16384
SWEEP_FACTORS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1, 2, 4, 8)
QUICK_SWEEP_FACTORS = (1 / 8, 1 / 2, 1, 2)
NCU_METRICS = (
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "lts__t_bytes.sum",
    "l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum",
    "l1tex__t_bytes_pipe_lsu_mem_global_op_red.sum",
)


def parse_case(text: str) -> tuple[int, int, int, int]:
    try:
        B, H, N, d = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a case is B,H,N,d (four integers), got {text!r}") from None
    if min(B, H, N, d) <= 0:
        raise argparse.ArgumentTypeError(f"B, H, N, d must be positive, got {text!r}")
    return B, H, N, d


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller shapes and sweep (a few minutes)")
    p.add_argument("--case", type=parse_case, action="append", help="B,H,N,d (repeatable; default the two above)")
    p.add_argument("--M", type=int, default=DEFAULT_M, help=f"shared memory per block in words (default {DEFAULT_M})")
    p.add_argument("--causal", action="store_true", help="causal masking")
    p.add_argument("--threads", type=int, default=128, help="threads per block (default 128)")
    p.add_argument("--reps", type=int, default=20, help="timed launches per measurement at most (default 20)")
    p.add_argument("--seconds", type=float, default=3.0, help="time budget per measurement (default 3 s)")
    p.add_argument("--kernels", nargs="+", default=list(FORWARD) + ["flash2-backward"], help="what to time")
    p.add_argument("--no-sweep", action="store_true", help="skip the M sweep")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch baseline")
    p.add_argument("--no-ncu", action="store_true", help="skip Nsight Compute even if ncu is installed")
    p.add_argument("--out", type=pathlib.Path, default=ROOT / "results" / "bench_gpu", help="output directory")
    p.add_argument("--ncu-child", nargs=5, metavar=("KERNEL", "N", "d", "M", "CAUSAL"), help=argparse.SUPPRESS)
    return p


def require_gpu():
    """numba.cuda on a real GPU, or exit with a message saying why not."""
    from iosim.gpu.launch import cuda_missing

    missing = cuda_missing()  # numba's deprecated built-in numba.cuda imports without numba-cuda: ask for the package
    if missing:
        print(f"bench/gpu.py: error: {missing}", file=sys.stderr)
        sys.exit(2)
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        sys.exit(
            "bench/gpu.py: NUMBA_ENABLE_CUDASIM is set: the CUDA simulator times nothing; unset it on a GPU machine"
        )
    from numba import cuda

    if not cuda.is_available():
        sys.exit(
            "bench/gpu.py: no CUDA GPU found (numba.cuda.is_available() is False). This benchmark needs one; "
            "without a GPU, `iosim check --kernel flash2 --quick` checks the kernels on the CUDA simulator."
        )
    return cuda


def flops(name: str, B: int, H: int, N: int, d: int, causal: bool) -> float:
    frac = (N + 1) / (2 * N) if causal else 1.0
    per = 10 if name.endswith("backward") else 4
    return per * B * H * N * N * d * frac


class Timer:
    def __init__(self, cuda, reps: int, seconds: float):
        self.cuda, self.reps, self.seconds = cuda, reps, seconds

    def median_ms(self, fn) -> float:
        """Median over up to ``reps`` launches (CUDA events on the default stream) after one warm-up launch."""
        cuda = self.cuda
        fn()  # warm-up (and compilation)
        cuda.synchronize()
        start, end = cuda.event(), cuda.event()
        times = []
        budget_start = time.perf_counter()
        while len(times) < self.reps:
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
            spent = time.perf_counter() - budget_start
            if len(times) >= 3 and spent > self.seconds:
                break
            if len(times) == 1 and times[0] / 1e3 > self.seconds:  # one launch is over budget
                break
        return statistics.median(times)


def lease_args(description: str, dry_run_help: str, out_name: str, argv=None) -> argparse.Namespace:
    """The options of a lease script (gpu_variants.py, gpu_waves.py): --dry-run, --out, --reps, --seconds."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--dry-run", action="store_true", help=dry_run_help)
    p.add_argument("--out", type=pathlib.Path, help=f"folder for {out_name}")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--seconds", type=float, default=1.0, help="time budget per timing (default 1 s)")
    args = p.parse_args(argv)
    if args.reps < 1 or args.seconds <= 0:
        p.error("--reps must be >= 1 and --seconds > 0")
    return args


def gpu_main(tool: str, rows, args, out_name: str) -> int:
    """A lease script's run on the GPU (gpu_variants.py, gpu_waves.py): one line and exit 2 where numba.cuda sees no
    GPU; else ``rows(cuda, Timer)`` as {"device", "rows"}, written to ``args.out``/``out_name`` when given."""
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "0")
    from numba import cuda

    if not cuda.is_available():
        print(f"{tool}: no CUDA GPU (use --dry-run without one)", file=sys.stderr)
        return 2
    name = cuda.get_current_device().name
    device = name.decode() if isinstance(name, bytes) else str(name)
    result = {"device": device, "rows": rows(cuda, Timer(cuda, args.reps, args.seconds))}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / out_name).write_text(json.dumps(result, indent=1))
    return 0


def simulated_words(gpu, name: str, N: int, d: int, M: int, causal: bool, BH: int) -> int | None:
    backward = name.endswith("backward")
    base = name.removesuffix("-backward")
    try:
        counts = gpu.simulated_counts(base, N, d, M, causal=causal, backward=backward, batch=BH)
    except Exception:
        return None
    return sum(c.reads + c.writes for c in counts.values())


def _outputs(cuda, name: str, BH: int, N: int, d: int) -> dict:
    shapes = {
        "flash2": {"O": (BH, N, d), "L": (BH, N)},
        "flash1": {"O": (BH, N, d), "l": (BH, N), "m": (BH, N), "L": (BH, N)},
        "standard": {"O": (BH, N, d), "S": (BH, N, N), "P": (BH, N, N)},
        "square-tiling": {"O": (BH, N, d), "S": (BH, N, N), "L": (BH, N)},
        "flash2-backward": {"dQ": (BH, N, d), "dK": (BH, N, d), "dV": (BH, N, d), "D": (BH, N)},
    }[name]
    return {k: cuda.device_array(s, dtype=np.float32) for k, s in shapes.items()}


def runner(cuda, gpu, name: str, arrays: dict, M: int, causal: bool, threads: int):
    """A no-argument launch of kernel ``name`` on device arrays, outputs preallocated (nothing allocated per call)."""
    Q, K, V = arrays["Q"], arrays["K"], arrays["V"]
    B, H, N, d = Q.shape
    out = _outputs(cuda, name, B * H, N, d)
    if name == "flash2-backward":
        fwd = gpu.forward("flash2", Q, K, V, M=M, causal=causal, threads=threads, poison=False)
        O, L = fwd.outputs["O"], fwd.outputs["L"]

        def run():
            gpu.backward(
                "flash2", Q, K, V, O, arrays["dO"], L, M=M, causal=causal, threads=threads, poison=False, out=out
            )

        return run

    def run():
        gpu.forward(name, Q, K, V, M=M, causal=causal, threads=threads, poison=False, out=out)

    return run


def torch_runners(arrays: dict, causal: bool):
    """SDPA forward and backward on the same device memory (zero-copy through __cuda_array_interface__)."""
    import torch
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    if not torch.cuda.is_available():
        return None
    q, k, v, do = (torch.as_tensor(arrays[n], device="cuda") for n in ("Q", "K", "V", "dO"))
    qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    o = sdpa(qg, kg, vg, is_causal=causal)

    def fwd():
        with torch.no_grad():
            sdpa(q, k, v, is_causal=causal)

    def bwd():
        torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)

    return {"forward": fwd, "backward": bwd}


def torch_median_ms(fn, reps: int, seconds: float) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    times, t0 = [], time.perf_counter()
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
        if len(times) >= 3 and time.perf_counter() - t0 > seconds:
            break
    return statistics.median(times)


def device_arrays(cuda, B, H, N, d, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    return {n: cuda.to_device(rng.standard_normal((B, H, N, d)).astype(np.float32)) for n in ("Q", "K", "V", "dO")}


def max_shared_words(cuda) -> int:
    return cuda.get_current_device().MAX_SHARED_MEMORY_PER_BLOCK_OPTIN // 4


def main_table(cuda, gpu, args, case, timer, torch_ok: bool) -> list[dict]:
    B, H, N, d = case
    arrays = device_arrays(cuda, B, H, N, d)
    M = min(args.M, max_shared_words(cuda))
    rows = []
    theirs = {}
    if torch_ok:
        tr = torch_runners(arrays, args.causal)
        if tr:
            theirs = {k: torch_median_ms(f, args.reps, args.seconds) for k, f in tr.items()}
            for k, t in theirs.items():
                fl = flops("x-backward" if k == "backward" else "x", B, H, N, d, args.causal)
                rows.append(
                    {
                        "case": case,
                        "kernel": f"torch sdpa {k}",
                        "M": None,
                        "tiling": "-",
                        "ms": t,
                        "TFLOP/s": fl / t / 1e9,
                        "GB/s": None,
                        "words": None,
                        "ours/torch": None,
                    }
                )
    for name in args.kernels:
        base = name.removesuffix("-backward")
        row = {"case": case, "kernel": name, "M": M}
        try:
            t = gpu.tiling_for(base, N, d, M, "fit", backward=name.endswith("backward"))
            row["tiling"] = str(t).replace("rule=fit, ", "")
            ms = timer.median_ms(runner(cuda, gpu, name, arrays, M, args.causal, args.threads))
        except Exception as e:  # a tiling that does not fit, or a launch failure: report it, keep going
            row.update({"tiling": f"not run: {e}", "ms": None})
            rows.append(row)
            continue
        words = simulated_words(gpu, name, N, d, M, args.causal, B * H)
        ref = theirs.get("backward" if name.endswith("backward") else "forward")
        row.update(
            {
                "ms": ms,
                "TFLOP/s": flops(name, B, H, N, d, args.causal) / ms / 1e9,
                "words": words,
                "GB/s": None if words is None else words * 4 / ms / 1e6,
                "ours/torch": None if ref is None else ms / ref,
            }
        )
        rows.append(row)
        print(f"  {name:18s} {row['tiling']:18s} {ms:10.3f} ms", flush=True)
    return rows


def sweep(cuda, gpu, args, case, timer) -> list[dict]:
    B, H, N, d = case
    arrays = device_arrays(cuda, B, H, N, d)
    top = max_shared_words(cuda)
    factors = QUICK_SWEEP_FACTORS if args.quick else SWEEP_FACTORS
    Ms = sorted({int(f * d * d) for f in factors if f * d * d <= top} | {top})
    rows = []
    for M in Ms:
        row = {"case": case, "M": M, "M/d^2": M / (d * d)}
        for name in ("flash2", "square-tiling"):
            try:
                t = gpu.tiling_for(name, N, d, M, "fit")
                ms = timer.median_ms(runner(cuda, gpu, name, arrays, M, args.causal, args.threads))
                row[f"{name} tiling"] = str(t).replace("rule=fit, ", "")
                row[f"{name} ms"] = ms
                row[f"{name} words"] = simulated_words(gpu, name, N, d, M, args.causal, B * H)
            except Exception as e:
                row[f"{name} tiling"] = f"not run: {type(e).__name__}"
                row[f"{name} ms"] = None
                row[f"{name} words"] = None
        f, s = row["flash2 ms"], row["square-tiling ms"]
        row["time sq/flash2"] = None if not (f and s) else s / f
        fw, sw = row["flash2 words"], row["square-tiling words"]
        row["I/O sq/flash2"] = None if not (fw and sw) else sw / fw
        rows.append(row)
        print(f"  M={M:6d} ({M / d / d:6.3f} d^2): flash2 {f} ms, square-tiling {s} ms", flush=True)
    return rows


def ncu_child(kernel: str, N: int, d: int, M: int, causal: bool) -> None:
    """One launch of ``kernel`` at B = H = 1 for Nsight Compute (no warm-up: compiling launches nothing)."""
    cuda = require_gpu()
    from iosim.gpu import launch as gpu

    arrays = device_arrays(cuda, 1, 1, N, d)
    run = runner(cuda, gpu, kernel, arrays, M, causal, 128)
    if kernel == "flash2-backward":
        cuda.synchronize()  # the forward that made O and L is outside the profiled range below
    cuda.profile_start()
    run()
    cuda.synchronize()
    cuda.profile_stop()


def parse_ncu_csv(text: str) -> list[dict]:
    """ncu --csv --print-units base rows grouped by launch: [{"id", "name", "grid", "block", metric: value, ...}],
    in launch order (the one parser: ncu_raw.parse, beside this file)."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import ncu_raw

    return ncu_raw.parse(text)


def ncu_table(gpu, args, case) -> list[dict]:
    _, _, N, d = case
    M = args.M
    rows = []
    for name in args.kernels:
        cmd = [
            shutil.which("ncu"),
            "--csv",
            "--print-units",
            "base",
            "--profile-from-start",
            "off",
            "--metrics",
            ",".join(NCU_METRICS),
            sys.executable,
            __file__,
            "--ncu-child",
            name,
            str(N),
            str(d),
            str(M),
            str(int(args.causal)),
        ]
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        totals: dict[str, float] = {}
        for launch in parse_ncu_csv(p.stdout):
            for metric, v in launch.items():
                if metric in NCU_METRICS and isinstance(v, float):
                    totals[metric] = totals.get(metric, 0.0) + v
        words = simulated_words(gpu, name, N, d, M, args.causal, 1)
        row = {"case": (1, 1, N, d), "kernel": name, "M": M, "simulated bytes": None if words is None else 4 * words}
        row.update({m: totals.get(m) for m in NCU_METRICS})
        if not totals:
            row["error"] = (p.stderr.strip().splitlines() or ["no metrics in ncu output"])[-1][:200]
        rows.append(row)
        print(f"  ncu {name}: {row.get('error') or 'ok'}", flush=True)
    return rows


def fmt(x, digits=3):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def write(out: pathlib.Path, meta: dict, tables: dict[str, list[dict]]) -> str:
    from tabulate import tabulate

    out.mkdir(parents=True, exist_ok=True)
    text = [f"# GPU benchmark: {meta['device']}", "", "```", json.dumps(meta, indent=1), "```"]
    for title, rows in tables.items():
        if not rows:
            continue
        keys = list(dict.fromkeys(k for r in rows for k in r))
        with open(out / f"{title}.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)
        text += [
            "",
            f"## {title}",
            "",
            tabulate(
                [[fmt(r.get(k)) for k in keys] for r in rows], headers=keys, tablefmt="github", disable_numparse=True
            ),
        ]
    (out / "results.json").write_text(json.dumps({"meta": meta, **tables}, indent=1, default=str))
    (out / "tables.md").write_text("\n".join(text) + "\n")
    return "\n".join(text)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.ncu_child:
        kernel, N, d, M, causal = args.ncu_child
        ncu_child(kernel, int(N), int(d), int(M), bool(int(causal)))
        return 0
    cuda = require_gpu()
    from iosim.gpu import launch as gpu

    if gpu.select_target() != "gpu":
        sys.exit("bench/gpu.py: numba.cuda is in simulator mode; unset NUMBA_ENABLE_CUDASIM")
    cases = args.case or (QUICK_CASES if args.quick else CASES)
    dev = cuda.get_current_device()
    torch_ok = False
    if not args.no_torch:
        try:
            import torch

            torch_ok = torch.cuda.is_available()
        except ImportError:
            pass
    import numba_cuda

    meta = {
        "device": dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name),
        "compute capability": list(dev.compute_capability),
        "max shared words per block": max_shared_words(cuda),
        "numba-cuda": getattr(numba_cuda, "__version__", "?"),
        "threads per block": args.threads,
        "M (main table)": args.M,
        "causal": args.causal,
        "precision": "float32, CUDA cores",
        "torch": None,
    }
    if torch_ok:
        import torch

        meta["torch"] = torch.__version__
    timer = Timer(cuda, args.reps, args.seconds)
    tables: dict[str, list[dict]] = {"kernels": [], "sweep": [], "ncu": []}
    for case in cases:
        print(f"case (B, H, N, d) = {case}", flush=True)
        tables["kernels"] += main_table(cuda, gpu, args, case, timer, torch_ok)
        if not args.no_sweep:
            tables["sweep"] += sweep(cuda, gpu, args, case, timer)
    if not args.no_ncu and shutil.which("ncu"):
        for case in cases:
            tables["ncu"] += ncu_table(gpu, args, case)
    print(write(args.out, meta, tables))
    print(f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""GPU evidence in one lease: the explicit counts of the numba.cuda kernels beside the hardware's counters and clocks.

Run on a machine with an NVIDIA GPU, the ``cuda`` extra and PyTorch (Nsight Compute's ``ncu`` on the PATH for the
profiler parts); ``experiments/bench/gpu_evidence.sh`` runs every part below with a time limit each and writes
one JSON file per part into ``--out``:

    python experiments/bench/gpu_evidence.py env        --out DIR   # device, driver, CUDA, library versions
    python experiments/bench/gpu_evidence.py sweep      --out DIR   # M from d^2/16 up: flash2 vs square tiling, timed
    python experiments/bench/gpu_evidence.py ncu-sweep  --out DIR   # the same launches under ncu: L2 and DRAM bytes
    python experiments/bench/gpu_evidence.py sdpa       --out DIR   # flash2 forward vs SDPA float32, TF32 off and on
    python experiments/bench/gpu_evidence.py ncu-torch  --out DIR   # SDPA's FlashAttention-2 kernels (fp16) under ncu
    python experiments/bench/gpu_evidence.py ncu-triton --out DIR   # Triton kernels (iosim's example, fla) under ncu
    python experiments/bench/gpu_evidence.py occupancy  --out DIR   # the driver's figures vs iosim.gpu.resources

The sweep answers whether the algorithm that moves fewer words (square tiling below M = d^2) also takes less time,
and whether the explicit count predicts the L2's traffic (shared memory <-> L2: ``lts__t_sectors_op_*``), the
DRAM's (``dram__bytes_*``), or neither. The exact counts are also read back from the kernels' own counters at the
full size, on the hardware, and compared with the simulator's.

Profiled launches are bracketed by a marker kernel whose grid encodes the launch's index, so one ncu process
profiles a whole table. Timings are medians of CUDA-event timed launches; tests never assert timings.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

SWEEP_N = 2048
SWEEP_BH = 8
SWEEP_D = (128, 64, 256)
SWEEP_KERNELS = ("flash2", "square-tiling")
SDPA_CASES = ((4, 16, 4096, 64), (1, 8, 8192, 128))
# FlashAttention-2 at the size of the hierarchy page's prediction, and a GQA decoding step
TORCH_FWD = (1, 32, 32768, 128)
TORCH_DECODE = (4, 32, 8, 32768, 128)  # B, H_q, H_kv, N_k, d; N_q = 1
TRITON_CASE = (1, 16, 4096, 64)  # B, H, N, d of the Triton kernels under ncu
METRICS = (
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "lts__t_bytes.sum",
    "lts__t_sectors_op_read.sum",
    "lts__t_sectors_op_write.sum",
    "lts__t_sectors_op_atom.sum",
    "lts__t_sectors_op_red.sum",
    "l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum",
    "l1tex__t_bytes_pipe_lsu_mem_global_op_red.sum",
    "l1tex__t_bytes_pipe_lsu_mem_global_op_atom.sum",
    "l1tex__t_bytes_pipe_lsu_mem_global_op_ldgsts.sum",
    "sm__cycles_elapsed.avg.per_second",
)
BASIC_METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum")


def dump(out: pathlib.Path, name: str, data) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=1, default=str))
    print(f"wrote {out / name}.json", flush=True)


def _cuda():
    from numba import cuda

    if not cuda.is_available():
        sys.exit("gpu_evidence.py: no CUDA GPU (numba.cuda.is_available() is False)")
    return cuda


# ----------------------------------------------------------------------------------------------------- env
def part_env(args) -> dict:
    info: dict = {"python": sys.version, "platform": platform.platform()}
    for cmd in (["nvidia-smi"], ["nvidia-smi", "-q", "-d", "CLOCK,POWER"], ["ncu", "--version"], ["nvcc", "--version"]):
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            info[" ".join(cmd)] = p.stdout[-4000:] + p.stderr[-1000:]
        except Exception as e:
            info[" ".join(cmd)] = f"failed: {e}"
    for mod in ("numpy", "numba", "numba_cuda", "llvmlite", "torch", "triton", "fla", "cuda.bindings", "iosim"):
        try:
            m = __import__(mod, fromlist=["_"])
            info[mod] = getattr(m, "__version__", "?")
        except Exception as e:
            info[mod] = f"not importable: {type(e).__name__}: {e}"
    try:
        import torch

        info["torch.version.cuda"] = torch.version.cuda
        info["torch device"] = torch.cuda.get_device_name(0)
        p = torch.cuda.get_device_properties(0)
        info["torch props"] = str(p)
    except Exception as e:
        info["torch device"] = f"failed: {e}"
    try:
        cuda = _cuda()
        dev = cuda.get_current_device()
        from cuda.bindings import driver

        info["driver version"] = driver.cuDriverGetVersion()[1]
        info["numba device"] = str(dev.name)
        info["cc"] = list(dev.compute_capability)
        for a in ("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", "MAX_SHARED_MEMORY_PER_BLOCK", "MULTIPROCESSOR_COUNT",
                  "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR", "L2_CACHE_SIZE", "MAX_REGISTERS_PER_BLOCK"):  # fmt: skip
            try:
                info[a] = getattr(dev, a)
            except Exception as e:
                info[a] = f"? {e}"
        info["numba-cuda runtime"] = str(cuda.runtime.get_version())
    except BaseException as e:  # no GPU: say so in the file rather than exit
        info["numba cuda"] = f"failed: {type(e).__name__}: {e}"
    return info


# ----------------------------------------------------------------------------------------------------- sweep
def sweep_configs(max_words: int) -> list[dict]:
    """(kernel, d, M) of the reviewers' experiment: M = d^2/16, d^2/8, ... up to the largest a block may use."""
    out = []
    for d in SWEEP_D:
        Ms, f = [], 1 / 16
        while f * d * d < max_words:
            Ms.append(int(f * d * d))
            f *= 2
        Ms.append(max_words)
        for M in Ms:
            for k in SWEEP_KERNELS:
                out.append({"kernel": k, "N": SWEEP_N, "d": d, "M": M, "BH": SWEEP_BH})
    return out


def largest_M(cuda, bench) -> int:
    """The largest M the parts use: the opt-in ceiling less 256 words (the sm_90 reserved 1 KiB that
    iosim.gpu.resources assumed a kernel's static shared memory; the H100's driver reports none)."""
    return bench.max_shared_words(cuda) - 256


def sweep_inputs(cuda, bench):
    """(configuration, device inputs) of the sweep, the inputs made once per d."""
    arrays_by_d: dict = {}
    for c in sweep_configs(largest_M(cuda, bench)):
        if c["d"] not in arrays_by_d:
            arrays_by_d.clear()
            arrays_by_d[c["d"]] = bench.device_arrays(cuda, 1, c["BH"], c["N"], c["d"])
        yield c, arrays_by_d[c["d"]]


def _counts_json(counts) -> dict:
    return {k: [v.reads, v.writes, v.init_writes] for k, v in sorted(counts.items())}


def part_sweep(args) -> dict:
    """Times every configuration (CUDA events, median), reads the kernels' counters once, beside the simulator."""
    import numpy as np

    cuda = _cuda()
    import gpu as bench

    from iosim.gpu import launch as gpu

    rows = []
    timer = bench.Timer(cuda, args.reps, args.seconds)
    t0 = time.perf_counter()
    for c, arrays in sweep_inputs(cuda, bench):
        if time.perf_counter() - t0 > args.budget:
            rows.append({**c, "error": "time budget of the part spent"})
            continue
        N, d, M, BH, k = c["N"], c["d"], c["M"], c["BH"], c["kernel"]
        row = dict(c)
        try:
            t = gpu.tiling_for(k, N, d, M, "fit")
            row["tiling"] = str(t)
            sim = gpu.simulated_counts(k, N, d, M, batch=BH)
            row["simulated words"] = sum(v.reads + v.writes for v in sim.values())
            counted = gpu.forward(k, arrays["Q"], arrays["K"], arrays["V"], M=M, count=True)
            row["counters equal simulator"] = _counts_json(counted.counts) == _counts_json(sim)
            if not row["counters equal simulator"]:
                row["counters"] = _counts_json(counted.counts)
                row["simulated"] = _counts_json(sim)
            O = counted.outputs["O"].copy_to_host() if hasattr(counted.outputs["O"], "copy_to_host") else None
            row["O finite"] = bool(O is not None and np.isfinite(O).all())
            row["ms"] = timer.median_ms(bench.runner(cuda, gpu, k, arrays, M, False, args.threads))
            row["GB/s of the simulated words"] = row["simulated words"] * 4 / row["ms"] / 1e6
            row["TFLOP/s"] = bench.flops(k, 1, BH, N, d, False) / row["ms"] / 1e9
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        rows.append(row)
        print(json.dumps({k2: row.get(k2) for k2 in ("kernel", "d", "M", "ms", "counters equal simulator", "error")}),
              flush=True)  # fmt: skip
    return {"threads": args.threads, "rows": rows}


# ----------------------------------------------------------------------------------------------- ncu plumbing
def _marker_kernel(cuda):
    @cuda.jit
    def iosim_marker(x):  # its work is irrelevant (a racy add); its grid names the launch that follows
        x[0] = x[0] + 1.0

    return iosim_marker


class Marked:
    """Profiled launches, each preceded by a marker kernel whose grid.x is its index + 1 (ncu's Grid Size)."""

    def __init__(self, path: pathlib.Path):
        import numpy as np

        self.path = path

        self.cuda = _cuda()
        self.kernel = _marker_kernel(self.cuda)
        self.buf = self.cuda.to_device(np.zeros(1, dtype=np.float32))
        self.kernel[1, 32](self.buf)  # compile outside the profiled range
        self.cuda.synchronize()
        self.labels: list[dict] = []

    def run(self, label: dict, fn) -> None:
        cuda = self.cuda
        cuda.synchronize()
        getattr(cuda, "profile_start", lambda: None)()  # the CUDA simulator has no profiler
        self.kernel[len(self.labels) + 1, 32](self.buf)
        fn()
        cuda.synchronize()
        getattr(cuda, "profile_stop", lambda: None)()
        self.labels.append(label)
        self.path.write_text(json.dumps(self.labels))  # after each launch: a child stopped at its budget keeps them


def parse_ncu_csv(text: str) -> list[dict]:
    """ncu --csv rows grouped by launch (experiments/bench/gpu.py's parser)."""
    import gpu as bench

    return bench.parse_ncu_csv(text)


def group_by_marker(launches: list[dict], labels: list[dict]) -> list[dict]:
    """Sum each metric over the launches that follow marker k; the kernel names in order."""
    out = [{**lab, "kernels": [], "launches": 0} for lab in labels]
    cur = None
    for r in launches:
        if "iosim_marker" in r["name"]:
            gx = int(str(r["grid"]).strip("()").split(",")[0])
            cur = out[gx - 1] if 0 < gx <= len(out) else None
            continue
        if cur is None:
            continue
        cur["kernels"].append(r["name"][:160])
        cur["launches"] += 1
        for k, v in r.items():
            if isinstance(v, float):
                cur[k] = cur.get(k, 0.0) + v
    return out


def run_ncu(part: str, args, metrics=METRICS) -> tuple[str, str, int]:
    """ncu over ``child-PART``; its CSV goes to a log file, read back even when the budget ran out."""
    ncu = shutil.which("ncu")
    if not ncu:
        raise SystemExit("gpu_evidence.py: ncu is not on the PATH")
    log = args.out / f"ncu-{part}.csv"
    log.unlink(missing_ok=True)
    cmd = [ncu, "--csv", "--print-units", "base", "--profile-from-start", "off", "--clock-control", "none",
           "--log-file", str(log), "--metrics", ",".join(metrics), sys.executable, __file__, f"child-{part}",
           "--out", str(args.out)]  # fmt: skip
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        out, err = p.communicate(timeout=args.budget)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        rc, err = -9, err + f"\n(ncu stopped at the budget of {args.budget} s)"
    text = log.read_text(errors="replace") if log.exists() else ""
    return text + out, err, rc


def part_ncu(part: str, args) -> dict:
    stdout, stderr, rc = run_ncu(part, args)
    metrics = METRICS
    if not parse_ncu_csv(stdout) and "metric" in (stdout + stderr).lower():  # an unknown metric stops ncu
        stdout, stderr, rc = run_ncu(part, args, BASIC_METRICS)
        metrics = BASIC_METRICS
    path = args.out / f"labels-{part}.json"
    labels = json.loads(path.read_text()) if path.exists() else []
    launches = parse_ncu_csv(stdout)
    return {"metrics": list(metrics), "rc": rc, "stderr": stderr[-3000:], "rows": group_by_marker(launches, labels),
            "launches": len(launches), "head": stdout[:1500]}  # fmt: skip


# -------------------------------------------------------------------------------------------- ncu children
def child_sweep(args) -> None:
    cuda = _cuda()
    import gpu as bench

    from iosim.gpu import launch as gpu

    mk = Marked(args.out / "labels-sweep.json")
    for c, arrays in sweep_inputs(cuda, bench):
        try:
            run = bench.runner(cuda, gpu, c["kernel"], arrays, c["M"], False, args.threads)
            run()  # compile outside the profiled range
            mk.run(c, run)
        except Exception as e:
            print(f"child-sweep: {c}: {type(e).__name__}: {e}", file=sys.stderr)


def child_torch(args) -> None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    mk = Marked(args.out / "labels-torch.json")
    B, H, N, d = TORCH_FWD
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, H, N, d, device="cuda", dtype=torch.float16, generator=g) for _ in range(4))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        for causal in (False, True):
            qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
            o = sdpa(qg, kg, vg, is_causal=causal)
            torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)
            torch.cuda.synchronize()
            lab = {"what": "sdpa flash forward fp16", "B": B, "H": H, "N": N, "d": d, "causal": causal}
            mk.run(lab, lambda causal=causal: sdpa(q, k, v, is_causal=causal))
            lab = {**lab, "what": "sdpa flash backward fp16"}
            mk.run(lab, lambda o=o, qg=qg, kg=kg, vg=vg: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True))
            del o, qg, kg, vg
    B, Hq, Hkv, Nk, d = TORCH_DECODE
    q = torch.randn(B, Hq, 1, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(B, Hkv, Nk, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    for backend in ("default", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        lab = {"what": f"sdpa decode GQA bf16, backend {backend}", "B": B, "H_q": Hq, "H_kv": Hkv, "N_q": 1,
               "N_k": Nk, "d": d}  # fmt: skip

        def call(backend=backend):
            if backend == "default":
                return sdpa(q, k, v, enable_gqa=True)
            with sdpa_kernel([getattr(SDPBackend, backend)]):
                return sdpa(q, k, v, enable_gqa=True)

        try:
            call()
            torch.cuda.synchronize()
        except Exception as e:
            print(f"child-torch: {backend}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
            continue
        mk.run(lab, call)


def _fla_launch(B, H, N, d, dtype):
    import torch
    from fla.ops.attn.parallel import parallel_attn_fwd

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, N, H, d, device="cuda", dtype=dtype, generator=g) for _ in range(3))
    return lambda: parallel_attn_fwd(q, k, v, g_cumsum=None, sink_bias=None, scale=d**-0.5)


def _triton_flash2(B, H, N, d, dtype, Br, Bc, causal):
    import torch

    from iosim.kernels.examples import triton_flash2

    g = torch.Generator(device="cuda").manual_seed(0)
    Q, K, V = (torch.randn(B * H, N, d, device="cuda", dtype=dtype, generator=g) for _ in range(3))
    return lambda: triton_flash2.run(Q, K, V, Br, Bc, causal)


def child_triton(args) -> None:
    import torch

    mk = Marked(args.out / "labels-triton.json")
    B, H, N, d = TRITON_CASE
    for dtype in ("float16", "float32"):
        dt = getattr(torch, dtype)
        for Br, Bc, causal in ((64, 32, False), (64, 32, True), (128, 64, False)):
            lab = {"what": "iosim example triton_flash2", "B": B, "H": H, "N": N, "d": d, "dtype": dtype, "Br": Br,
                   "Bc": Bc, "causal": causal}  # fmt: skip
            try:
                fn = _triton_flash2(B, H, N, d, dt, Br, Bc, causal)
                fn()
                torch.cuda.synchronize()
                mk.run(lab, fn)
            except Exception as e:
                print(f"child-triton: {lab}: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr)
        lab = {"what": "fla parallel_attn_fwd (causal)", "B": B, "H": H, "N": N, "d": d, "dtype": dtype}
        try:
            fn = _fla_launch(B, H, N, d, dt)
            fn()
            torch.cuda.synchronize()
            mk.run(lab, fn)
        except Exception as e:
            print(f"child-triton: fla: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr)


# ----------------------------------------------------------------------------------------------------- sdpa
def part_sdpa(args) -> dict:
    """flash2 forward (numba.cuda, float32) against SDPA float32 on the same inputs, TF32 off and on."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    cuda = _cuda()
    import gpu as bench

    from iosim.gpu import launch as gpu

    timer = bench.Timer(cuda, args.reps, args.seconds)
    top = largest_M(cuda, bench)
    rows = []
    kernels = ["flash2"] + [k for k in getattr(gpu, "FAST_KERNELS", ())]
    for B, H, N, d in SDPA_CASES:
        arrays = bench.device_arrays(cuda, B, H, N, d)
        q, k, v = (torch.as_tensor(arrays[n], device="cuda") for n in ("Q", "K", "V"))
        ref = sdpa(q.double(), k.double(), v.double())
        for tf32 in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.backends.cudnn.allow_tf32 = tf32
            for backend in ("default", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
                row = {"case": [B, H, N, d], "tf32": tf32, "what": f"sdpa {backend}"}
                try:
                    be = None if backend == "default" else getattr(SDPBackend, backend)
                    fn = lambda be=be, q=q, k=k, v=v: _with_backend(sdpa_kernel, be, sdpa, q, k, v)  # noqa: E731
                    out = fn()
                    row["rel err"] = float((out.double() - ref).norm() / ref.norm())
                    row["ms"] = bench.torch_median_ms(fn, args.reps, args.seconds)
                    row["TFLOP/s"] = bench.flops("x", B, H, N, d, False) / row["ms"] / 1e9
                    if backend == "default":
                        row["kernels"] = _kernel_names(fn)
                except Exception as e:
                    row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                rows.append(row)
                print(json.dumps(row)[:300], flush=True)
        torch.backends.cuda.matmul.allow_tf32 = False
        for name in kernels:
            for M in sorted({min(x, top) for x in (8192, 16384, 32768, top)}):
                for threads in (128, 256):
                    row = {"case": [B, H, N, d], "what": f"iosim {name}", "M": M, "threads": threads}
                    try:
                        r = gpu.forward(name, arrays["Q"], arrays["K"], arrays["V"], M=M, threads=threads)
                        O = torch.as_tensor(r.outputs["O"], device="cuda").double()
                        row["rel err"] = float((O - ref).norm() / ref.norm())
                        row["tiling"] = str(r.tiling)
                        row["ms"] = timer.median_ms(bench.runner(cuda, gpu, name, arrays, M, False, threads))
                        row["TFLOP/s"] = bench.flops("x", B, H, N, d, False) / row["ms"] / 1e9
                    except Exception as e:
                        row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                    rows.append(row)
                    print(json.dumps(row)[:300], flush=True)
    return {"rows": rows}


def part_ab(args) -> dict:
    """The flash2 forward kernel against an earlier build of it (``--before FILE``, a copy of
    algorithms/cuda/flash.py from an earlier commit) on the same inputs in the same process: time ratios."""
    import importlib.util

    cuda = _cuda()
    import gpu as bench
    from iosim.algorithms.cuda import flash

    from iosim.gpu import launch as gpu

    spec = importlib.util.spec_from_file_location("flash_before", args.before)
    before = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(before)
    timer = bench.Timer(cuda, args.reps, args.seconds)
    top = largest_M(cuda, bench)
    rows = []
    for B, H, N, d in SDPA_CASES:
        arrays = bench.device_arrays(cuda, B, H, N, d)
        Q, K, V = arrays["Q"], arrays["K"], arrays["V"]
        for M in sorted({min(x, top) for x in (8192, 16384, top)}):
            t = gpu.tiling_for("flash2", N, d, M)
            row = {"case": [B, H, N, d], "M": M, "tiling": str(t)}
            for label, mod in (("before", before), ("after", flash)):
                try:
                    r = mod.flash2_forward(Q, K, V, Br=t.Br, Bc=t.Bc, M=M, poison=False)
                    row[f"{label} O[0,0,0,:2]"] = r.outputs["O"][0, 0, 0, :2].copy_to_host().tolist()
                    row[f"{label} ms"] = timer.median_ms(
                        lambda mod=mod, Q=Q, K=K, V=V, t=t, M=M: mod.flash2_forward(
                            Q, K, V, Br=t.Br, Bc=t.Bc, M=M, poison=False
                        )
                    )
                except Exception as e:
                    row[f"{label} error"] = f"{type(e).__name__}: {str(e)[:200]}"
            if row.get("before ms") and row.get("after ms"):
                row["before / after"] = row["before ms"] / row["after ms"]
                row["after TFLOP/s"] = bench.flops("x", B, H, N, d, False) / row["after ms"] / 1e9
            rows.append(row)
            print(json.dumps(row)[:300], flush=True)
    return {"rows": rows}


def _with_backend(sdpa_kernel, be, sdpa, q, k, v):
    """SDPA with backend ``be`` only (None: PyTorch's own choice)."""
    if be is None:
        return sdpa(q, k, v)
    with sdpa_kernel([be]):
        return sdpa(q, k, v)


def _kernel_names(fn) -> list[str]:
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name[:160] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})


# ------------------------------------------------------------------------------------------------ occupancy
def part_occupancy(args) -> dict:
    """cuFuncGetAttribute and the occupancy API on the kernels as launched, beside iosim.gpu.resources."""
    cuda = _cuda()
    import gpu as bench
    from cuda.bindings import driver as drv

    from iosim.gpu import launch as gpu
    from iosim.gpu import resources

    cc = tuple(cuda.get_current_device().compute_capability)
    predicted = {}
    try:
        predicted = {
            (r["kernel"], r["N"], r["d"], r["M"]): r
            for r in resources.rows([cc], [4096], [64, 128], [4096, 16384, 49152], 128)
        }
    except Exception as e:
        print(f"occupancy: resources.rows failed: {type(e).__name__}: {e}", file=sys.stderr)
    rows = []
    import numba.cuda.dispatcher as _  # noqa: F401
    from iosim.algorithms.cuda import flash, square_tiling, standard

    dispatchers = {}
    for mod in (flash, square_tiling, standard):
        for nm in dir(mod):
            obj = getattr(mod, nm)
            if nm.endswith("_kernel") and hasattr(obj, "overloads"):
                dispatchers[nm] = obj
    # run each kernel once at each (d, M) so its overloads exist, then ask the driver
    for d in (64, 128):
        arrays = bench.device_arrays(cuda, 1, 1, 256, d)  # compiles the kernels; the figures are N = 4096's
        for M in (4096, 16384, 49152):
            for name in ("flash2", "flash1", "standard", "square-tiling", "flash2-backward"):
                try:
                    bench.runner(cuda, gpu, name, arrays, M, False, 128)()
                except Exception as e:
                    print(f"occupancy: {name} d={d} M={M}: {e}", file=sys.stderr)
            cuda.synchronize()
            for nm, disp in dispatchers.items():
                for ov in disp.overloads.values():
                    try:
                        cufunc = ov._codelibrary.get_cufunc()
                        fn = (
                            drv.cuKernelGetFunction(cufunc.handle)[1]
                            if hasattr(drv, "cuKernelGetFunction")
                            else cufunc.handle
                        )
                        attrs = {}
                        for a in ("NUM_REGS", "SHARED_SIZE_BYTES", "LOCAL_SIZE_BYTES", "MAX_THREADS_PER_BLOCK",
                                  "MAX_DYNAMIC_SHARED_SIZE_BYTES", "BINARY_VERSION", "PTX_VERSION"):  # fmt: skip
                            e_, val = drv.cuFuncGetAttribute(
                                getattr(drv.CUfunction_attribute, f"CU_FUNC_ATTRIBUTE_{a}"), fn
                            )
                            attrs[a] = int(val)
                        pred = predicted.get((nm, 4096, d, M))
                        dyn = None if pred is None or pred.get("dynamic_smem") is None else pred["dynamic_smem"]
                        row = {"kernel": nm, "d": d, "M": M, "driver": attrs}
                        if dyn is not None:
                            e_, blocks = drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, 128, dyn)
                            row["driver blocks/SM"] = int(blocks)
                            row["dynamic smem"] = dyn
                        if pred is not None:
                            row["iosim"] = {k: pred.get(k) for k in ("registers", "static_smem", "reserved_smem",
                                            "stack", "blocks_per_sm", "limiter", "dynamic_smem")}  # fmt: skip
                        rows.append(row)
                    except Exception as e:
                        rows.append({"kernel": nm, "d": d, "M": M, "error": f"{type(e).__name__}: {e}"[:300]})
    return {"cc": cc, "rows": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("part")
    p.add_argument("--out", type=pathlib.Path, default=ROOT / "results" / "gpu_evidence")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--seconds", type=float, default=0.5)
    p.add_argument("--threads", type=int, default=128)
    p.add_argument("--budget", type=float, default=240.0, help="seconds a part may take (sweep, ncu)")
    p.add_argument("--before", type=pathlib.Path, default=ROOT / ".ab" / "flash_before.py", help="part ab's baseline")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    part = args.part
    if part.startswith("child-"):
        {"child-sweep": child_sweep, "child-torch": child_torch, "child-triton": child_triton}[part](args)
        return 0
    if part == "env":
        data = part_env(args)
    elif part == "sweep":
        data = part_sweep(args)
    elif part == "sdpa":
        data = part_sdpa(args)
    elif part == "ab":
        data = part_ab(args)
    elif part == "occupancy":
        data = part_occupancy(args)
    elif part.startswith("ncu-"):
        data = part_ncu(part.removeprefix("ncu-"), args)
    else:
        raise SystemExit(f"gpu_evidence.py: unknown part {part!r}")
    data["seconds"] = time.perf_counter() - t0
    dump(args.out, part, data)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

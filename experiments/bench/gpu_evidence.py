"""GPU evidence in one lease: the explicit counts of the numba.cuda kernels beside the hardware's counters and clocks.

Run on a machine with an NVIDIA GPU, the ``cuda`` extra and PyTorch (Nsight Compute's ``ncu`` on the PATH for the
profiler parts). ``run-all`` (what ``experiments/bench/gpu_evidence.sh`` calls) runs the plan, each part in a child
process under its own time limit, the whole under ``--limit`` seconds; ``--dry-run`` prints the plan on any
machine. Each part writes one JSON file into ``--out``, and its raw output as it came under ``--out``/raw/ (its
stdout and stderr, its exit status; a profiled part also ncu's CSV, return code, stderr, labels and metric list:
ncu_raw.py). One part alone:

    python experiments/bench/gpu_evidence.py env        --out DIR   # device, driver, CUDA, library versions
    python experiments/bench/gpu_evidence.py variants   --out DIR   # register-tiled flash2 variants vs SDPA float32
    python experiments/bench/gpu_evidence.py waves      --out DIR   # flash2 over Br at many waves vs L2/HBM ceilings
    python experiments/bench/gpu_evidence.py ncu-query  --out DIR   # ncu --query-metrics, stored
    python experiments/bench/gpu_evidence.py predictions --out DIR  # the predictions file's launches under ncu
    python experiments/bench/gpu_evidence.py ncu-fa2    --out DIR   # FlashAttention-2: L2 by source, registers
    python experiments/bench/gpu_evidence.py m-top      --out DIR   # whether M = 58,112 words launches
    python experiments/bench/gpu_evidence.py sweep      --out DIR   # M from d^2/16 up: flash2 vs square tiling, timed
    python experiments/bench/gpu_evidence.py sweep-backward --out DIR  # the flash2 backward over the same M
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
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import ncu_raw  # noqa: E402  (the neighbour module: the path above)

from iosim.base.errors import InputError  # noqa: E402

T0 = time.monotonic()  # this process's start, near enough (after its imports of the standard library and iosim)

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
# FlashAttention-2's L2 traffic split by source: requests from the SMs (srcunit tex) apart from the traffic between
# the two L2 partitions (srcunit ltcfabric); the registers and the occupancy limit they set, per launch; and its local
# memory (the forward's 136-144 byte stack frame at 255 registers, gpu_h100/fa2-resources.json): the local bytes the
# LSU moves and the bytes L1 writes to / reads from the L2 for local and global accesses together (less the global
# bytes: the local traffic that reaches the L2), which decides the hypothesis that spills make the forward's DRAM
# writes exceed its stores (docs/hierarchy-hardware.md)
FA2_METRICS = METRICS + (
    "lts__t_sectors_srcunit_tex_op_read.sum",
    "lts__t_sectors_srcunit_tex_op_write.sum",
    "lts__t_sectors_srcunit_ltcfabric_op_read.sum",
    "lts__t_sectors_srcunit_ltcfabric_op_write.sum",
    "launch__registers_per_thread",
    "launch__occupancy_limit_registers",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
    "l1tex__m_l1tex2xbar_write_bytes_mem_lg_op_st.sum",
    "l1tex__m_xbar2l1tex_read_bytes_mem_lg_op_ld.sum",
)
M_TOP_CASES = ((64, 58112), (128, 58112), (64, 57856), (128, 57856))  # (d, M): the opt-in ceiling and 256 below


def _prediction_metrics(args) -> list[str]:
    """The metrics of the predictions file the part measures (``--predictions``; the second H200 lease asked for
    the default file's, so h200.json's level l1_reduction went unmeasured)."""
    import gpu_predictions

    return gpu_predictions.metrics_for(gpu_predictions.load(args.predictions))


# a profiled part: (its child, the metrics it asks for); its raw output is raw/<part>.*
NCU_PARTS = {
    "ncu-sweep": ("sweep", METRICS),
    "ncu-torch": ("torch", METRICS),
    "ncu-triton": ("triton", METRICS),
    "ncu-fa2": ("fa2", FA2_METRICS),
    "predictions": ("predictions", _prediction_metrics),
}


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
    """(kernel, d, M) of the reviewers' experiment: M = d^2/16, d^2/8, ... up to the largest a block may use; the
    largest M/d^2 first (:func:`fast_first`)."""
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
    return fast_first(out)


def fast_first(configs: list[dict]) -> list[dict]:
    """The largest M/d^2 first, the kernels of one (d, M) together: small M means tiny tiles and launches of
    seconds, so a budget spent early cuts those, not the range where the kernels are fast (the H200 lease's
    sweep, smallest M first, spent its 40 s on 7 of 42 launches)."""
    return sorted(configs, key=lambda c: (-c["M"] / c["d"] ** 2, c["d"]))


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


def _counted(gpu, kernel: str, arrays: dict, M: int):
    """The kernel's own counters of one launch at ``M`` (the backward from a forward made first)."""
    Q, K, V = arrays["Q"], arrays["K"], arrays["V"]
    if kernel != "flash2-backward":
        return gpu.forward(kernel, Q, K, V, M=M, count=True)
    fwd = gpu.forward("flash2", Q, K, V, M=M, poison=False)
    return gpu.backward("flash2", Q, K, V, fwd.outputs["O"], arrays["dO"], fwd.outputs["L"], M=M, count=True)


def sweep_row(c: dict, arrays: dict, timer, args) -> dict:
    """One launch of the sweep: tiling, the simulator's words, the kernel's counters against them, finite outputs,
    the median time and the rates of the simulated words and the flops."""
    import numpy as np

    cuda = _cuda()
    import gpu as bench

    from iosim.gpu import launch as gpu

    N, d, M, BH, k = c["N"], c["d"], c["M"], c["BH"], c["kernel"]
    backward = k == "flash2-backward"
    base = k.removesuffix("-backward")
    row = dict(c)
    try:
        row["tiling"] = str(gpu.tiling_for(base, N, d, M, "fit", backward=backward))
        sim = gpu.simulated_counts(base, N, d, M, batch=BH, backward=backward)
        row["simulated words"] = sum(v.reads + v.writes for v in sim.values())
        counted = _counted(gpu, k, arrays, M)
        row["counters equal simulator"] = _counts_json(counted.counts) == _counts_json(sim)
        if not row["counters equal simulator"]:
            row["counters"], row["simulated"] = _counts_json(counted.counts), _counts_json(sim)
        outs = [o.copy_to_host() for o in counted.outputs.values() if hasattr(o, "copy_to_host")]
        row["outputs finite"] = bool(outs) and all(np.isfinite(o).all() for o in outs)
        row["ms"] = timer.median_ms(bench.runner(cuda, gpu, k, arrays, M, False, args.threads))
        row["GB/s of the simulated words"] = row["simulated words"] * 4 / row["ms"] / 1e6
        row["TFLOP/s"] = bench.flops(k, 1, BH, N, d, False) / row["ms"] / 1e9
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {e}"[:300]
    print(json.dumps({k2: row.get(k2) for k2 in ("kernel", "d", "M", "ms", "counters equal simulator", "error")}),
          flush=True)  # fmt: skip
    return row


def _sweep(args, configs) -> dict:
    cuda = _cuda()
    import gpu as bench

    timer = bench.Timer(cuda, args.reps, args.seconds)
    rows, arrays, t0 = [], {}, time.perf_counter()
    for c in configs:
        if time.perf_counter() - t0 > args.budget:
            rows.append({**c, "error": "time budget of the part spent"})
            continue
        if arrays.get("d") != c["d"]:
            arrays = {"d": c["d"], **bench.device_arrays(cuda, 1, c["BH"], c["N"], c["d"])}
        rows.append(sweep_row(c, arrays, timer, args))
    return {"threads": args.threads, "rows": rows}


def part_sweep(args) -> dict:
    """Times every configuration of the sweep (CUDA events, median), the counters read once beside the simulator."""
    cuda = _cuda()
    import gpu as bench

    return _sweep(args, sweep_configs(largest_M(cuda, bench)))


def part_sweep_backward(args) -> dict:
    """The flash2 backward over the same (d, M) grid (square tiling has no backward kernel), fast first."""
    cuda = _cuda()
    import gpu as bench

    return _sweep(args, backward_configs(largest_M(cuda, bench)))


def backward_configs(max_words: int) -> list[dict]:
    """The sweep's (d, M) for the flash2 backward, in the sweep's order (:func:`fast_first`)."""
    return [{**c, "kernel": "flash2-backward"} for c in sweep_configs(max_words) if c["kernel"] == "flash2"]


def part_m_top(args) -> dict:
    """Whether M = 58,112 words (the whole opt-in shared memory per block, 232,448 bytes) launches, against 256
    words below it, for every kernel of the sweep and the backward."""
    cuda = _cuda()
    import gpu as bench

    rows = {"opt-in words": bench.max_shared_words(cuda), "rows": []}
    configs = [{"kernel": k, "N": SWEEP_N, "d": d, "M": M, "BH": SWEEP_BH}
               for d, M in M_TOP_CASES for k in (*SWEEP_KERNELS, "flash2-backward")]  # fmt: skip
    rows["rows"] = _sweep(args, configs)["rows"]
    return rows


# ----------------------------------------------------------------------------------------------- ncu plumbing
def _marker_kernel(cuda):
    @cuda.jit
    def iosim_marker(x):  # its work is irrelevant (a racy add); its grid names the launch that follows
        x[0] = x[0] + 1.0

    return iosim_marker


class Marked:
    """Profiled launches, each preceded by a marker kernel whose grid.x is its index + 1 (ncu's Grid Size). Past
    ``budget`` seconds :meth:`expired` is true and :meth:`run` profiles nothing more, so that the child ends by
    itself and ncu prints what it profiled (ncu writes its CSV when the profiled process ends; killed, it writes
    none: the H200 lease's ncu-sweep)."""

    def __init__(self, path: pathlib.Path, budget: float = float("inf")):
        import numpy as np

        self.path = path
        self.deadline = T0 + budget  # from the process's start: its imports count

        self.cuda = _cuda()
        self.kernel = _marker_kernel(self.cuda)
        self.buf = self.cuda.to_device(np.zeros(1, dtype=np.float32))
        self.kernel[1, 32](self.buf)  # compile outside the profiled range
        self.cuda.synchronize()
        self.labels: list[dict] = []

    def expired(self) -> bool:
        return time.monotonic() > self.deadline

    def run(self, label: dict, fn) -> None:
        if self.expired():
            print(f"profiling budget spent: {label} not profiled", file=sys.stderr, flush=True)
            return
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
    """ncu --csv rows grouped by launch (the layout experiments/bench/gpu.py reads; ncu_raw.parse)."""
    return ncu_raw.parse(text)


def group_by_marker(launches: list[dict], labels: list[dict]) -> list[dict]:
    """Sum each metric over the launches that follow marker k; the kernel names in order."""
    out = [{**lab, "kernels": [], "launches": 0} for lab in labels]
    cur = None
    for r in launches:
        k = ncu_raw.marker_index(r)
        if k is not None:
            cur = out[k] if 0 <= k < len(out) else None
            continue
        if cur is None:
            continue
        cur["kernels"].append(r["name"][:160])
        cur["launches"] += 1
        for key, v in r.items():
            if isinstance(v, float):
                cur[key] = cur.get(key, 0.0) + v
    return out


def _ncu() -> str:
    ncu = shutil.which("ncu")
    if not ncu:
        raise SystemExit("gpu_evidence.py: ncu is not on the PATH")
    return ncu


def query_metrics(part: str, args) -> str:
    """``ncu --query-metrics`` of this device, stored as raw/<part>.metrics.txt (asked once per run: the first
    part's answer, raw/ncu-query-metrics.txt, is copied for the later ones)."""
    raw = args.out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    shared = raw / "ncu-query-metrics.txt"
    if not shared.exists():
        try:
            p = subprocess.run([_ncu(), "--query-metrics"], capture_output=True, text=True, timeout=30)
            text, rc = p.stdout + p.stderr, p.returncode
        except subprocess.TimeoutExpired:
            text, rc = "", -9
        shared.write_text(text)
        (raw / "ncu-query-metrics.rc").write_text(f"{rc}\n")
    text = shared.read_text()
    (raw / f"{part}.metrics.txt").write_text(text)
    return text


NCU_FLAGS = ("--csv", "--print-units", "base", "--profile-from-start", "off", "--clock-control", "none")


def _kill_tree(pid: int) -> None:
    """SIGKILL the process ``pid`` and every process below it (ncu's child, the profiled Python), by id."""
    import signal

    children: dict[int, list[int]] = {}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    todo, tree = [pid], []
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


NCU_MARGIN = 15  # seconds the child leaves ncu to print its CSV after the last profiled launch (at most)


def child_budget(timeout: float) -> float:
    """The profiled child's own budget under ncu's ``timeout``: the margin, but never more than a quarter of it (the
    second H200 lease's ncu-fa2 had 17 s, left its child 2 s, and the child, still importing torch, profiled
    nothing)."""
    return max(timeout - min(NCU_MARGIN, timeout / 4), 1.0)


def run_ncu(part: str, args, metrics=METRICS, timeout: float | None = None) -> tuple[str, str, str, int]:
    """ncu over ``child-CHILD`` of ``part``: (its CSV log, raw/<part>.csv, as ncu wrote it; its stdout; its stderr;
    its return code), the log read back even when the budget ran out (-9: ncu and the profiled process killed)."""
    timeout = args.budget if timeout is None else timeout
    log = args.out / "raw" / f"{part}.csv"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    cmd = [_ncu(), *NCU_FLAGS, "--log-file", str(log), "--metrics", ",".join(metrics), sys.executable, __file__,
           f"child-{NCU_PARTS[part][0]}", "--out", str(args.out), "--predictions", str(args.predictions),
           "--budget", str(child_budget(timeout))]  # fmt: skip
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        out, err = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        _kill_tree(p.pid)
        out, err = p.communicate()
        rc, err = -9, err + f"\n(ncu stopped at the part's budget, after {timeout:.0f} s)"
    text = log.read_text(errors="replace") if log.exists() else ""
    return text, out, err, rc


def part_ncu(part: str, args) -> dict:
    """One profiled part: the metric list asked first, ncu run with the metrics it offers, its CSV, return code and
    stderr stored under raw/ as they came (ncu_raw.store_raw), and the report's file repacked from them."""
    t0 = time.perf_counter()
    child, wanted = NCU_PARTS[part]
    if child == "predictions" and not args.predictions.exists():
        return {"note": f"no predictions file at {args.predictions}: nothing measured"}
    wanted = wanted(args) if callable(wanted) else wanted
    metrics, not_offered = ncu_raw.split_offered(wanted, query_metrics(part, args))
    labels_path = args.out / f"labels-{child}.json"
    labels_path.unlink(missing_ok=True)  # the child writes it after each launch: none from an earlier run
    text, stdout, stderr, rc = run_ncu(part, args, metrics, args.budget - (time.perf_counter() - t0))
    raw = args.out / "raw"
    (raw / f"{part}.stdout").write_text(stdout)
    labels = json.loads(labels_path.read_text()) if labels_path.exists() else []
    ncu_raw.store_raw(raw, part, text, rc, stderr, labels)
    data = ncu_raw.repack(text, labels, metrics, rc, stderr, command=" ".join(["ncu", *NCU_FLAGS, "--metrics ..."]))
    data["not offered by this ncu"] = not_offered
    return data


# -------------------------------------------------------------------------------------------- ncu children
def child_sweep(args) -> None:
    cuda = _cuda()
    import gpu as bench

    from iosim.gpu import launch as gpu

    mk = Marked(args.out / "labels-sweep.json", args.budget)
    for c, arrays in sweep_inputs(cuda, bench):
        if mk.expired():
            break
        try:
            run = bench.runner(cuda, gpu, c["kernel"], arrays, c["M"], False, args.threads)
            run()  # compile outside the profiled range
            mk.run(c, run)
        except Exception as e:
            print(f"child-sweep: {c}: {type(e).__name__}: {e}", file=sys.stderr)


def _fa2_launches(mk: Marked):
    """FlashAttention-2's forward and backward (SDPA, fp16) at TORCH_FWD, without and with the causal mask."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

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
    return g


def child_fa2(args) -> None:
    """FlashAttention-2 alone, under FA2_METRICS (L2 traffic by source, registers, the register occupancy limit)."""
    _fa2_launches(Marked(args.out / "labels-fa2.json", args.budget))


def child_predictions(args) -> None:
    """Every launch of the predictions file, as it is, one marker each (gpu_predictions.launcher)."""
    import gpu_predictions

    entries = gpu_predictions.load(args.predictions)
    (args.out / "raw").mkdir(parents=True, exist_ok=True)
    (args.out / "raw" / "predictions.entries.json").write_text(json.dumps(entries, indent=1))
    mk = Marked(args.out / "labels-predictions.json", args.budget)
    for e in entries:
        if mk.expired():
            break
        try:
            fn = gpu_predictions.launcher(e)
            fn()  # inputs made and kernels compiled outside the profiled range
            mk.cuda.synchronize()
            mk.run({"id": e["id"], "what": e["what"], "backend": e["backend"]}, fn)
        except Exception as exc:
            print(f"child-predictions: {e['id']}: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)


def child_torch(args) -> None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    mk = Marked(args.out / "labels-torch.json", args.budget)
    g = _fa2_launches(mk)
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

    mk = Marked(args.out / "labels-triton.json", args.budget)
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


# ------------------------------------------------------------------------------------------------ the lease
# 8 workers: each compiles its own kernels (numba's), which is most of the time on a fresh machine (the H200 lease's
# one process passed 16 of 36 tests in 90 s); the device has 16 cores
TESTS = ["env", "IOSIM_GPU=1", sys.executable, "-P", "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE",
         "-n", "8", "-m", "gpu or not slow", "tests/test_cuda.py", "tests/test_cuda_fast.py"]  # fmt: skip
# part -> (its time limit in seconds, what it answers); the order of DEFAULT_PLAN is the order of the lease
CATALOG = {
    "env": (20, "device, driver, CUDA, library versions"),
    "ncu-query": (15, "ncu --query-metrics: the metrics this profiler offers (raw/ncu-query-metrics.txt)"),
    "predictions": (90, "every launch of experiments/bench/predictions/h100.json under ncu"),
    "ncu-fa2": (45, "FlashAttention-2 forward/backward: L2 sectors by source, registers, occupancy limit"),
    "tests": (
        90,
        "IOSIM_GPU=1 pytest tests/test_cuda*.py on the device (output: raw/tests.txt)",
    ),
    "m-top": (20, "whether M = 58,112 words launches (and 57,856), every kernel"),
    "sweep-backward": (45, "flash2 backward over the sweep's (d, M): time, counters against the simulator"),
    "sweep": (50, "flash2 against square tiling over M: time, counters against the simulator"),
    "ncu-sweep": (70, "the sweep's launches under ncu: LSU, L2, DRAM bytes"),
    "sdpa": (40, "flash2 forward against SDPA float32"),
    "ncu-torch": (40, "SDPA's FlashAttention-2 and decode kernels under ncu"),
    "occupancy": (25, "the driver's registers and blocks/SM against iosim gpu-resources"),
    "ncu-triton": (45, "Triton kernels (iosim's example, fla) under ncu"),
    "ab": (50, "flash2 forward against an earlier build (--before)"),
    "variants": (60, "the register-tiled flash2 forward variants against SDPA float32 (gpu_variants.py)"),
    "waves": (60, "fewer words, less time? flash2 over Br at many waves against L2/HBM ceilings (gpu_waves.py)"),
}
DEFAULT_PLAN = ("env", "variants", "waves", "ncu-query", "predictions", "ncu-fa2", "tests", "m-top", "sweep-backward",
                "sweep", "ncu-sweep", "sdpa", "ncu-torch", "occupancy", "ncu-triton")  # fmt: skip
DEFAULT_LIMIT = 540  # seconds for the whole run: parts that would start with under 15 s left are skipped


def part_argv(part: str, seconds: int, args) -> list[str]:
    """The command of one part, its inner budget 10 s under its limit (so that it writes what it has)."""
    if part == "tests":
        return TESTS
    argv = [sys.executable, __file__, part, "--out", str(args.out), "--budget", str(max(seconds - 10, 5))]
    return argv + (["--predictions", str(args.predictions)] if part == "predictions" else [])


def plan(parts, limit: int) -> list[tuple[str, int, int]]:
    """(part, its limit, the second of the run it starts at if every earlier part takes its whole limit); a part
    written ``name=SECONDS`` runs under that limit in place of the catalogue's."""
    out, t = [], 0
    for p in parts:
        p, _, secs = p.partition("=")
        if p not in CATALOG:
            raise InputError("--parts", f"must name parts among {', '.join(CATALOG)}", p)
        if secs and not (secs.isdigit() and 15 <= int(secs) <= 600):
            raise InputError("--parts", "a part's own limit (name=SECONDS) must be 15..600 seconds", secs)
        seconds = int(secs) if secs else CATALOG[p][0]
        out.append((p, seconds, t))
        t += seconds
    return out


def print_plan(steps, limit: int) -> None:
    total = sum(s for _, s, _ in steps)
    print(f"plan: {len(steps)} parts, {total} s of limits, the run bounded at {limit} s")
    for p, secs, t in steps:
        late = "" if t + secs <= limit else "  (cut short, or skipped, unless earlier parts finish early)"
        print(f"  +{t:4d} s  {p:15s} {secs:4d} s  {CATALOG[p][1]}{late}")


def run_part(argv: list[str], seconds: float, log: pathlib.Path) -> int:
    """One part as a child process group (stdout and stderr into ``log``), killed at ``seconds``: rc 124 then."""
    import signal

    with open(log, "w") as f:
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        try:
            return p.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            f.write(f"\n(stopped at the part's limit of {seconds:.0f} s)\n")
            return 124


def run_all(args) -> int:
    """Every part of the plan in order, each under its limit, the run under ``--limit``; each part's output in
    raw/<part>.log (the tests' in raw/tests.txt) and its exit status in raw/<part>.exit."""
    steps = plan(args.parts or DEFAULT_PLAN, args.limit)
    print_plan(steps, args.limit)
    if args.dry_run:
        return 0
    raw = args.out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    for p, secs, _ in steps:
        left = args.limit - (time.monotonic() - t0)
        if left < 15:
            print(f"== {p}: skipped ({left:.0f} s left of {args.limit} s)", flush=True)
            (raw / f"{p}.exit").write_text("skipped\n")
            continue
        secs = min(secs, left)
        log = raw / ("tests.txt" if p == "tests" else f"{p}.log")
        print(f"== {p} (limit {secs:.0f} s) at +{time.monotonic() - t0:.0f} s", flush=True)
        rc = run_part(part_argv(p, int(secs), args), secs, log)
        (raw / f"{p}.exit").write_text(f"{rc}\n")
        tail = log.read_text(errors="replace").splitlines()[-8:]
        print(f"== {p}: rc={rc} at +{time.monotonic() - t0:.0f} s", *tail, sep="\n", flush=True)
    return 0


def part_variants(args) -> dict:
    """The register-tiled flash2 forward variants against SDPA float32 at SDPA_CASES (gpu_variants.py: time,
    relative error, counters against the simulator, registers and blocks per SM)."""
    cuda = _cuda()
    import gpu as bench
    import gpu_variants

    return {"rows": gpu_variants.rows(cuda, bench.Timer(cuda, args.reps, args.seconds))}


def part_waves(args) -> dict:
    """The register-tiled flash2 forward over Br at many waves, beside the L2 and HBM read ceilings measured in the
    same process, with the verdict on whether words decide time where the kernel is I/O-bound (gpu_waves.py)."""
    cuda = _cuda()
    import gpu as bench
    import gpu_waves

    return {"rows": gpu_waves.rows(cuda, bench.Timer(cuda, args.reps, args.seconds))}


def part_ncu_query(args) -> dict:
    text = query_metrics("ncu-query", args)
    return {"metrics offered": len(ncu_raw.offered(text))}


PARTS = {"env": part_env, "variants": part_variants, "waves": part_waves, "sweep": part_sweep,
         "sweep-backward": part_sweep_backward, "m-top": part_m_top, "sdpa": part_sdpa, "ab": part_ab,
         "occupancy": part_occupancy, "ncu-query": part_ncu_query}  # fmt: skip
CHILDREN = {"child-sweep": child_sweep, "child-torch": child_torch, "child-triton": child_triton,
            "child-fa2": child_fa2, "child-predictions": child_predictions}  # fmt: skip


def main(argv=None) -> int:
    """The command line; bad input is one line on stderr and exit status 2."""
    try:
        return _main(argv)
    except InputError as e:
        print(f"gpu_evidence.py: error: {e}", file=sys.stderr)
        return 2


def _main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("part", help=f"run-all, or one of: {', '.join(CATALOG)}")
    p.add_argument("--out", type=pathlib.Path, default=ROOT / "results" / "gpu_evidence")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--seconds", type=float, default=0.5)
    p.add_argument("--threads", type=int, default=128)
    p.add_argument("--budget", type=float, default=240.0, help="seconds a part may take (sweep, ncu)")
    p.add_argument("--before", type=pathlib.Path, default=ROOT / ".ab" / "flash_before.py", help="part ab's baseline")
    p.add_argument(
        "--predictions",
        type=pathlib.Path,
        default=HERE / "predictions" / "h200-next.json",
        help="the registered predictions file the part measures (default: the one no lease has measured)",
    )
    p.add_argument("--parts", nargs="+", help="run-all: these parts, in this order (default: the plan)")
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help="run-all: seconds for the whole run")
    p.add_argument("--dry-run", action="store_true", help="run-all: print the plan and the limits, run nothing")
    args = p.parse_args(argv)
    part = args.part
    if part == "run-all":
        return run_all(args)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if part in CHILDREN:
        CHILDREN[part](args)
        return 0
    if part in PARTS:
        data = PARTS[part](args)
    elif part in NCU_PARTS:
        data = part_ncu(part, args)
    else:
        raise InputError("part", f"must be run-all or one of {', '.join(CATALOG)}", part)
    data["seconds"] = time.perf_counter() - t0
    dump(args.out, part, data)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

"""Registered predictions, measured unchanged: the entry format, the launch each entry describes, the ncu metrics
that measure each level, and the comparison (docs/gpu.md, "Predictions file").

A predictions file (``experiments/bench/predictions/h100.json``) is ``{"device": ..., "entries": [entry, ...]}``;
an entry is

    {"id": "fa2-fwd-causal-ascending", "what": "one line", "backend": "sdpa-flash",
     "B": 1, "H_q": 32, "H_kv": 32, "N_q": 32768, "N_k": 32768, "d": 128, "causal": true, "dtype": "float16",
     "order": "ascending", "predicted": {"dram_read": 805306368, "l2_read": ...}}

with the optional fields ``pass`` ("forward" | "backward", default forward), ``gqa`` ("packed": SDPA's
``enable_gqa``, the default; "per-head": K and V expanded to H_q heads before the profiled launch), ``M`` (words of
shared memory: backend iosim-cuda only) and ``bytes`` (the buffer: backend copy only). ``order`` names the CTA
order the prediction assumes; the measurement runs the backend as it is (a backend has no order switch), so an
order the backend does not walk is a prediction of a launch that is not run, and the report says so by the id.

Backends: ``sdpa-flash`` and ``sdpa-cudnn`` (PyTorch's scaled_dot_product_attention restricted to
FlashAttention-2's or cuDNN's kernel), ``iosim-cuda`` (iosim's numba.cuda flash2; float32, H_q = H_kv,
N_q = N_k), ``copy`` (the L2 capacity probe: one kernel reads a float32 buffer of ``bytes`` bytes twice, each
thread its grid-stride share, so a word's second read comes one buffer's traffic after its first).

Nsight Compute flushes the caches before each profiled kernel (its default ``--cache-control all``), so every
launch starts with a cold L2. A level's measured bytes are the sum over the launch's kernels, PyTorch's own
elementwise and copy kernels (``at::``) left out (``measured_kernel``).
"""

from __future__ import annotations

import json
import pathlib
import sys

from iosim.base.errors import InputError

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_FILE = HERE / "predictions" / "h100.json"
BACKENDS = ("sdpa-flash", "sdpa-cudnn", "iosim-cuda", "copy")
DTYPES = ("float16", "bfloat16", "float32")
REQUIRED = ("id", "what", "backend", "B", "H_q", "H_kv", "N_q", "N_k", "d", "causal", "dtype", "order", "predicted")
SECTOR = 32  # bytes per L2 sector (Nsight Compute Kernel Profiling Guide, Memory Tables)
# level -> the ncu metrics whose sum (times the factor: sectors are 32 bytes) is that level's bytes
LEVELS = {
    "dram_read": (("dram__bytes_read.sum", 1),),
    "dram_write": (("dram__bytes_write.sum", 1),),
    "l2_read": (("lts__t_sectors_op_read.sum", SECTOR),),
    "l2_write": (("lts__t_sectors_op_write.sum", SECTOR),),
    "l2_reduction": (("lts__t_sectors_op_red.sum", SECTOR), ("lts__t_sectors_op_atom.sum", SECTOR)),
    # the reductions' sectors as the L1 sends them (to tell whether the L2's count of them is the L1's)
    "l1_reduction": (("l1tex__t_sectors_pipe_lsu_mem_global_op_red.sum", SECTOR),),
    "l2_read_from_sm": (("lts__t_sectors_srcunit_tex_op_read.sum", SECTOR),),
    "l2_write_from_sm": (("lts__t_sectors_srcunit_tex_op_write.sum", SECTOR),),
    "l2_read_from_fabric": (("lts__t_sectors_srcunit_ltcfabric_op_read.sum", SECTOR),),
    "l2_write_from_fabric": (("lts__t_sectors_srcunit_ltcfabric_op_write.sum", SECTOR),),
    "global_load": (("l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum", 1),),
    "global_store": (("l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum", 1),),
}
TIME = "gpu__time_duration.sum"


def _need(cond: bool, entry: dict, field: str, accepted: str) -> None:
    if not cond:
        raise InputError(f"predictions entry {entry.get('id', '?')!r}: {field}", accepted, entry.get(field))


def check(entry: dict) -> dict:
    """The entry with its defaults filled in, or InputError naming the entry, the field and what it accepts."""
    for f in REQUIRED:
        _need(f in entry, entry, f, "is required")
    e = {"pass": "forward", "gqa": "packed", "M": None, "bytes": None, **entry}
    _need(e["backend"] in BACKENDS, e, "backend", f"one of {', '.join(BACKENDS)}")
    _need(e["dtype"] in DTYPES, e, "dtype", f"one of {', '.join(DTYPES)}")
    _need(e["pass"] in ("forward", "backward"), e, "pass", "forward or backward")
    _need(e["gqa"] in ("packed", "per-head"), e, "gqa", "packed or per-head")
    for f in ("B", "H_q", "H_kv", "N_q", "N_k", "d"):
        _need(isinstance(e[f], int) and e[f] >= 1, e, f, "an integer >= 1")
    _need(e["H_q"] % e["H_kv"] == 0, e, "H_kv", "a divisor of H_q")
    _need(isinstance(e["predicted"], dict) and set(e["predicted"]) <= set(LEVELS), e, "predicted",
          f"an object whose keys are among {', '.join(LEVELS)}")  # fmt: skip
    if e["backend"] == "iosim-cuda":
        _need(isinstance(e["M"], int) and e["M"] >= 1, e, "M", "an integer >= 1 (words of shared memory)")
        _need(e["dtype"] == "float32", e, "dtype", "float32 (iosim's kernels)")
        _need(e["H_q"] == e["H_kv"] and e["N_q"] == e["N_k"], e, "H_kv", "H_q, with N_k = N_q (iosim's kernels)")
    if e["backend"] == "copy":
        _need(isinstance(e["bytes"], int) and e["bytes"] >= 4, e, "bytes", "an integer >= 4 (the buffer's size)")
    return e


def registered(path: pathlib.Path, force: bool) -> bool:
    """True (and one line on stderr saying so) when ``path`` is a registered predictions file that ``force`` does not
    allow a script to write over: a registered file is measured unchanged, never rewritten in place."""
    if pathlib.Path(path).exists() and not force:
        print(f"{path} is registered (a lease measures it unchanged); --force writes over it", file=sys.stderr)
        return True
    return False


def load(path: pathlib.Path = DEFAULT_FILE) -> list[dict]:
    """The checked entries of a predictions file; [] where the file does not exist."""
    if not pathlib.Path(path).exists():
        return []
    data = json.loads(pathlib.Path(path).read_text())
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise InputError("predictions file", 'an object {"device": ..., "entries": [...]}', str(path))
    ids = [e.get("id") for e in entries]
    if len(set(ids)) != len(ids):
        raise InputError("predictions file: id", "unique per entry", sorted(i for i in ids if ids.count(i) > 1))
    return [check(e) for e in entries]


def metrics_for(entries: list[dict]) -> list[str]:
    """The ncu metrics that measure every level the entries predict, and the kernel time."""
    out = [TIME]
    for e in entries:
        for level in e["predicted"]:
            out += [m for m, _ in LEVELS[level] if m not in out]
    return out


def measured_kernel(name: str) -> bool:
    """Whether a kernel of a launch counts toward its levels: all but PyTorch's own elementwise and copy kernels
    (``at::`` in the name: the zero-fills and copies autograd issues around FlashAttention's kernels), as in the
    hierarchy table of docs/gpu.md."""
    return "at::" not in name


def measured(row: dict) -> dict:
    """{level: bytes} of one label's summed ncu metrics; a level with a metric ncu did not give is left out."""
    out = {}
    for level, parts in LEVELS.items():
        if all(m in row for m, _ in parts):
            out[level] = sum(row[m] * k for m, k in parts)
    return out


def compare(entries: list[dict], rows_by_id: dict) -> list[dict]:
    """One row per (entry, predicted level): predicted bytes, measured bytes (None: not measured), ratio."""
    out = []
    for e in entries:
        got = measured(rows_by_id[e["id"]]) if e["id"] in rows_by_id else {}
        for level, p in e["predicted"].items():
            m = got.get(level)
            out.append({"id": e["id"], "level": level, "predicted": p, "measured": m,
                        "ratio": None if m is None or not p else m / p})  # fmt: skip
    return out


# ------------------------------------------------------------------------------------------ the launches (GPU)
def launcher(e: dict):
    """A no-argument function that issues the entry's launch; inputs made (and kernels compiled) beforehand."""
    if e["backend"] == "copy":
        return _copy(e["bytes"])
    if e["backend"] == "iosim-cuda":
        return _iosim(e)
    return _sdpa(e)


def _copy(nbytes: int):
    import numpy as np
    from numba import cuda

    @cuda.jit
    def read_twice(x, out):  # each thread reads its grid-stride share of x, then the same share again
        i0, stride = cuda.grid(1), cuda.gridsize(1)
        acc = 0.0
        for _ in range(2):
            for i in range(i0, x.shape[0], stride):
                acc += x[i]
        out[i0] = acc

    x = cuda.to_device(np.ones(nbytes // 4, dtype=np.float32))
    blocks, threads = 132 * 8, 256  # 8 blocks of 256 threads on each of the H100's 132 SMs
    out = cuda.device_array(blocks * threads, dtype=np.float32)
    return lambda: read_twice[blocks, threads](x, out)


def _iosim(e: dict):
    import gpu as bench
    from numba import cuda

    from iosim.gpu import launch as gpu

    arrays = bench.device_arrays(cuda, e["B"], e["H_q"], e["N_q"], e["d"])
    name = "flash2-backward" if e["pass"] == "backward" else "flash2"
    return bench.runner(cuda, gpu, name, arrays, e["M"], e["causal"], 128)


def _sdpa(e: dict):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    dt = getattr(torch, e["dtype"])
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(e["B"], e["H_q"], e["N_q"], e["d"], device="cuda", dtype=dt, generator=g)
    k, v = (torch.randn(e["B"], e["H_kv"], e["N_k"], e["d"], device="cuda", dtype=dt, generator=g) for _ in range(2))
    if e["gqa"] == "per-head" and e["H_q"] != e["H_kv"]:
        k, v = (x.repeat_interleave(e["H_q"] // e["H_kv"], dim=1).contiguous() for x in (k, v))
    gqa = k.shape[1] != q.shape[1]
    backend = SDPBackend.FLASH_ATTENTION if e["backend"] == "sdpa-flash" else SDPBackend.CUDNN_ATTENTION

    def fwd(q=q, k=k, v=v):
        with sdpa_kernel([backend]):
            return sdpa(q, k, v, is_causal=e["causal"], enable_gqa=gqa)

    if e["pass"] == "forward":
        return lambda: fwd()
    qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    o = fwd(qg, kg, vg)
    do = torch.randn_like(o)
    return lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)

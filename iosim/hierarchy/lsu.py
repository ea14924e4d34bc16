"""The LSU level: 32-byte sectors per warp request of iosim's numba.cuda tile copies, against Nsight Compute.

Nsight Compute counts the global memory traffic of the load/store unit as ``l1tex__t_bytes_pipe_lsu_mem_global_op_ld``
and ``..._op_st``: 32 bytes per sector that a warp-wide request touches (Nsight Compute Kernel Profiling Guide,
Memory Tables: a sector is an aligned 32-byte chunk, and a request's sectors are counted once per request). A
request is one warp executing one global load or store instruction: the distinct sectors its active lanes'
addresses fall in, however many lanes share one.

iosim's kernels (``iosim.algorithms.cuda``) move every tile through the helpers of ``_common.py``: ``load_tile``,
``store_tile`` and their transposed forms (same global addresses, only the on-chip order differs), ``load_vec``,
``store_vec``. In each, element ``e`` of an ``nr x nc`` tile (row-major, ``e = r nc + c``) is copied by thread
``e mod T`` in its loop iteration ``e // T`` (``for e in range(threadIdx.x, nr nc, blockDim.x)``, T = threads per
block): warp ``w`` of iteration ``k`` copies elements ``k T + 32 w + lane``, lanes past the tile inactive. The
element's word address is ``base + r ld + c`` with ``ld`` the array's row length, 4 bytes per word (float32), and
arrays start on a sector boundary (each is its own device allocation, 256-byte aligned: CUDA C++ Programming
Guide, "Device Memory Accesses"). So a copy costs :func:`copy_sectors` sectors, a function of the tile's shape,
its row length and its first word modulo 8 words.

A warp request is one *instruction*, and the compiler decides which iterations share one. The PTX that numba-cuda
(NVVM) emits for every copy loop of these kernels runs it unrolled four times (four global accesses per loop body),
the leftover ``t mod 4`` iterations of a thread with ``t`` iterations after it (LLVM's runtime unrolling with an
epilogue; ``tests/test_lsu.py`` reads :data:`UNROLL` off the compiled PTX). Lanes of one warp whose trip counts
differ (t and t - 1, in the warp where the tile's last partial iteration ends) then run their iterations
``4 floor((t-1)/4) .. t - 2`` in different code when ``t`` is a multiple of 4: one iteration becomes two requests,
and a sector both halves touch is counted twice. A tile of whole rows of d (flash2: ``nc = ld = d``, a multiple of
8 words) splits on a sector boundary and loses nothing; the square tiling's B-wide tiles split inside sectors.

The forward kernel of flash2 also reads its block mask (``blocks[i, j]``, int64, all ones when no mask is given):
every thread reads the same element, one sector per warp per read, twice per column block (the scan for a
non-empty row block, then the skip test), reads the kernel's own counters never see. The square tiling's kernels
read no mask. :func:`predict` gives the per-array sectors of one launch; :func:`compare` holds them against the
stored measurements (``experiments/bench/gpu_h100/ncu-sweep.json``, launch configurations from ``sweep.json``).

    python -m iosim.hierarchy.lsu --table     # the table of docs/hierarchy-hardware.md
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import numpy as np

from iosim.base.errors import InputError

WARP = 32
WORD_BYTES = 4  # float32: every array the kernels copy
SECTOR_BYTES = 32  # Nsight Compute Kernel Profiling Guide, Memory Tables (Device.sector_bytes of every preset)
UNROLL = 4  # the copy loops' unroll factor in the kernels' PTX (numba-cuda 0.30 / NVVM 13; tests/test_lsu.py)
_SPW = SECTOR_BYTES // WORD_BYTES  # words per sector


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def warps(threads: int) -> int:
    return cdiv(threads, WARP)


def copy_sectors(nr: int, nc: int, ld: int, base: int, threads: int, unroll: int = UNROLL) -> int:
    """Sectors summed over the warp requests of one tile copy by the helpers: an ``nr x nc`` tile whose element
    (r, c) is word ``base + r ld + c`` of its array, ``threads`` threads striding over it in row-major order, the
    loop unrolled ``unroll`` times with the leftover iterations after it (``unroll=1``: one request per iteration
    and warp)."""
    if nr <= 0 or nc <= 0:
        return 0
    return _copy_sectors(nr, nc, ld, base % _SPW, threads, unroll)


@cache
def _copy_sectors(nr: int, nc: int, ld: int, base: int, threads: int, unroll: int) -> int:
    n = nr * nc
    e = np.arange(n, dtype=np.int64)
    sector = (base + (e // nc) * ld + e % nc) // _SPW
    tid, k = e % threads, e // threads  # the thread copying e, in its iteration k
    trips = (n - tid + threads - 1) // threads  # that thread's iterations
    leftover = (k >= trips // unroll * unroll).astype(np.int64)  # 1: run by the loop after the unrolled one
    request = ((k * warps(threads) + tid // WARP) * 2 + leftover) * (int(sector.max()) + 1)
    return int(np.unique(request + sector).size)


def _span(i: int, B: int, N: int) -> tuple[int, int]:
    return i * B, min(B, N - i * B)


def flash2_forward(
    N: int, d: int, Br: int, Bc: int, threads: int, causal: bool = False, h: int = 0, unroll: int = UNROLL
) -> dict:
    """Sectors per array of one (b, h) of ``flash2_forward_kernel`` (grid.x = ceil(N / Br) blocks), no block mask:
    loads Q, K, V and the mask, stores O, L. Column block j is loaded by row block i unless causal skips it.
    ``h``: the pair's first row, bh N, modulo 8 (its arrays' first words are h d, h N, ... modulo a sector)."""
    Tr, Tc = cdiv(N, Br), cdiv(N, Bc)
    ld = {"Q": 0, "K": 0, "V": 0, "mask": 0}
    st = {"O": 0, "L": 0}
    kv = [copy_sectors(_span(j, Bc, N)[1], d, d, (h + _span(j, Bc, N)[0]) * d, threads, unroll) for j in range(Tc)]
    for i in range(Tr):
        r0, br = _span(i, Br, N)
        ld["Q"] += copy_sectors(br, d, d, (h + r0) * d, threads, unroll)
        steps = [j for j in range(Tc) if not (causal and j * Bc > r0 + br - 1)]
        for j in steps:
            ld["K"] += kv[j]
            ld["V"] += kv[j]
        ld["mask"] += warps(threads) * (Tc + len(steps))  # the non-empty scan, then the skip test per step
        st["O"] += copy_sectors(br, d, d, (h + r0) * d, threads, unroll)
        st["L"] += copy_sectors(1, br, N, h + r0, threads, unroll)
    return {"ld": ld, "st": st}


def square_phase1(N: int, d: int, B: int, threads: int, causal: bool = False, h: int = 0, unroll: int = UNROLL) -> dict:
    """Sectors per array of one (b, h) of ``square_phase1_kernel``: Q and K tiles (B x B slices of d) for every
    (i, j, slice), the S tile (i, j) stored, L_i stored. Causal skips j > i."""
    Tn, Td = cdiv(N, B), cdiv(d, B)
    ld = {"Q": 0, "K": 0}
    st = {"S": 0, "L": 0}
    for i in range(Tn):
        r0, bi = _span(i, B, N)
        for l in range(Td):  # noqa: E741 - the paper's slice index
            k0, bk = _span(l, B, d)
            tile = copy_sectors(bi, bk, d, (h + r0) * d + k0, threads, unroll)
            ld["Q"] += tile * (i + 1 if causal else Tn)  # Q_(i, l) for every j <= i (all j)
            ld["K"] += tile * (Tn - i if causal else Tn)  # K_(i, l) as the j-th column tile for rows i' >= i
        for j in range(i + 1 if causal else Tn):
            c0, bj = _span(j, B, N)
            st["S"] += copy_sectors(bi, bj, N, (h + r0) * N + c0, threads, unroll)
        st["L"] += copy_sectors(1, bi, N, h + r0, threads, unroll)
    return {"ld": ld, "st": st}


def square_phase2(N: int, d: int, B: int, threads: int, causal: bool = False, h: int = 0, unroll: int = UNROLL) -> dict:
    """Sectors per array of one (b, h) of ``square_phase2_kernel``: L_i, then per output column tile c the S tiles
    (i, k) and V tiles (k, c) for every k (k <= i causal), O tile (i, c) stored."""
    Tn, Td = cdiv(N, B), cdiv(d, B)
    ld = {"L": 0, "S": 0, "V": 0}
    st = {"O": 0}
    for i in range(Tn):
        r0, bi = _span(i, B, N)
        ld["L"] += copy_sectors(1, bi, N, h + r0, threads, unroll)
        ks = range(i + 1 if causal else Tn)
        s_row = sum(copy_sectors(bi, _span(k, B, N)[1], N, (h + r0) * N + k * B, threads, unroll) for k in ks)
        ld["S"] += Td * s_row
        for c in range(Td):
            c0, bc = _span(c, B, d)
            ld["V"] += sum(copy_sectors(_span(k, B, N)[1], bc, d, (h + k * B) * d + c0, threads, unroll) for k in ks)
            st["O"] += copy_sectors(bi, bc, d, (h + r0) * d + c0, threads, unroll)
    return {"ld": ld, "st": st}


KERNELS = {"flash2_forward_kernel": "flash2", "square_phase1_kernel": "square", "square_phase2_kernel": "square"}


def predict(
    kernel: str, N: int, d: int, tiles: dict, BH: int, threads: int, causal: bool = False, unroll: int = UNROLL
) -> dict:
    """Predicted Nsight bytes of one launch: {"ld": bytes, "st": bytes, "per_array": {"ld": {...}, "st": {...}}}
    (sectors x 32, summed over the BH (batch, head) pairs of grid.y)."""
    for name, v in (("N", N), ("d", d), ("BH", BH), ("threads", threads), *tiles.items()):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(name, "must be a positive integer", v)
    if threads > 1024:
        raise InputError("threads", "must be in 1..1024", threads)
    if isinstance(unroll, bool) or not isinstance(unroll, int) or unroll < 1:
        raise InputError("unroll", "must be a positive integer", unroll)
    fn = {"flash2_forward_kernel": flash2_forward, "square_phase1_kernel": square_phase1,
          "square_phase2_kernel": square_phase2}.get(kernel)  # fmt: skip
    if fn is None:
        raise InputError("kernel", f"must be one of {', '.join(KERNELS)}", kernel)
    need = ("Br", "Bc") if kernel == "flash2_forward_kernel" else ("B",)
    if sorted(tiles) != sorted(need):
        raise InputError("tiles", f"must give exactly {', '.join(need)} for {kernel}", tiles)
    args = tuple(tiles[k] for k in need)
    per = {"ld": {}, "st": {}}
    for h in range(_SPW):  # the (b, h) pairs by their first row modulo 8: the same sectors within a class
        pairs = sum(1 for bh in range(BH) if bh * N % _SPW == h)
        if pairs:
            s = fn(N, d, *args, threads, causal, h, unroll)
            for op in per:
                for a, n in s[op].items():
                    per[op][a] = per[op].get(a, 0) + n * SECTOR_BYTES * pairs
    return {"ld": sum(per["ld"].values()), "st": sum(per["st"].values()), "per_array": per}


# --------------------------------------------------------------------------------- against the stored measurement
def _bench_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("iosim.experiments")  # the experiments folder, without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("iosim.experiments is not installed: the measurements are its bench/gpu_h100/")
    return Path(next(iter(spec.submodule_search_locations))) / "bench" / "gpu_h100"


def _tiles(text: str) -> dict:
    """``rule=fit, Br=95, Bc=95`` -> {"Br": 95, "Bc": 95}."""
    return {k: int(v) for k, v in re.findall(r"\b(Br|Bc|B)=(\d+)", text)}


def compare(ncu_path: Path | None = None, sweep_path: Path | None = None) -> list[dict]:
    """One row per stored kernel launch of the sweep: its configuration (label of ``ncu-sweep.json``; tiles and
    threads from ``sweep.json``), the prediction and the measured ``l1tex__t_bytes_pipe_lsu_mem_global_op_ld/st``.
    Raises if a stored grid is not the one the configuration launches."""
    base = _bench_dir()
    ncu = json.loads(Path(ncu_path or base / "ncu-sweep.json").read_text())
    sweep = json.loads(Path(sweep_path or base / "sweep.json").read_text())
    tiling = {(r["kernel"], r["N"], r["d"], r["M"], r["BH"]): r.get("tiling") for r in sweep["rows"]}
    rows = []
    for launch in ncu["launches"]:
        lab = ncu["labels"][launch["label"]]
        kernel = next((k for k in KERNELS if f"::{k}[" in launch["kernel"]), None)
        if kernel is None:
            raise ValueError(f"launch {launch['label']}: not a sweep kernel: {launch['kernel'][:60]}")
        N, d, BH = lab["N"], lab["d"], lab["BH"]
        tiles = _tiles(tiling[(lab["kernel"], N, d, lab["M"], BH)])
        threads = int(launch["block"].strip("()").split(",")[0])
        grid = tuple(int(x) for x in launch["grid"].strip("()").split(","))
        rows_per_cta = tiles.get("Br", tiles.get("B"))
        if grid != (cdiv(N, rows_per_cta), BH, 1) or threads != sweep["threads"]:
            raise ValueError(f"launch {launch['label']}: grid {grid}, block {threads} is not {lab}, {tiles}")
        p = predict(kernel, N, d, tiles, BH, threads)
        plain = predict(kernel, N, d, tiles, BH, threads, unroll=1)
        m_ld = int(launch["l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum"])
        m_st = int(launch["l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum"])
        rows.append(dict(label=launch["label"], kernel=kernel, N=N, d=d, M=lab["M"], BH=BH, threads=threads,
                         tiles=tiles, ld=p["ld"], st=p["st"], mask=p["per_array"]["ld"].get("mask", 0),
                         plain_ld=plain["ld"], plain_st=plain["st"],
                         measured_ld=m_ld, measured_st=m_st))  # fmt: skip
    return rows


def _diff(pred: int, meas: int) -> str:
    if pred == meas:
        return "0"
    return f"{pred - meas:+,} ({(pred - meas) / meas:+.3%})"


def table(rows: list[dict] | None = None) -> str:
    """The Markdown table of :func:`compare` with a summary (what ``--table`` prints). "Difference" is predicted
    minus measured; "without the split" is the same model with one request per iteration and warp (unroll 1)."""
    rows = compare() if rows is None else rows
    out = [
        "| label | kernel | d | M | tiles | load B: predicted | measured | difference | without the split "
        "| of which mask reads | store B: predicted | measured | difference | without the split |",
        "|---:|---|---:|---:|---|---:|---:|---|---|---:|---:|---:|---|---|",
    ]
    for r in rows:
        tiles = ", ".join(f"{k}={v}" for k, v in r["tiles"].items())
        out.append(
            f"| {r['label']} | {r['kernel'].removesuffix('_kernel')} | {r['d']} | {r['M']:,} | {tiles} "
            f"| {r['ld']:,} | {r['measured_ld']:,} | {_diff(r['ld'], r['measured_ld'])} "
            f"| {_diff(r['plain_ld'], r['measured_ld'])} | {r['mask']:,} "
            f"| {r['st']:,} | {r['measured_st']:,} | {_diff(r['st'], r['measured_st'])} "
            f"| {_diff(r['plain_st'], r['measured_st'])} |"
        )
    return "\n".join(out) + "\n\n" + summary(rows)


def summary(rows: list[dict]) -> str:
    """Per kernel family: launches exact in load and store bytes, with the unroll split and without it."""
    lines = []
    families = (
        ("flash2", ("flash2_forward_kernel",)),
        ("square tiling", ("square_phase1_kernel", "square_phase2_kernel")),
    )
    for fam, names in families:
        rs = [r for r in rows if r["kernel"] in names]
        for key, what in (("", f"loops unrolled {UNROLL}x (the PTX)"), ("plain_", "one request per iteration")):
            exact = sum((r[key + "ld"], r[key + "st"]) == (r["measured_ld"], r["measured_st"]) for r in rs)
            worst = max(abs(r[key + op] - r["measured_" + op]) / r["measured_" + op] for r in rs for op in ("ld", "st"))
            lines.append(
                f"- {fam}, {what}: {exact} of {len(rs)} kernel launches exact in load and store bytes; "
                f"largest difference {worst:.3%} of a measured figure."
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m iosim.hierarchy.lsu", description=__doc__.splitlines()[0])
    p.add_argument("--table", action="store_true", help="print the table against the stored measurements")
    p.add_argument("--ncu", type=Path, help="an ncu-sweep.json (default: experiments/bench/gpu_h100/)")
    p.add_argument("--sweep", type=Path, help="its sweep.json (default: experiments/bench/gpu_h100/)")
    args = p.parse_args(argv)
    if not args.table:
        p.print_usage(sys.stderr)
        print("error: --table: the only output so far (nothing else was asked)", file=sys.stderr)
        return 2
    try:
        print(table(compare(args.ncu, args.sweep)))
    except (InputError, OSError, KeyError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

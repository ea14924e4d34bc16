"""Fewer words, less time? The register-tiled flash2 forward over row-block sizes, many waves, beside bandwidth
ceilings.

    python experiments/bench/gpu_waves.py --dry-run        # plan, simulated words, waves, residency, ptxas resources
    python experiments/bench/gpu_waves.py --out DIR        # on a GPU: measure, write DIR/gpu_waves.json

One problem, (B, H, N, d) = :data:`CASE`, and the variant ``rt16x16v`` of iosim.algorithms.cuda.flash_fast (16 x 16
threads, contiguous ownership: any Br, TM = ceil(Br / 16) rows per thread, so Br = 8 leaves half the row groups on
slack rows whose sums are dropped) at Bc = 64 and Br = 128, 64, 32, 16, 8 (:data:`PLAN`); then :data:`EXTRA`, the
same code capped at 64 registers for 4 blocks per SM at Br <= 32, where flash_fast defines that variant
(:func:`planned`). In flash2 forward only Br changes the words: K and V are read once per row block, Tr =
ceil(N / Br) times per head, while the FLOPs (4 N^2 d per head) stay put, so the FLOPs per word of K and V are
2 Br and halving Br doubles the dominant traffic. The grid is (Tr, B H) thread blocks: at this case at least 4
waves of (SMs x resident blocks) for every planned Br (7.8 at Br = 128 and 2 blocks per SM, 124 at Br = 8).

Each flash row: the median time (experiments/bench/gpu.py's Timer: CUDA events, one warm-up launch), the
simulator's words for ``Schedule("flash2", Br=, Bc=)`` at the model's working set M of those tiles times B H (per
array and total), the kernel's own counters from one counting launch against them, the simulated words' bytes per
second (the traffic that fills shared memory: global loads and stores, which L1, L2 or DRAM serve) and that as a
fraction of the two ceilings below, TFLOP/s, the relative error of O against a float64 NumPy reference on a slice
(the first :data:`REF_ROWS` rows of the first and last head), CTAs, blocks per SM (ptxas's registers through
iosim.gpu.resources.occupancy, as gpu_variants does) and waves = CTAs / (SMs x blocks per SM).

Ceilings, measured in the same process with the same Timer: a read kernel (``ld.global.cg``: cached in L2, not
L1; 256 threads, 8 independent loads per thread per chunk, one wave of 6 blocks per SM) over a 16 MiB buffer read
512 times in one launch (it stays in the 60 MiB L2: the L2 read ceiling) and over a 2 GiB buffer read once (the
HBM read ceiling).
:func:`verdict` then says where the kernel is I/O-bound (simulated bytes per second at least
:data:`IO_FRACTION` of the L2 ceiling) and, among those launches only, whether ordering by words agrees with
ordering by time. Nothing is fitted to the measurements.

Where K and V come from (:func:`residency`): K + V of one head are 2 N d x 4 bytes (2 MiB here), 128 MiB for all
heads, over the L2. If blocks start in blockIdx.x-fastest order (row blocks of one head together; the hardware's
order is not documented), the heads in flight at once hold far less than the L2, so the Tr re-reads of K and V
are L2 (or L1) hits and DRAM sees Q, K, V, O, L about once (the compulsory bytes, also reported as a rate).
"""

from __future__ import annotations

import functools
import json
import math
import os
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
CASE = (4, 16, 4096, 64)  # B, H, N, d: the gpu_variants d = 64 case (Br = 128 there: 9.4 ms on an H200)
VARIANT = "rt16x16v"
PLAN = tuple((VARIANT, Br, 64) for Br in (128, 64, 32, 16, 8))  # (variant, Br, Bc): 5 compiled kernels
# rt16x16v at 64 registers (launch_bounds (256, 4)): 4 blocks / SM at Br <= 32 (ptxas, nvJitLink 13, sm_90: 64
# registers, no spills at Br = 8, 16, 32), twice the loads in flight of PLAN's 2 blocks; planned only where
# flash_fast.VARIANTS has it (planned())
EXTRA = tuple(("rt16x16v4", Br, 64) for Br in (32, 16, 8))
SMS = 132  # H200 MULTIPROCESSOR_COUNT (experiments/bench/gpu_h200_2/env.json); the device's own on a GPU
L2_BYTES = 62_914_560  # H200 L2_CACHE_SIZE, same file
IO_FRACTION = 0.5  # a launch is I/O-bound when its simulated bytes/s reach this fraction of the L2 ceiling
REF_ROWS = 256
WORD = 4  # bytes per float32 word
# (name, buffer words, reads of the buffer in one launch)
CEILINGS = (("L2", 16 * 2**20 // WORD, 512), ("HBM", 2 * 2**30 // WORD, 1))
# ceiling kernel: 256 threads, 8 loads per thread per chunk, launch_bounds (256, 6): 40 registers, no spills (ptxas,
# sm_90; at (256, 8) 32 registers spill 4 bytes), 6 resident blocks = 1536 threads x 32 bytes in flight per SM
READ_THREADS, READ_UNROLL, READ_BLOCKS = 256, 8, 6


def _gv():
    sys.path.insert(0, str(HERE))
    import gpu_variants

    return gpu_variants


def planned() -> tuple:
    """PLAN, then the EXTRA entries whose variant flash_fast defines."""
    from iosim.algorithms.cuda import flash_fast as ff

    return PLAN + tuple(e for e in EXTRA if e[0] in ff.VARIANTS)


def plan_row(case, variant: str, Br: int, Bc: int, blocks_per_sm: int | None, sms: int = SMS) -> dict:
    """The launch's arithmetic: Tr = ceil(N / Br) row blocks, CTAs = Tr B H, waves = CTAs / (sms x blocks_per_sm)
    (None when blocks_per_sm is unknown), M = the model's working set of the tiles."""
    B, H, N, d = case
    Tr = -(-N // Br)
    ctas = Tr * B * H
    waves = ctas / (sms * blocks_per_sm) if blocks_per_sm else None
    M = _gv().working_set(d, Br, Bc)
    return {"variant": variant, "Br": Br, "Bc": Bc, "M": M, "Tr": Tr, "CTAs": ctas, "blocks/SM": blocks_per_sm,
            "SMs": sms, "waves": waves}  # fmt: skip


def residency(case, Br: int, blocks_per_sm: int | None, sms: int = SMS, l2_bytes: int = L2_BYTES) -> dict:
    """Bytes of K + V per head and in all against the L2, and (blocks starting in blockIdx.x-fastest order, an
    assumption) the heads whose K, V are in use at once: ceil(resident CTAs / Tr) + 1 (a wave may straddle)."""
    B, H, N, d = case
    per_head = 2 * N * d * WORD
    out = {"K+V bytes per head": per_head, "K+V bytes in all": per_head * B * H, "L2 bytes": l2_bytes}
    if blocks_per_sm:
        Tr = -(-N // Br)
        heads = min(B * H, -(-(sms * blocks_per_sm) // Tr) + 1)
        out["heads in flight"] = heads
        out["K+V bytes in flight"] = heads * per_head
        out["K,V re-reads from"] = "L2" if heads * per_head < l2_bytes else "DRAM (in-flight K+V exceed the L2)"
    return out


def simulated(case, Br: int, Bc: int) -> dict:
    """The simulator's flash2 forward counts for Schedule("flash2", Br=, Bc=) at M = working set, times B H:
    {array: [reads, writes, init writes]}."""
    B, H, N, d = case
    return _gv()._simulated(N, d, _gv().working_set(d, Br, Bc), Br, Bc, B * H)


def total_words(per_array: dict) -> int:
    """Reads plus writes over the arrays, as experiments/bench/gpu.py's simulated_words sums them."""
    return sum(r + w for r, w, _ in per_array.values())


def compulsory_bytes(case) -> int:
    """Q, K, V read once, O and L written once: what DRAM must move at least."""
    B, H, N, d = case
    return B * H * (4 * N * d + N) * WORD


# ------------------------------------------------------------------------------------------------------- verdict
def _ranks(xs) -> list[float]:
    """Ranks from 1, ties given their mean rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _spearman(xs, ys) -> float | None:
    """Pearson's correlation of the ranks; None when either side has one value only."""
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return None if sxx == 0 or syy == 0 else sxy / math.sqrt(sxx * syy)


def ordering(rows) -> dict:
    """Whether more words means more time: over pairs with different words, those whose times differ the same way;
    Spearman's rho of (words, ms); ms per million words, its least, largest and their ratio."""
    agree = pairs = 0
    for i, a in enumerate(rows):
        for b in rows[i + 1 :]:
            if a["words"] != b["words"]:
                pairs += 1
                agree += (a["words"] < b["words"]) == (a["ms"] < b["ms"])
    per = [r["ms"] / r["words"] * 1e6 for r in rows]
    rho = _spearman([r["words"] for r in rows], [r["ms"] for r in rows]) if len(rows) > 1 else None
    return {"launches": len(rows), "pairs": pairs, "pairs agreeing": agree, "spearman": rho,
            "ms per Mword min": min(per), "ms per Mword max": max(per),
            "ms per Mword max/min": max(per) / min(per)}  # fmt: skip


def label(row) -> str:
    return f"{row['variant']} Br={row['Br']} Bc={row['Bc']}"


def verdict(rows, ceilings: dict, fraction: float = IO_FRACTION) -> dict:
    """Where the hypothesis "fewer words, less time" is tested: among the timed flash rows, those whose simulated
    bytes/s reach ``fraction`` of ``ceilings["L2 GB/s"]`` (I/O-bound) and, if two or more, whether their times
    order as their words (``ordering``). Rows above ``ceilings["HBM GB/s"]`` are listed: their words cannot all
    have come from DRAM. Every row's ordering is reported as context, not as the test."""
    l2, hbm = ceilings["L2 GB/s"], ceilings.get("HBM GB/s")
    timed = [r for r in rows if r.get("kind") == "flash2" and isinstance(r.get("ms"), (int, float))]
    out = {"threshold": f"{fraction:.0%} of the L2 read ceiling ({l2:.0f} GB/s)", "tested": False}
    if not timed:
        return {**out, "why": "not tested: no timed launch"}
    top = max(timed, key=lambda r: r["words GB/s"])
    out["highest fraction of L2"] = {"launch": label(top), "fraction": top["words GB/s"] / l2}
    out["I/O-bound"] = [label(r) for r in timed if r["words GB/s"] >= fraction * l2]
    if hbm:
        out["above the HBM ceiling"] = [label(r) for r in timed if r["words GB/s"] > hbm]
    out["all launches (context)"] = ordering(timed)
    bound = [r for r in timed if r["words GB/s"] >= fraction * l2]
    if not bound:
        out["why"] = (
            f"not tested: no launch reaches {fraction:.0%} of L2 bandwidth (highest "
            f"{top['words GB/s'] / l2:.1%}, {label(top)})"
        )
    elif len(bound) == 1:
        out["why"] = f"not tested: only one launch ({out['I/O-bound'][0]}) reaches {fraction:.0%} of L2 bandwidth"
    elif len({r["words"] for r in bound}) < 2:
        out["why"] = f"not tested: the I/O-bound launches ({', '.join(out['I/O-bound'])}) move the same words"
    else:
        o = ordering(bound)
        out.update(tested=True, ordering=o, agrees=o["pairs agreeing"] == o["pairs"])
        out["why"] = f"tested on {len(bound)} I/O-bound launches: {o['pairs agreeing']} of {o['pairs']} pairs agree"
    return out


def ceilings_of(rows) -> dict:
    """{"L2 GB/s": .., "HBM GB/s": ..} from the ceiling rows."""
    return {f"{r['ceiling']} GB/s": r["GB/s"] for r in rows if r.get("kind") == "ceiling" and "GB/s" in r}


# ------------------------------------------------------------------------------------------------------- ceilings
@functools.cache
def read_kernel(threads: int, unroll: int):
    """A kernel reading a buffer of ``chunks`` chunks of threads x unroll words ``reps`` times: block b takes chunks
    b, b + grid, ..., at repetition r chunk (c + r) mod chunks (an address that changes with r, so the compiler
    cannot hoist a load out of the repetitions). ``unroll`` independent ``ld.global.cg`` loads (cached in L2, not
    L1) per thread per chunk, consecutive threads on consecutive words; one store only if the sum is a value no
    float32 sum of these reaches (so the loads are not dead code)."""
    global cuda, float32, uint64  # module globals: the CUDA simulator swaps a kernel's global ``cuda``, not a local
    from numba import cuda, float32, uint64
    from numba.core import config

    if config.ENABLE_CUDASIM:  # the simulator has no cache hints

        @cuda.jit(device=True)
        def load(a, i):
            return a[i]
    else:
        load = cuda.ldcg
    CH = threads * unroll

    def read(buf, chunks, reps, out):
        t = cuda.threadIdx.x
        acc = float32(0.0)
        shift = 0  # r mod chunks: the address depends on the repetition, so no load is hoisted out of its loop
        for _ in range(reps):
            for c in range(cuda.blockIdx.x, chunks, cuda.gridDim.x):
                cs = c + shift
                if cs >= chunks:
                    cs -= chunks
                base = uint64(cs * CH + t)  # unsigned: no wrap-around of negative indices to compute
                for k in range(unroll):
                    acc += load(buf, base + uint64(k * threads))
            shift += 1
            if shift == chunks:
                shift = 0
        if acc == float32(-3.0e38):
            out[0] = acc

    if config.ENABLE_CUDASIM:
        return cuda.jit(read)
    return cuda.jit(launch_bounds=(threads, READ_BLOCKS))(read)


def _time_read(timer, launch, buf, chunks: int, reps: int, out) -> float:
    return timer.median_ms(lambda: launch(buf, chunks, reps, out))


def ceiling_rows(cuda, timer, ceilings=CEILINGS, threads: int = READ_THREADS, unroll: int = READ_UNROLL, sms=SMS):
    """One row per ceiling: bytes read, ms, GB/s; grid = min(chunks, sms x READ_BLOCKS) blocks (one wave)."""
    kernel = read_kernel(threads, unroll)
    out_buf = cuda.device_array(1, dtype="float32")
    rows = []
    for name, words, reps in ceilings:
        t0 = time.perf_counter()
        row = {"kind": "ceiling", "ceiling": name, "buffer bytes": words * WORD, "reads": reps}
        try:
            chunks = words // (threads * unroll)
            buf = cuda.device_array(chunks * threads * unroll, dtype="float32")
            grid = max(1, min(chunks, sms * READ_BLOCKS))
            row["ms"] = _time_read(timer, kernel[grid, threads], buf, chunks, reps, out_buf)
            row["bytes"] = chunks * threads * unroll * WORD * reps
            row["GB/s"] = row["bytes"] / row["ms"] / 1e6
            row["grid"] = grid
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        row["wall s"] = round(time.perf_counter() - t0, 2)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------------------- flash rows
def reference_error(arrays, O, case, rows: int = REF_ROWS) -> float:
    """||O - O_ref|| / ||O_ref|| over the first ``rows`` rows of the first and last head, O_ref in float64."""
    import numpy as np

    B, H, N, d = case
    num = den = 0.0
    for b, h in {(0, 0), (B - 1, H - 1)}:
        q, k, v = (np.asarray(arrays[n][b, h].copy_to_host(), dtype=np.float64) for n in ("Q", "K", "V"))
        s = q[:rows] @ k.T / math.sqrt(d)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        ref = p @ v / p.sum(axis=1, keepdims=True)
        got = np.asarray(O[b * H + h, :rows].copy_to_host(), dtype=np.float64)
        num += float(((got - ref) ** 2).sum())
        den += float((ref**2).sum())
    return math.sqrt(num / den)


def flash_row(cuda, timer, ff, case, plan_entry, arrays, ceilings: dict, sms: int) -> dict:
    """One timed, checked launch of the planned (variant, Br, Bc) (module docstring)."""
    gv = _gv()
    B, H, N, d = case
    name, Br, Bc = plan_entry
    v = ff.variant(name)
    M = gv.working_set(d, Br, Bc)
    out = {"O": cuda.device_array((B * H, N, d), dtype="float32"), "L": cuda.device_array((B * H, N), dtype="float32")}
    Q, K, V = arrays["Q"], arrays["K"], arrays["V"]

    def launch():
        ff.flash2_forward_fast(Q, K, V, variant_name=name, Br=Br, Bc=Bc, M=M, poison=False, out=out)

    ms = timer.median_ms(launch)
    kernel, words = ff.kernel_for(v, min(Br, N), min(Bc, N), d)
    registers = gv._registers(kernel)
    row = {"kind": "flash2", "case": list(case), "threads": v.threads, "shared_words": words, "registers": registers}
    row.update(plan_row(case, name, Br, Bc, gv._blocks_per_sm(cuda, registers, words, v.threads), sms))
    row["ms"] = ms
    per = simulated(case, Br, Bc)
    row["words per array"] = per
    row["words"] = total_words(per)
    row["bytes"] = row["words"] * WORD
    row["words GB/s"] = row["bytes"] / ms / 1e6
    row["compulsory GB/s"] = compulsory_bytes(case) / ms / 1e6
    for c in ("L2", "HBM"):
        if f"{c} GB/s" in ceilings:
            row[f"fraction of {c}"] = row["words GB/s"] / ceilings[f"{c} GB/s"]
    row["TFLOP/s"] = 4 * B * H * N * N * d / ms / 1e9
    row["rel err vs NumPy (slice)"] = reference_error(arrays, out["O"], case)
    counted = ff.flash2_forward_fast(Q, K, V, variant_name=name, Br=Br, Bc=Bc, M=M, poison=False, count=True).counts
    row["counters equal simulator"] = {k: [c.reads, c.writes, c.init_writes] for k, c in counted.items()} == per
    row.update(residency(case, Br, row["blocks/SM"], sms))
    return row


def _sms(cuda) -> int:
    try:
        return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)
    except Exception:  # the simulator's device has no attributes
        return SMS


def rows(cuda, timer, case=CASE, plan=None, ceilings=CEILINGS, threads: int = READ_THREADS) -> list[dict]:
    """On a GPU: the two ceiling rows, one row per planned (variant, Br, Bc) at ``case`` (default :func:`planned`),
    then a verdict row; JSON-able dicts, each printed as it is made."""
    sys.path.insert(0, str(HERE))
    import gpu as bench
    from iosim.algorithms.cuda import flash_fast as ff

    sms = _sms(cuda)
    out = ceiling_rows(cuda, timer, ceilings, threads, sms=sms)
    ceil = ceilings_of(out)
    B, H, N, d = case
    arrays = bench.device_arrays(cuda, B, H, N, d)
    for entry in plan or planned():
        t0 = time.perf_counter()
        try:
            row = flash_row(cuda, timer, ff, case, entry, arrays, ceil, sms)
        except Exception as e:
            row = {"kind": "flash2", "variant": entry[0], "Br": entry[1], "Bc": entry[2], "case": list(case),
                   "error": f"{type(e).__name__}: {str(e)[:300]}"}  # fmt: skip
        row["wall s"] = round(time.perf_counter() - t0, 2)
        print(json.dumps(row), flush=True)
        out.append(row)
    if "L2 GB/s" in ceil:
        v = {"kind": "verdict", **verdict(out, ceil)}
    else:
        v = {"kind": "verdict", "tested": False, "why": "not tested: the L2 ceiling was not measured"}
    print(json.dumps(v), flush=True)
    out.append(v)
    return out


# ------------------------------------------------------------------------------------------------------- dry run
def read_kernel_resources(cc=(9, 0)) -> dict:
    """ptxas's report of the ceiling read kernel for ``cc`` and whether its PTX holds ld.global.cg."""
    from iosim.algorithms.cuda import ptx
    from numba import cuda, types

    from iosim.gpu import resources as res

    kernel = read_kernel(READ_THREADS, READ_UNROLL)
    sig = (types.Array(types.float32, 1, "C"), types.int64, types.int64, types.Array(types.float32, 1, "C"))
    with ptx._target_cc_for_device_functions(cc):
        bounds = (READ_THREADS, READ_BLOCKS)
        text, _ = cuda.compile_ptx(kernel.py_func, sig, cc=cc, launch_bounds=bounds)
    r = res.parse_info_log(res._link(text, cc)[0])
    occ = res.occupancy(res.ARCHS[cc], r["registers"], 0, 0, READ_THREADS)
    return {"kernel": "read (ceiling)", "registers": r["registers"], "spill_stores": r["spill_stores"],
            "blocks_per_sm": occ["blocks_per_sm"],
            "ld.global.cg in PTX": "ld.global.cg" in text}  # fmt: skip


def plan_lines(case=CASE, plan=None, blocks: dict | None = None) -> list[dict]:
    """The plan as JSON-able dicts: launch arithmetic, simulated words, bytes, residency (blocks per SM from
    ``blocks`` {(variant, Br, Bc): n} where known)."""
    out = []
    for name, Br, Bc in plan or planned():
        bps = (blocks or {}).get((name, Br, Bc))
        row = {"case": list(case), **plan_row(case, name, Br, Bc, bps)}
        per = simulated(case, Br, Bc)
        row.update({"words per array": per, "words": total_words(per), "bytes": total_words(per) * WORD})
        row.update(residency(case, Br, bps))
        out.append(row)
    return out


def dry_run() -> int:
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "0")
    gv = _gv()
    B, H, N, d = CASE
    print(f"case (B, H, N, d) = {CASE}; compulsory bytes {compulsory_bytes(CASE):,}; ceilings {CEILINGS}")
    blocks, status = {}, 0
    try:
        missing = [e for e in EXTRA if e not in planned()]
        if missing:
            print(f"not planned (variant not in flash_fast.VARIANTS): {missing}")
        for r in gv.resource_rows(tuple((n, Br, Bc, d) for n, Br, Bc in planned())):
            blocks[(r["variant"], r["Br"], r["Bc"])] = r["blocks_per_sm"]
            print("resources:", json.dumps(r))
        print("resources:", json.dumps(read_kernel_resources()))
    except gv.ToolchainMissingError as e:
        print(f"gpu_waves: no resource report (waves unknown): {e}", file=sys.stderr)
        status = 2
    print("plan: variant Br Bc | M | Tr CTAs blocks/SM waves | words bytes FLOP/word | heads, K+V MiB in flight: from")
    for row in plan_lines(blocks=blocks):
        print(f"plan: {label(row)} | {row['M']} | {row['Tr']} {row['CTAs']} {row['blocks/SM']} "
              f"{row['waves'] and round(row['waves'], 1)} | {row['words']:,} {row['bytes']:,} "
              f"{4 * B * H * N * N * d / row['words']:.0f} | {row.get('heads in flight')}, "
              f"{row.get('K+V bytes in flight', 0) / 2**20:.0f}: {row.get('K,V re-reads from')}")  # fmt: skip
    for row in plan_lines(blocks=blocks):
        print("plan json:", json.dumps(row))
    return status


def main(argv=None) -> int:
    sys.path.insert(0, str(HERE))
    import gpu as bench

    args = bench.lease_args(
        __doc__.splitlines()[0], "print the plan, words and resources (no GPU)", "gpu_waves.json", argv
    )
    if args.dry_run:
        return dry_run()
    return bench.gpu_main("gpu_waves", rows, args, "gpu_waves.json")


if __name__ == "__main__":
    sys.exit(main())

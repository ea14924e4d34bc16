"""The register-tiled flash2 forward variants (iosim.algorithms.cuda.flash_fast) against SDPA float32, on a GPU.

    python experiments/bench/gpu_variants.py --dry-run        # the plan and ptxas's resources, no GPU needed
    python experiments/bench/gpu_variants.py --out DIR        # on a GPU: time, check, write DIR/gpu_variants.json

For each planned (variant, Br, Bc) at the two cases (B, H, N, d) = (4, 16, 4096, 64) and (1, 8, 8192, 128):
the variant's median time (experiments/bench/gpu.py's Timer: CUDA events, one warm-up launch), the same inputs'
SDPA float32 time measured in this process (torch.nn.functional.scaled_dot_product_attention, TF32 off,
gpu.torch_median_ms), the output's relative error against SDPA, and the kernel's counters (one counting
launch) against the simulator's flash2 forward for the same (N, d, M, Br, Bc) times B H. M is the model's
working set of the tiles, 2 d (Br + Bc) + 2 Br + Br Bc: the fit rule's choice at that M where the fit rule
reaches these tiles, an explicit schedule (``iosim.Schedule("flash2", Br=, Bc=)``) otherwise; either way the
simulator counts that schedule. Imports only numpy, numba-cuda, torch and iosim. Rows are JSON-able dicts.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
CASES = ((4, 16, 4096, 64), (1, 8, 8192, 128))
# (variant, Br, Bc, d): 5 compiled kernels in all; the tiles are the fit rule's at M = working_set(d, Br, Bc).
PLAN = (
    ("rt16x16", 128, 64, 64),
    ("rt16x16", 64, 64, 128),
    ("rt16x16v", 128, 64, 64),
    ("rt16x16v", 64, 64, 128),
    ("rt16x16v1", 64, 64, 128),
)
CC = (9, 0)


class ToolchainMissingError(RuntimeError):
    """nvJitLink (or NVVM) is not usable here: the resource report cannot be made."""


def working_set(d: int, Br: int, Bc: int) -> int:
    """The model's words for flash2 forward's tiles (io_model.flash_working_set)."""
    return 2 * d * (Br + Bc) + 2 * Br + Br * Bc


def _signature():
    from iosim.algorithms.cuda import ptx
    from numba import types

    F1 = types.Array(types.float32, 1, "C")
    return (F1, F1, F1, ptx.F3, ptx.F2, ptx.F, ptx.B, ptx.I2)


def resource_rows(plan=PLAN, cc=CC) -> list[dict]:
    """ptxas's registers, spills and stack per planned kernel (no GPU), shared memory and blocks per SM."""
    from iosim.algorithms.cuda import ptx

    ptx.real_target()
    from iosim.gpu import resources as res

    why = res.toolchain_missing()
    if why:
        raise ToolchainMissingError(why)
    from iosim.algorithms.cuda import flash_fast as ff
    from numba import cuda

    out = []
    for name, Br, Bc, d in plan:
        v = ff.VARIANTS[name]
        kernel, words = ff.kernel_for(v, Br, Bc, d)
        bounds = (v.threads, ff.min_blocks_for(v, words))
        with ptx._target_cc_for_device_functions(cc):
            text, _ = cuda.compile_ptx(kernel.py_func, _signature(), cc=cc, launch_bounds=bounds)
        log, _cubin = res._link(text, cc)
        r = res.parse_info_log(log)
        occ = res.occupancy(res.ARCHS[cc], r["registers"], 0, words * 4, v.threads)
        out.append(
            {
                "variant": name, "Br": Br, "Bc": Bc, "d": d, "threads": v.threads, "cc": f"{cc[0]}.{cc[1]}",
                "registers": r["registers"], "spill_stores": r["spill_stores"], "spill_loads": r["spill_loads"],
                "stack": r["stack"], "shared_words": words, "M": working_set(d, Br, Bc), "launch_bounds": list(bounds),
                "blocks_per_sm": occ["blocks_per_sm"], "limiter": occ["limiter"], "aim": v.aim,
            }
        )  # fmt: skip
    return out


def _simulated(N: int, d: int, M: int, Br: int, Bc: int, BH: int) -> dict:
    import iosim

    r = iosim.run(iosim.Schedule("flash2", Br=Br, Bc=Bc), N=N, d=d, M=M, count_only=True)
    per = r.passes["forward"].stats.per_array
    return {k: [BH * v.reads, BH * v.writes, BH * v.init_writes] for k, v in per.items()}


def _sdpa_ms(bench, arrays, reps: int, seconds: float):
    """(SDPA float32 ms with TF32 off, its output as a torch tensor)."""
    import torch
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    q, k, v = (torch.as_tensor(arrays[n], device="cuda") for n in ("Q", "K", "V"))
    out = sdpa(q, k, v)
    return bench.torch_median_ms(lambda: sdpa(q, k, v), reps, seconds), out


def _row(cuda, timer, bench, ff, case, plan_row, arrays, ref, sdpa_ms, sim_cache) -> dict:
    import torch

    from iosim.gpu.launch import tiling_for

    B, H, N, d = case
    name, Br, Bc, _ = plan_row
    v = ff.variant(name)
    M = working_set(d, Br, Bc)
    row = {"variant": name, "case": list(case), "M": M, "Br": Br, "Bc": Bc, "threads": v.threads}
    t = tiling_for("flash2", N, d, M)
    row["tiling"] = "fit" if (t.Br, t.Bc) == (Br, Bc) else "explicit"
    out = {"O": cuda.device_array((B * H, N, d), dtype="float32"), "L": cuda.device_array((B * H, N), dtype="float32")}
    Q, K, V = arrays["Q"], arrays["K"], arrays["V"]

    def launch():
        ff.flash2_forward_fast(Q, K, V, variant_name=name, Br=Br, Bc=Bc, M=M, poison=False, out=out)

    row["ms"] = timer.median_ms(launch)
    kernel, words = ff.kernel_for(v, Br, Bc, d)
    row["shared_words"] = words
    row["registers"] = _registers(kernel)
    row["blocks/SM"] = _blocks_per_sm(cuda, row["registers"], words, v.threads)
    row["TFLOP/s"] = bench.flops("x", B, H, N, d, False) / row["ms"] / 1e9
    row["sdpa ms"] = sdpa_ms
    row["ms/SDPA ms"] = row["ms"] / sdpa_ms
    O = torch.as_tensor(out["O"], device="cuda").reshape(B, H, N, d)
    row["rel err vs SDPA"] = float((O.double() - ref.double()).norm() / ref.double().norm())
    counted = ff.flash2_forward_fast(Q, K, V, variant_name=name, Br=Br, Bc=Bc, M=M, poison=False, count=True).counts
    key = (N, d, Br, Bc)
    if key not in sim_cache:
        sim_cache[key] = _simulated(N, d, M, Br, Bc, B * H)
    row["counters"] = {k: [c.reads, c.writes, c.init_writes] for k, c in counted.items()}
    row["counters equal"] = row["counters"] == sim_cache[key]
    return row


def _registers(kernel):
    try:
        return next(iter(kernel.get_regs_per_thread().values()))
    except Exception as e:  # reported, not fatal
        return f"{type(e).__name__}: {e}"


def _blocks_per_sm(cuda, registers, words: int, threads: int):
    from iosim.gpu import resources as res

    cc = cuda.get_current_device().compute_capability
    if not isinstance(registers, int) or tuple(cc) not in res.ARCHS:
        return None
    return res.occupancy(res.ARCHS[tuple(cc)], registers, 0, words * 4, threads)["blocks_per_sm"]


def rows(cuda, timer, cases=CASES, plan=PLAN) -> list[dict]:
    """On a GPU: one row per (case, planned variant with that case's d), JSON-able; SDPA timed with the
    timer's reps and seconds."""
    sys.path.insert(0, str(HERE))
    import gpu as bench
    from iosim.algorithms.cuda import flash_fast as ff

    out, sim_cache = [], {}
    for case in cases:
        B, H, N, d = case
        arrays = bench.device_arrays(cuda, B, H, N, d)
        sdpa_ms, ref = _sdpa_ms(bench, arrays, timer.reps, timer.seconds)
        for plan_row in plan:
            if plan_row[3] != d:
                continue
            t0 = time.perf_counter()
            try:
                row = _row(cuda, timer, bench, ff, case, plan_row, arrays, ref, sdpa_ms, sim_cache)
            except Exception as e:
                row = {"variant": plan_row[0], "case": list(case), "error": f"{type(e).__name__}: {str(e)[:300]}"}
            row["wall s"] = round(time.perf_counter() - t0, 2)
            print(json.dumps(row), flush=True)
            out.append(row)
    return out


def main(argv=None) -> int:
    sys.path.insert(0, str(HERE))
    import gpu as bench

    args = bench.lease_args(
        __doc__.splitlines()[0], "print the plan and each kernel's resources (no GPU)", "gpu_variants.json", argv
    )
    if args.dry_run:
        for case in CASES:
            for name, Br, Bc, d in PLAN:
                if d == case[3]:
                    print(f"plan: case {case} {name} Br={Br} Bc={Bc} M={working_set(d, Br, Bc)}")
        try:
            for r in resource_rows():
                print(json.dumps(r))
        except ToolchainMissingError as e:
            print(f"gpu_variants: no resource report: {e}", file=sys.stderr)
            return 2
        return 0
    return bench.gpu_main("gpu_variants", rows, args, "gpu_variants.json")


if __name__ == "__main__":
    sys.exit(main())

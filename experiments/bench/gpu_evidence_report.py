"""Tables and figure of the GPU evidence, from the measurements kept in experiments/bench/gpu_h100/ (no GPU needed).

    python experiments/bench/gpu_evidence_report.py                  # the tables (Markdown) on stdout
    python experiments/bench/gpu_evidence_report.py --figure F.png   # and the figure (the plot extra)
    python experiments/bench/gpu_evidence_report.py --recompute      # redo the CPU side (minutes: see below)

The measurements were made by ``experiments/bench/gpu_evidence.sh`` on one H100 (the versions are in ``env.json``).
The CPU side, kept in ``cpu-side.json`` with the command of each figure, is what ``--recompute`` redoes:
``iosim hierarchy``'s predictions at the launches PyTorch's FlashAttention-2 kernels ran (their tile sizes read off
the kernel names Nsight Compute printed), and ``iosim kernel``'s counts of the Triton kernels the GPU ran, at the
same sizes (about 5 minutes per Triton kernel on two cores).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
DATA = HERE / "gpu_h100"
MB = 1e6

# iosim hierarchy: flash-attn 2's forward ran Flash_fwd_kernel_traits<128, 128, 64, ...> (Br = 128, Bc = 64), its
# backward Flash_bwd_kernel_traits<128, 64, 128, ...> (Br = 64, Bc = 128); the decode is the L2 page's example.
HIERARCHY = {
    "forward": "iosim hierarchy flash2 --N 32768 --d 128 --heads 32 --device H100 --Br 128 --Bc 64 --json",
    "forward causal": (
        "iosim hierarchy flash2 --N 32768 --d 128 --heads 32 --device H100 --Br 128 --Bc 64 --causal --json"
    ),
    "backward": "iosim hierarchy flash2 --N 32768 --d 128 --heads 32 --device H100 --backward --Br 64 --Bc 128 --json",
    "backward causal": (
        "iosim hierarchy flash2 --N 32768 --d 128 --heads 32 --device H100 --backward --Br 64 --Bc 128 --causal --json"
    ),
    "decode GQA": (
        "iosim hierarchy flash2 --Nq 1 --Nk 32768 --d 128 --heads 32 --kv-heads 8 --batch 4 --device H100 --json"
    ),
}
_COUNT = "--N 4096 --d 64 --H 16 --dtype float16 --like flash2 --no-numerics --json --timeout 3600"
KERNEL_COUNTS = {
    "triton_flash2 64x32": f"iosim kernel iosim/kernels/examples/triton_flash2.py --Br 64 --Bc 32 {_COUNT}",
    "triton_flash2 64x32 causal": (
        f"iosim kernel iosim/kernels/examples/triton_flash2.py --Br 64 --Bc 32 --causal {_COUNT}"
    ),
    "triton_flash2 128x64": f"iosim kernel iosim/kernels/examples/triton_flash2.py --Br 128 --Bc 64 {_COUNT}",
    "fla parallel_attn causal": (
        f"iosim kernel experiments/bench/gpu_kernel_launchers.py:fla_hopper --backend triton --causal {_COUNT}"
    ),
}


def load(name: str):
    return json.loads((DATA / f"{name}.json").read_text())


def table(headers, rows) -> str:
    from tabulate import tabulate

    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def f(x, spec=",.0f") -> str:
    return "-" if x is None else format(x, spec)


def _l2(r) -> float:
    return 32 * sum(r.get(f"lts__t_sectors_op_{op}.sum", 0.0) for op in ("read", "write", "red", "atom"))


def _lsu(r) -> float:
    return sum(r.get(f"l1tex__t_bytes_pipe_lsu_mem_global_op_{op}.sum", 0.0) for op in ("ld", "st", "red", "atom"))


def _dram(r) -> float:
    return r.get("dram__bytes_read.sum", 0.0) + r.get("dram__bytes_write.sum", 0.0)


def per_label(ncu: dict, keep=lambda name: True) -> list[dict]:
    """The launches after each marker summed per label (only kernels whose name ``keep`` accepts)."""
    out = [dict(lab, kernels=[]) for lab in ncu["labels"]]
    for r in ncu["launches"]:
        if not keep(r["kernel"]):
            continue
        row = out[r["label"]]
        row["kernels"].append(r["kernel"])
        for k, v in r.items():
            if isinstance(v, float):
                row[k] = row.get(k, 0.0) + v
    return out


# ------------------------------------------------------------------------------------------------- the sweep
def sweep_rows() -> list[dict]:
    timed = {(r["kernel"], r["d"], r["M"]): r for r in load("sweep")["rows"]}
    before = {(r["kernel"], r["d"], r["M"]): r.get("ms") for r in load("sweep-before")["rows"]}
    for key, r in timed.items():
        r["ms before"] = before.get(key)
    ncu = {(r["kernel"], r["d"], r["M"]): r for r in per_label(load("ncu-sweep"))}
    rows = []
    for key, t in timed.items():
        r = {**t, "ncu": ncu.get(key)}
        rows.append(r)
    return rows


def sweep_table(d: int | None = None) -> str:
    rows = [r for r in sweep_rows() if d is None or r["d"] == d]
    by = {}
    for r in rows:
        by.setdefault((r["d"], r["M"]), {})[r["kernel"]] = r
    out = []
    for (dd, M), pair in sorted(by.items()):
        fl, sq = pair.get("flash2", {}), pair.get("square-tiling", {})

        def cells(r):
            n, w = r.get("ncu"), r.get("simulated words")
            if not r.get("ms"):
                return ["not run", "-", "-", "-", "-"]
            b = 4 * w
            return [f(r["ms"], ".1f"), f(b / MB), f(_lsu(n) / b, ".2f"), f(_l2(n) / b, ".2f"), f(_dram(n) / MB)]

        ratio = fl.get("ms") and sq.get("ms") and sq["ms"] / fl["ms"]
        out.append([dd, f(M), f(M / dd / dd, ".3g"), f(fl.get("ms before"), ".1f"), *cells(fl), *cells(sq),
                    f(ratio, ".2f") if ratio else "-"])  # fmt: skip
    head = ["d", "M", "M/d²", "flash2 ms, scalar build"]
    for k in ("flash2", "square"):
        head += [f"{k} ms", f"{k} MB counted", "LSU/counted", "L2/counted", "DRAM MB"]
    return table(head + ["time square/flash2"], out)


def counters_line() -> str:
    rows = load("sweep")["rows"]
    run = [r for r in rows if "counters equal simulator" in r]
    equal = sum(bool(r["counters equal simulator"]) for r in run)
    return f"{equal} of {len(run)} launches: the kernels' own counters equal the simulator's per array"


def figure(path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sweep_rows()
    ds = sorted({r["d"] for r in rows})
    fig, axes = plt.subplots(2, len(ds), figsize=(4.2 * len(ds), 7), sharex="col")
    for col, d in enumerate(ds):
        for kernel, style in (("flash2", "o-"), ("square-tiling", "s--")):
            pts = sorted((r["M"] / d / d, r) for r in rows if r["d"] == d and r["kernel"] == kernel and r.get("ms"))
            x = [p for p, _ in pts]
            axes[0, col].plot(x, [r["ms"] for _, r in pts], style, label=kernel)
            if kernel == "flash2":
                xb = [p for p, r in pts if r.get("ms before")]
                yb = [r["ms before"] for _, r in pts if r.get("ms before")]
                axes[0, col].plot(xb, yb, "o:", color="grey", label="flash2, scalar build")
            counted = [4 * r["simulated words"] for _, r in pts]
            axes[1, col].plot(x, [c / MB for c in counted], style, label=f"{kernel}: counted")
            axes[1, col].plot(x, [_l2(r["ncu"]) / MB for _, r in pts], style, alpha=0.5, label=f"{kernel}: L2")
            axes[1, col].plot(x, [_dram(r["ncu"]) / MB for _, r in pts], style, alpha=0.25, label=f"{kernel}: DRAM")
        for ax in axes[:, col]:
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.axvline(1.0, color="grey", lw=0.8)
            ax.grid(alpha=0.3)
        axes[0, col].set_title(f"d = {d}: time (H100, float32)")
        axes[1, col].set_title(f"d = {d}: MB moved")
        axes[1, col].set_xlabel("M / d²")
    axes[0, 0].set_ylabel("ms (median)")
    axes[1, 0].set_ylabel("MB")
    axes[0, 0].legend(fontsize=8)
    axes[1, 0].legend(fontsize=6)
    fig.suptitle("N = 2048, B·H = 8: flash2 vs square tiling as shared memory M shrinks below d²")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# --------------------------------------------------------------------------------------- hierarchy vs Nsight
def hierarchy_table() -> str:
    pred = load("cpu-side")["hierarchy"]
    torch = per_label(load("ncu-torch"), keep=lambda k: "at::" not in k)  # FlashAttention's / cuDNN's own kernels
    measured = {}
    for r in torch:
        what = r["what"]
        if what.startswith("sdpa flash"):
            key = ("forward" if "forward" in what else "backward") + (" causal" if r["causal"] else "")
        elif what == "sdpa decode GQA bf16, backend default":
            key = "decode GQA"
        else:
            continue
        measured[key] = r
    out = []
    for key, p in pred.items():
        m = measured.get(key)
        if m is None:
            continue
        bpw = p["bytes_per_word"]
        pr, pw = p["dram_read"] * bpw, p["dram_update"] * bpw
        mr, mw = m["dram__bytes_read.sum"], m["dram__bytes_write.sum"]
        l2p = sum(a["l2_read"] + a["l2_update"] for a in p["per_array"].values()) * bpw
        l2m = 32 * (m["lts__t_sectors_op_read.sum"] + m["lts__t_sectors_op_red.sum"])
        out.append([key, f(pr / MB), f(mr / MB), f(mr / pr, ".2f"), f(pw / MB), f(mw / MB), f(mw / pw, ".2f"),
                    f(l2p / MB), f(l2m / MB), f(l2m / l2p, ".2f")])  # fmt: skip
    head = ["launch", "DRAM read MB: iosim", "measured", "ratio", "DRAM write MB: iosim", "measured", "ratio",
            "L2 read + update MB: iosim", "L2 read + reduction MB: measured", "ratio"]  # fmt: skip
    return table(head, out)


# ----------------------------------------------------------------------------------- Triton kernels, both sides
def triton_table() -> str:
    counts = load("cpu-side")["kernel counts"]
    ncu = load("ncu-triton")
    out = []
    for r in ncu["launches"]:
        lab = ncu["labels"][r["label"]]
        if lab["dtype"] != "float16" or "Fill" in r["kernel"]:
            continue
        if lab["what"].startswith("fla"):
            key = "fla parallel_attn causal"
        else:
            key = f"triton_flash2 {lab['Br']}x{lab['Bc']}" + (" causal" if lab["causal"] else "")
        c = counts.get(key)
        if c is None or "per_array" not in c:
            continue
        rd = sum(a["read_bytes"] for a in c["per_array"].values())
        wr = sum(a["write_bytes"] for a in c["per_array"].values())
        ld, st = r["l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum"], r["l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum"]
        out.append([key, f(rd), f(ld), f(ld / rd, ".4f"), f(wr), f(st), f(st / wr, ".4f"),
                    f(32 * r["lts__t_sectors_op_read.sum"] / MB, ".1f"),
                    f(r["dram__bytes_read.sum"] / MB, ".1f")])  # fmt: skip
    head = ["kernel (fp16, N=4096, d=64, H=16)", "iosim kernel: read B", "ncu global ld B", "ratio",
            "iosim kernel: write B", "ncu global st B", "ratio", "L2 read MB", "DRAM read MB"]  # fmt: skip
    return table(head, out)


# ---------------------------------------------------------------------------------------------- speed vs SDPA
def sdpa_table() -> str:
    rows = load("sdpa")["rows"]
    out = []
    for case in sorted({tuple(r["case"]) for r in rows}, key=lambda c: c[2]):
        ours = [r for r in rows if tuple(r["case"]) == case and r["what"] == "iosim flash2" and r.get("ms")]
        best = min(ours, key=lambda r: r["ms"])
        for tf32 in (False, True):
            s = next(
                r for r in rows if tuple(r["case"]) == case and r.get("tf32") == tf32 and r["what"] == "sdpa default"
            )
            kernel = (s.get("kernels") or ["?"])[0].split("(")[0]
            out.append([", ".join(map(str, case)), "on" if tf32 else "off", kernel, f(s["ms"], ".2f"),
                        f(s["TFLOP/s"], ".1f"), f"M={best['M']}, {best['threads']} threads, "
                        + best["tiling"].replace("rule=fit, ", ""), f(best["ms"], ".1f"), f(best["TFLOP/s"], ".2f"),
                        f(best["ms"] / s["ms"], ".1f")])  # fmt: skip
    head = ["B, H, N, d", "TF32", "SDPA kernel (default backend)", "SDPA ms", "TFLOP/s", "iosim flash2: best of",
            "ms", "TFLOP/s", "iosim / SDPA"]  # fmt: skip
    return table(head, out)


def ab_table() -> str:
    out = []
    for r in load("ab")["rows"]:
        out.append([", ".join(map(str, r["case"])), f(r["M"]), r["tiling"].replace("rule=fit, ", ""),
                    f(r["before ms"], ".1f"), f(r["after ms"], ".1f"), f(r["before / after"], ".2f")])  # fmt: skip
    return table(["B, H, N, d", "M", "tiles", "before ms", "after ms", "speed-up"], out)


# ------------------------------------------------------------------------------------------------- occupancy
def occupancy_summary() -> tuple[str, str]:
    from iosim.gpu import resources

    arch = resources.ARCHS[(9, 0)]
    rows = [r for r in load("occupancy")["rows"] if "driver blocks/SM" in r]
    agree = sum(
        resources.occupancy(arch, r["driver"]["NUM_REGS"], r["driver"]["SHARED_SIZE_BYTES"], r["dynamic smem"], 128)[
            "blocks_per_sm"
        ]
        == r["driver blocks/SM"]
        for r in rows
    )
    regs = {}
    for r in rows:
        regs[r["kernel"]] = (r["driver"]["NUM_REGS"], r["iosim"]["registers"], r["driver"]["SHARED_SIZE_BYTES"])
    line = (
        f"{agree} of {len(rows)} (kernel, d, M) launches: iosim's occupancy formula, given the driver's register "
        "count, equals cuOccupancyMaxActiveBlocksPerMultiprocessor"
    )
    tab = table(
        ["kernel", "registers: driver", "iosim gpu-resources (nvJitLink)", "static smem: driver"],
        [[k, a, b, c] for k, (a, b, c) in sorted(regs.items())],
    )
    return line, tab


def report() -> str:
    env = load("env")
    versions = (
        f"{env['torch device']}, driver {env['nvidia-smi'].split('Driver Version:')[1].split()[0]}, CUDA "
        f"{env['torch.version.cuda']}, numba-cuda {env['numba_cuda']}, numba {env['numba']}, numpy {env['numpy']}, "
        f"torch {env['torch']}, triton {env['triton']}, fla-core {env['fla']}, "
        f"{env['ncu --version'].strip().splitlines()[-1]}"
    )
    occ_line, occ_tab = occupancy_summary()
    parts = [
        f"Measured on: {versions}.",
        "",
        "### flash2 against square tiling as M shrinks (N = 2048, B·H = 8, float32)",
        "",
        counters_line() + ".",
        "",
        sweep_table(),
        "",
        "### iosim hierarchy against Nsight Compute (PyTorch SDPA's FlashAttention-2 and cuDNN, on the H100)",
        "",
        hierarchy_table(),
        "",
        "### A Triton kernel counted on the CPU and measured on the GPU",
        "",
        triton_table(),
        "",
        "### flash2 forward against SDPA (float32)",
        "",
        sdpa_table(),
        "",
        "### The register-tiled flash2 forward against the one it replaced (same inputs, same process)",
        "",
        ab_table(),
        "",
        "### The driver's figures against the resource report",
        "",
        occ_line + ".",
        "",
        occ_tab,
    ]
    return "\n".join(parts) + "\n"


def recompute() -> None:
    root = HERE.parents[1]
    out = {"hierarchy": {}, "kernel counts": {}, "commands": {**HIERARCHY, **KERNEL_COUNTS}}
    for key, cmd in {**HIERARCHY, **KERNEL_COUNTS}.items():
        print(f"running: {cmd}", file=sys.stderr, flush=True)
        p = subprocess.run(cmd.split(), capture_output=True, text=True, cwd=root)
        data = json.loads(p.stdout) if p.stdout.strip().startswith("{") else {"error": p.stderr.strip()[-300:]}
        if key in HIERARCHY:
            out["hierarchy"][key] = data
        else:
            out["kernel counts"][key] = data.get("counts", data)
    (DATA / "cpu-side.json").write_text(json.dumps(out, indent=0))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--figure", type=pathlib.Path, help="write the sweep figure here (needs matplotlib)")
    p.add_argument("--recompute", action="store_true", help="redo the CPU side first (slow)")
    args = p.parse_args(argv)
    if args.recompute:
        recompute()
    print(report(), end="")
    if args.figure:
        figure(args.figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())

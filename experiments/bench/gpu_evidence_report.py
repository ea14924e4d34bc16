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
import contextlib
import json
import math
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
DATA = HERE / "gpu_h100"
MB = 1e6
# The H100 SXM5's peaks (NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column: GPU memory bandwidth 3.35 TB/s,
# FP32 67 teraFLOPS; the FP32 figure is 132 SMs x 128 FP32 lanes x 2 flops x 1.98 GHz, and Nsight Compute measured
# the SM clock at 1.99 GHz in every sweep launch: sm__cycles_elapsed.avg.per_second in ncu-sweep.json)
HBM_BYTES_PER_S = 3.35e12
FP32_FLOP_PER_S = 67e12
# The H200's (NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column: GPU memory bandwidth 4.8 TB/s, FP32 67
# teraFLOPS: the H100's SMs and clocks with HBM3e)
H200_HBM_BYTES_PER_S = 4.8e12
H200 = HERE / "gpu_h200"
H200_2 = HERE / "gpu_h200_2"  # the second H200 lease: the variants, the H200 predictions
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

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
    """A stored part; a profiled part (ncu-*, predictions) is repacked from its raw CSV where raw/ holds one."""
    import ncu_raw

    raw = DATA / "raw"
    if (raw / f"{name}.csv").exists() and (raw / f"{name}.labels.json").exists():
        path = DATA / f"{name}.json"
        metrics = json.loads(path.read_text()).get("metrics", []) if path.exists() else []
        return ncu_raw.rebuild(raw, name, metrics)
    if not (DATA / f"{name}.json").exists() and (raw / f"{name}.log").exists():
        return {"rows": log_rows(raw / f"{name}.log"), "stopped": True}
    return json.loads((DATA / f"{name}.json").read_text())


def log_rows(path: pathlib.Path) -> list[dict]:
    """The rows a part printed as it went (one JSON object a line), for a part stopped at its limit before it
    wrote its file."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut at 300 characters
                continue
    return out


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
    old = load("sweep-before")["rows"] if has("sweep-before") else []  # the scalar build's run, first lease only
    before = {(r["kernel"], r["d"], r["M"]): r.get("ms") for r in old}
    for key, r in timed.items():
        r["ms before"] = before.get(key)
    data = load("ncu-sweep")
    ncu = {(r["kernel"], r["d"], r["M"]): r for r in per_label(data)}
    launches = {}
    for lab_i, lab in enumerate(data["labels"]):  # each label's kernels, in launch order
        launches[(lab["kernel"], lab["d"], lab["M"])] = [k for k in data["launches"] if k["label"] == lab_i]
    return [{**t, "ncu": ncu.get(key), "ncu launches": launches.get(key, [])} for key, t in timed.items()]


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
                return ["not run", "-", "-", "-", "-", "-", "-"]
            b = 4 * w
            return [f(r["ms"], ".1f"), f(b / MB), f(_lsu(n) / b, ".2f"), f(_l2(n) / b, ".2f"), f(_dram(n) / MB),
                    f(dram_rate(r) / 1e9, ".1f"), f(flop_rate(r) / 1e12, ".2f")]  # fmt: skip

        ratio = fl.get("ms") and sq.get("ms") and sq["ms"] / fl["ms"]
        out.append([dd, f(M), f(M / dd / dd, ".3g"), f(fl.get("ms before"), ".1f"), *cells(fl), *cells(sq),
                    f(ratio, ".2f") if ratio else "-"])  # fmt: skip
    head = ["d", "M", "M/d²", "flash2 ms, scalar build"]
    for k in ("flash2", "square"):
        head += [f"{k} ms", f"{k} MB counted", "LSU/counted", "L2/counted", "DRAM MB", "DRAM GB/s", "TFLOP/s"]
    return table(head + ["time square/flash2"], out)


def flops(r: dict) -> float:
    """The forward's flops, 4 B H N^2 d (QK^T and PV, two flops per multiply-add; the same for both kernels)."""
    return 4 * r["BH"] * r["N"] ** 2 * r["d"]


def flop_rate(r: dict) -> float:
    """Flops per second at the timed median (CUDA events)."""
    return flops(r) / (r["ms"] / 1e3)


def dram_rate(r: dict) -> float:
    """DRAM bytes per second of the profiled launch: its DRAM bytes over its own duration (gpu__time_duration)."""
    return _dram(r["ncu"]) / (r["ncu"]["gpu__time_duration.sum"] / 1e9)


PART = {"flash2_forward_kernel": ("flash2", "forward"), "square_phase1_kernel": ("square-tiling", "phase 1"),
        "square_phase2_kernel": ("square-tiling", "phase 2")}  # fmt: skip


def sector_rows() -> list[dict]:
    """Each sweep launch's global load and store bytes (Nsight Compute's LSU) beside the LSU level's prediction,
    ``iosim.hierarchy.lsu.compare`` on the stored ncu-sweep.json and sweep.json: 32-byte sectors per warp request of
    the kernels' tile copies, loops unrolled as in their PTX ("model"), and one request per iteration ("plain")."""
    from iosim.hierarchy import lsu

    out = []
    for r in lsu.compare(DATA / "ncu-sweep.json", DATA / "sweep.json"):
        kernel, part = PART[r["kernel"]]
        out.append({"kernel": kernel, "part": part, "d": r["d"], "M": r["M"], "mask": r["mask"],
                    "ld": r["measured_ld"], "ld model": r["ld"], "ld plain": r["plain_ld"],
                    "st": r["measured_st"], "st model": r["st"], "st plain": r["plain_st"]})  # fmt: skip
    return out


def sector_facts() -> dict:
    """Per kernel launch kind: launches, those whose load and store bytes both equal the model, those that equal it
    with one request per iteration and warp ("plain"), and the largest excess of a measured figure over "plain"."""
    out: dict = {}
    for r in sector_rows():
        key = r["kernel"] + ("" if r["part"] == "forward" else f" {r['part']}")
        o = out.setdefault(key, {"n": 0, "equal": 0, "plain equal": 0, "plain excess": 0.0})
        o["n"] += 1
        o["equal"] += (r["ld"], r["st"]) == (r["ld model"], r["st model"])
        o["plain equal"] += (r["ld"], r["st"]) == (r["ld plain"], r["st plain"])
        o["plain excess"] = max(o["plain excess"], *(r[op] / r[op + " plain"] - 1 for op in ("ld", "st")))
    return out


def sector_table() -> str:
    rows = [[k, o["n"], o["equal"], o["plain equal"], f"{100 * o['plain excess']:.2f} %"]
            for k, o in sector_facts().items()]  # fmt: skip
    head = ["kernel", "launches", "load and store bytes equal the model",
            "equal with one request per iteration", "largest excess over that"]  # fmt: skip
    return table(head, rows)


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
def hierarchy_rows() -> list[dict]:
    """iosim hierarchy's DRAM and L2 bytes beside Nsight Compute's, per launch of PyTorch's kernels."""
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
        out.append(
            {
                "launch": key,
                "read": p["dram_read"] * bpw,
                "read measured": m["dram__bytes_read.sum"],
                "write": p["dram_update"] * bpw,
                "write measured": m["dram__bytes_write.sum"],
                "l2": sum(a["l2_read"] + a["l2_update"] for a in p["per_array"].values()) * bpw,
                "l2 measured": 32 * (m["lts__t_sectors_op_read.sum"] + m["lts__t_sectors_op_red.sum"]),
            }
        )
    return out


def hierarchy_table() -> str:
    out = []
    for r in hierarchy_rows():
        pr, mr, pw, mw, l2p, l2m = (r[k] for k in ("read", "read measured", "write", "write measured", "l2",
                                                    "l2 measured"))  # fmt: skip
        out.append([r["launch"], f(pr / MB), f(mr / MB), f(mr / pr, ".2f"), f(pw / MB), f(mw / MB), f(mw / pw, ".2f"),
                    f(l2p / MB), f(l2m / MB), f(l2m / l2p, ".2f")])  # fmt: skip
    head = ["launch", "DRAM read MB: iosim", "measured", "ratio", "DRAM write MB: iosim", "measured", "ratio",
            "L2 read + update MB: iosim", "L2 read + reduction MB: measured", "ratio"]  # fmt: skip
    return table(head, out)


# ----------------------------------------------------------------------------------- Triton kernels, both sides
def triton_rows() -> list[dict]:
    """Per Triton launch: its label, iosim kernel's counts (fp16 only: the CPU side counted those) and ncu's row."""
    counts = load("cpu-side")["kernel counts"]
    ncu = load("ncu-triton")
    out = []
    for r in ncu["launches"]:
        lab = ncu["labels"][r["label"]]
        if "Fill" in r["kernel"]:
            continue
        if lab["what"].startswith("fla"):
            key = "fla parallel_attn causal"
        else:
            key = f"triton_flash2 {lab['Br']}x{lab['Bc']}" + (" causal" if lab["causal"] else "")
        c = counts.get(key)
        if c is None or "per_array" not in c:
            continue
        out.append({"key": key, "dtype": lab["dtype"], "ncu": r, "per_array": c["per_array"],
                    "read": sum(a["read_bytes"] for a in c["per_array"].values()),
                    "write": sum(a["write_bytes"] for a in c["per_array"].values())})  # fmt: skip
    return out


def triton_table() -> str:
    out = []
    for t in (t for t in triton_rows() if t["dtype"] == "float16"):
        r, rd, wr = t["ncu"], t["read"], t["write"]
        ld, st = r["l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum"], r["l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum"]
        out.append([t["key"], f(rd), f(ld), f(ld / rd, ".4f"), f(wr), f(st), f(st / wr, ".4f"),
                    f(32 * r["lts__t_sectors_op_read.sum"] / MB, ".1f"),
                    f(r["dram__bytes_read.sum"] / MB, ".1f")])  # fmt: skip
    head = ["kernel (fp16, N=4096, d=64, H=16)", "iosim kernel: read B", "ncu global ld B", "ratio",
            "iosim kernel: write B", "ncu global st B", "ratio", "L2 read MB", "DRAM read MB"]  # fmt: skip
    return table(head, out)


# ---------------------------------------------------------------------------------------------- speed vs SDPA
def sdpa_rows() -> list[dict]:
    """Per case and TF32 setting: SDPA's default backend and iosim's best flash2 forward configuration."""
    rows = load("sdpa")["rows"]
    out = []
    for case in sorted({tuple(r["case"]) for r in rows}, key=lambda c: c[2]):
        ours = [r for r in rows if tuple(r["case"]) == case and r["what"] == "iosim flash2" and r.get("ms")]
        best = min(ours, key=lambda r: r["ms"])
        for tf32 in (False, True):
            s = next(
                r for r in rows if tuple(r["case"]) == case and r.get("tf32") == tf32 and r["what"] == "sdpa default"
            )
            out.append({"case": case, "tf32": tf32, "sdpa": s, "best": best})
    return out


def sdpa_table() -> str:
    out = []
    for r in sdpa_rows():
        s, best = r["sdpa"], r["best"]
        kernel = (s.get("kernels") or ["?"])[0].split("(")[0]
        out.append([", ".join(map(str, r["case"])), "on" if r["tf32"] else "off", kernel, f(s["ms"], ".2f"),
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
def occupancy_rows() -> list[dict]:
    """Per (kernel, d, M) launch: the driver's blocks/SM, iosim's formula given the driver's register count, and
    the resource report's own prediction (iosim's register count from nvJitLink)."""
    from iosim.gpu import resources

    arch = resources.ARCHS[(9, 0)]
    out = []
    for r in (r for r in load("occupancy")["rows"] if "driver blocks/SM" in r):
        drv = r["driver"]
        given = resources.occupancy(arch, drv["NUM_REGS"], drv["SHARED_SIZE_BYTES"], r["dynamic smem"], 128)
        out.append({"kernel": r["kernel"], "d": r["d"], "M": r["M"], "driver": r["driver blocks/SM"],
                    "formula, driver's registers": given["blocks_per_sm"], "iosim": r["iosim"]["blocks_per_sm"],
                    "registers": (drv["NUM_REGS"], r["iosim"]["registers"]),
                    "static smem": drv["SHARED_SIZE_BYTES"]})  # fmt: skip
    return out


def occupancy_facts() -> dict:
    rows = occupancy_rows()
    miss = [r for r in rows if r["iosim"] != r["driver"]]
    return {"n": len(rows), "given": sum(r["formula, driver's registers"] == r["driver"] for r in rows),
            "own": len(rows) - len(miss), "miss by": sorted({abs(r["iosim"] - r["driver"]) for r in miss}),
            "miss kernels": sorted({r["kernel"] for r in miss})}  # fmt: skip


def occupancy_summary() -> tuple[str, str]:
    o = occupancy_facts()
    by = " or ".join(str(x) for x in o["miss by"])
    line = (
        f"{o['given']} of {o['n']} (kernel, d, M) launches: iosim's occupancy formula, given the driver's register "
        f"count, equals cuOccupancyMaxActiveBlocksPerMultiprocessor; with iosim's own register count (the resource "
        f"report) {o['own']} of {o['n']}, each miss off by {by} block{'s' if o['miss by'] != [1] else ''}"
    )
    regs = {r["kernel"]: (*r["registers"], r["static smem"]) for r in occupancy_rows()}
    tab = table(
        ["kernel", "registers: driver", "iosim gpu-resources (nvJitLink)", "static smem: driver"],
        [[k, a, b, c] for k, (a, b, c) in sorted(regs.items())],
    )
    return line, tab


# ----------------------------------------------------------------------------------- the prose's numbers
def rng(values, spec: str = ".2f") -> str:
    """'a-b' of the smallest and largest value as formatted (one value where they print the same)."""
    lo, hi = format(min(values), spec), format(max(values), spec)
    return lo if lo == hi else f"{lo}-{hi}"


def _br(r: dict) -> int:
    return int(r["tiling"].split("Br=")[1].split(",")[0])


def _pairs(rows: list[dict]) -> list[tuple[dict, dict]]:
    """(flash2, square tiling) rows at each (d, M) where both ran."""
    by: dict = {}
    for r in rows:
        by.setdefault((r["d"], r["M"]), {})[r["kernel"]] = r
    return [(p["flash2"], p["square-tiling"]) for _, p in sorted(by.items())
            if p.get("flash2", {}).get("ms") and p.get("square-tiling", {}).get("ms")]  # fmt: skip


def sweep_facts() -> dict:
    """Every number the prose says about the sweep, from sweep.json, sweep-before.json and ncu-sweep.json."""
    rows = sweep_rows()
    ran = [r for r in rows if r.get("ms")]
    pairs = _pairs(rows)
    fl = [r for r in ran if r["kernel"] == "flash2"]
    sq = [r for r in ran if r["kernel"] == "square-tiling"]
    x = {
        "N": rows[0]["N"],
        "BH": rows[0]["BH"],
        "ds": sorted({r["d"] for r in rows}),
        "M top": max(r["M"] for r in rows),
    }
    x["launches"] = len(ran)
    small = [(a, b) for a, b in pairs if a["M"] <= a["d"] ** 2 / 4]
    x["small words"] = [b["simulated words"] / a["simulated words"] for a, b in small]
    x["small square faster"] = all(b["ms"] < a["ms"] for a, b in small)
    large = [(a, b) for a, b in pairs if a["M"] > a["d"] ** 2]
    x["large flash2 both"] = all(a["simulated words"] < b["simulated words"] and a["ms"] < b["ms"] for a, b in large)
    x["large"] = len(large)
    x["agree"] = sum((a["simulated words"] < b["simulated words"]) == (a["ms"] < b["ms"]) for a, b in pairs)
    x["pairs"] = len(pairs)
    x["disagree"] = [(a["d"], a["M"], *_faster(a, b)) for a, b in pairs
                     if (a["simulated words"] < b["simulated words"]) != (a["ms"] < b["ms"])]  # fmt: skip
    x.update(_before_facts(load("sweep-before")["rows"]))
    x["dram %"] = 100 * max(dram_rate(r) for r in ran) / HBM_BYTES_PER_S
    x["flop %"] = 100 * max(flop_rate(r) for r in ran) / FP32_FLOP_PER_S
    x["GB/s"], x["TFLOP/s"] = max(dram_rate(r) for r in ran) / 1e9, max(flop_rate(r) for r in ran) / 1e12
    x["lsu"] = {
        br: [_lsu(r["ncu"]) / (4 * r["simulated words"]) for r in fl if pick(_br(r))]
        for br, pick in (("7+", lambda b: b >= 7), ("3", lambda b: b == 3), ("1", lambda b: b == 1))
    }
    x["lsu square"] = [_lsu(r["ncu"]) / (4 * r["simulated words"]) for r in sq]
    x["l2"] = [_l2(r["ncu"]) / (4 * r["simulated words"]) for r in fl]
    x["l2 square"] = [_l2(r["ncu"]) / (4 * r["simulated words"]) for r in sq]
    x.update(_dram_facts(fl, sq))
    top = [r for r in fl if r["M"] == x["M top"]]
    x["ctas top"] = {r["d"]: _ctas(r["ncu launches"][0]["grid"]) for r in top}
    return x


def _ctas(grid: str) -> int:
    """Thread blocks of a launch from ncu's "(x, y, z)" grid size."""
    x, y, z = (int(v) for v in grid.strip("()").split(","))
    return x * y * z


def _faster(a: dict, b: dict) -> tuple[str, float]:
    """The faster kernel of a pair and its words over the other's."""
    fast, slow = (a, b) if a["ms"] < b["ms"] else (b, a)
    return fast["kernel"], fast["simulated words"] / slow["simulated words"]


def _before_facts(before: list[dict]) -> dict:
    """Above d², within the scalar build's own run (sweep-before.json): the pairs where square tiling was faster."""
    pairs = [(a, b) for a, b in _pairs(before) if a["M"] > a["d"] ** 2]
    slower = [(a["d"], a["M"], 100 * (a["ms"] / b["ms"] - 1)) for a, b in pairs if a["ms"] >= b["ms"]]
    return {"before large": len(pairs), "before square faster": slower}


def compulsory(r: dict) -> int:
    """Bytes of Q, K, V, O (N x d each) and L (N) over B·H, float32: each read or written once."""
    return 4 * r["BH"] * r["N"] * (4 * r["d"] + 1)


def _dram_facts(fl: list[dict], sq: list[dict]) -> dict:
    tiled = [r for r in fl if _br(r) >= 7]
    over = [
        (r["d"], r["M"], _dram(r["ncu"]) / MB, compulsory(r) / MB) for r in tiled if _dram(r["ncu"]) > compulsory(r)
    ]
    return {
        "dram/compulsory": [_dram(r["ncu"]) / compulsory(r) for r in tiled],
        "compulsory MB": [compulsory(r) / MB for r in tiled],
        "over compulsory": over,
        "square dram MB": [_dram(r["ncu"]) / MB for r in sq],
        "S MB": 4 * sq[0]["BH"] * sq[0]["N"] ** 2 / MB,
    }


def registers_facts() -> dict:
    """flash2's forward as the driver built it: registers per thread and the blocks (of 4 warps) per SM."""
    rows = [r for r in occupancy_rows() if r["kernel"] == "flash2_forward_kernel"]
    return {"registers": rows[0]["registers"][0], "blocks": sorted({r["driver"] for r in rows})}


def triton_facts() -> dict:
    rows = triton_rows()
    fla = next(t for t in rows if t["dtype"] == "float16" and t["key"].startswith("fla"))
    L = fla["per_array"]["L"]["write_bytes"]
    extra = fla["ncu"]["l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum"] - fla["write"]
    warps = int(fla["ncu"]["block"].strip("()").split(",")[0]) // 32
    fp16 = {t["key"]: t for t in rows if t["dtype"] == "float16"}
    f32 = [(t, fp16[t["key"]]) for t in rows if t["dtype"] == "float32" and t["key"] in fp16]
    ld = [t["ncu"]["l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum"] / (2 * h["read"]) for t, h in f32]
    l2 = [32 * t["ncu"]["lts__t_sectors_op_read.sum"] / (2 * h["read"]) for t, h in f32]
    return {"extra": extra, "L": L, "copies": extra / L, "warps": warps, "f32 ld": ld, "f32 l2": l2}


def hierarchy_facts() -> dict:
    h = {r["launch"]: r for r in hierarchy_rows()}
    l2 = {k: r["l2 measured"] / r["l2"] for k, r in h.items()}
    plain = ("forward", "backward")
    return {"l2 plain": [abs(l2[k] - 1) for k in plain], "l2 causal": [abs(l2[k] - 1) for k in l2 if "causal" in k],
            "dram plain": [h[k][m] / h[k][p] for k in plain for m, p in (("read measured", "read"),
                                                                         ("write measured", "write"))],
            "causal fwd read": h["forward causal"]["read measured"] / h["forward causal"]["read"],
            "decode read": h["decode GQA"]["read measured"] / h["decode GQA"]["read"],
            "decode MB": h["decode GQA"]["read measured"] / MB}  # fmt: skip


def sdpa_facts() -> dict:
    rows = sdpa_rows()
    ab = load("ab")["rows"]
    sweep = {(r["kernel"], r["d"], r["M"]): r for r in load("sweep")["rows"]}
    before = load("sweep-before")["rows"]
    br1 = [sweep[("flash2", r["d"], r["M"])]["ms"] / r["ms"] for r in before
           if r["kernel"] == "flash2" and r.get("ms") and "Br=1," in r["tiling"]]  # fmt: skip
    return {
        "sdpa TFLOP/s": [r["sdpa"]["TFLOP/s"] for r in rows],
        "sdpa %": [100e12 * r["sdpa"]["TFLOP/s"] / FP32_FLOP_PER_S for r in rows],
        "ours %": [100e12 * r["best"]["TFLOP/s"] / FP32_FLOP_PER_S for r in rows],
        "tf32 same error": all(len({x["sdpa"]["rel err"] for x in rows if x["case"] == r["case"]}) == 1 for r in rows),
        "rel err": [r["sdpa"]["rel err"] for r in rows],
        "slower": {r["case"][3]: r["best"]["ms"] / r["sdpa"]["ms"] for r in rows if not r["tf32"]},
        "ab fast": [r["before / after"] for r in ab if int(r["tiling"].split("Br=")[1].split(",")[0]) >= 52],
        "ab Br15": [r["before / after"] for r in ab if "Br=15," in r["tiling"]],
        "br1": br1,
    }


def _versions(short: bool = False) -> str:
    env = load("env")
    driver = env["nvidia-smi"].split("Driver Version:")[1].split()[0]
    ncu = env["ncu --version"].strip().splitlines()[-1]
    if short:
        return (f"driver {driver}, CUDA {env['torch.version.cuda']}, numba-cuda {env['numba_cuda']}, PyTorch "
                f"{env['torch'].split('+')[0]}, Triton {env['triton']}, Nsight Compute {ncu.split()[1]}")  # fmt: skip
    return (
        f"{env['torch device']}, driver {driver}, CUDA {env['torch.version.cuda']}, numba-cuda {env['numba_cuda']}, "
        f"numba {env['numba']}, numpy {env['numpy']}, torch {env['torch']}, triton {env['triton']}, fla-core "
        f"{env['fla']}, {ncu}"
    )


def wrap(paragraph: str) -> str:
    """A paragraph or bullet wrapped at 116 characters, as the docs are written (a bullet's lines indented by 2)."""
    import textwrap

    indent = "  " if paragraph.startswith("- ") else ""
    return textwrap.fill(paragraph, 116, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)


def _times(n: int) -> str:
    return {0: "never", 1: "once", 2: "twice"}.get(n, f"{n} times")


def _pct(x: float) -> str:
    return f"{abs(x) * 100:.0f} %"


def prose_sweep(x: dict) -> list[str]:
    ds = ", ".join(map(str, x["ds"]))
    dis = "; ".join(f"d = {d}, M = {M:,}, where {k} is faster while moving {w:.2f} times the words"
                    for d, M, k, w in x["disagree"])  # fmt: skip
    bef = "; ".join(f"d = {d}, M = {M:,}, flash2 {p:.1f} % slower" for d, M, p in x["before square faster"])
    reg = registers_facts()
    env = load("env")
    sm_smem, sms = env["MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"], env["MULTIPROCESSOR_COUNT"]
    return [
        f"- **The kernels run the simulated schedules on hardware.** In all {x['launches']} launches of the sweep "
        f"(N = {x['N']:,}, B·H = {x['BH']}, d = {ds}, M from d²/16 to {x['M top']:,} words) the kernels' own "
        "counters equal the simulator's reads and writes, array by array. The lease's pytest output was not stored, "
        "so its counts are not repeated here (the plan now stores it, as `tests.txt` in `raw/`); the logsumexp "
        "accuracy "
        "failure at N = 1536, d = 2 reported from that lease stays open.",
        "- **Fewer words and less time go together below d²; the data do not show that the words set the time.** "
        f"At M ≤ d²/4 square tiling moves {rng(x['small words'])} of flash2's words and "
        + ("takes less time at every d" if x["small square faster"] else "is not always faster")
        + "; above d² flash2 moves fewer words and "
        + ("is faster in all " if x["large flash2 both"] else "is not always faster in the ")
        + f"{x['large']} pairs of the same run. Over all {x['pairs']} (d, M) pairs the kernel that moves fewer words "
        f"is the faster one {x['agree']} times; not at {dis}. (In the scalar build's own run, above d², square "
        f"tiling was faster in {len(x['before square faster'])} of {x['before large']} pairs: {bef or 'none'}.) "
        f"But no launch of the sweep uses more than {x['dram %']:.1f} % of the H100's HBM bandwidth "
        f"({x['GB/s']:.0f} GB/s at most, of 3.35 TB/s) or {x['flop %']:.1f} % of its FP32 peak "
        f"({x['TFLOP/s']:.2f} TFLOP/s at most, of 67): neither the memory nor the arithmetic bounds these times, so "
        "the sweep cannot test whether fewer words cause less time. What else sets them the data do not isolate; "
        f"the driver built flash2's forward with {reg['registers']} registers per thread, which leaves room for "
        f"at most {max(reg['blocks'])} blocks of 4 warps ({4 * max(reg['blocks'])} warps) per SM; at the largest "
        f"M a block's {4 * x['M top']:,} bytes of shared memory leave room for {sm_smem // (4 * x['M top'])} per SM "
        f"(of {sm_smem:,} bytes), and flash2's launches there are "
        + ", ".join(f"{n} blocks (d = {d}: {n / sms:.2f} waves)" for d, n in sorted(x["ctas top"].items()))
        + f" on the {sms} SMs.",
    ]


def prose_traffic(x: dict) -> list[str]:
    sec = sector_facts()
    sq = [o for k, o in sec.items() if k.startswith("square-tiling")]
    n, equal = sum(o["n"] for o in sec.values()), sum(o["equal"] for o in sec.values())
    sq_n, sq_plain = sum(o["n"] for o in sq), sum(o["plain equal"] for o in sq)
    warps = load("sweep")["threads"] // 32
    over = "; ".join(f"{mb:.1f} against {c:.1f} MB at d = {d}, M = {M:,}" for d, M, mb, c in x["over compulsory"])
    lsu = x["lsu"]
    return [
        "- **The explicit count predicts the words the SMs ask for, not L2 or DRAM traffic.** The global load/store "
        f"bytes (the LSU's) are {rng(lsu['7+'])} of the counted bytes for flash2 once Br ≥ 7, {rng(lsu['3'])} at "
        f"Br = 3 and {rng(lsu['1'])} at Br = 1, and {rng(x['lsu square'])} for square tiling: LSU bytes near the count "
        "hold for flash2 at Br ≥ 7 only. The LSU level of `iosim.hierarchy.lsu` accounts for the rest (the "
        "mechanism and the parameters it cites: [the LSU level](hierarchy-hardware.md#the-lsu-level-32-byte-sectors-"
        "per-warp-request); table below): its replay of the kernels' tile copies, 32-byte sectors per warp request, "
        f"gives the measured load and store bytes exactly in {equal} of {n} kernel launches ({sec['flash2']['equal']} "
        f"of {sec['flash2']['n']} flash2, {sum(o['equal'] for o in sq)} of {sq_n} square tiling). flash2's excess "
        f"over the count is its block mask (all ones here), read twice per tile pair (i, j) by each of a block's "
        f"{warps} warps, {2 * 32 * warps} bytes per pair and head, which the count leaves out as it is not one of "
        "attention's arrays. Square tiling's is sector rounding (tile rows of B words whose start or width is not a "
        "multiple of 8 words) and its copy loops, which the PTX unrolls four times: where a tile's last iteration is "
        "partial inside a warp, one iteration can become two requests that count a shared sector twice. With one "
        f"request per iteration the model equals {sq_plain} of the {sq_n} square tiling launches and falls short of "
        f"the rest by up to {100 * max(o['plain excess'] for o in sq):.2f} %: that gap is the unrolled loops' split. "
        "L2 traffic is "
        f"{rng(x['l2'])} of flash2's count (the L1 serves the rest of the requests) and {rng(x['l2 square'])} of "
        f"square tiling's. DRAM traffic is far below both: from Br = 7 up, flash2's is "
        f"{rng(x['dram/compulsory'])} of its compulsory Q, K, V, O, L bytes ({rng(x['compulsory MB'], '.0f')} MB), "
        f"above them {_times(len(x['over compulsory']))} ({over}); "
        f"square tiling's N × N scores ({x['S MB']:.0f} MB, more than the 50 MB L2) go to DRAM and back "
        f"({rng(x['square dram MB'], ',.0f')} MB).",
    ]


def prose_hierarchy(h: dict) -> list[str]:
    return [
        "- **The hierarchy against FlashAttention-2.** PyTorch's SDPA ran FlashAttention-2's own kernels "
        "(`flash_fwd_kernel` with Br = 128, Bc = 64; the backward with Br = 64, Bc = 128, its dot(dO, O) and dQ "
        "conversion kernels). `iosim hierarchy` predicts the L2 traffic of these launches to within "
        f"{_pct(max(h['l2 plain']))} (forward, backward) and {rng([100 * v for v in h['l2 causal']], '.0f')} % "
        "(causal). Its DRAM prediction is the compulsory traffic, and the hardware moved "
        f"{rng(h['dram plain'])} times it without a mask, and {h['causal fwd read']:.1f} times the reads for the "
        "causal forward, which the model does not capture (the order in which FlashAttention-2 walks a causal row "
        "block's column blocks is a candidate; the registered predictions measure ascending against descending "
        "walks). For GQA decoding (cuDNN's kernel, B = 4, 32 query heads on 8 KV heads, N_k = 32,768) the "
        f"prediction is within {100 * abs(h['decode read'] - 1):.1f} % of the {h['decode MB']:.0f} MB read.",
    ]


def prose_triton(t: dict) -> list[str]:
    return [
        "- **A Triton kernel, both sides.** For iosim's Triton flash2 example and fla-core's `parallel_attn_fwd` "
        "(fp16, N = 4096, d = 64, 16 heads, the block sizes they ran on the H100), `iosim kernel`'s byte counts on "
        "the CPU equal the hardware's global load bytes exactly, and its store bytes for iosim's kernel (table "
        f"below); fla's stores are {t['extra']:,.0f} bytes more, {t['copies']:.0f} extra copies of its "
        f"{t['L']:,}-byte logsumexp ({t['copies'] + 1:.0f} in all, as many as the kernel's {t['warps']} warps). In "
        f"float32 the same kernels load {rng(t['f32 ld'], '.2f')} times the bytes of the fp16 count at 4 bytes a "
        f"word (their L2 reads {rng(t['f32 l2'])} of it); float32 was not counted on the CPU.",
    ]


def prose_speed(sp: dict) -> list[str]:
    err = " and ".join(sorted({format(e, ".1e") for e in sp["rel err"]}))
    return [
        "- **Speed.** numba-cuda has no tensor-core intrinsics; SDPA's float32 path ran CUTLASS's memory-efficient "
        f"kernel (`fmha_cutlassF_f32`) at {rng(sp['sdpa TFLOP/s'], '.0f')} TFLOP/s ({rng(sp['sdpa %'], '.0f')} % of "
        "the FP32 peak), "
        + (
            "the same with TF32 on (relative error " + err + " at the two sizes, TF32 on or off)"
            if sp["tf32 same error"]
            else "with TF32 on or off"
        )
        + f". The best flash2 forward configuration here is {sp['slower'][64]:.1f} times slower at d = 64 and "
        f"{sp['slower'][128]:.1f} times at d = 128 ({rng(sp['ours %'], '.1f')} % of the FP32 peak): not the 2 "
        "times the kernels aim at. Register tiles (2 × 8 outputs per thread, Q_i, S_ij and O_i transposed on chip "
        f"so that a warp reads 32 consecutive words) made it {rng(sp['ab fast'])} times faster at Br ≥ 52 in one "
        f"process (the A/B table) and slower at small tiles ({rng(sp['ab Br15'])} at Br = 15); at Br = 1 the two "
        f"sweeps, separate runs, differ by {rng(sp['br1'], '.1f')} times.",
    ]


def prose() -> str:
    """The bullets of docs/gpu.md's "Measured on an H100", every number computed from the stored files."""
    clocks = [r["sm__cycles_elapsed.avg.per_second"] for r in load("ncu-sweep")["launches"]]
    peaks = (
        "The H100's peaks used below are the H100 SXM datasheet's (NVIDIA H100 Tensor Core GPU datasheet: "
        f"{HBM_BYTES_PER_S / 1e12:.2f} TB/s of HBM3 bandwidth, {FP32_FLOP_PER_S / 1e12:.0f} TFLOP/s FP32); the SM "
        f"clock Nsight Compute measured in the sweep's launches, {rng([c / 1e9 for c in clocks])} GHz, gives "
        f"{rng([132 * 128 * 2 * c / 1e12 for c in clocks], '.1f')} TFLOP/s (132 SMs × 128 FP32 lanes × 2 flops "
        "per cycle)."
    )
    x = sweep_facts()
    lines = prose_sweep(x) + prose_traffic(x) + prose_hierarchy(hierarchy_facts()) + prose_triton(triton_facts())
    lines += prose_speed(sdpa_facts())
    lines.append(
        "- **Not measured yet**: the backward in the M sweep (square tiling has no backward kernel), whether "
        f"M = 58,112 words launches (the sweep stopped at {x['M top']:,}), and the traffic per array (Nsight "
        "Compute's metrics are per kernel); the plan's parts `sweep-backward` and `m-top` measure the first two."
    )
    return "\n".join([wrap(peaks), "", "What the hardware said:", "", *(wrap(line) for line in lines)])


def readme_section() -> str:
    """The README's "Measured on a GPU" text (between its markers), every number from the stored files."""
    x, h, sp = sweep_facts(), hierarchy_facts(), sdpa_facts()
    sec = sector_facts().values()
    lsu_n, lsu_equal = sum(o["n"] for o in sec), sum(o["equal"] for o in sec)
    intro = (
        f"On one H100 ({_versions(short=True)}), `bash experiments/bench/gpu_evidence.sh` (on a GPU machine) "
        "ran iosim's numba.cuda kernels with shared memory limited to M words per block. In all "
        f"{x['launches']} launches the kernels' own counters equalled the simulator's, array by array. At "
        f'd = 128 (N = {x["N"]:,}, B·H = {x["BH"]}, float32; "LSU" is the global load/store bytes Nsight '
        "Compute counted; DRAM GB/s is the profiled launch's DRAM bytes over its own time):"
    )
    words = (
        "At M ≤ d²/4 square tiling moves fewer words and is faster, at every d tried; above d² flash2 does "
        f"both. But no launch uses more than {x['dram %']:.1f} % of the HBM bandwidth or {x['flop %']:.1f} % "
        "of the FP32 peak, so these times do not test whether fewer words cause less time. The count predicts "
        f"the bytes the SMs request for flash2 once Br ≥ 7 (LSU {rng(x['lsu']['7+'])} of the count; up to "
        f"{max(x['lsu square']):.2f} for square tiling), not L2 or DRAM traffic; the LSU level of "
        f"`iosim.hierarchy.lsu` gives the measured load and store bytes of {lsu_equal} of the {lsu_n} kernel "
        "launches exactly, flash2's and square tiling's: flash2's block-mask reads, square tiling's sector rounding "
        "and copy loops unrolled four times ([the LSU level](docs/hierarchy-hardware.md#the-lsu-level-32-byte-"
        "sectors-per-warp-request))."
    )
    rest = (
        "`iosim hierarchy` predicts the L2 traffic of PyTorch's FlashAttention-2 kernels within "
        f"{_pct(max(h['l2 plain']))} ({rng([100 * v for v in h['l2 causal']], '.0f')} % causal); the "
        f"hardware's DRAM traffic is {rng(h['dram plain'], '.1f')} times its prediction without a mask and "
        f"{h['causal fwd read']:.0f} times the reads for the causal forward. iosim's float32 flash2 forward is "
        f"{sp['slower'][64]:.0f}-{sp['slower'][128]:.0f} times slower than PyTorch's float32 SDPA. All tables, "
        "the Triton kernels counted on the CPU against the same kernels on the GPU, and what remains: [Measured "
        "on an H100](docs/gpu.md#measured-on-an-h100), printed by `python "
        "experiments/bench/gpu_evidence_report.py` from `experiments/bench/gpu_h100/`."
    )
    return "\n".join([wrap(intro), "", sweep_table(128), "", wrap(words + " " + rest), *h200_readme()])


def h200_readme() -> list[str]:
    """The README's line on the H200 lease (where its files are stored)."""
    if not (H200 / "env.json").exists():
        return []
    with stored(H200):
        px = prediction_facts()
    return [
        "",
        wrap(
            f"On an H200 (same SMs, a {px['l2'] / 2**20:.0f} MiB L2 by the driver), the predictions registered for the "
            f"H100 before that lease, measured unchanged: {px['hits']} of {px['n']} levels within {HIT * 100:.0f} %, "
            f"{px['exact']} of them to the byte; the largest misses: "
            + ", ".join(f"{c['id']} {c['level']} ({c['ratio']:.2f})" for c in px["worst"])
            + ": [Measured on an H200](docs/gpu.md#measured-on-an-h200-2026-11-28)."
        ),
    ]


# ------------------------------------------------------------------------- the next lease's parts (where stored)
def has(name: str) -> bool:
    """Whether the part ``name`` is stored (``predictions.entries``: the entries a lease measured, under raw/); a
    profiled part whose ncu was stopped before it printed (no launch in its CSV) is not."""
    if not any((DATA / x).exists() for x in (f"{name}.json", f"raw/{name}.csv", f"raw/{name}.json")):
        return (DATA / "raw" / f"{name}.log").exists() and bool(load(name)["rows"])
    if name.startswith("ncu-") or name == "predictions":
        return bool(load(name).get("launches"))
    return True


@contextlib.contextmanager
def stored(folder: pathlib.Path):
    """The report's functions read ``folder`` (another lease's measurements) inside the block."""
    global DATA
    old, DATA = DATA, folder
    try:
        yield
    finally:
        DATA = old


def measured_predictions() -> tuple[list[dict], dict]:
    """(the entries a lease measured: its copy in raw/predictions.entries.json, {id: ncu's metrics summed over the
    launch's kernels, PyTorch's own copies left out})."""
    import gpu_predictions

    entries = json.loads((DATA / "raw" / "predictions.entries.json").read_text())
    return entries, {r["id"]: r for r in per_label(load("predictions"), keep=gpu_predictions.measured_kernel)}


def predictions_table() -> str:
    """Each registered prediction against its measurement, as measured: the entries the lease ran (its copy in
    raw/predictions.entries.json), ncu's bytes per level summed over the launch's kernels, nothing refitted."""
    import gpu_predictions

    entries, rows = measured_predictions()
    out = []
    for c in gpu_predictions.compare(entries, rows):
        m = c["measured"]
        shown = "not measured" if m is None else f(m / MB, ",.1f")
        n = len(rows[c["id"]]["kernels"]) if c["id"] in rows else 0
        out.append([c["id"], c["level"], f(c["predicted"] / MB, ",.1f"), shown, f(c["ratio"], ".2f"), n])
    head = ["prediction", "level", "predicted MB", "measured MB", "measured / predicted", "kernels summed"]
    return table(head, out)


def sweep_backward_table() -> str:
    out = []
    for r in load("sweep-backward")["rows"]:
        eq = r.get("counters equal simulator")
        out.append([r["d"], f(r["M"]), r.get("tiling", "-").replace("rule=fit, ", ""), f(r.get("ms"), ".1f"),
                    "-" if eq is None else ("yes" if eq else "no"), f(r.get("TFLOP/s"), ".2f"),
                    r.get("error", "")[:80]])  # fmt: skip
    return table(["d", "M", "tiles", "ms", "counters = simulator", "TFLOP/s", "error"], out)


def m_top_table() -> str:
    out = [[r["kernel"], r["d"], f(r["M"]), "no" if r.get("error") else "yes", f(r.get("ms"), ".1f"),
            (r.get("error") or "")[:100]] for r in load("m-top")["rows"]]  # fmt: skip
    return table(["kernel", "d", "M", "launched", "ms", "error"], out)


def fa2_table() -> str:
    """FlashAttention-2's L2 reads split by source: SM requests (srcunit tex) and partition-crossing traffic."""
    out = []
    levels = ("lts__t_sectors_op_read.sum", "lts__t_sectors_srcunit_tex_op_read.sum",
              "lts__t_sectors_srcunit_ltcfabric_op_read.sum", "lts__t_sectors_srcunit_tex_op_write.sum",
              "lts__t_sectors_srcunit_ltcfabric_op_write.sum")  # fmt: skip
    for r in per_label(load("ncu-fa2"), keep=lambda k: "at::" not in k):
        cells = ["-" if m not in r else f(32 * r[m] / MB) for m in levels]
        out.append([r["what"] + (" causal" if r.get("causal") else ""), *cells])
    head = ["launch", "L2 read MB", "from SMs", "from the other partition", "L2 write MB from SMs", "from the other"]
    ncu = load("ncu-fa2")
    regs = []
    for r in (r for r in ncu["launches"] if "at::" not in r["kernel"]):
        regs.append(
            [
                ncu["labels"][r["label"]]["what"],
                r["kernel"].split("<")[0][:60],
                f(r.get("launch__registers_per_thread")),
                f(r.get("launch__occupancy_limit_registers")),
            ]
        )
    return table(head, out) + "\n\n" + table(["launch", "kernel", "registers/thread", "blocks/SM (registers)"], regs)


NEXT = (  # (stored part, heading, table)
    ("predictions.entries", "### The registered predictions, measured", predictions_table),
    ("ncu-fa2", "### FlashAttention-2's L2 traffic by source", fa2_table),
    ("sweep-backward", "### The flash2 backward over M", sweep_backward_table),
    ("m-top", "### Whether the whole opt-in shared memory launches", m_top_table),
)


def absent_line() -> str:
    """The metrics each stored profiled part asked for that no launch of it reports (and the reason where the
    part's file records one: repacked files from raw/ do, the first lease's do not)."""
    out = []
    for name in (n for n in ("ncu-sweep", "ncu-torch", "ncu-triton", "ncu-fa2", "predictions") if has(n)):
        data = load(name)
        absent = data.get("absent metrics") or {
            m: ["no reason recorded"]
            for m in data.get("metrics", [])
            if not any(m in r for r in data.get("launches", []))
        }
        out += [f"{m} in {name} ({'; '.join(why)})" for m, why in absent.items()]
    return "Requested but reported by no launch: " + (", ".join(out) if out else "none")


def _sweep_section() -> list[str]:
    model = "Global load and store bytes (Nsight Compute's LSU) against the LSU level of `iosim.hierarchy.lsu` "
    model += "(32-byte sectors per warp request, copy loops unrolled four times as in the PTX; per launch: "
    model += "`python -m iosim.hierarchy.lsu --table`; the mechanism: "
    model += "[the LSU level](hierarchy-hardware.md#the-lsu-level-32-byte-sectors-per-warp-request)):"
    return [counters_line() + ".", "", sweep_table(), "", model, "", sector_table()]


def _occupancy_section() -> list[str]:
    line, tab = occupancy_summary()
    return [line + ".", "", tab]


SECTIONS = (  # (heading, the parts it reads, its lines); a section whose files are not stored is left out
    ("### flash2 against square tiling as M shrinks (N = 2048, B·H = 8, float32)", ("sweep", "ncu-sweep"),
     _sweep_section),
    ("### iosim hierarchy against Nsight Compute (PyTorch SDPA's FlashAttention-2 and cuDNN, on the H100)",
     ("cpu-side", "ncu-torch"), lambda: [hierarchy_table()]),
    ("### A Triton kernel counted on the CPU and measured on the GPU", ("cpu-side", "ncu-triton"),
     lambda: [triton_table()]),
    ("### flash2 forward against SDPA (float32)", ("sdpa",), lambda: [sdpa_table()]),
    ("### The register-tiled flash2 forward against the one it replaced (same inputs, same process)", ("ab",),
     lambda: [ab_table()]),
    ("### The driver's figures against the resource report", ("occupancy",), _occupancy_section),
)  # fmt: skip


def report() -> str:
    """Every table, from the files stored in DATA (a section whose files are absent is left out)."""
    parts = [f"Measured on: {_versions()}.", "", absent_line() + "."]
    for heading, needs, make in SECTIONS:
        if all(has(n) for n in needs):
            parts += ["", heading, "", *make()]
    for name, heading, make in NEXT:
        if has(name):
            parts += ["", heading, "", make()]
    return "\n".join(parts) + "\n"


# ------------------------------------------------------------------------------------------ the H200 lease
HIT = 0.10  # a prediction is a hit where the measurement is within 10 % of it (the same line for every level)


def prediction_facts() -> dict:
    """The registered predictions as they fell: hits and misses per level, the L2 size the driver reported."""
    import gpu_predictions

    entries, rows = measured_predictions()
    cmp = [c for c in gpu_predictions.compare(entries, rows) if c["ratio"] is not None]
    hit = [c for c in cmp if abs(c["ratio"] - 1) <= HIT]
    by_level = {}
    for c in cmp:
        by_level.setdefault(c["level"], []).append(c)
    return {"n": len(cmp), "hits": len(hit), "by level": by_level, "registered for": _registered_for(entries),
            "l2": load("env")["L2_CACHE_SIZE"], "misses": [c for c in cmp if abs(c["ratio"] - 1) > HIT],
            "exact": sum(c["measured"] == c["predicted"] for c in cmp),
            "worst": sorted(cmp, key=lambda c: -abs(math.log(c["ratio"])))[:3]}  # fmt: skip


def _registered_for(entries: list[dict]) -> str:
    """The device of the predictions file whose entries this lease ran (``entries``, its copy of them, matched by
    ids: the lease's command names the file, the copy does not)."""
    ran = {e["id"] for e in entries}
    for path in sorted((HERE / "predictions").glob("*.json")):
        doc = json.loads(path.read_text())
        if isinstance(doc, dict) and {e["id"] for e in doc.get("entries", [])} == ran:
            return doc["device"]
    return "?"


def _h100_l2() -> int:
    from iosim.hierarchy.devices import device

    return device("H100").l2_bytes


def _level_line(level: str, cs: list[dict]) -> str:
    n = sum(abs(c["ratio"] - 1) <= HIT for c in cs)
    return f"{level} {n} of {len(cs)} ({rng([c['ratio'] for c in cs])})"


def h200_prose() -> str:
    """What the H200 lease measured, every number from the stored files."""
    px = prediction_facts()
    sp = sdpa_rows()
    slower = {r["case"][3]: r["best"]["ms"] / r["sdpa"]["ms"] for r in sp if not r["tf32"]}
    ours = [100e12 * r["best"]["TFLOP/s"] / FP32_FLOP_PER_S for r in sp if not r["tf32"]]
    theirs = [100e12 * r["sdpa"]["TFLOP/s"] / FP32_FLOP_PER_S for r in sp if not r["tf32"]]
    bwd = load("sweep-backward")["rows"]
    ran = [r for r in bwd if r.get("ms")]
    eq = [r for r in ran if r.get("counters equal simulator")]
    lines = [
        f"- **The registered predictions** (experiments/bench/predictions/h100.json, registered for the "
        f"{px['registered for']} with the H100 preset's L2 of {_h100_l2() // 1024:,} KB) measured unchanged on "
        "this device, whose driver reports an "
        f"L2 of {px['l2']:,} bytes: {px['hits']} of {px['n']} predicted levels within {HIT * 100:.0f} % of the "
        "measurement. Per level: " + "; ".join(_level_line(k, v) for k, v in px["by level"].items()) + ". The "
        "misses are listed in the first table; nothing is refitted.",
        f"- **Speed.** iosim's best float32 flash2 forward is {slower[64]:.1f} times slower than SDPA's float32 "
        f"kernel at d = 64 and {slower[128]:.1f} times at d = 128, as on the H100 ({rng(ours, '.1f')} % of the "
        f"FP32 peak of {FP32_FLOP_PER_S / 1e12:.0f} TFLOP/s, which the H200's datasheet gives as the H100's, "
        f"against SDPA's {rng(theirs, '.0f')} %).",
        f"- **The backward over M** (float32, N = 2,048, B·H = 8): {len(ran)} launches ran, {len(eq)} of them "
        f"with counters equal to the simulator's; the other {len(bwd) - len(ran)} (the smallest M/d², the slowest) "
        "were not reached in the part's time.",
    ]
    return "\n".join(wrap(line) for line in lines)


def variants_table() -> str:
    """The register-tiled flash2 forward variants against SDPA float32, as the lease timed them."""
    out = []
    for r in load("variants")["rows"]:
        out.append([", ".join(map(str, r["case"])), r["variant"], f"{r.get('Br')}, {r.get('Bc')}", f(r.get("M")),
                    r.get("registers", "-"), r.get("blocks/SM", "-"), f(r.get("ms"), ".2f"), f(r.get("sdpa ms"), ".2f"),
                    f(r.get("ms/SDPA ms"), ".2f"), f(r.get("TFLOP/s"), ".1f"), f(r.get("rel err vs SDPA"), ".1e"),
                    "yes" if r.get("counters equal") else "no"])  # fmt: skip
    head = ["B, H, N, d", "variant", "Br, Bc", "M", "registers", "blocks/SM", "ms", "SDPA ms", "/ SDPA", "TFLOP/s",
            "rel err", "counters = simulator"]  # fmt: skip
    return table(head, out)


def alternatives_table() -> str:
    """Each registered alternative of the predictions file, measured / predicted per level (the primary first)."""
    import gpu_predictions

    entries, rows = measured_predictions()
    levels = ("dram_read", "dram_write", "l2_read_from_fabric")
    out = []
    for e in entries:
        got = gpu_predictions.measured(rows[e["id"]]) if e["id"] in rows else {}
        for name, pred in (("registered", e["predicted"]), *(e.get("alternatives") or {}).items()):
            cells = [f(got[lv] / pred[lv], ".2f") if got.get(lv) and pred.get(lv) else "-" for lv in levels]
            out.append([e["id"], name, *cells])
    return table(["prediction", "model", *(f"{lv}: measured / predicted" for lv in levels)], out)


def tests_line() -> str:
    """pytest's summary line on the device and its failures (raw/tests.txt as it came)."""
    text = (DATA / "raw" / "tests.txt").read_text(errors="replace").splitlines()
    summary = next((x.strip("= ") for x in reversed(text) if " passed" in x), "no summary (stopped)")
    rows = [" ".join(x.split()[1:10]) for x in text if x.startswith("E ") and " FAIL " in x]
    return summary + ("; failing outputs: " + "; ".join(rows) if rows else "")


def h200_2_prose() -> str:
    """What the second H200 lease measured, every number from the stored files."""
    px = prediction_facts()
    v = [r for r in load("variants")["rows"] if r.get("ms")]
    best = {}
    for r in v:
        d = r["case"][3]
        if d not in best or r["ms"] < best[d]["ms"]:
            best[d] = r
    speed = "; ".join(
        f"d = {d}: {r['variant']} at {r['ms/SDPA ms']:.2f} times SDPA's time ({r['ms']:.2f} against "
        f"{r['sdpa ms']:.2f} ms, {r['TFLOP/s']:.1f} TFLOP/s)"
        for d, r in sorted(best.items())
    )
    eq = sum(bool(r.get("counters equal")) for r in v)
    lines = [
        f"- **Kernels within 2 times SDPA's float32 time.** The register-tiled flash2 forward "
        f"(algorithms/cuda/flash_fast.py, the fit rule's tiles, the same loads and stores): {speed}. The counters "
        f"equal the simulator's in {eq} of {len(v)} timed launches; the outputs' relative error against SDPA is "
        f"{rng([r['rel err vs SDPA'] for r in v], '.1e')}.",
        f"- **The H200 predictions** (experiments/bench/predictions/h200.json, committed before this lease): "
        f"{px['hits']} of {px['n']} predicted levels within {HIT * 100:.0f} %, {px['exact']} to the byte. Per "
        "level: " + "; ".join(_level_line(k, vs) for k, vs in px["by level"].items()) + ". The level "
        "l1_reduction was not measured: the part asked ncu for the metrics of the default file (h100.json, which "
        "has no such level); it now asks for those of the file it measures. The second table gives each "
        "registered alternative beside the model as built.",
        f"- **pytest on the device** (tests/test_cuda.py, tests/test_cuda_fast.py): {tests_line()}.",
        "- **FlashAttention-2's registers** were not measured: the profiled child's budget left it 2 s, spent "
        "importing PyTorch (ncu-fa2's stderr); the plan's child budget is now at least three quarters of the part's.",
    ]
    return "\n".join(wrap(line) for line in lines)


H200_2_TABLES = (  # (stored part, heading, table) of the second lease
    ("variants", "#### The register-tiled flash2 forward against SDPA (float32)", variants_table),
    ("predictions.entries", "#### The H200 predictions, measured", predictions_table),
    ("predictions.entries", "#### Each registered alternative", alternatives_table),
    ("m-top", "#### Whether the whole opt-in shared memory launches", m_top_table),
)


def h200_2_section() -> list[str]:
    with stored(H200_2):
        parts = ["", "### The second lease: the variants and the H200's own predictions", "", h200_2_prose()]
        for name, heading, make in H200_2_TABLES:
            if has(name):
                parts += ["", heading, "", make()]
        if has("occupancy"):
            line, tab = occupancy_summary()
            parts += ["", "#### The driver's figures against the resource report", "", wrap(line + "."), "", tab]
    return parts


def h200_section() -> str:
    """docs/gpu.md's "Measured on an H200": the prose and every table the lease's files allow."""
    with stored(H200):
        parts = [f"Measured on: {_versions()}.", "", absent_line() + ".", "", h200_prose()]
        for name, heading, make in NEXT:
            if has(name):
                parts += ["", heading.replace("###", "####"), "", make()]
        if has("sdpa"):
            parts += ["", "#### flash2 forward against SDPA (float32)", "", sdpa_table()]
    if (H200_2 / "env.json").exists():
        parts += h200_2_section()
    return "\n".join(parts) + "\n"


BLOCKS = {  # file -> (start marker, end marker, the text between them)
    "docs/gpu.md": [("<!-- gpu-evidence-prose -->", "<!-- /gpu-evidence-prose -->", prose),
                    ("<!-- gpu-evidence-report -->", "<!-- /gpu-evidence-report -->", report),
                    ("<!-- gpu-evidence-h200 -->", "<!-- /gpu-evidence-h200 -->", h200_section)],
    "README.md": [("<!-- gpu-evidence: readme -->", "<!-- /gpu-evidence -->", readme_section)],
}  # fmt: skip


def block(text: str, start: str, end: str) -> str:
    """The text between two marker lines (stripped); ValueError where a marker is missing."""
    i, j = text.index(start + "\n") + len(start) + 1, text.index("\n" + end)
    return text[i:j].strip()


def write_blocks(root: pathlib.Path) -> list[str]:
    """Rewrite every generated block of the README and docs/gpu.md from the stored files; the files changed."""
    changed = []
    for name, blocks in BLOCKS.items():
        path = root / name
        text = path.read_text()
        for start, end, make in blocks:
            i, j = text.index(start + "\n") + len(start) + 1, text.index("\n" + end)
            text = text[:i] + make().strip() + text[j:]
        if text != path.read_text():
            path.write_text(text)
            changed.append(name)
    return changed


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
    global DATA
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--figure", type=pathlib.Path, help="write the sweep figure here (needs matplotlib)")
    p.add_argument("--recompute", action="store_true", help="redo the CPU side first (slow)")
    p.add_argument("--data", type=pathlib.Path, default=DATA, help="the stored measurements (default gpu_h100/)")
    p.add_argument("--write", action="store_true", help="rewrite the generated blocks of README.md and docs/gpu.md")
    p.add_argument("--h200", action="store_true", help="print the H200 lease's section (gpu_h200/) and stop")
    args = p.parse_args(argv)
    if args.h200:
        print(h200_section(), end="")
        return 0
    if not (args.data / "env.json").exists():
        p.error(f"--data must be a folder of stored measurements (with env.json), got {args.data}")
    DATA = args.data
    if args.recompute:
        recompute()
    if args.write:
        print("rewrote:", ", ".join(write_blocks(HERE.parents[1])) or "nothing (already current)", file=sys.stderr)
    print(report(), end="")
    if args.figure:
        figure(args.figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())

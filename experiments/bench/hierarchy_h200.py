"""The H100's registered predictions as an H200 measured them (2026-11-28), the mechanisms that explain the misses,
and the predictions registered for the next H200 lease. Nothing here is fitted to a measurement: the H200 preset's
parameters have their sources (experiments/data/devices.csv: its L2 is the driver's 60 MiB), the kernels' tiles are
read off their names, and each candidate mechanism is a named option of the model (iosim.hierarchy.Machine's
``far_copy``: where a line read from the far L2 partition is kept, NVIDIA does not publish it).

Measured: ``experiments/bench/gpu_h200/predictions.json`` (Nsight Compute's launches of
``experiments/bench/predictions/h100.json``, labelled by entry; ``raw/predictions.entries.json`` the entries).

Run: ``python experiments/bench/hierarchy_h200.py compute`` (the model runs on the H200 preset, each far-copy
variant: minutes on 2 cores, to predictions/h200-runs.json), ``... table [--write]`` (the docs table of the H100
predictions against the H200's measurement), ``... predictions`` (predictions/h200.json from the stored runs).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gpu_predictions  # noqa: E402
import hierarchy_h100 as h100  # noqa: E402

MEASURED = HERE / "gpu_h200" / "predictions.json"
MEASURED_ENTRIES = HERE / "gpu_h200" / "raw" / "predictions.entries.json"
RUNS = HERE / "predictions" / "h200-runs.json"
PREDICTIONS = HERE / "predictions" / "h200.json"
BLOCK = ("<!-- hierarchy-h200 -->", "<!-- /hierarchy-h200 -->")
DEVICE = "H200"
MIB = 1 << 20
HIT = 0.10  # a level is a hit when measured / predicted is within 10 % of 1
# The far-copy variants (iosim.hierarchy.l2, "Where a far-homed line is kept"); "near" is the one the L2 probe and
# the fabric reads measured on the H200 support (docs/hierarchy-hardware.md), "both" the model as built.
VARIANTS = ("both", "near", "home", "shared")
PRIMARY = "both"
TWO_CTAS = f"{PRIMARY}, 2 CTAs/SM"  # the forward if its registers (unknown: no __launch_bounds__) allow only 2
# cuDNN's decode as the H200 ran it (gpu_h200/predictions.json): its main kernel's grid is (8, 8, 4), 8 blocks per
# (KV head, batch item), then cudnn::lean_reduction_kernel combines them: split-KV with 8 splits, read off the grid
CUDNN_SPLITS = 8
SPLIT = f"{PRIMARY}, cuDNN's {CUDNN_SPLITS} KV splits"
PROBE_MB = (8, 16, 32, 40, 48, 56, 64, 72, 96)
FA2 = ("forward", "forward causal", "backward", "backward causal", "decode GQA")
FIG2 = (False, True)  # forward, backward


# ------------------------------------------------------------------------------------ measured against predicted
def measured_by_id(path: pathlib.Path = MEASURED) -> dict:
    """{entry id: {metric: summed value}} of the lease's launches, PyTorch's at:: copies left out."""
    data = json.loads(path.read_text())
    ids = [x["id"] for x in data["labels"]]
    out: dict = {}
    for x in data["launches"]:
        if not gpu_predictions.measured_kernel(x["kernel"]):
            continue
        row = out.setdefault(ids[x["label"]], {})
        for k, v in x.items():
            if isinstance(v, float):
                row[k] = row.get(k, 0.0) + v
    return out


def comparison(entries_path: pathlib.Path = MEASURED_ENTRIES, measured_path: pathlib.Path = MEASURED) -> list[dict]:
    """gpu_predictions.compare of the entries the lease measured against what it measured."""
    entries = [gpu_predictions.check(e) for e in json.loads(entries_path.read_text())]
    return gpu_predictions.compare(entries, measured_by_id(measured_path))


def verdict(ratio: float | None) -> str:
    if ratio is None:
        return "not measured"
    return "hit" if abs(ratio - 1) <= HIT else "miss"


def table(rows: list[dict] | None = None) -> str:
    """The docs table: every registered level, predicted (H100 preset), measured (H200), their ratio, hit or miss."""
    from tabulate import tabulate

    body = [[r["id"], r["level"], f"{r['predicted'] / 1e6:,.1f}",
             "-" if r["measured"] is None else f"{r['measured'] / 1e6:,.1f}",
             "-" if r["ratio"] is None else f"{r['ratio']:.3f}", verdict(r["ratio"])]
            for r in (rows if rows is not None else comparison())]  # fmt: skip
    head = ["entry", "level", "predicted MB (H100 preset)", "measured MB (H200)", "measured / predicted", "within 10 %"]
    return tabulate(body, headers=head, tablefmt="github", disable_numparse=True)


# ------------------------------------------------------------------------------------ the model on the H200 preset
def run_fa2(name: str, far_copy: str, blocks_per_sm: int | None = None, splits: int = 1):
    """One of the first lease's SDPA launches with every mechanism the H100 predictions modelled for it (hierarchy_h100:
    kernel dtypes, partitions, resident CTAs, FA2's descending walk for the forward; the decode up to partitions) on
    the H200 preset, a far-homed line kept as ``far_copy`` says; ``blocks_per_sm`` (None: from the kernel's resources)
    the forward's resident CTAs if its registers allow fewer (hierarchy_h100.TWO_CTAS); ``splits`` the decode's KV
    splits (CUDNN_SPLITS)."""
    from iosim import Schedule
    from iosim.hierarchy import Machine
    from iosim.hierarchy.scheduler import Scheduler
    from iosim.hierarchy.simulate import hierarchy

    spec = h100.LAUNCHES[name]
    tiles = dict(Br=spec["Br"], Bc=spec["Bc"]) if spec["Br"] else {}
    flash2 = Schedule("flash2", gqa="packed" if name == "decode GQA" else "per-head", splits=splits, **tiles)
    kw = dict(problem=h100._problem(name), backward=spec["backward"], allow_long=True, element_bytes="kernel")
    if name == "decode GQA":
        machine = Machine(DEVICE, partitions=2, home_lines=h100.HOME_LINES, far_copy=far_copy)
        return hierarchy(flash2, device=machine, **kw)
    machine = Machine(DEVICE, partitions=2, home_lines=h100.HOME_LINES, kernel=h100.main_kernel(name),
                      far_copy=far_copy, blocks_per_sm=blocks_per_sm)  # fmt: skip
    if not spec["backward"]:
        kw.update(scheduler=Scheduler(order="head-grouped", walk="descending"))
    return hierarchy(flash2, M=h100._working_set(name), device=machine, **kw)


def run_fig2(backward: bool, far_copy: str):
    """FlashAttention's Figure 2 launch (GPT-2 medium, causal) as hierarchy_fig2 runs FA2, on the H200 preset."""
    import hierarchy_fig2 as fig2

    import iosim
    from iosim.hierarchy import Machine, hierarchy

    kernel, br, bc = fig2.FA2[backward]
    sched = iosim.Schedule("flash2", backward=backward, Br=br, Bc=bc)
    machine = Machine(DEVICE, partitions="device", home_lines=h100.HOME_LINES, sector_bytes="device", kernel=kernel,
                      far_copy=far_copy)  # fmt: skip
    return hierarchy(fig2.problem(), sched, machine, M=fig2.working_set(sched), element_bytes="kernel",
                     allow_long=True)  # fmt: skip


def levels(r) -> dict:
    """hierarchy_h100.levels as Nsight Compute counts them (:func:`_ncu_levels`)."""
    return _ncu_levels(h100.levels(r))


def _ncu_levels(got: dict) -> dict:
    """The model's levels as Nsight Compute's metrics count them: the fabric of reads only (its
    ``srcunit_ltcfabric_op_read``); the L1's reduction sectors, the reductions' bytes (4-byte atomics, a warp's 32
    on one row of 128 bytes: whole sectors, FA2's GmemTiledCopydQaccumAtomicAdd); and the L2's reduction sectors
    counted at every slice a reduction visits, the near one and, for a line homed across the fabric, the home's
    (the stored H200 rows show the same for reads and writes: PyTorch's copies' op_read and op_write are their
    bytes and half again, srcunit tex plus srcunit ltcfabric)."""
    out = {k: v for k, v in got.items() if k not in ("fabric_reads_only", "fabric_reductions")}
    out["l2_read_from_fabric"] = got["fabric_reads_only"]
    out["l1_reduction"] = got["l2_reduction"]
    out["l2_reduction"] = got["l2_reduction"] + got["fabric_reductions"]
    return out


def jobs(variants=VARIANTS) -> list:
    """(key, function) of every model run: the probe, Figure 2's launches and the first lease's, per variant."""
    out = [(f"probe {mb} MiB | {v}", lambda mb=mb, v=v: _ncu_levels(h100.copy_probe(mb * MIB, 2, DEVICE, v)))
           for mb in PROBE_MB for v in variants]  # fmt: skip
    out += [(f"probe {mb} MiB | one L2", lambda mb=mb: _ncu_levels(h100.copy_probe(mb * MIB, 1, DEVICE)))
            for mb in PROBE_MB]  # fmt: skip
    out += [(f"fig2 {'bwd' if b else 'fwd'} | {v}", lambda b=b, v=v: levels(run_fig2(b, v))) for b in FIG2
            for v in variants]  # fmt: skip
    out += [(f"iosim causal | {v}", lambda v=v: run_iosim(v)) for v in variants]
    out += [(f"{n} | {v}", lambda n=n, v=v: levels(run_fa2(n, v))) for n in FA2 for v in variants]
    out += [(f"{n} | {TWO_CTAS}", lambda n=n: levels(run_fa2(n, PRIMARY, 2))) for n in ("forward", "forward causal")]
    out += [(f"decode GQA | {SPLIT}", lambda: levels(run_fa2("decode GQA", PRIMARY, splits=CUDNN_SPLITS)))]
    return out


def compute(variants=VARIANTS, path: pathlib.Path = RUNS, only: str | None = None) -> dict:
    """Every (launch, variant) on the H200 preset not stored yet, stored after each run (a stopped compute loses
    little); ``only``: the keys that start with it."""
    from iosim.base.version import __version__

    out = json.loads(path.read_text()) if path.exists() else {"device": DEVICE, "runs": {}}
    out["iosim_version"] = __version__
    for key, job in jobs(variants):
        if key in out["runs"] or (only and not key.startswith(only)):
            continue
        t0 = time.perf_counter()
        out["runs"][key] = {**job(), "seconds": round(time.perf_counter() - t0, 1)}
        path.write_text(json.dumps(out, indent=1) + "\n")
        print(f"{key}: {out['runs'][key]['seconds']} s", file=sys.stderr, flush=True)
    return out


def run_iosim(far_copy: str):
    """hierarchy_h100._iosim_causal on the H200 preset: iosim's numba.cuda flash2 forward, causal, float32 (B = 1,
    32 heads, N = 8192, d = 64, M = 16,384 words), its resources as the H100's driver gave them (the same kernel
    and compiler: hierarchy_h100.IOSIM_FLASH2_FORWARD)."""
    from iosim import Problem
    from iosim.hierarchy import Machine
    from iosim.hierarchy.simulate import hierarchy

    p = Problem(B=1, H_q=32, N=8192, d=64, dtype_q="fp32", causal=True)
    machine = Machine(DEVICE, partitions=2, home_lines=h100.HOME_LINES, kernel=h100.IOSIM_FLASH2_FORWARD,
                      far_copy=far_copy)  # fmt: skip
    r = hierarchy("flash2", problem=p, M=16384, device=machine, element_bytes="kernel", allow_long=True)
    return {**levels(r), "blocks_per_sm": r.blocks_per_sm}


# ------------------------------------------------------------------------------------ the registered predictions
KEEP = ("dram_read", "dram_write", "global_load", "global_store", "l2_reduction", "l1_reduction",
        "l2_read_from_fabric")  # fmt: skip
FA2_IDS = {"forward": "fa2-fwd", "forward causal": "fa2-fwd-causal", "backward": "fa2-bwd",
           "backward causal": "fa2-bwd-causal", "decode GQA": "cudnn-decode-gqa-packed"}  # fmt: skip


def _predicted(got: dict) -> dict:
    return {k: int(got[k]) for k in KEEP if got.get(k)}


def _entry(base: dict, runs: dict, key: str, variants=VARIANTS) -> dict:
    """``base`` (the launch's fields) with the primary variant's levels as ``predicted`` and the others' as named
    alternatives."""
    alts = {f"far_copy={v}": _predicted(runs[f"{key} | {v}"]) for v in variants if v != PRIMARY}
    for extra in (TWO_CTAS, SPLIT):
        if f"{key} | {extra}" in runs:
            alts[f"far_copy={extra}"] = _predicted(runs[f"{key} | {extra}"])
    if f"{key} | one L2" in runs:
        alts["one L2 of 60 MiB"] = _predicted(runs[f"{key} | one L2"])
    return {**base, "model": f"far_copy={PRIMARY}", "predicted": _predicted(runs[f"{key} | {PRIMARY}"]),
            "alternatives": alts}  # fmt: skip


def _fa2_base(name: str, old: dict) -> dict:
    """The first lease's entry (predictions/h100.json) of the same launch, its fields but not its figures."""
    base = {k: v for k, v in old.items() if k not in ("predicted", "alternatives", "model", "blocks_per_sm")}
    return {**base, "what": f"{base['what'].split(' (')[0]}; on the H200 preset (60 MiB L2), every mechanism"}


def predictions(stored: dict | None = None) -> dict:
    """The predictions file of the next H200 lease (gpu_predictions' format) from the stored runs."""
    from iosim.base.version import __version__

    runs = (stored or json.loads(RUNS.read_text()))["runs"]
    old = {e["id"]: e for e in json.loads(h100.PREDICTIONS.read_text())["entries"]}
    entries = [_entry(_fa2_base(n, old[FA2_IDS[n]]), runs, n) for n in FA2 if f"{n} | {PRIMARY}" in runs]
    if f"iosim causal | {PRIMARY}" in runs:
        entries.append(_entry(_fa2_base("iosim", old["iosim-fwd-causal-ascending"]), runs, "iosim causal"))
    for mb in PROBE_MB:
        base = {**{k: v for k, v in old["l2-probe-8MiB"].items() if k not in ("predicted", "alternatives")},
                "id": f"l2-probe-{mb}MiB", "bytes": mb * MIB,
                "what": f"one float32 buffer of {mb} MiB read twice (L2 capacity; LRU refetches all of it on the "
                        "second read once it passes the capacity)"}  # fmt: skip
        entries.append(_entry(base, runs, f"probe {mb} MiB"))
    for b in FIG2:
        fid = f"fig2-gpt2-fa2-{'bwd' if b else 'fwd'}-causal"
        entries.append(_entry({**_fa2_base("fig2", old[fid]), "what": f"FlashAttention Fig. 2 (GPT-2 medium): SDPA "
                                f"FlashAttention-2 {'backward' if b else 'forward'} on the H200 preset"},
                              runs, f"fig2 {'bwd' if b else 'fwd'}"))  # fmt: skip
    return {"device": "H200 (132 SMs, 60 MiB L2: the driver's, experiments/bench/gpu_h200/env.json)",
            "iosim_version": __version__, "registered": time.strftime("%Y-%m-%d"),
            "note": "registered before the lease that measures it; not to be refitted. The primary prediction is the "
                    "model as built (far_copy=both: a line read from the far L2 partition kept by the reader's "
                    "partition and by its home); the alternatives keep it once (near, home, shared: the H200's probe "
                    "supported a single copy, its FlashAttention launches refuted near's second DRAM fetch; "
                    "docs/hierarchy-hardware.md), and the forward's 2 CTAs/SM and cuDNN's 8 KV splits. The model's "
                    "L2 is LRU: past the capacity the probe predicts 2x the buffer, where the H200 measured 1.62x "
                    "at 64 MiB (not LRU).",
            "entries": entries}  # fmt: skip


# ------------------------------------------------------------------------------------ the variants against the H200
def run_keys() -> dict:
    """{measured entry id: the stored runs' key prefix} of every launch the lease measured that the runs model."""
    keys = {i: n for n, i in FA2_IDS.items()}
    keys["iosim-fwd-causal-ascending"] = "iosim causal"
    keys.update({f"fig2-gpt2-fa2-{p}-causal": f"fig2 {p}" for p in ("fwd", "bwd")})
    keys.update({f"l2-probe-{mb}MiB": f"probe {mb} MiB" for mb in PROBE_MB})
    return keys


VARIANT_LEVELS = ("dram_read", "dram_write", "global_load", "global_store", "l2_reduction", "l2_read_from_fabric")


def variants_table(stored: dict | None = None, measured: dict | None = None) -> str:
    """Per measured launch and level: the H200's measurement and measured / predicted under each far-copy variant on
    the H200 preset (and one L2 for the probe)."""
    from tabulate import tabulate

    runs = (stored or json.loads(RUNS.read_text()))["runs"]
    got = measured or measured_by_id()
    cols = [*VARIANTS, "one L2"]
    body = []
    for eid, key in run_keys().items():
        if eid not in got or f"{key} | {PRIMARY}" not in runs:
            continue
        m = gpu_predictions.measured(got[eid])
        for level in VARIANT_LEVELS:
            if level not in m or not runs[f"{key} | {PRIMARY}"].get(level):
                continue
            ratios = [runs.get(f"{key} | {v}", {}).get(level) for v in cols]
            body.append([eid, level, f"{m[level] / 1e6:,.1f}",
                         *("-" if not p else f"{m[level] / p:.3f}" for p in ratios)])  # fmt: skip
    head = ["entry", "level", "measured MB (H200)", *(f"measured / {v}" for v in cols)]
    return tabulate(body, headers=head, tablefmt="github", disable_numparse=True)


def block() -> str:
    """The docs block: the H100 predictions as the H200 measured them, then the variants on the H200 preset."""
    return (
        f"{table()}\n\nThe same launches on the H200 preset (60 MiB), each placement of a far-read line "
        f"(`far_copy`), measured / predicted:\n\n{variants_table()}"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("compute", "table", "predictions"))
    ap.add_argument("--only", help="compute: only the runs whose key starts with this")
    ap.add_argument("--write", action="store_true", help="table: also write it into docs/hierarchy-hardware.md")
    ap.add_argument("--force", action="store_true", help="predictions: write over the registered file")
    args = ap.parse_args(argv)
    if args.what == "compute":
        compute(only=args.only)
        print(f"wrote {RUNS}")
    elif args.what == "table":
        print(block())
        if args.write:
            h100.write_block(block(), BLOCK)
            print(f"wrote the tables into {h100.DOC}")
    else:
        if gpu_predictions.registered(PREDICTIONS, args.force):
            return 2
        data = predictions()
        for e in data["entries"]:
            gpu_predictions.check(e)
        PREDICTIONS.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {PREDICTIONS} ({len(data['entries'])} entries)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

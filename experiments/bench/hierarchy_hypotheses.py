"""The open DRAM gaps of docs/hierarchy-hardware.md and the hypotheses tested against them, each as a model run with
no parameter fitted to a measurement (docs/hierarchy-hypotheses.md):

* **replacement** (the L2's policy, which NVIDIA does not publish): the H200's L2 capacity probe (one buffer read
  twice, ``hierarchy_h100.copy_trace``) and the H100 sweep's square-tiling launches (``hierarchy_h100_sweep``) under
  ``lru``, ``random`` and W-way set-associative LRU ``sets:W`` for a band of W (no value chosen), one L2 of the
  preset's capacity with whole-line fills (:mod:`iosim.hierarchy.replacement` replays the line stream in one
  cache: partitions and sectors are not modelled under these policies, so ``lru`` is run on the same machine as
  the baseline);
* **flush**: the sweep's square tiling on the sweep's own machine (two partitions, sectors: ``hierarchy_h100_sweep``
  's ``predict``) with ``Machine(flush="per-kernel")``, Nsight Compute's cache control, each launch from a clean L2;
* **forward writes**: FlashAttention-2's forward (B·H = 32, N = 32,768, d = 128, fp16) on the H200 preset under
  each ``far_copy`` placement (``hierarchy_h200.run_fa2``), its DRAM writes during the kernel and with the flush.

Run: ``python experiments/bench/hierarchy_hypotheses.py compute probe|sweep|flush|forward [--label ...]`` (each run
merged into the stored JSON after it: ``gpu_h200_2/hierarchy-hypotheses.json`` for the probe and the forward,
``gpu_h100/hierarchy-hypotheses.json`` for the sweep), ``... table [--write]`` (the page's tables from them).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import hierarchy_h100 as h100  # noqa: E402
import hierarchy_h100_sweep as sweep  # noqa: E402

H100_RUNS = HERE / "gpu_h100" / "hierarchy-hypotheses.json"
H200_RUNS = HERE / "gpu_h200_2" / "hierarchy-hypotheses.json"
H200_MEASURED = HERE / "gpu_h200_2" / "predictions.json"
DOC = HERE.parent.parent / "docs" / "hierarchy-hypotheses.md"
BLOCKS = {k: (f"<!-- hypotheses-{k} -->", f"<!-- /hypotheses-{k} -->") for k in ("probe", "sweep", "flush", "forward")}
MIB, MB = 1 << 20, 1e6
PROBE_MB = (8, 16, 32, 40, 48, 56, 64, 72, 96)  # the sizes the H200 measured (hierarchy_h200.PROBE_MB)
WAYS = (8, 16, 32, 64)  # a band: NVIDIA publishes no associativity
POLICIES = ("lru", "random", *(f"sets:{w}" for w in WAYS), *(f"sets:{w}:xor" for w in WAYS))
SEEDS = ("random", "random:1", "random:2")  # random replacement, three seeds: the spread of one draw
SQUARE = (9, 11, 13, 26, 28, 30, 36, 38, 40)  # square-tiling launches, d = 64-256, B = 73-184 (the faster ones)
FLASH2 = (8, 12, 29, 39)  # flash2's forward at d = 64-256 (the faster ones)
LABELS = SQUARE + FLASH2
FAR_COPY = ("both", "near", "home", "shared")


def _load(path: pathlib.Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"runs": {}}


def _store(path: pathlib.Path, key: str, got: dict) -> None:
    from iosim.base.version import __version__

    out = _load(path)
    out["iosim_version"] = __version__
    out["runs"][key] = got
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"{key}: {got.get('seconds')} s", file=sys.stderr, flush=True)


def probe(mb: int, policy: str) -> dict:
    """The probe (one buffer of ``mb`` MiB read twice) on the H200 preset's SMs and its one 60 MiB L2 under
    ``policy``, whole lines: DRAM read bytes."""
    from iosim.hierarchy import Machine
    from iosim.hierarchy import device as preset
    from iosim.hierarchy.simulate import hierarchy

    t, dev = h100.copy_trace(mb * MIB), preset("H200")
    machine = Machine(P=dev.sms, C=dev.l2_bytes // 4, L=dev.l2_line_bytes // 4, blocks_per_sm=8)
    r = hierarchy("read twice", N=1, d=1, M=t.M, device=machine, bytes_per_word=4, _trace=t, allow_long=True,
                  policy=policy)  # fmt: skip
    return dict(dram_read=r.level_bytes("dram_read"), buffer=mb * MIB)


def sweep_run(label: int, policy: str, machine_kw: dict) -> dict:
    """Sweep configuration ``label`` (the square tiling's two launches, or flash2's forward) under ``policy`` on the
    H100 preset with ``machine_kw``: each launch's DRAM read, its writes during the kernel and the flush after it
    (bytes)."""
    import iosim
    from iosim.hierarchy import Machine, hierarchy

    cfg = next(c for c in sweep.configurations() if c["label"] == label)
    p = iosim.Problem(B=1, H_q=cfg["BH"], N=cfg["N"], d=cfg["d"], dtype_q="fp32")
    machine = Machine("H100", kernel=cfg["resources"][cfg["kernels"][0]], **machine_kw)
    t0 = time.perf_counter()
    r = hierarchy(p, iosim.Schedule(cfg["algorithm"], **cfg["tiles"]), machine, M=cfg["M"], element_bytes="kernel",
                  allow_long=True, policy=policy)  # fmt: skip
    launches = {k: dict(dram_read=w["read_bytes"], dram_write=w["during_bytes"], flush_after=w["flush_after_bytes"])
                for k, w in zip(cfg["kernels"], r.dram_writes, strict=True)}  # fmt: skip
    return dict(label=label, policy=policy, launches=launches, seconds=round(time.perf_counter() - t0, 1))


SWEEP_MACHINE = dict(partitions="device", home_lines=sweep.HOME_LINES, sector_bytes="device")  # predict()'s


def forward(far_copy: str) -> dict:
    """FlashAttention-2's forward on the H200 preset under ``far_copy`` (hierarchy_h200.run_fa2): DRAM writes during
    the kernel and with the final flush, the LSU's stores (bytes)."""
    import hierarchy_h200

    t0 = time.perf_counter()
    r = hierarchy_h200.run_fa2("forward", far_copy)
    (w,) = r.dram_writes
    return dict(far_copy=far_copy, during=w["during_bytes"], with_flush=w["with_flush_bytes"],
                stores=r.level_bytes("l2_update"), dram_read=r.level_bytes("dram_read"),
                seconds=round(time.perf_counter() - t0, 1))  # fmt: skip


def compute(what: str, labels=None) -> None:
    """The runs of one hypothesis not stored yet, each stored after it runs."""
    if what == "probe":
        for mb in PROBE_MB:
            for pol in (*POLICIES, *SEEDS[1:]):
                key = f"probe {mb} MiB | {pol}"
                if key not in _load(H200_RUNS)["runs"]:
                    t0 = time.perf_counter()
                    _store(H200_RUNS, key, {**probe(mb, pol), "seconds": round(time.perf_counter() - t0, 1)})
    elif what in ("sweep", "flush"):
        for label in labels or (LABELS if what == "sweep" else SQUARE):
            pols = (*POLICIES, *SEEDS[1:]) if what == "sweep" else ("lru",)
            kw = {} if what == "sweep" else {**SWEEP_MACHINE, "flush": "per-kernel"}
            for pol in pols:
                key = f"{what} {label} | {pol}"
                if key not in _load(H100_RUNS)["runs"]:
                    _store(H100_RUNS, key, sweep_run(label, pol, kw))
    elif what == "forward":
        for fc in FAR_COPY:
            key = f"forward | {fc}"
            if key not in _load(H200_RUNS)["runs"]:
                _store(H200_RUNS, key, forward(fc))


# ------------------------------------------------------------------------------------------------------ the tables
def _r(meas, pred) -> str:
    return "-" if not pred else f"{meas / pred:.2f}"


def _band(xs) -> str:
    """A band of ratios (min-max; one value where they agree to two places)."""
    lo, hi = f"{min(xs):.2f}", f"{max(xs):.2f}"
    return lo if lo == hi else f"{lo}-{hi}"


def _groups(get) -> dict:
    """measured / predicted per policy group: lru, random (three seeds), sets:W and sets:W:xor (W in WAYS)."""
    return {"lru": [get("lru")], "random": [get(p) for p in SEEDS],
            "sets:W": [get(f"sets:{w}") for w in WAYS], "sets:W:xor": [get(f"sets:{w}:xor") for w in WAYS]}  # fmt: skip


def probe_table() -> str:
    """The H200's probe: measured DRAM read beside each policy's (one 60 MiB L2, whole lines); ratio = measured /
    predicted, a band over the seeds (random) and over W (sets)."""
    import hierarchy_h200
    from tabulate import tabulate

    meas = hierarchy_h200.measured_by_id(H200_MEASURED)
    runs = _load(H200_RUNS)["runs"]
    body = []
    for mb in PROBE_MB:
        m = meas[f"l2-probe-{mb}MiB"]["dram__bytes_read.sum"]
        if f"probe {mb} MiB | sets:64:xor" not in runs:
            continue
        g = _groups(lambda p, mb=mb, m=m: m / runs[f"probe {mb} MiB | {p}"]["dram_read"])
        pred = {k: [runs[f"probe {mb} MiB | {p}"]["dram_read"] / MB for p in ps] for k, ps in
                {"lru": ["lru"], "random": SEEDS}.items()}  # fmt: skip
        body.append([mb, f"{mb * MIB / MB:.1f}", f"{m / MB:.1f}", f"{m / (mb * MIB):.2f}", f"{pred['lru'][0]:.1f}",
                     _band(g["lru"]), f"{statistics_mean(pred['random']):.1f}", _band(g["random"]),
                     _band(g["sets:W"]), _band(g["sets:W:xor"])])  # fmt: skip
    head = ["MiB", "buffer MB", "measured DRAM read MB", "measured / buffer", "lru MB", "measured / lru",
            "random MB (mean of 3 seeds)", "measured / random", "measured / sets:W (W 8-64)",
            "measured / sets:W:xor (W 8-64)"]  # fmt: skip
    return tabulate(body, headers=head, tablefmt="github", disable_numparse=True)


def statistics_mean(xs) -> float:
    return sum(xs) / len(xs)


def _sweep_meas() -> dict:
    return sweep.measured()


def sweep_table() -> str:
    """The sweep's launches: measured DRAM read / predicted under each policy (one 50 MiB L2, whole lines), beside
    the stored prediction of hierarchy_h100_sweep (two partitions, sectors); then the count within 15 %."""
    from tabulate import tabulate

    meas, runs = _sweep_meas(), _load(H100_RUNS)["runs"]
    stored = json.loads(sweep.STORED.read_text())["runs"]
    body, within = [], {}
    for cfg in sweep.configurations():
        lab = cfg["label"]
        if f"sweep {lab} | sets:64:xor" not in runs:
            continue
        for k in cfg["kernels"]:
            m = meas[(lab, k)]["dram_read"]
            g = _groups(lambda p, lab=lab, k=k, m=m: m / runs[f"sweep {lab} | {p}"]["launches"][k]["dram_read"])
            for name, xs in g.items():
                within.setdefault((k, name), []).append(all(abs(x - 1) <= 0.15 for x in xs))
            tiles = ", ".join(f"{a}={b}" for a, b in cfg["tiles"].items())
            was = stored[str(lab)]["launches"][k]["dram_read"]
            body.append([lab, k.removesuffix("_kernel"), cfg["d"], tiles, f"{m / MB:.1f}", _r(m, was),
                         *(_band(xs) for xs in g.values())])  # fmt: skip
    head = ["label", "kernel", "d", "tiles", "measured DRAM read MB", "measured / stored (2 partitions, sectors)",
            "measured / lru", "measured / random (3 seeds)", "measured / sets:W (W 8-64)",
            "measured / sets:W:xor (W 8-64)"]  # fmt: skip
    lines = [f"- {k.removesuffix('_kernel')}, {name}: {sum(v)} of {len(v)} launches within 15 % (every seed or W)"
             for (k, name), v in within.items()]  # fmt: skip
    return tabulate(body, headers=head, tablefmt="github", disable_numparse=True) + "\n\n" + "\n".join(lines)


def flush_table() -> str:
    """The square tiling on the sweep's machine with flush="per-kernel": each launch's DRAM writes during the kernel
    (and reads) against the measured, beside the stored prediction without the flush."""
    from tabulate import tabulate

    meas, runs = _sweep_meas(), _load(H100_RUNS)["runs"]
    stored = json.loads(sweep.STORED.read_text())["runs"]
    body = []
    for lab in sorted(int(k.split()[1]) for k in runs if k.startswith("flush ")):
        got = runs.get(f"flush {lab} | lru")
        if got is None:
            continue
        for k in ("square_phase1_kernel", "square_phase2_kernel"):
            m, p, s0 = meas[(lab, k)], got["launches"][k], stored[str(lab)]["launches"][k]
            body.append([lab, k.removesuffix("_kernel"), f"{m['dram_write'] / MB:.1f}", f"{s0['dram_write'] / MB:.1f}",
                         _r(m["dram_write"], s0["dram_write"]), f"{p['dram_write'] / MB:.1f}",
                         _r(m["dram_write"], p["dram_write"]), f"{p['flush_after'] / MB:.1f}",
                         _r(m["dram_read"], s0["dram_read"]), _r(m["dram_read"], p["dram_read"])])  # fmt: skip
    head = ["label", "kernel", "measured DRAM write MB", "stored (no flush) MB", "measured / stored",
            "flush per-kernel MB", "measured / flush", "flush after it MB", "DRAM read: measured / stored",
            "measured / flush"]  # fmt: skip
    return tabulate(body, headers=head, tablefmt="github", disable_numparse=True)


def forward_table() -> str:
    """FlashAttention-2's forward on the H200 preset under each far_copy placement: DRAM writes against the
    H200's measured."""
    import hierarchy_h200
    from tabulate import tabulate

    m = hierarchy_h200.measured_by_id(H200_MEASURED)["fa2-fwd"]
    mw = m["dram__bytes_write.sum"]
    runs = _load(H200_RUNS)["runs"]
    body = [[fc, f"{r['stores'] / MB:.1f}", f"{r['during'] / MB:.1f}", f"{r['with_flush'] / MB:.1f}",
             f"{mw / MB:.1f}", _r(mw, r["during"]), _r(mw, r["with_flush"])]
            for fc in FAR_COPY if (r := runs.get(f"forward | {fc}"))]  # fmt: skip
    head = ["far_copy", "L2 stores MB (model)", "DRAM write during MB", "with the final flush MB",
            "measured MB (H200)", "measured / during", "measured / with flush"]  # fmt: skip
    return tabulate(body, headers=head, tablefmt="github", disable_numparse=True) + "\n\n" + bounds_table()


def bounds_table() -> str:
    """The forward's DRAM writes against each hypothesis's bound, per GPU (measured: H100 ncu-torch.json, H200
    gpu_h200_2): stores written back once; one L2 of earlier kernels' dirty lines; both partitions writing back
    (1.5 x the stores, with homes alternating); and a store-once kernel on the same L2 (iosim's own forward)."""
    import hierarchy_h200
    from tabulate import tabulate

    from iosim.hierarchy import device

    h100_m = h100.measured("forward")
    h200_all = hierarchy_h200.measured_by_id(H200_MEASURED)
    h200_m = h200_all["fa2-fwd"]
    st = "l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum"
    rows = []
    for gpu, w, s in (("H100", h100_m["dram_write"], h100_m["global_store"]),
                      ("H200", h200_m["dram__bytes_write.sum"], h200_m[st])):  # fmt: skip
        l2 = device(gpu).l2_bytes
        rows.append([gpu, f"{s / MB:.1f}", f"{w / MB:.1f}", f"{w / s:.2f}", f"{(w - s) / MB:.1f}", f"{l2 / MB:.1f}",
                     f"{1.5 * s / MB:.1f}"])  # fmt: skip
    head = ["GPU", "LSU stores MB", "DRAM write MB", "write / stores", "excess MB", "one L2 MB", "1.5 x stores MB"]
    others = {
        "iosim-fwd-causal-ascending": "iosim's own flash2 forward (causal, fp32, d = 64)",
        "fa2-fwd-causal": "FlashAttention-2's forward, causal (d = 128)",
        "fig2-gpt2-fa2-fwd-causal": "FlashAttention-2's forward of Figure 2 (GPT-2 medium, causal, d = 64)",
    }
    lines = []
    for k, what in others.items():
        w, st_k = h200_all[k]["dram__bytes_write.sum"], h200_all[k][st]
        lines.append(f"- {what}: DRAM write {w / MB:.1f} MB for {st_k / MB:.1f} MB of LSU stores ({w / st_k:.2f})")
    return (tabulate(rows, headers=head, tablefmt="github", disable_numparse=True)
            + "\n\nOther forwards on the same H200 (gpu_h200_2):\n\n" + "\n".join(lines))  # fmt: skip


TABLES = {"probe": probe_table, "sweep": sweep_table, "flush": flush_table, "forward": forward_table}


def tables() -> str:
    return "\n\n".join(f"{k}:\n{f()}" for k, f in TABLES.items())


def write_docs() -> None:
    """Each table between its markers in docs/hierarchy-hypotheses.md."""
    doc = DOC.read_text()
    for k, f in TABLES.items():
        head, rest = doc.split(BLOCKS[k][0], 1)
        _, tail = rest.split(BLOCKS[k][1], 1)
        doc = f"{head}{BLOCKS[k][0]}\n{f()}\n{BLOCKS[k][1]}{tail}"
    DOC.write_text(doc)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("compute", "table"))
    ap.add_argument("hypothesis", nargs="?", choices=("probe", "sweep", "flush", "forward"))
    ap.add_argument("--label", type=int, nargs="+", help="sweep/flush: these sweep labels (default LABELS)")
    ap.add_argument("--write", action="store_true", help="table: also write the tables into the page")
    args = ap.parse_args(argv)
    if args.what == "compute":
        if args.hypothesis is None:
            ap.error("compute needs a hypothesis: probe, sweep, flush or forward")
        compute(args.hypothesis, args.label)
        return 0
    print(tables())
    if args.write:
        write_docs()
    return 0


if __name__ == "__main__":
    sys.exit(main())

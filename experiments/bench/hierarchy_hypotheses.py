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
SQUARE = (13, 30, 40, 9, 26, 36)  # square-tiling launches spanning d = 64-256 and B = 36-138 (the faster ones)
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
    """Sweep configuration ``label`` (the square tiling's two launches, or flash2's forward) under ``policy`` on the H100 preset with
    ``machine_kw``: each launch's DRAM read, its writes during the kernel and the flush after it (bytes)."""
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

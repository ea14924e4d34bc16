"""The hierarchy against the H100's sweep launches, level by level: iosim's own numba.cuda kernels (flash2's forward,
the square tiling's two phases; float32, N = 2048, B·H = 8, 128 threads) as Nsight Compute measured them
(``experiments/bench/gpu_h100/ncu-sweep.json``, one row per kernel launch of the 41 configurations).

Every parameter comes from a stated source, none from the measurement:

* the launch: the label's algorithm, N, d, M and B·H (``ncu-sweep.json``), the tiles it ran with (``sweep.json``,
  ``tiling``), the grid (row block, b·h) with the row block fastest (``algorithms/cuda/flash.py``,
  ``job.launch(flash2_forward_kernel, (cdiv(N, Br), BH), ...)``; ``algorithms/cuda/square_tiling.py`` the same), so
  the hierarchy's ``head-grouped`` order; every array float32 (the kernels' arrays; ``iosim.hierarchy.lsu``);
* the device: the ``H100`` preset (``experiments/data/devices.csv``, each parameter with its source): 132 SMs,
  50 MiB of L2 in 2 partitions, 128-byte lines filled by 32-byte sectors (``sector_bytes="device"``);
* the partitions' address hash, which NVIDIA does not publish: lines alternate between the partitions in runs of
  ``HOME_LINES`` = 16 (the stated choice of ``hierarchy_h100.py``, the same here);
* resident CTAs: the CUDA occupancy of the kernel's resources on the H100 (``iosim.hierarchy.resident``): 128
  threads, the registers the H100's driver reported for it (``gpu_h100/occupancy.json``, ``NUM_REGS``; numba
  compiles one binary per kernel signature, so the figure is the same at every d and M), and the dynamic shared
  memory the launcher gives it at the label's tiles (float32 words of ``forward_layout`` /
  ``square_shared_words``, ``algorithms/cuda/_host.py``: ``launch`` passes ``words * 4`` bytes).

The levels, each as the metric it is compared with counts it:

* **LSU** (``l1tex__t_bytes_pipe_lsu_mem_global_op_ld/st``): the sector model of ``iosim.hierarchy.lsu`` (exact on
  every launch, docs/hierarchy-hardware.md), beside the hierarchy's own L2 requests (the two-level words x 4 bytes);
* **L2** (``lts__t_sectors_op_read/write`` x 32): the hierarchy's reads that reach the L2 plus the reads that cross
  between the partitions (the H100's ``lts__t_sectors_op_*`` counts a read that misses its near partition there and
  again at the line's home: ``fabric``), and its stores;
* **DRAM** (``dram__bytes_read/write``): the hierarchy's fills and its write-backs *during* each kernel.

Two things the measurement has that the hierarchy does not, reported apart and not folded in: flash2's block mask
(one Tr x Tc int64 array for every head, read by each CTA: ``algorithms/cuda/flash.py``, ``blocks = np.ones(shape,
np.int64)``; bracketed between one read of it and one per head), and Nsight Compute's cache flush before every
kernel (``--cache-control all``), where the hierarchy keeps the L2 across the square tiling's two launches.

Run: ``python experiments/bench/hierarchy_h100_sweep.py compute [--label ...]`` (all 41 configurations, or some,
merged into ``gpu_h100/hierarchy-sweep.json`` after each: 58 minutes of wall time on the 2-core machine under load,
each run's seconds stored with it; the longest are the square tiling at B = 8 and 12 and flash2 at Br = Bc = 1, 6 to
9 minutes each), ``... table [--write]`` (the docs table from the stored results).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import hierarchy_h100  # noqa: E402  (its HOME_LINES, its docs page)

NCU = HERE / "gpu_h100" / "ncu-sweep.json"
SWEEP = HERE / "gpu_h100" / "sweep.json"
OCCUPANCY = HERE / "gpu_h100" / "occupancy.json"
STORED = HERE / "gpu_h100" / "hierarchy-sweep.json"
DOC = hierarchy_h100.DOC
BLOCK = ("<!-- hierarchy-h100-sweep -->", "<!-- /hierarchy-h100-sweep -->")
HOME_LINES = hierarchy_h100.HOME_LINES
THREADS = 128  # sweep.json "threads": every launch of the sweep
WORD = 4  # float32
SECTOR = 32  # bytes per sector (Nsight Compute Kernel Profiling Guide, Memory Tables)
MB = 1e6
# phase 1 of the square tiling reads Q, K and stores S, L; phase 2 reads L, S, V and stores O (square_tiling.py)
PHASE = {"square_phase1_kernel": ("Q", "K"), "square_phase2_kernel": ("L", "S", "V")}
HIERARCHY_LAUNCH = {"flash2_forward_kernel": "flash2 forward", "square_phase1_kernel": "phase 1 (S, L)",
                    "square_phase2_kernel": "phase 2 (O)"}  # fmt: skip


def predict(problem, schedule, device: str, M: int | None = None, kernel=None, element_bytes: str = "kernel"):  # noqa: N803
    """THE call of ``iosim.hierarchy`` in this file and in ``hierarchy_fig2.py``: ``problem`` and ``schedule`` (an
    ``iosim.Schedule``) on the ``device`` preset with its L2 partitions (lines homed in runs of ``HOME_LINES``) and
    its sectors, each array at its kernel dtype (``element_bytes="uniform"``: every array at the problem's K/V
    dtype), ``M`` words of shared memory per CTA (None: the device's largest
    per block) and the blocks per SM from ``kernel``'s resources (a dict of threads, registers, smem_bytes, or an
    FA2 kernel name; None: from M). The device keywords live here only."""
    from iosim.hierarchy import Machine, hierarchy

    machine = Machine(device, partitions="device", home_lines=HOME_LINES, sector_bytes="device", kernel=kernel)
    return hierarchy(problem, schedule, machine, M=M, element_bytes=element_bytes, allow_long=True)


def _json(path: pathlib.Path) -> dict:
    return json.loads(path.read_text())


def registers(kernel: str) -> int:
    """The H100 driver's NUM_REGS for ``kernel`` (occupancy.json); one figure at every (d, M) or it raises."""
    regs = {r["driver"]["NUM_REGS"] for r in _json(OCCUPANCY)["rows"] if r["kernel"] == kernel}
    if len(regs) != 1:
        raise ValueError(f"{kernel}: occupancy.json gives {sorted(regs)} registers, not one figure")
    return regs.pop()


def shared_bytes(algorithm: str, N: int, d: int, tiles: dict) -> int:  # noqa: N803
    """Dynamic shared memory the launcher gives the kernel at these tiles (words x 4, algorithms/cuda/_host.py)."""
    from iosim.algorithms.cuda import flash, square_tiling

    if algorithm == "flash2":
        return WORD * flash.forward_layout.host(N, d, tiles["Br"], tiles["Bc"], False)[-1]
    return WORD * square_tiling.square_shared_words(N, d, tiles["B"])


def configurations() -> list[dict]:
    """The 41 labels: algorithm, N, d, M, B·H, tiles (sweep.json), the kernels launched and their resources."""
    from iosim.hierarchy.lsu import _tiles
    from iosim.hierarchy.resident import resident_ctas

    ncu, sweep = _json(NCU), _json(SWEEP)
    tiling = {(r["kernel"], r["N"], r["d"], r["M"], r["BH"]): r["tiling"] for r in sweep["rows"]
              if "tiling" in r}  # fmt: skip
    out = []
    for label, lab in enumerate(ncu["labels"]):
        alg, N, d, M, BH = lab["kernel"], lab["N"], lab["d"], lab["M"], lab["BH"]  # noqa: N806
        tiles = _tiles(tiling[(alg, N, d, M, BH)])
        kernels = ["flash2_forward_kernel"] if alg == "flash2" else list(PHASE)
        smem = shared_bytes(alg, N, d, tiles)
        res = {k: dict(name=k, threads=THREADS, registers=registers(k), smem_bytes=smem) for k in kernels}
        blocks = {k: resident_ctas("H100", THREADS, r["registers"], smem)[0] for k, r in res.items()}
        out.append(dict(label=label, algorithm=alg, N=N, d=d, M=M, BH=BH, tiles=tiles, kernels=kernels,
                        resources=res, blocks_per_sm=blocks))  # fmt: skip
    return out


def run(cfg: dict) -> dict:
    """The hierarchy's prediction of one configuration, per kernel launch: L2 requests, fabric, stores, DRAM read
    and write during the kernel (bytes). The square tiling's two kernels run as one hierarchy call (its declared
    launches), with the blocks per SM of phase 1's resources (both phases' are listed; see :func:`table`)."""
    import iosim

    p = iosim.Problem(B=1, H_q=cfg["BH"], N=cfg["N"], d=cfg["d"], dtype_q="fp32")
    sched = iosim.Schedule(cfg["algorithm"], **cfg["tiles"])
    t0 = time.perf_counter()
    r = predict(p, sched, "H100", cfg["M"], cfg["resources"][cfg["kernels"][0]])
    during = {w["kernel"]: w["during_bytes"] for w in r.dram_writes}
    per = r.per_array
    launches = {}
    for k in cfg["kernels"]:
        reads = PHASE.get(k, tuple(per))  # flash2: one launch, every array
        writes = {"square_phase1_kernel": ("S", "L"), "square_phase2_kernel": ("O",)}.get(k, tuple(per))
        launches[k] = dict(
            two_level_load=sum(per[a].bytes("two_level_reads") for a in reads if a in per),
            l2_read=sum(per[a].bytes("l2_read") for a in reads if a in per),
            fabric=sum(per[a].bytes("fabric") for a in reads if a in per),
            l2_write=sum(per[a].bytes("l2_update") for a in writes if a in per),
            dram_read=sum(per[a].bytes("dram_read") for a in reads if a in per),
            dram_write=during[HIERARCHY_LAUNCH[k]],
        )
    return dict(label=cfg["label"], blocks_per_sm=r.blocks_per_sm, resident=r.resident, M=r.M,
                l2_partitions=r.l2_partitions, sector_bytes=r.sector_bytes, launches=launches,
                dram_read_total=r.level_bytes("dram_read"), seconds=round(time.perf_counter() - t0, 1))  # fmt: skip


def compute(labels=None, save: bool = False) -> dict:
    """Every configuration's prediction (or those of ``labels``), with the time each took; ``save``: merged into
    the stored file after each configuration (a long run loses little when stopped)."""
    from iosim.base.version import __version__

    out = {"iosim_version": __version__, "home_lines": HOME_LINES, "runs": {}}
    if save and STORED.exists():
        out["runs"] = _json(STORED)["runs"]
    for cfg in configurations():
        if labels is not None and cfg["label"] not in labels:
            continue
        got = run(cfg)
        out["runs"][str(cfg["label"])] = got
        if save:
            out["runs"] = dict(sorted(out["runs"].items(), key=lambda kv: int(kv[0])))
            STORED.write_text(json.dumps(out, indent=1) + "\n")
        print(f"label {cfg['label']} {cfg['algorithm']} d={cfg['d']} M={cfg['M']}: {got['seconds']} s",
              file=sys.stderr, flush=True)  # fmt: skip
    return out


def measured() -> dict:
    """{(label, kernel): bytes per level} of the stored Nsight launches: LSU load, L2 read and write (sectors x 32),
    DRAM read and write."""
    from iosim.hierarchy.lsu import KERNELS

    out = {}
    for x in _json(NCU)["launches"]:
        kernel = next(k for k in KERNELS if f"::{k}[" in x["kernel"])
        out[(x["label"], kernel)] = dict(
            lsu_load=x["l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum"],
            lsu_store=x["l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum"],
            l2_read=SECTOR * x["lts__t_sectors_op_read.sum"], l2_write=SECTOR * x["lts__t_sectors_op_write.sum"],
            dram_read=x["dram__bytes_read.sum"], dram_write=x["dram__bytes_write.sum"],
        )  # fmt: skip
    return out


def mask_bytes(cfg: dict) -> tuple[int, int]:
    """flash2's block mask (Tr x Tc int64, one array for every head): read once, or once per head (bytes)."""
    if cfg["algorithm"] != "flash2":
        return 0, 0
    n = -(-cfg["N"] // cfg["tiles"]["Br"]) * -(-cfg["N"] // cfg["tiles"]["Bc"]) * 8
    return n, n * cfg["BH"]


def rows(stored: dict | None = None) -> list[dict]:
    """One row per stored kernel launch: the configuration, the LSU model, the hierarchy's levels, the measured."""
    from iosim.hierarchy.lsu import compare

    stored = (stored or _json(STORED))["runs"]
    lsu = {(r["label"], r["kernel"]): r for r in compare(NCU, SWEEP)}
    meas = measured()
    out = []
    for cfg in configurations():
        got = stored.get(str(cfg["label"]))
        for k in cfg["kernels"]:
            m, p = meas[(cfg["label"], k)], None if got is None else got["launches"][k]
            out.append(dict(cfg=cfg, kernel=k, measured=m, predicted=p, lsu=lsu[(cfg["label"], k)],
                            blocks_per_sm=cfg["blocks_per_sm"][k], mask=mask_bytes(cfg),
                            phase1=None if got is None else got["launches"].get("square_phase1_kernel")))  # fmt: skip
    return out


def _mb(x) -> str:
    return "-" if x is None else f"{x / MB:,.1f}"


def _ratio(meas, pred) -> str:
    return "-" if not pred or meas is None else f"{meas / pred:.2f}"


def table(stored: dict | None = None) -> str:
    """The docs table: per kernel launch, each level's prediction beside its measurement (MB = 10^6 bytes; ratio =
    measured / iosim), then :func:`summary`."""
    from tabulate import tabulate

    body, rs = [], rows(stored)
    for r in rs:
        c, m, p, lsu = r["cfg"], r["measured"], r["predicted"] or {}, r["lsu"]
        tiles = ", ".join(f"{k}={v}" for k, v in c["tiles"].items())
        l2r = None if not p else p["l2_read"] + p["fabric"]
        lsu_cell = _mb(lsu["ld"]) + ("" if lsu["ld"] == m["lsu_load"] else " (differs)")
        body.append([c["label"], r["kernel"].removesuffix("_kernel"), c["d"], f"{c['M']:,}", tiles, r["blocks_per_sm"],
                     lsu_cell, _mb(p.get("two_level_load")), _mb(l2r), _mb(m["l2_read"]), _ratio(m["l2_read"], l2r),
                     _mb(p.get("l2_write")), _mb(m["l2_write"]), _ratio(m["l2_write"], p.get("l2_write")),
                     _mb(p.get("dram_read")), _mb(m["dram_read"]), _ratio(m["dram_read"], p.get("dram_read")),
                     "-" if not r["mask"][0] else f"{_mb(r['mask'][0])}-{_mb(r['mask'][1])}",
                     _mb(p.get("dram_write")), _mb(m["dram_write"]),
                     _ratio(m["dram_write"], p.get("dram_write"))])  # fmt: skip
    head = ["label", "kernel", "d", "M", "tiles", "CTAs/SM", "LSU load MB: model = measured", "two-level load MB",
            "L2 read MB: iosim (+ fabric)", "measured", "ratio", "L2 write MB: iosim", "measured", "ratio",
            "DRAM read MB: iosim", "measured", "ratio", "block mask MB (once-per head)",
            "DRAM write MB (during): iosim", "measured", "ratio"]  # fmt: skip
    return tabulate(body, headers=head, tablefmt="github", disable_numparse=True) + "\n\n" + summary(rs)


def _spread(xs: list[float]) -> str:
    import statistics

    if not xs:
        return "none computed"
    return f"median {statistics.median(xs):.2f}, range {min(xs):.2f}-{max(xs):.2f}"


def summary(rs: list[dict]) -> str:
    """Per kernel and level: how many launches were computed, the median and range of measured / iosim, and how
    many DRAM reads are within 15 %."""
    lines = []
    for k in HIERARCHY_LAUNCH:
        got = [r for r in rs if r["kernel"] == k and r["predicted"]]
        if not got:
            continue

        def ratios(level, extra="", got=got):
            return [r["measured"][level] / (r["predicted"][level] + (r["predicted"][extra] if extra else 0))
                    for r in got if r["predicted"][level]]  # fmt: skip

        dr = ratios("dram_read")
        within = sum(abs(x - 1) <= 0.15 for x in dr)
        lines.append(f"- {k.removesuffix('_kernel')}: {len(got)} of {sum(r['kernel'] == k for r in rs)} launches "
                     f"computed; measured / iosim, L2 read {_spread(ratios('l2_read', 'fabric'))}; L2 write "
                     f"{_spread(ratios('l2_write'))}; DRAM read {_spread(dr)} ({within} of {len(dr)} within 15 %); "
                     f"DRAM write during {_spread(ratios('dram_write'))}.")  # fmt: skip
    f2 = [r for r in rs if r["kernel"] == "flash2_forward_kernel" and r["predicted"]]
    inside = sum(r["predicted"]["dram_read"] + r["mask"][0] <= r["measured"]["dram_read"]
                 <= r["predicted"]["dram_read"] + r["mask"][1] for r in f2)  # fmt: skip
    once = [r["measured"]["dram_read"] / (r["predicted"]["dram_read"] + r["mask"][0]) for r in f2]
    lines.append(f"- flash2_forward's DRAM read with its block mask: measured between iosim + the mask read once and "
                 f"iosim + the mask read once per head on {inside} of {len(f2)} launches; measured / (iosim + the "
                 f"mask once) {_spread(once)} ({sum(abs(x - 1) <= 0.15 for x in once)} within 15 %).")  # fmt: skip
    for k in HIERARCHY_LAUNCH:
        m = [r["measured"] for r in rs if r["kernel"] == k]
        lines.append(f"- {k.removesuffix('_kernel')}, measured against measured (every launch): L2 read / LSU load "
                     f"{_spread([x['l2_read'] / x['lsu_load'] for x in m])}; L2 write / LSU store "
                     f"{_spread([x['l2_write'] / x['lsu_store'] for x in m])}.")  # fmt: skip
    adj = [x for x in map(_phase2_without_leftovers, rs) if x is not None]
    lines.append(
        f"- square_phase2's DRAM write during the kernel less phase 1's dirty lines left in the L2 "
        f"(which Nsight Compute's flush writes back between the kernels): measured / iosim {_spread(adj)}."
    )
    lsu_exact = sum(r["lsu"]["ld"] == r["measured"]["lsu_load"] for r in rs)
    lines.append(f"- LSU: the sector model equals the measured load bytes on {lsu_exact} of {len(rs)} launches.")
    return "\n".join(lines)


def _phase2_without_leftovers(r: dict) -> float | None:
    """measured / (iosim's phase 2 write-backs during the kernel less phase 1's stores still dirty at its end, which
    the hierarchy writes back during phase 2 and Nsight Compute's flush before phase 2 writes back uncounted)."""
    if r["kernel"] != "square_phase2_kernel" or not r["predicted"]:
        return None
    p1 = r["phase1"]
    own = r["predicted"]["dram_write"] - (p1["l2_write"] - p1["dram_write"])
    return r["measured"]["dram_write"] / own if own > 0 else None


def write_docs() -> None:
    """Put :func:`table` between the doc's sweep markers."""
    hierarchy_h100.write_block(table(), BLOCK)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("compute", "table"))
    ap.add_argument("--label", type=int, nargs="+", help="compute only these labels (merged into the stored file)")
    ap.add_argument("--write", action="store_true", help="table: also write it into docs/hierarchy-hardware.md")
    args = ap.parse_args(argv)
    if args.what == "compute":
        compute(args.label, save=True)
        print(f"wrote {STORED}")
    else:
        print(table())
        if args.write:
            write_docs()
            print(f"wrote the table into {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The predictions registered for the next H200 lease, designed to tell apart what the causal forward's gap could be
(docs/hierarchy-hardware.md, "The causal forward's gap, hypothesis by hypothesis"): FlashAttention-2's forward as
PyTorch's SDPA launches it (fp16, B = 1, H = 32, d = 128, Br = 128, Bc = 64), causal and not, at N = 8,192, 16,384
and 32,768, on the H200 preset with every mechanism of the H100 page and the resident CTAs its binary gives (255
registers per thread: 2 CTAs per SM, gpu_h100/fa2-resources.json).

What they tell apart. The model's L2 is LRU: a causal forward whose K_j, V_j come back before the two partitions
evict them reads them once. On the H200 preset it does at all three N (the registered DRAM reads are the compulsory
bytes, Q, K and V once, to 1.3 %), where the H200 measured 3.22 times that at N = 32,768. An L2 that is not LRU (the
H200's probe read a buffer 1.60 times at 64 MiB where LRU reads it twice and random replacement 1.11 times, and
already 1.05 and 1.26 times at 48 and 56 MiB, below the capacity: docs/hierarchy-hypotheses.md) misses before the
capacity: if that is the mechanism, the excess shows at the smaller N too, growing with N, where the model stays at
the compulsory bytes. The non-causal launches, which the model predicts within 6 % at N = 32,768,
are the control. The alternatives are the far-copy placements (``Machine(far_copy=...)``), as in
predictions/h200.json.

Nothing is fitted: the parameters are the H200 preset's (experiments/data/devices.csv), the kernel's (tiles, threads,
shared memory from its name; registers from its binary), and the model's stated choice of the partitions' hash
(``hierarchy_h100.HOME_LINES``).

Run: ``python experiments/bench/hierarchy_next.py predictions`` (about 3 minutes on 2 cores; refuses to write over a
registered file), ``... show`` (the registered figures as a table). The next lease measures the file unchanged:
``PREDICTIONS=experiments/bench/predictions/h200-next.json PARTS="predictions" bash experiments/bench/gpu_evidence.sh``.
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
import hierarchy_causal as hc  # noqa: E402
import hierarchy_h100 as h100  # noqa: E402

PREDICTIONS = HERE / "predictions" / "h200-next.json"
DEVICE = "H200"
SIZES = (8192, 16384, 32768)
VARIANTS = ("both", "near", "home", "shared")  # iosim.hierarchy.l2, "Where a far-homed line is kept"; both first
KEEP = ("dram_read", "dram_write", "global_load", "global_store", "l2_read_from_fabric")


def run(N: int, causal: bool, far_copy: str):  # noqa: N803
    """The hierarchy's prediction of one launch (module docstring): the causal-gap experiment's source model on the
    H200 preset (hierarchy_causal.run) at this N and far-copy placement."""
    return hc.run(hc.Variant(f"next-N{N}", "-", "the next lease's prediction", "-", device=DEVICE, causal=causal,
                             far_copy=far_copy, N=N))  # fmt: skip


def entry(N: int, causal: bool) -> dict:  # noqa: N803
    """One registered entry: the model as built (far_copy=both) and each other placement as an alternative."""
    got = {}
    for v in VARIANTS:
        r = run(N, causal, v)
        levels = h100.levels(r)
        got[v] = {k: int(levels[k]) for k in KEEP if levels.get(k)}
        assert r.blocks_per_sm == 2, r.resident  # the binary's registers: 2 CTAs per SM on the H200 too
        print(f"N={N} causal={causal} far_copy={v}: DRAM read {levels['dram_read'] / 1e6:,.1f} MB", file=sys.stderr)
    kind = "causal " if causal else ""
    return {
        "id": f"fa2-fwd-{'causal-' if causal else ''}N{N}",
        "what": f"SDPA FlashAttention-2 {kind}forward at N = {N:,}, H = 32, d = 128, fp16 on the H200 preset, every "
        "mechanism, 2 CTAs/SM (255 registers, from the binary)",
        "backend": "sdpa-flash", "B": 1, "H_q": 32, "H_kv": 32, "N_q": N, "N_k": N, "d": 128, "causal": causal,
        "dtype": "float16", "order": "head-grouped", "pass": "forward", "blocks_per_sm": 2,
        "model": "far_copy=both", "predicted": got["both"],
        "alternatives": {f"far_copy={v}": got[v] for v in VARIANTS[1:]},
    }  # fmt: skip


def predictions() -> dict:
    from iosim.base.version import __version__

    entries = [entry(n, c) for c in (True, False) for n in SIZES]
    for e in entries:
        gpu_predictions.check(e)
    return {"device": "H200 (132 SMs, 60 MiB L2: the driver's, experiments/bench/gpu_h200/env.json)",
            "iosim_version": __version__, "registered": time.strftime("%Y-%m-%d"),
            "note": "registered before the lease that measures it; not to be refitted. The causal forward at three "
                    "N against the model's LRU cliff (hierarchy_next.py's docstring); the non-causal as the control.",
            "entries": entries}  # fmt: skip


def show(path: pathlib.Path = PREDICTIONS) -> str:
    """The registered DRAM reads per launch and placement (MB), and the compulsory bytes (Q, K, V read once)."""
    from tabulate import tabulate

    rows = []
    for e in json.loads(path.read_text())["entries"]:
        compulsory = 3 * e["B"] * e["H_q"] * e["N_q"] * e["d"] * 2
        alts = [e["alternatives"][f"far_copy={v}"]["dram_read"] / 1e6 for v in VARIANTS[1:]]
        rows.append([e["id"], compulsory / 1e6, e["predicted"]["dram_read"] / 1e6, *alts,
                     e["predicted"]["dram_read"] / compulsory])  # fmt: skip
    head = ["launch", "Q, K, V once MB", "DRAM read MB (both)", *(f"{v} MB" for v in VARIANTS[1:]), "both / once"]
    return tabulate(rows, head, tablefmt="github", floatfmt=(",.1f",) * 6 + (".3f",))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("predictions", "show"))
    ap.add_argument("--force", action="store_true", help="predictions: write over the registered file")
    args = ap.parse_args(argv)
    if args.what == "show":
        print(show())
        return 0
    if gpu_predictions.registered(PREDICTIONS, args.force):
        return 2
    data = predictions()
    PREDICTIONS.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {PREDICTIONS} ({len(data['entries'])} entries)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

# ruff: noqa: N999 - numbered experiment scripts, loaded by file or by importlib
"""Experiment 14: a shared L2 in front of DRAM: the DRAM traffic of a launch against the two-level count.

Question (the reviewers of the fine-grained paper, Li et al. arXiv 2410.09397): "the slow memory of a real GPU is
an L2 cache, not HBM: are the theorems still applicable, and how does the model map onto real GPU architectures?"
:func:`iosim.hierarchy` runs each launch (the schedule cut into thread blocks at its outer loop, B x H heads)
over the SMs of a device preset (A100: 108 SMs, 40 MB L2; H100: 132 SMs, 50 MB L2; 128-byte lines, fp16 words),
the blocks' tile requests interleaved by the clock model into an LRU L2, and reports DRAM words over the two-level
count (the theorems' quantity) and over the compulsory traffic (every word once).

Grid: (1) FlashAttention-2 forward, d in {64, 128, 256}, N from 1k to 64k, batch x heads from 1 to 128, each block
order (grid = heads fastest, head-grouped = FlashAttention-2's launch, swizzled), M = the device's shared memory
per block; the backward at d = 128 up to N = 16k; points over ``max_requests`` tile requests are skipped (listed).
(2) GQA: 32 query heads on 8 KV heads, each order. (3) The small-cache regime: d = 256, M = 16,384 words (32 KB,
below d^2 = 65,536), square tiling against flash2 at the same M, head-grouped.

Run: ``iosim experiments run hierarchy`` (``--quick``: N up to 4k, two batch sizes).
"""

from __future__ import annotations

from iosim.experiments import runner
from iosim.experiments._common import Verdict

from iosim.hierarchy import ORDERS, Scheduler, hierarchy

NAME = "hierarchy"
TITLE = "A shared L2 in front of DRAM: DRAM traffic vs the two-level count, per block order"
CLAIM = (
    "Reviewers of Li et al.: the slow memory of a GPU is an L2, not HBM; do the two-level theorems still describe "
    "the DRAM traffic, and which block order should a kernel use?"
)
DEVICES = ("A100", "H100")

FULL = {
    "Ns": [1024, 4096, 16384, 65536],
    "ds": [64, 128, 256],
    "heads": [1, 8, 32, 128],
    "backward_N": 16384,
    "max_requests": 60_000_000,
    "square_Ns": [1024, 2048, 4096],
}
QUICK = {
    "Ns": [1024, 4096],
    "ds": [128],
    "heads": [1, 32],
    "backward_N": 1024,
    "max_requests": 2_000_000,
    "square_Ns": [512, 1024],
}


def _requests(N, d, heads, M, backward):  # noqa: N803
    """Tile requests of a flash2 launch, roughly (to skip points over the budget before running them)."""
    b = max(int((M / 3) ** 0.5), 1) if not backward else max(int((M / 6) ** 0.5), 1)
    t = -(-N // b)
    return heads * t * t * (6 if backward else 2)


def _row(r, part, order, dev):
    return {
        "part": part,
        "device": dev,
        "algorithm": r.algorithm,
        "pass": "backward" if r.backward else "forward",
        "order": order,
        "N": r.N,
        "d": r.d,
        "M": r.M,
        "B": r.B,
        "H_q": r.H_q,
        "H_kv": r.H_kv,
        "heads": r.B * r.H_q,
        "ctas": r.ctas,
        "waves": sum(r.waves),
        "two_level": r.two_level,
        "dram": r.dram,
        "compulsory": r.compulsory,
        "dram_over_two_level": r.ratio,
        "dram_over_compulsory": r.dram / r.compulsory,
        "kv_dram_over_kv_compulsory": _kv(r),
        "dram_GB": r.dram_bytes / 1e9,
        "seconds": r.seconds,
    }


def _kv(r):
    kv = [r.per_array[n] for n in ("K", "V") if n in r.per_array]
    comp = sum(c.compulsory for c in kv)
    return sum(c.dram for c in kv) / comp if comp else float("nan")


def measure(g) -> list[dict]:
    rows = []
    for dev in DEVICES:
        for d in g.ds:
            for N in g.Ns:  # noqa: N806
                for heads in g.heads:
                    if _requests(N, d, heads, 100_000, False) > g.max_requests:
                        g.skipped.append(f"{dev} flash2 forward N={N} d={d} heads={heads}: over the request budget")
                        continue
                    for order in ORDERS[:2]:  # swizzled = head-grouped without GQA
                        r = hierarchy("flash2", N=N, d=d, H_q=heads, device=dev, scheduler=Scheduler(order=order),
                                      allow_long=True)  # fmt: skip
                        rows.append(_row(r, "mha", order, dev))
                    if d == 128 and N <= g.backward_N:
                        for order in ORDERS[:2]:
                            r = hierarchy("flash2", N=N, d=d, H_q=heads, device=dev, scheduler=Scheduler(order=order),
                                          backward=True, allow_long=True)  # fmt: skip
                            rows.append(_row(r, "mha", order, dev))
        for N in g.Ns:  # noqa: N806
            for B in (1, 4):  # noqa: N806
                if _requests(N, 128, 32 * B, 100_000, False) > g.max_requests:
                    g.skipped.append(f"{dev} GQA N={N} B={B}: over the request budget")
                    continue
                for order in ORDERS:
                    r = hierarchy("flash2", N=N, d=128, B=B, H_q=32, H_kv=8, device=dev,
                                  scheduler=Scheduler(order=order), allow_long=True)  # fmt: skip
                    rows.append(_row(r, "gqa", order, dev))
        for N in g.square_Ns:  # noqa: N806
            for heads in (1, 8):
                for alg in ("flash2", "square-tiling"):
                    r = hierarchy(alg, N=N, d=256, M=16384, H_q=heads, device=dev, allow_long=True)  # head-grouped
                    rows.append(_row(r, "small-cache", "head-grouped", dev))
    return rows


def _pick(rows, **kw):
    return [x for x in rows if all(x[k] == v for k, v in kw.items())]


def verdict(rows, g) -> runner.Summary:
    table = []
    mha = [x for x in rows if x["part"] == "mha" and x["pass"] == "forward"]
    for dev in DEVICES:
        for d in g.ds:
            for N in g.Ns:  # noqa: N806
                for heads in g.heads:
                    pts = {x["order"]: x for x in _pick(mha, device=dev, d=d, N=N, heads=heads)}
                    if len(pts) < 2:
                        continue
                    hg, gr = pts["head-grouped"], pts["grid"]
                    table.append(
                        [dev, "flash2 fwd", str(d), f"{N:,}", str(heads), f"{hg['dram_over_two_level']:.4f}",
                         f"{hg['dram_over_compulsory']:.2f}", f"{gr['dram_over_two_level']:.4f}",
                         f"{gr['dram_over_compulsory']:.2f}", f"{hg['dram_GB']:.3f}"]
                    )  # fmt: skip
    # where the L2 stops absorbing the K/V re-reads: the first (N, heads) at which DRAM exceeds 1.5 x compulsory
    notes = []
    worst_hg = max((x for x in mha if x["order"] == "head-grouped"), key=lambda x: x["dram_over_compulsory"])
    worst_gr = max((x for x in mha if x["order"] == "grid"), key=lambda x: x["dram_over_compulsory"])
    for dev in DEVICES:
        for order in ("grid", "head-grouped"):
            bad = sorted(
                (x for x in mha if x["device"] == dev and x["order"] == order and x["d"] == 128
                 and x["kv_dram_over_kv_compulsory"] > 1.5),
                key=lambda x: (x["N"] * x["heads"], x["N"]),
            )  # fmt: skip
            if bad:
                b = bad[0]
                notes.append(
                    f"{dev}, {order}, d = 128: the L2 stops absorbing the K/V re-reads (K/V DRAM > 1.5 x compulsory) "
                    f"first at N = {b['N']:,}, batch x heads = {b['heads']} (K/V {b['kv_dram_over_kv_compulsory']:.1f}"
                    f" x compulsory; the heads' K/V: {2 * b['N'] * 128 * 2 * b['heads'] / 2**20:.0f} MiB)."
                )
            else:
                notes.append(f"{dev}, {order}, d = 128: K/V DRAM stays within 1.5 x compulsory on the whole grid.")
    gqa = _pick(rows, part="gqa")
    for dev in DEVICES:
        for N in g.Ns:  # noqa: N806
            pts = {x["order"]: x for x in _pick(gqa, device=dev, N=N, B=4)} or {
                x["order"]: x for x in _pick(gqa, device=dev, N=N, B=1)
            }
            if len(pts) == 3:
                notes.append(
                    f"GQA {dev} N = {N:,} (32 query heads on 8 KV heads, batch {next(iter(pts.values()))['B']}): "
                    + ", ".join(f"{o} {pts[o]['dram_over_compulsory']:.2f}" for o in ORDERS)
                    + " x compulsory."
                )
    sq = _pick(rows, part="small-cache")
    for dev in DEVICES:
        for N in g.square_Ns:  # noqa: N806
            for heads in (1, 8):
                f2 = _pick(sq, device=dev, N=N, heads=heads, algorithm="flash2")
                st = _pick(sq, device=dev, N=N, heads=heads, algorithm="square-tiling")
                if f2 and st:
                    f2, st = f2[0], st[0]
                    notes.append(
                        f"Small cache ({dev}, d = 256, M = 16,384 < d^2, N = {N:,}, heads {heads}): square tiling / "
                        f"flash2 = {st['two_level'] / f2['two_level']:.3f} in the two-level count, "
                        f"{st['dram'] / f2['dram']:.3f} in DRAM words."
                    )
    notes.append(
        f"Worst head-grouped point: {worst_hg['device']} d = {worst_hg['d']} N = {worst_hg['N']:,} heads "
        f"{worst_hg['heads']}: {worst_hg['dram_over_compulsory']:.2f} x compulsory; worst grid-order point: "
        f"{worst_gr['device']} d = {worst_gr['d']} N = {worst_gr['N']:,} heads {worst_gr['heads']}: "
        f"{worst_gr['dram_over_compulsory']:.2f} x compulsory."
    )
    notes.append(
        "Model limits: a fully associative LRU L2 (the real one is set-associative, hashed and on H100 split in two "
        "partitions), CTAs in lockstep (each advances by the words it moves, compute takes no time), write-back "
        "with write-validate; see README, 'A shared L2 in front of DRAM'."
    )
    hg_all = [x["dram_over_two_level"] for x in mha if x["order"] == "head-grouped"]
    v = Verdict(
        NAME,
        CLAIM,
        measured=(
            f"flash2 forward, FlashAttention-2's head-grouped order: DRAM words are {min(hg_all):.4f}-"
            f"{max(hg_all):.3f} of the two-level count, at most {worst_hg['dram_over_compulsory']:.2f} x the "
            f"compulsory traffic; heads-fastest grid order up to {worst_gr['dram_over_compulsory']:.1f} x"
        ),
        figure=f"worst DRAM / compulsory: head-grouped {worst_hg['dram_over_compulsory']:.2f}, grid "
        f"{worst_gr['dram_over_compulsory']:.2f}",
        holds=None,
        notes=notes,
    )
    headers = ["device", "pass", "d", "N", "B x H", "DRAM/2-level (head-grouped)", "DRAM/compulsory (head-grouped)",
               "DRAM/2-level (grid)", "DRAM/compulsory (grid)", "DRAM GB (head-grouped)"]  # fmt: skip
    return runner.Summary(v, table, headers)


def plot(rows, g):
    import matplotlib.pyplot as plt

    d = 128 if 128 in g.ds else g.ds[0]
    fig, axes = plt.subplots(1, len(DEVICES), figsize=(5.5 * len(DEVICES), 4.2), sharey=True)
    colours = dict(zip(g.heads, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"), strict=False))
    for ax, dev in zip(axes, DEVICES, strict=True):
        for order, ls, mk in (("head-grouped", "-", "o"), ("grid", "--", "x")):
            for heads in g.heads:
                sel = sorted(
                    (x for x in rows if x["part"] == "mha" and x["pass"] == "forward" and x["device"] == dev
                     and x["d"] == d and x["order"] == order and x["heads"] == heads),
                    key=lambda x: x["N"],
                )  # fmt: skip
                if sel:
                    ax.plot([x["N"] for x in sel], [x["dram_over_compulsory"] for x in sel], ls=ls, marker=mk,
                            color=colours[heads], label=f"{order}, B x H = {heads}")  # fmt: skip
        ax.axhline(1, color="k", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("N")
        ax.set_title(f"{dev}: flash2 forward, d = {d}, LRU L2")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("DRAM words / compulsory words")
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    return fig


main = runner.script(globals())  # python experiments/NN_x.py [--quick] [--out DIR]

if __name__ == "__main__":
    raise SystemExit(main())

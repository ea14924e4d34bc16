# ruff: noqa: N999 - numbered experiment scripts, loaded by file or by importlib
"""Experiment 06: sparse attention, block-sparse FlashAttention (Proposition 4) and the pattern effect.

Claims. FlashAttention Proposition 4 (Dao et al., NeurIPS 2022): block-sparse FlashAttention makes
Theta(Nd + N^2 d^2 s / M) HBM accesses, s the fraction of nonzero blocks, so the I/O above the Nd floor scales as
s^1. The fine-grained paper's reviewers asked whether the sparsity *pattern*, not only the number of nonzeros,
changes the I/O: at equal nnz a block-aligned pattern should save in proportion and random element sparsity
almost nothing (nearly every tile is partial, so nearly no tile is skipped).

Run: ``iosim experiments run sparse`` (or ``python experiments/06_sparse.py``); count-only, ``fit`` tiling, forward,
exact to the word (every run is checked against its closed form in iosim.theory.io_model). N = 4096 (quick: 1024),
d = 64, M = d^2 / 2 (small cache) and 8 d^2 (large cache); densities s = 1/2 .. 1/64 for five patterns:

* ``window``: sliding window of width w with (2w - 1) / N = s (local attention);
* ``blockdiag``: 1/s documents of N s tokens each;
* ``random-blocks``: FlashAttention's test masks, blocks of 16 rows x 256 columns kept at density s;
* ``dilated``: a window with dilation 8 (structured, but it touches 8x as many tiles as its nnz needs);
* ``random``: each score kept independently with probability s.

Algorithms: flash2 (policy skip), flash1 (paper and skip) and masked square tiling, against the provisional nnz
lower bound of docs/theory.md L6, min{Z_in^2 / M, Z_in sqrt(Z_QK / M)} with Z_in = Nd, Z_QK = nnz. The Prop. 4 fit is
the least-squares fit of I/O = a Nd + b N^2 d^2 s / M over the block-aligned patterns (window, blockdiag,
random-blocks), s = s_tiles measured on the algorithm's own tiling: Prop. 4 holds when the I/O is affine in s
(R^2 >= 0.99) with an Nd-sized intercept a; ``floor`` in the CSV is the same algorithm's exact I/O under a mask
that allows nothing (writing O and L, the initialisation writes and, policy ``paper``, the outer-loop loads).
"""

from __future__ import annotations

import math

from iosim.experiments import runner
from iosim.experiments._common import Verdict

NAME = "sparse"
TITLE = "Sparse attention: Proposition 4's scaling in s and the pattern effect"
CLAIM = (
    "FlashAttention Prop. 4: block-sparse FlashAttention makes Theta(Nd + N^2 d^2 s / M) accesses (affine in s, "
    "the fraction of nonzero blocks); at equal nnz, block-aligned patterns save in proportion, random element "
    "sparsity almost nothing."
)
R2 = 0.99  # the affine fit in s must explain this much of the variance
RUNS = (("flash2", "skip"), ("flash1", "paper"), ("flash1", "skip"), ("square-tiling", "paper"))
PATTERNS = ("window", "blockdiag", "random-blocks", "dilated", "random")
ALIGNED = ("window", "blockdiag", "random-blocks")
DILATION = 8
DENSITIES = [2.0**-k for k in range(1, 7)]
FULL = {"N": 4096, "d": 64}  # M = d^2 / 2 (small cache) and 8 d^2 (large cache)
QUICK = {"N": 1024, "d": 64}


def _mask(pattern: str, s: float, N: int):
    from iosim.masking import masks

    if pattern == "window":
        return masks.SlidingWindow(max(1, round((s * N + 1) / 2)))
    if pattern == "blockdiag":
        L = max(1, round(s * N))
        return masks.BlockDiagonal((L,) * (N // L) + ((N % L,) if N % L else ()))
    if pattern == "random-blocks":
        return masks.RandomBlocks(s, (16, 256), seed=1)
    if pattern == "dilated":
        return masks.Dilated(max(1, round((s * N * DILATION + 1) / 2 / DILATION)), DILATION)
    return masks.RandomElements(s, seed=1)


def _Ms(d: int) -> tuple[int, int]:
    return d * d // 2, 8 * d * d


def measure(g) -> list[dict]:
    import numpy as np

    import iosim
    from iosim.masking import masks
    from iosim.theory import bounds
    from iosim.theory.io_model import tile_sums

    N, d, Ms, densities = g.N, g.d, _Ms(g.d), DENSITIES
    rows = []
    dense = {
        (a, M): iosim.run(a, N=N, d=d, M=M, count_only=True).stats.total for a, _ in RUNS for M in Ms
    }  # fmt: skip
    nothing = masks.FromBlocks(np.zeros((1, 1), bool), (N, N)).compile(N)
    floor = {
        (a, p, M): iosim.run(iosim.Schedule(a, kv_policy=p), N=N, d=d, M=M, mask=nothing, count_only=True).stats.total
        for a, p in RUNS
        for M in Ms
    }
    for pattern in PATTERNS:
        for s in densities:
            spec = _mask(pattern, s, N)
            compiled = spec.compile(N)
            nnz = compiled.nnz()
            for M in Ms:
                lb, switch = bounds.sparse_lower_bound(N, d, M, nnz)
                for algo, policy in RUNS:
                    r = iosim.run(iosim.Schedule(algo, kv_policy=policy), N=N, d=d, M=M, mask=compiled, count_only=True)
                    t = r.tiling
                    Br, Bc = (t.Br, t.Bc) if t.Br else (t.B, t.B)
                    ts = tile_sums(N, Br, Bc, compiled)
                    s_tiles = ts.tiles / (math.ceil(N / Br) * math.ceil(N / Bc))
                    total = r.stats.total
                    rows.append(
                        {
                            "pattern": pattern,
                            "mask": compiled.label,
                            "s_nominal": s,
                            "nnz_density": nnz / (N * N),
                            "algorithm": algo,
                            "kv_policy": policy,
                            "N": N,
                            "d": d,
                            "M": M,
                            "M_over_d2": M / (d * d),
                            "tiling": str(t),
                            "s_tiles": s_tiles,
                            "partial_tiles": ts.tiles - ts.full,
                            "reads": r.stats.reads,
                            "writes": r.stats.writes,
                            "total": total,
                            "over_dense": total / dense[(algo, M)],
                            "floor": floor[(algo, policy, M)],
                            "nnz_lower_bound": lb,
                            "lb_switch_M": switch,
                            "over_lb": total / lb,
                            "prop4": N * d + N * N * d * d * s_tiles / M,
                            "exact": r.main.exact,
                        }
                    )
    return rows


def verdict(rows, g) -> runner.Summary:
    N, d, Ms = g.N, g.d, _Ms(g.d)
    table, fits = [], {}
    for algo, policy in RUNS:
        for M in Ms:
            sel = [
                r for r in rows
                if r["algorithm"] == algo and r["kv_policy"] == policy and r["M"] == M and r["pattern"] in ALIGNED
            ]  # fmt: skip
            f = _affine([r["s_tiles"] for r in sel], [r["total"] for r in sel], N * d, N * N * d * d / M)
            fits[(algo, policy, M)] = f
            table.append(
                [f"{algo} ({policy})", f"{M / (d * d):g} d^2", "block-aligned", len(sel), "a Nd + b N^2d^2 s/M",
                 f"a = {f[0]:.2f}, b = {f[1]:.2f}, R^2 = {f[2]:.5f}", "yes" if f[2] >= R2 else "no"]
            )  # fmt: skip
    # the pattern effect at equal density s = 1/8: I/O relative to dense attention, flash2 (skip), large cache
    s_eq, M_hi = 1 / 8, Ms[1]
    effect = {r["pattern"]: r for r in rows if r["algorithm"] == "flash2" and r["M"] == M_hi and r["s_nominal"] == s_eq}
    for p in PATTERNS:
        r = effect[p]
        table.append(
            [f"flash2 (skip), {p}", f"{M_hi // (d * d)} d^2", f"nnz {r['nnz_density']:.3f}", 1,
             "-", f"s_tiles {r['s_tiles']:.3f}, I/O {r['over_dense']:.3f} of dense", "-"]
        )  # fmt: skip
    flash_fits = [fits[(a, p, Ms[1])] for a, p in RUNS if a.startswith("flash")]
    holds_prop4 = all(f[2] >= R2 for f in flash_fits)
    aligned_save = max(effect[p]["over_dense"] for p in ("window", "blockdiag"))
    random_save = effect["random"]["over_dense"]
    holds = holds_prop4 and random_save > 0.9 and aligned_save < 0.4
    inexact = sum(not r["exact"] for r in rows)
    v = Verdict(
        NAME,
        CLAIM,
        measured=(
            "I/O = a Nd + b N^2 d^2 s / M at M = 8 d^2: "
            + ", ".join(f"{a} ({p}) a {fits[(a, p, Ms[1])][0]:.2f}, b {fits[(a, p, Ms[1])][1]:.2f}" for a, p in RUNS)
            + f"; at nnz density 1/8 flash2 moves {random_save:.2f} of dense I/O with random element sparsity, "
            + ", ".join(f"{effect[p]['over_dense']:.2f} ({p})" for p in PATTERNS if p != "random")
        ),
        figure="R^2 of the affine fit in s: "
        + ", ".join(f"{a} ({p}) {fits[(a, p, Ms[1])][2]:.4f}" for a, p in RUNS if a.startswith("flash")),
        holds=holds,
    )
    skip_gain = [
        r1["total"] - r2["total"]
        for r1 in rows
        for r2 in rows
        if r1["algorithm"] == r2["algorithm"] == "flash1" and r1["kv_policy"] == "paper" and r2["kv_policy"] == "skip"
        and r1["mask"] == r2["mask"] and r1["M"] == r2["M"]
    ]  # fmt: skip
    v.notes.append(
        f"flash1 paper vs skip (K_j, V_j of all-empty column blocks): the policies differ by at most "
        f"{max(skip_gain):,} words here (at most 2Nd = {2 * N * d:,}), on masks with all-empty column blocks "
        "(random blocks at low density); Prop. 4's Nd term absorbs it."
    )
    small = {f"{a} ({p})": fits[(a, p, Ms[0])] for a, p in RUNS}
    v.notes.append(
        f"Small cache (M = d^2/2): R^2 {', '.join(f'{k} {f[2]:.4f}' for k, f in small.items())}; "
        "square tiling's skipped tiles make it a sparse small-cache algorithm, ratio to the nnz bound in the CSV."
    )
    v.notes.append(
        "Dilated windows have the nnz of a window but touch DILATION times as many tiles, and random element "
        "sparsity leaves almost every tile partial: the pattern, not the nnz, decides the I/O."
    )
    v.notes.append(
        "The nnz lower bound (docs/theory.md L6) is provisional (the fine-grained paper's sparse theorem was not "
        "readable); its regime switches at M = Z_in^2 / Z_QK, which is d^2 for dense masks."
    )
    v.notes.append(f"{len(rows)} runs, {inexact} differing from their closed form in iosim.theory.io_model.")
    headers = ["algorithm / pattern", "M", "points", "n", "claimed", "least-squares fit / measured", "holds"]
    return runner.Summary(v, table, headers)


def _affine(s, total, Nd: float, unit: float) -> tuple[float, float, float]:
    """Least squares total = a Nd + b unit s: (a, b, R^2)."""
    import numpy as np

    x, y = np.asarray(s, float), np.asarray(total, float)
    b, a = np.polyfit(x, y, 1)
    r2 = 1 - float(np.sum((y - (a + b * x)) ** 2)) / float(np.sum((y - y.mean()) ** 2))
    return a / Nd, b / unit, r2


def plot(rows, g):
    import matplotlib.pyplot as plt

    d, Ms = g.d, _Ms(g.d)
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    colors = dict(zip(PATTERNS, ("tab:blue", "tab:green", "tab:orange", "tab:purple", "tab:red"), strict=True))
    for row, M in enumerate(Ms):
        ax = axes[row, 0]
        for p in PATTERNS:
            sel = sorted(
                (r for r in rows if r["pattern"] == p and r["M"] == M and r["algorithm"] == "flash2"),
                key=lambda r: r["s_nominal"],
            )
            ax.plot([r["s_nominal"] for r in sel], [r["total"] for r in sel], "o-", ms=4, color=colors[p], label=p)
        sel = sorted((r for r in rows if r["pattern"] == "window" and r["M"] == M and r["algorithm"] == "flash2"),
                     key=lambda r: r["s_nominal"])  # fmt: skip
        ax.plot([r["s_nominal"] for r in sel], [r["nnz_lower_bound"] for r in sel], "k--", lw=1,
                label="nnz lower bound (L6, provisional)")  # fmt: skip
        ax.set_title(f"flash2 (skip) by pattern, M = {M / (d * d):g} d²")
        ax = axes[row, 1]
        for (algo, policy), style in zip(RUNS, ("o-", "v-", "^--", "s-"), strict=True):
            sel = sorted(
                (r for r in rows if r["pattern"] == "random-blocks" and r["M"] == M and r["algorithm"] == algo
                 and r["kv_policy"] == policy),
                key=lambda r: r["s_nominal"],
            )  # fmt: skip
            ax.plot([r["s_nominal"] for r in sel], [r["total"] for r in sel], style, ms=4, label=f"{algo} ({policy})")
        ax.plot([r["s_nominal"] for r in sel], [r["nnz_lower_bound"] for r in sel], "k--", lw=1, label="nnz bound")
        ax.set_title(f"random blocks 16x256, M = {M / (d * d):g} d²")
        for ax in axes[row]:
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("density s")
            ax.set_ylabel("forward I/O (words)")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    N = rows[0]["N"]
    fig.suptitle(f"Sparse attention, N = {N}, d = {d}: exact counts (count-only, fit tiling)")
    fig.tight_layout()
    return fig


main = runner.script(globals())  # python experiments/NN_x.py [--quick] [--out DIR]

if __name__ == "__main__":
    raise SystemExit(main())

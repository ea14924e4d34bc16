# ruff: noqa: N999 - numbered experiment scripts, loaded by file or by importlib
"""Experiment 01: the crossover at M ~ d^2 between square tiling and FlashAttention, forward and backward.

Claim (Saha & Ye, ICML 2024, Theorem 3.1; Li et al., arXiv 2410.09397, Theorem 1.1): with standard matrix
multiplication the I/O of exact attention is Theta(min(N^2 d^2 / M, N^2 d / sqrt(M))). FlashAttention attains the
first term and is optimal only in the large-cache regime M >= d^2; below d^2 the square-tiled algorithms
(algorithms/square_tiling.py) attain the second term and move fewer words.

Run: ``python experiments/01_crossover.py`` (about a minute; ``--quick`` for a smaller smoke run). For N = 2048
and d in {64, 128, 256} it sweeps M over 17 log-spaced points M = d^2 * 2^(k/2), k = -8..8 (d^2/16 to 16 d^2),
and counts the forward and the backward pass of standard, flash1, flash2 and square-tiling with the ``fit``
tiling in count-only mode (iosim.run(..., count_only=True): the same schedules, exact to the word, no
arithmetic). A point where an algorithm has no tiling (M below its smallest working set) is skipped and listed.

Outputs in results/ (created if missing):

* ``01_crossover.csv``: one row per (d, pass, M, algorithm): reads, writes, total, peak, tiling, whether the
  count equals its closed form in iosim.theory.io_model, the largest applicable lower bound and total / bound.
* ``01_crossover.png``: log-log total I/O vs M, one panel per d (columns) and pass (rows), the lower bounds drawn
  in their regimes and the line M = d^2 marked.
* ``01_crossover.txt``: the crossover table (M / d^2 where square-tiling's total crosses flash2's and flash1's,
  log-interpolated between the two grid points that bracket it) and the tightness table (total / matching lower
  bound, min and max over the sweep, per algorithm, pass and regime), and every skipped point.
* ``01_crossover.tex`` / ``01_crossover.md``: the crossover table and the verdict.

What the plot shows (measured with the command above, N = 2048): square-tiling is below flash1 and flash2 at every
M well below d^2 and above them well above d^2, in both passes and for every d. Measured crossovers M / d^2
(square-tiling vs flash2 / vs flash1): forward 1.05-1.11 / 2.10-2.16, backward 2.31 / 5.78-5.89, the same for
d = 64, 128, 256 (the theory's M = d^2, shifted by the algorithms' constants; docs/theory.md estimates 1.67 for F1 vs
S1 with the paper tilings). Tightness for M < d^2: square-tiling moves 3.74-4.46 times the Saha-Ye small-cache
lower bound 2 N^2 d / sqrt(M) - 2M forward and 7.55-9.45 times it backward, a flat constant across 24 points,
whereas flash2 ranges 5.2-32 (forward) and 17.8-76 (backward), growing as M shrinks. For M >= d^2 the provisional
large-cache bound N^2 d^2 / (4(M + d^2)) - M never exceeds the trivial 4Nd at N = 2048, so there the ÷Θ column
is the informative one: flash2 forward is 8.0-12.0 N^2 d^2 / M. Standard attention with square-tiled products is
also Theta(N^2 d / sqrt(M)) below d^2 (attention reduces to matrix multiplication there, Saha & Ye Thm 4.17), a
few N^2 words above square-tiling. The README section "The small-cache regime and the crossover at M ~ d^2" has
the tables.
"""

from __future__ import annotations

import math

from iosim.experiments import runner
from iosim.experiments._common import ALGORITHMS, PASSES, STYLE, Verdict, theta
from iosim.memory_model import CapacityError
from tabulate import tabulate

import iosim
from iosim.base.errors import InputError
from iosim.theory import bounds

NAME = "crossover"
TITLE = "The crossover at M ~ d^2 between square tiling and FlashAttention, forward and backward"
CLAIM = (
    "Saha & Ye Thm 3.1 / Li et al. Thm 1.1: I/O is Theta(min(N^2 d^2/M, N^2 d/sqrt(M))); square tiling wins below "
    "M ~ d^2, FlashAttention above."
)

FULL = {"N": 2048, "ds": (64, 128, 256), "half": 8}  # M = d^2 2^(k/2), k = -half..half
QUICK = {"N": 512, "ds": (32, 64), "half": 4}
DPI = 120


def m_grid(d: int, half_octaves: int = 8) -> list[int]:
    """M = d^2 2^(k/2) for k = -half_octaves..half_octaves (rounded to whole words): d^2/16 .. 16 d^2 by default."""
    return [max(1, round(d * d * 2 ** (k / 2))) for k in range(-half_octaves, half_octaves + 1)]


def backward_available() -> bool:
    """Whether iosim.run supports backward=True yet (the backward passes land separately)."""
    try:
        iosim.run("flash2", N=4, d=2, M=4096, count_only=True, backward=True)
    except (InputError, TypeError):
        return False
    return True


def sweep(N: int, ds, algorithms=ALGORITHMS, passes=PASSES, half_octaves: int = 8) -> tuple[list[dict], list[str]]:
    """Count every (d, pass, M, algorithm) of the sweep. Returns (rows, skipped): skipped lists the points where an
    algorithm has no tiling (or a pass is not available), one line each."""
    rows, skipped = [], []
    for pass_ in passes:
        if pass_ == "backward" and not backward_available():
            skipped.append("backward: iosim.run(backward=True) is not available yet; no backward rows")
            continue
        backward = pass_ == "backward"
        for d in ds:
            for M in m_grid(d, half_octaves):
                lb, lb_name = bounds.lower_bound(N, d, M, backward=backward)
                th = theta(N, d, M, backward)
                for name in algorithms:
                    try:
                        r = iosim.run(name, N=N, d=d, M=M, count_only=True, backward=backward)
                    except (InputError, CapacityError) as e:
                        skipped.append(f"{pass_} d={d} M={M} ({M / d**2:.3g} d^2) {name}: {e}")
                        continue
                    p = r.main
                    rows.append(
                        {
                            "pass": pass_,
                            "N": N,
                            "d": d,
                            "M": M,
                            "M_over_d2": M / (d * d),
                            "regime": "small" if M < d * d else "large",
                            "algorithm": name,
                            "tiling": str(r.tiling),
                            "reads": p.stats.reads,
                            "writes": p.stats.writes,
                            "total": p.stats.total,
                            "peak": p.stats.peak,
                            "exact": p.exact,
                            "lower_bound": lb,
                            "lower_bound_name": lb_name,
                            "total_over_lb": p.stats.total / lb if lb > 0 else math.nan,
                            "theta": th,
                            "total_over_theta": p.stats.total / th,
                        }
                    )
    return rows, skipped


def _series(rows, pass_, d, name) -> dict[int, int]:
    return {r["M"]: r["total"] for r in rows if r["pass"] == pass_ and r["d"] == d and r["algorithm"] == name}


def _first_crossing(rows, pass_, d, other, ours: str = "square-tiling") -> float | None:
    """M (words) of the first log-interpolated crossing of ours and other, or None."""
    a, b = _series(rows, pass_, d, ours), _series(rows, pass_, d, other)
    Ms = sorted(set(a) & set(b))
    g = [math.log(a[M] / b[M]) for M in Ms]
    for k in range(1, len(Ms)):
        if (g[k - 1] < 0) != (g[k] < 0):
            x0, x1 = math.log(Ms[k - 1]), math.log(Ms[k])
            return math.exp(x0 + (x1 - x0) * g[k - 1] / (g[k - 1] - g[k]))
    return None


def crossovers(rows, ours: str = "square-tiling", others=("flash2", "flash1")) -> list[list]:
    """M / d^2 where ``ours`` stops being cheaper than each of ``others``, per d and pass.

    Between the grid points that bracket a sign change of log(ours / other) the crossing is interpolated linearly
    in log M. Several sign changes (block-size rounding) are all listed; "< lo" / "> hi" when there is none in
    the swept range.
    """
    table = []
    for pass_ in PASSES:
        for d in sorted({r["d"] for r in rows if r["pass"] == pass_}):
            line = [pass_, d]
            a = _series(rows, pass_, d, ours)
            for other in others:
                b = _series(rows, pass_, d, other)
                Ms = sorted(set(a) & set(b))
                if not Ms:
                    line.append("-")
                    continue
                g = [math.log(a[M] / b[M]) for M in Ms]
                found = []
                for k in range(1, len(Ms)):
                    if (g[k - 1] < 0) != (g[k] < 0):
                        x0, x1 = math.log(Ms[k - 1]), math.log(Ms[k])
                        x = x0 + (x1 - x0) * g[k - 1] / (g[k - 1] - g[k])
                        found.append(f"{math.exp(x) / d**2:.2f}")
                if found:
                    line.append(", ".join(found))
                elif g[0] < 0:
                    line.append(f"> {Ms[-1] / d**2:.3g} (always below)")
                else:
                    line.append(f"< {Ms[0] / d**2:.3g} (always above)")
            table.append(line)
    return table


def tightness(rows) -> list[list]:
    """Per algorithm, pass and regime: min and max of total / (largest applicable lower bound) over the sweep."""
    table = []
    for name in ALGORITHMS:
        for pass_ in PASSES:
            for regime in ("small", "large"):
                sel = [
                    r
                    for r in rows
                    if r["algorithm"] == name and r["pass"] == pass_ and r["regime"] == regime and r["lower_bound"] > 0
                ]
                if not sel:
                    continue
                ratios = [r["total_over_lb"] for r in sel]
                consts = [r["total_over_theta"] for r in sel]
                lbs = sorted({r["lower_bound_name"] for r in sel})
                table.append(
                    [
                        name,
                        pass_,
                        "M < d^2" if regime == "small" else "M >= d^2",
                        f"{min(ratios):.2f}",
                        f"{max(ratios):.2f}",
                        f"{min(consts):.2f}",
                        f"{max(consts):.2f}",
                        len(sel),
                        ", ".join(lbs),
                    ]
                )
    return table


def plot(rows, g):
    import matplotlib.pyplot as plt

    ds = sorted({r["d"] for r in rows})
    passes = [p for p in PASSES if any(r["pass"] == p for r in rows)]
    fig, axes = plt.subplots(len(passes), len(ds), figsize=(5.2 * len(ds), 4.4 * len(passes)), squeeze=False)
    N = rows[0]["N"]
    for pi, pass_ in enumerate(passes):
        backward = pass_ == "backward"
        for di, d in enumerate(ds):
            ax = axes[pi][di]
            for name in ALGORITHMS:
                s = _series(rows, pass_, d, name)
                if s:
                    Ms = sorted(s)
                    color, marker = STYLE[name]
                    ax.plot(Ms, [s[M] for M in Ms], marker=marker, ms=4, color=color, label=name)
            Ms = sorted({r["M"] for r in rows if r["pass"] == pass_ and r["d"] == d})
            lower = [
                b for b in (bounds.backward_bounds if backward else bounds.forward_bounds)(N, d, Ms[0]) if b.is_lower
            ]
            for k, b0 in enumerate(lower):
                xs, ys = [], []
                for M in Ms:
                    b = next(
                        x
                        for x in (bounds.backward_bounds if backward else bounds.forward_bounds)(N, d, M)
                        if x.name == b0.name
                    )
                    if b.applies and b.value > 0:
                        xs.append(M)
                        ys.append(b.value)
                if xs:
                    ax.plot(
                        xs,
                        ys,
                        ls=("--", ":", "-.", (0, (3, 1, 1, 1, 1, 1)))[k % 4],
                        color="black",
                        lw=1,
                        label=f"LB: {b0.name}",
                    )
            ax.axvline(d * d, color="purple", lw=1, alpha=0.6)
            ax.text(d * d, ax.get_ylim()[1], " M = d²", color="purple", va="top", fontsize=8)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{pass_}, N={N}, d={d}")
            ax.set_xlabel("fast memory M (words)")
            ax.set_ylabel("total I/O (words)")
            ax.grid(True, which="major", alpha=0.3)
            cross = _first_crossing(rows, pass_, d, "flash2")
            if cross is not None:
                ax.axvline(cross, color="tab:red", ls=":", lw=1, label="crossover vs flash2")
            if di == len(ds) - 1:  # one legend per row, outside the last panel
                ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle("Exact I/O vs fast-memory size: square tiling wins below M ≈ d², FlashAttention above")
    fig.tight_layout()
    return fig


def measure(g) -> list[dict]:
    rows, skipped = sweep(g.N, g.ds, half_octaves=g.half)
    g.skipped += skipped
    return rows


def verdict(rows, g) -> runner.Summary:
    """The crossover and tightness tables (also written to 01_crossover.txt) and the verdict."""
    N, ds, half, skipped = g.N, g.ds, g.half, g.skipped
    inexact = [r for r in rows if not r["exact"]]
    cross, tight = crossovers(rows), tightness(rows)
    text = [
        f"N = {N}, d in {list(ds)}, M = d^2 2^(k/2) for k = -{half}..{half}, fit tiling, count-only; "
        f"{len(rows)} runs, {len(inexact)} differing from their closed form",
        "",
        "Crossover M / d^2 (square-tiling's total crosses the other's; log-interpolated between grid points)",
        tabulate(cross, headers=["pass", "d", "vs flash2", "vs flash1"], tablefmt="github"),
        "",
        "Tightness: measured total / largest applicable lower bound (min, max over the sweep, all d);",
        "÷Θ: total / the tight Theta-expression with constant 1",
        "(forward min(N^2 d^2/M, N^2 d/sqrt(M)), Saha & Ye Thm 3.1; backward Li et al. Thm 1.1)",
        tabulate(
            tight,
            headers=["algorithm", "pass", "regime", "min", "max", "÷Θ min", "÷Θ max", "points", "lower bound"],
            tablefmt="github",
        ),
    ]
    if skipped:
        text += ["", f"Skipped ({len(skipped)}): no tiling fits (or the pass is not available)", *skipped]
    fwd = [c for c in cross if c[0] == "forward"]
    bwd = [c for c in cross if c[0] == "backward"]

    def span(lines, col):
        vals = [float(x) for c in lines for x in str(c[col]).split(", ") if x.replace(".", "").isdigit()]
        return f"{min(vals):.2f}-{max(vals):.2f}" if vals else "none"

    sq = [t for t in tight if t[0] == "square-tiling" and t[2] == "M < d^2"]
    holds = all(span(x, 2) != "none" for x in (fwd, bwd))
    v = Verdict(
        NAME,
        CLAIM,
        measured=(
            f"square-tiling crosses flash2 at M = {span(fwd, 2)} d^2 forward and {span(bwd, 2)} d^2 backward "
            f"(flash1: {span(fwd, 3)} / {span(bwd, 3)}), for d in {list(ds)}, N = {N}"
        ),
        figure=f"square-tiling below d^2: {sq[0][3]}-{sq[0][4]} x the small-cache lower bound forward, "
        f"{sq[1][3]}-{sq[1][4]} backward",
        holds=holds,
    )
    v.notes.append(f"{len(rows)} runs, {sum(not r['exact'] for r in rows)} differing from their closed form.")
    if skipped:
        v.notes.append(f"{len(skipped)} points skipped (no tiling fits): e.g. {skipped[0]}")
    table = [[*c] for c in cross]
    headers = ["pass", "d", "vs flash2 (M/d^2)", "vs flash1 (M/d^2)"]
    return runner.Summary(v, table, headers, texts={"txt": "\n".join(text) + "\n"})


main = runner.script(globals())  # python experiments/NN_x.py [--quick] [--out DIR]

if __name__ == "__main__":
    raise SystemExit(main())

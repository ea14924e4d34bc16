"""What every experiment shares besides the runner (experiments/runner.py): the verdict, the extras check,
power-law fits with confidence intervals, and the CSV writer."""

from __future__ import annotations

import csv
import importlib.util
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

RESULTS = Path("results")  # ./results of the current directory
ALGORITHMS = ("standard", "flash1", "flash2", "square-tiling")  # the dense algorithms, in the plots' order
PASSES = ("forward", "backward")
STYLE = {  # colour and marker per algorithm, the same in every figure
    "standard": ("tab:gray", "s"),
    "flash1": ("tab:blue", "v"),
    "flash2": ("tab:green", "^"),
    "square-tiling": ("tab:red", "o"),
}
EXTRA_MODULES = {"plot": "matplotlib", "sweep": "pandas", "dask": "distributed"}


class MissingExtra(Exception):  # noqa: N818 - it is not an error of the user's input
    """An optional dependency an experiment needs is not installed: exit 2 with one line naming the extra."""

    def __init__(self, extra: str) -> None:
        self.extra = extra
        from iosim.base.errors import install_hint

        super().__init__(install_hint(extra))


def require(extras: Sequence[str]) -> None:
    """Raise MissingExtra for the first extra whose module is missing: call before anything is written."""
    for extra in extras:
        if importlib.util.find_spec(EXTRA_MODULES[extra]) is None:
            raise MissingExtra(extra)


@dataclass
class Verdict:
    """What the paper claims, what was measured, and the fitted exponent or ratio that decides it."""

    name: str
    claim: str
    measured: str
    figure: str  # the deciding number(s), e.g. "slope -0.998 [-1.003, -0.993]"
    holds: bool | None  # True: measured agrees with the claim; False: it does not; None: not decidable here
    notes: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)  # iosim's own checks that failed: the run exits 1

    @property
    def word(self) -> str:
        return {True: "reproduced", False: "not reproduced", None: "see notes"}[self.holds]

    def line(self) -> str:
        return f"{self.word}: {self.measured} ({self.figure})"


@dataclass(frozen=True)
class Fit:
    """Least-squares slope of log y on log x with its 95% confidence interval (Student t, n - 2 dof)."""

    slope: float
    lo: float
    hi: float
    n: int

    def __str__(self) -> str:
        if math.isnan(self.slope):
            return f"n/a ({self.n} points)"
        return f"{self.slope:.3f} [{self.lo:.3f}, {self.hi:.3f}]"


def fit_power(xs: Sequence[float], ys: Sequence[float]) -> Fit:
    """The exponent b of y ~ a x^b by least squares in log-log space, with its 95% confidence interval."""
    from scipy import stats

    lx = [math.log(x) for x in xs]
    ly = [math.log(y) for y in ys]
    n = len(lx)
    if n < 3:  # no confidence interval without a degree of freedom: report n/a rather than a fake number
        return Fit(math.nan, math.nan, math.nan, n)
    r = stats.linregress(lx, ly)
    t = stats.t.ppf(0.975, n - 2)
    return Fit(float(r.slope), float(r.slope - t * r.stderr), float(r.slope + t * r.stderr), n)


def write_csv(path: Path, rows: list[dict]) -> None:
    fields: list[str] = []
    for r in rows:
        fields += [k for k in r if k not in fields]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


def theta(N: int, d: int, M: int, backward: bool = False) -> float:
    """The tight Theta-expression with constant 1: min(N^2 d^2 / M, N^2 d / sqrt(M)) forward (Saha & Ye Thm 3.1),
    min((N^2 d^2 + N d^3) / M, (N^2 d + N d^2) / sqrt(M)) backward (Li et al. Thm 1.1)."""
    if backward:
        return min((N * N * d * d + N * d**3) / M, (N * N * d + N * d * d) / math.sqrt(M))
    return min(N * N * d * d / M, N * N * d / math.sqrt(M))


def records(grid, skipped: list[str] | None = None, label: Sequence[str] = ("d", "M")) -> list[dict]:
    """The records of an iosim.sweep grid that ran (run serially); each point that could not run (no tiling fits)
    goes to ``skipped`` as one line: its ``label`` keys, the algorithm and the reason. An experiment is long work
    its user asked for by name, and its grid is fixed: it runs without asking (``allow_long``; a grid estimated
    at over an hour is still refused), with the sweep's progress bar on a terminal."""
    from iosim.runner.sweep import sweep

    ok = []
    for r in sweep(grid, executor="serial", as_frame=False, allow_long=True):
        if r["status"] == "ok":
            ok.append(r)
        elif skipped is not None:
            skipped.append(" ".join(f"{k}={r[k]}" for k in label) + f" {r['algorithm']}: {r['error']}")
    return ok

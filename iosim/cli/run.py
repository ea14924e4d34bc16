"""``iosim run ALGO --N --d --M``: one algorithm, its counts per array, peak and what filled it."""

from __future__ import annotations

import json

from tabulate import tabulate

from iosim import api
from iosim.cli.options import (
    add_algorithm,
    add_problem_options,
    add_problem_sizes,
    add_run_options,
    bytes_rows,
    exact,
    fmt_err,
    fmt_int,
    problem_run_kwargs,
)


def add_arguments(p) -> None:
    add_algorithm(p)
    add_problem_sizes(p)
    add_run_options(p)
    add_problem_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def command(args) -> int:
    r = api.run(args.algorithm, **problem_run_kwargs(args))
    if args.json:
        print(json.dumps(r.as_dict(), indent=2))
        return 0 if r.finite else 1
    s, p = r.stats, r.predicted
    rows = [
        ["algorithm", r.algorithm],
        ["pass", r.main.name],
        ["N, d, M", f"{r.N}, {r.d}, {r.M}"],
        *([["problem", str(r.problem)]] if not r.problem.is_single else []),
        *([["schedule", ", ".join(f"{k} {v}" for k, v in r.schedule.items() if v is not None)]] if r.schedule else []),
        ["regime", r.regime],
        ["mask", r.mask if r.mask in ("none", "causal") else f"{r.mask} (kv policy {r.kv_policy})"],
        ["tiling", str(r.tiling)],
        ["reads", fmt_int(s.reads)],
        ["writes", fmt_int(s.writes)],
        ["  of which initialisation", fmt_int(s.init_writes)],
        ["total", fmt_int(s.total)],
        ["predicted total (io_model)", "-" if p is None else fmt_int(p.total)],
        ["exact (per array and peak)", exact(r.main.exact)],
        ["peak / M", f"{s.peak} / {r.M}"],
        ["fast memory at the peak", ", ".join(f"{n} {w}" for n, w in s.at_peak.items()) or "-"],
        [f"lower bound ({r.main.lower_bound_name})", fmt_int(r.lower_bound)],
        ["total / lower bound", f"{s.total / r.lower_bound:.2f}" if r.lower_bound else "-"],
        ["max abs error vs float64", fmt_err(r.max_abs_error)],
        ["outputs finite", "yes" if r.finite else "NO (overflow: see the warning)"],
    ]
    if "backward" in r.passes:
        f = r.passes["forward"]
        rows += [
            *([name + " max abs error", fmt_err(err)] for name, err in r.errors.items()),
            ["forward tiling", str(f.tiling)],
            ["forward total", fmt_int(f.stats.total)],
            ["forward exact", exact(f.exact)],
            ["total, both passes", fmt_int(f.stats.total + s.total)],
        ]
    if args.bytes:
        rows += bytes_rows(r)
    print(tabulate(rows, tablefmt=args.format))
    per = [[n, fmt_int(c.reads), fmt_int(c.writes), fmt_int(c.init_writes)] for n, c in s.per_array.items()]
    print()
    print(
        tabulate(
            per,
            headers=["array", "reads", "writes", "init writes"],
            tablefmt=args.format,
            colalign=("left", "right", "right", "right"),
        )
    )
    return 0 if r.finite else 1

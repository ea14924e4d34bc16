"""``iosim run ALGO --N --d --M``: one algorithm, its counts per array, peak and what filled it."""

from __future__ import annotations

import json

from tabulate import tabulate

from iosim.base.errors import InputError
from iosim.cli.options import (
    add_algorithm,
    add_kv_format_option,
    add_problem_options,
    add_problem_sizes,
    add_run_options,
    add_topk_options,
    bytes_rows,
    exact,
    fmt_err,
    fmt_int,
    kv_format_rows,
    problem_run_kwargs,
)
from iosim.runner import api


def add_arguments(p) -> None:
    add_algorithm(p)
    add_problem_sizes(p)
    add_run_options(p)
    add_problem_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    add_topk_options(p)
    add_kv_format_option(p)


def command(args) -> int:
    from iosim.cli import topk
    from iosim.runner import registry

    if args.algorithm in registry.INDEX_SCHEDULES or args.indices is not None:
        return topk.command(args)
    topk.refuse_own_options(args)
    if args.kv_format is not None:
        from iosim.spec.kv_format import kv_format

        if args.algorithm not in ("flash1", "flash2"):
            raise InputError("--kv-format", "reads the whole K/V rows of flash1, flash2 and topk-sparse (the "
                             f"square-tiled ones read rows in column slices), not {args.algorithm}",
                             args.kv_format)  # fmt: skip
        fmt = kv_format(args.kv_format)  # a bad name or a layout that does not fit the rows: one line, no work
        if args.backward:
            raise InputError("--kv-format", "reports a forward run's K/V reads (not with --backward)", args.kv_format)
    kw = problem_run_kwargs(args)
    if args.kv_format is not None:
        p = kw.get("problem")
        for array, width in (("K", p.d_qk if p else args.d), ("V", p.d_v if p else args.d)):
            if not (array == "V" and p is not None and p.latent):
                fmt.components(width, array)
    r = api.run_keywords(args.algorithm, **kw)
    if args.kv_format is not None:  # the reads in bytes per component, checked before anything is printed
        kv_rows = kv_format_rows(r.problem, {n: c.reads for n, c in r.stats.per_array.items()}, args.kv_format)
    if args.json:
        out = r.as_dict()
        if args.kv_format is not None:
            out["kv_format"] = {row[0]: row[1] for row in kv_rows}
        print(json.dumps(out, indent=2))
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
    if args.kv_format is not None:
        rows += kv_rows
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

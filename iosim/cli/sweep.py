"""``iosim sweep``: count a grid of (algorithm, pass, N, d, M, mask, tiling) points."""

from __future__ import annotations

import argparse
import sys

from tabulate import tabulate

from iosim import masks, registry
from iosim.cli.options import FORMATS, SIZES, add_yes, output_file, positive
from iosim.errors import InputError


def add_arguments(p) -> None:
    p.add_argument("--algorithm", nargs="+", help="algorithms (default: all)")
    p.add_argument("--pass", dest="passes", nargs="+", default=["forward"], help="forward and/or backward")
    for name, what in SIZES:
        p.add_argument(f"--{name}", type=int, nargs="+", required=True, help=what + " (one or more)")
    p.add_argument("--causal", choices=("no", "yes", "both"), default="no", help="causal masking (default no)")
    p.add_argument("--mask", nargs="+", default=["none"], help=f"masks (default none): {masks.FORMS}")
    p.add_argument(
        "--kv-policy",
        nargs="+",
        default=[None],
        help="empty-block policies: paper and/or skip (default: paper for one head, skip over a problem)",
    )
    p.add_argument("--tiling", nargs="+", default=["fit"], help="block-size rules: fit and/or paper (default fit)")
    for opt, key, kind, what in (
        ("--batch", "batch", int, "batch sizes"),
        ("--heads", "heads", int, "query heads H_q"),
        ("--kv-heads", "kv_heads", int, "key/value heads H_kv"),
        ("--Nq", "N_q", int, "query rows N_q (default N)"),
        ("--Nk", "N_k", int, "keys N_k (default N)"),
        ("--dv", "d_v", int, "value widths (default d)"),
        ("--page-size", "page_size", int, "paged KV page sizes"),
        ("--gqa", "gqa", str, "GQA schedules: per-head and/or packed"),
        ("--splits", "splits", int, "split-KV splits (flash2)"),
        ("--mla", "mla", str, "MLA latent cache read: shared and/or naive"),
        ("--Br", "Br", int, "explicit row blocks"),
        ("--Bc", "Bc", int, "explicit column blocks"),
        ("--B", "B", int, "explicit square tiles"),
    ):
        p.add_argument(opt, dest=f"grid_{key}", type=kind, nargs="+", default=None, help=what + " (one or more)")
    p.add_argument("--numeric", action="store_true", help="run the arithmetic too (default: count-only)")
    p.add_argument("--jobs", type=positive("--jobs"), help="worker processes (default: all cores)")
    p.add_argument("--executor", default="processes", help="processes (default), serial, dask:ADDRESS or dask:local")
    p.add_argument("--out", help="write the records to a .csv, .jsonl or .parquet file")
    p.add_argument(
        "--cache", default="results/.sweep_cache.jsonl", help="cache file (default results/.sweep_cache.jsonl)"
    )
    p.add_argument("--no-cache", action="store_true", help="recompute every point")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help="progress bar")
    p.add_argument("--format", choices=FORMATS, default="simple", help="table format")
    add_yes(p, "a sweep")


def command(args) -> int:
    """``iosim sweep``: every point of the grid; invalid points are listed on stderr (exit 2), the rest still run."""
    from iosim.sweep import OUT_FORMATS, PASSES, sweep  # the module (iosim.sweep, the attribute, is the function)

    if args.out is not None:  # before any work (sweep creates missing folders)
        output_file("--out", args.out, OUT_FORMATS, create_parent=True)
    if not args.no_cache:
        output_file("--cache", args.cache, (".jsonl",), create_parent=True)

    for p_ in args.passes:
        if p_ not in PASSES:
            raise InputError("--pass", f"must be one of {', '.join(PASSES)}", p_)
    grid = {
        "algorithm": args.algorithm or registry.algorithms(),
        "pass": args.passes,
        "N": args.N,
        "d": args.d,
        "M": args.M,
        "causal": {"no": [False], "yes": [True], "both": [False, True]}[args.causal],
        "mask": args.mask,
        "kv_policy": args.kv_policy,
        "tiling": args.tiling,
        "count_only": not args.numeric,
    }
    for key, values in vars(args).items():
        if key.startswith("grid_") and values is not None:
            grid[key[5:]] = values
    if args.grid_mla is not None:
        grid["latent"] = True
    stats: dict = {}
    recs = sweep(
        grid,
        executor=args.executor,
        jobs=args.jobs,
        cache=None if args.no_cache else args.cache,
        out=args.out,
        as_frame=False,
        progress=args.progress,
        stats=stats,
        allow_long=args.yes,
    )
    ok = [r for r in recs if r["status"] == "ok"]
    if ok:
        cols = ["algorithm", "pass", "N", "d", "M", "causal", "tiling", "total", "exact", "total_over_lb"]
        if args.mask != ["none"] or args.kv_policy != [None]:  # which mask and policy each row ran
            cols[6:6] = ["mask", "kv_policy"]
        given = [k[5:] for k, v in vars(args).items() if k.startswith("grid_") and v is not None]
        if given:  # a problem sweep: its keys, the bytes and the thread blocks beside the counts
            cols[cols.index("tiling") : cols.index("tiling")] = given
            cols += ["total_bytes", "thread_blocks"]
        rows = [[r[c] if c != "total_over_lb" else f"{r[c]:.2f}" for c in cols] for r in ok]
        print(tabulate(rows, headers=cols, tablefmt=args.format, intfmt=","))
    bad = [r for r in recs if r["status"] != "ok"]
    print(
        f"{stats['points']} points: {stats['computed']} computed, {stats['cached']} from the cache, "
        f"{len(bad)} not run" + (f"; wrote {args.out}" if args.out else "")
    )
    for r in bad:
        where = ", ".join(f"{k}={r[k]}" for k in ("algorithm", "pass", "N", "d", "M", "causal", "tiling"))
        print(f"iosim: {r['status']} point ({where}): {r['error']}", file=sys.stderr)
    return 2 if bad else 0

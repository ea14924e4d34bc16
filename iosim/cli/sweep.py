"""``iosim sweep``: count a grid of (algorithm, pass, N, d, M, mask, tiling) points."""

from __future__ import annotations

import argparse
import sys

from tabulate import tabulate

from iosim.base.errors import InputError
from iosim.cli.options import FORMATS, SIZES, add_yes, dtype_choice, output_file, positive
from iosim.masking import masks
from iosim.runner import registry


def add_arguments(p) -> None:
    p.add_argument("--algorithm", nargs="+", help="algorithms (default: all)")
    p.add_argument("--pass", dest="passes", nargs="+", default=["forward"], help="forward and/or backward")
    for name, what in SIZES:  # N may be left out when --Nq and --Nk give both lengths (as iosim compare takes them)
        p.add_argument(f"--{name}", type=int, nargs="+", required=name != "N", help=what + " (one or more)")
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
        ("--dtype-q", "dtype_q", dtype_choice("--dtype-q"), "storage dtypes of Q"),
        ("--dtype-kv", "dtype_kv", dtype_choice("--dtype-kv"), "storage dtypes of K, V"),
        ("--dtype-o", "dtype_o", dtype_choice("--dtype-o"), "storage dtypes of O"),
    ):
        p.add_argument(opt, dest=f"grid_{key}", type=kind, nargs="+", default=None, help=what + " (one or more)")
    p.add_argument("--bytes", action="store_true", help="show the bytes at each array's dtype beside the words")
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
    from iosim.runner.sweep import (  # the module (iosim.runner.sweep, the attribute, is the function)
        OUT_FORMATS,
        PASSES,
        sweep,
    )

    if args.out is not None:  # before any work (sweep creates missing folders)
        output_file("--out", args.out, OUT_FORMATS, create_parent=True)
    if not args.no_cache:
        output_file("--cache", args.cache, (".jsonl",), create_parent=True)

    for p_ in args.passes:
        if p_ not in PASSES:
            raise InputError("--pass", f"must be one of {', '.join(PASSES)}", p_)
    lengths = _lengths(args)
    grid = {
        "algorithm": args.algorithm or registry.algorithms(),
        "pass": args.passes,
        "N": lengths,
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
        print(_table(args, ok))
    bad = [r for r in recs if r["status"] != "ok"]
    print(  # beside a LaTeX table, on stderr: stdout is the table a paper takes as it is
        f"{stats['points']} points: {stats['computed']} computed, {stats['cached']} from the cache, "
        f"{len(bad)} not run" + (f"; wrote {args.out}" if args.out else ""),
        file=sys.stderr if args.format == "latex" else sys.stdout,
    )
    for r in bad:
        where = ", ".join(f"{k}={r[k]}" for k in ("algorithm", "pass", "N", "d", "M", "causal", "tiling"))
        print(f"iosim: {r['status']} point ({where}): {r['error']}", file=sys.stderr)
    return 2 if bad else 0


def _lengths(args) -> list[int]:
    """The grid's N: --N, or, when it is left out, --Nk (N stands for N_k then, as for a Problem object; --Nq gives
    the query rows). --N beside both --Nq and --Nk would be ignored: refused."""
    if args.N is not None:
        if args.grid_N_q is not None and args.grid_N_k is not None:
            raise InputError("--N", "must not be given with both --Nq and --Nk (not both: N would be ignored)", args.N)
        return args.N
    if args.grid_N_q is None or args.grid_N_k is None:
        raise InputError("--N", "must be given (or --Nq and --Nk for the query rows and keys)", None)
    lengths, args.grid_N_k = args.grid_N_k, None
    args.keys_as_N = True
    return lengths


def _table(args, ok: list[dict]) -> str:
    """The records that ran, one row each; in LaTeX, booleans as marks and the columns that hold one value for every
    row in the caption with iosim's version (a table a paper can take as it is)."""
    cols = ["algorithm", "pass", "N", "d", "M", "causal", "tiling", "total", "exact", "total_over_lb"]
    if args.mask != ["none"] or args.kv_policy != [None]:  # which mask and policy each row ran
        cols[6:6] = ["mask", "kv_policy"]
    given = [k[5:] for k, v in vars(args).items() if k.startswith("grid_") and v is not None]
    if given:  # a problem sweep: its keys, the bytes and the thread blocks beside the counts
        cols[cols.index("tiling") : cols.index("tiling")] = given
        cols += ["total_bytes", "thread_blocks"]
    elif args.bytes:
        cols.append("total_bytes")
    names = {"N": "N_k"} if getattr(args, "keys_as_N", False) else {}
    if args.format != "latex":
        rows = [[r[c] if c != "total_over_lb" else f"{r[c]:.2f}" for c in cols] for r in ok]
        return tabulate(rows, headers=[names.get(c, c) for c in cols], tablefmt=args.format, intfmt=",")
    return _latex(ok, cols, names)


def _latex(ok: list[dict], cols: list[str], names: dict) -> str:
    from iosim.base.version import __version__

    def cell(v) -> str:  # LaTeX: a boolean as a mark, numbers with thousands separators, text escaped
        if isinstance(v, bool):
            return r"\checkmark" if v else "--"
        if isinstance(v, float):
            return f"{v:.2f}"
        return f"{v:,}" if isinstance(v, int) else _tex(str(v))

    constant = [c for c in cols if len({str(r[c]) for r in ok}) == 1] if len(ok) > 1 else []
    shown = [c for c in cols if c not in constant] or cols
    rows = [[cell(r[c]) for c in shown] for r in ok]
    head = [_tex(names.get(c, c)) for c in shown]
    body = tabulate(rows, headers=head, tablefmt="latex_raw", disable_numparse=True)
    fixed = ", ".join(f"{_tex(names.get(c, c))} = {cell(ok[0][c])}" for c in constant)
    caption = f"Counted by iosim {__version__} (iosim sweep)" + (f"; every row: {fixed}" if fixed else "") + "."
    return "\\begin{table}\n\\centering\n" + body + f"\n\\caption{{{caption}}}\n\\end{{table}}"


def _tex(text: str) -> str:
    """Plain text for LaTeX: its special characters escaped."""
    out = text.replace("\\", r"\textbackslash ")
    for ch in "&%$#_{}":
        out = out.replace(ch, "\\" + ch)
    return out.replace("~", r"\textasciitilde ").replace("^", r"\textasciicircum ")

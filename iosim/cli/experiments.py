"""``iosim experiments list | run NAME | run all``: the papers' claims, one experiment each (CSV, plot, verdict)."""

from __future__ import annotations

import sys

from tabulate import tabulate

from iosim.base.errors import InputError


def add_arguments(p) -> None:
    p.add_argument("action", choices=("list", "run"), help="list them, or run one (NAME) or all")
    p.add_argument("name", nargs="?", help="with run: an experiment name or number, or all")
    p.add_argument("--quick", action="store_true", help="smaller smoke-run grids")
    p.add_argument("--out", default="results", help="output folder (default results/)")


def package():
    """The experiments package (``iosim.experiments``, installed from the experiments/ folder)."""
    import importlib

    return importlib.import_module("iosim.experiments")


def command(args) -> int:
    """``iosim experiments list | run NAME | run all``: results/<stem>.{csv,png,tex,md}; ``all`` adds index.md."""
    import time

    ex = package()
    if args.action == "list" and args.name is not None:
        raise InputError("experiments list", "takes no name (iosim experiments run NAME runs one)", args.name)
    if args.action == "list":
        rows = [
            [e.name, e.stem, e.item, e.title if not e.pending else f"{e.title} ({e.pending})"] for e in ex.EXPERIMENTS
        ]
        print(tabulate(rows, headers=["name", "file", "claim", "what"]))
        return 0
    if not args.name:
        raise InputError("experiments run", f"needs a NAME: one of {', '.join(ex.names())} or all")
    from iosim.cli.options import output_folder

    out = output_folder("--out", args.out)
    flags = (" --quick" if args.quick else "") + (f" --out {args.out}" if args.out != "results" else "")
    try:
        if args.name == "all":
            t0 = time.perf_counter()
            done = ex.run_all(out, quick=args.quick)
            print(f"all experiments in {time.perf_counter() - t0:.0f} s; wrote {out / 'index.md'}")
            return 1 if any(v is not None and v.failures for _, v in done) else 0
        entry = ex.get(args.name)
        v = ex.run(entry, out, quick=args.quick, command=f"iosim experiments run {entry.name}{flags}")
    except ex.MissingExtra as e:
        print(e, file=sys.stderr)
        return 2
    ex.runner.report(v, out)
    return 1 if v.failures else 0

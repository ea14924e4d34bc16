"""``iosim trace ALGO ... -o FILE``: every load, store, alloc and free of a run, written to a file and replayed."""

from __future__ import annotations

from iosim.cli.options import (
    add_algorithm,
    add_problem_options,
    add_problem_sizes,
    add_run_options,
    fmt_int,
    output_file,
    problem_run_kwargs,
)
from iosim.runner import api


def add_arguments(p) -> None:
    add_algorithm(p)
    add_problem_sizes(p)
    add_run_options(p)
    add_problem_options(p)
    p.add_argument("-o", "--output", required=True, help="the trace file: .csv, .npy or .parquet (iosim[parquet])")


def command(args) -> int:
    """Run one algorithm with the event trace on and write it (.csv, .npy or .parquet), then replay it."""
    from iosim.views import trace_io
    from iosim.views.trace_io import write_trace

    out = output_file("--output", args.output, trace_io.SUFFIXES)
    trace_io._check(out)  # the parquet extra, before the run
    kwargs = problem_run_kwargs(args)
    r = api.run_keywords(args.algorithm, **{**kwargs, "trace": True})
    write_trace(r.trace, out)  # checks the suffix and the parquet extra before anything is written
    replayed = r.trace.replay(r.M, strict=False)
    same = replayed == r.stats
    print(
        f"{r.algorithm} {r.main.name}: {len(r.trace):,} events written to {out} "
        f"({out.stat().st_size:,} bytes); reads {fmt_int(r.stats.reads)}, writes {fmt_int(r.stats.writes)}, "
        f"peak {r.stats.peak} of M={r.M}"
    )
    print(f"replay through a fresh model of M={r.M} words: {'equal counts and peak' if same else 'DIFFERENT'}")
    return 0 if same else 1

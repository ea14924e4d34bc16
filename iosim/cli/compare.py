"""``iosim compare``: every algorithm side by side against the bounds (the main job)."""

from __future__ import annotations

import csv
import json
import sys

from tabulate import tabulate

from iosim.base.errors import InputError
from iosim.base.version import __version__
from iosim.cli.options import (
    add_problem_options,
    add_run_options,
    add_sizes,
    exact,
    fmt_err,
    fmt_int,
    mask_words,
    output_file,
    problem_of,
    problem_run_kwargs,
    run_kwargs,
)
from iosim.masking import masks
from iosim.memory_model import CapacityError
from iosim.runner import api, registry, warmup
from iosim.theory import bounds

DEFAULTS = {"N": 1024, "d": 64, "M": 16384}


def add_arguments(p) -> None:
    add_sizes(p, DEFAULTS)
    add_run_options(p)
    add_problem_options(p)
    p.add_argument("--html", metavar="FILE", help="also write a teaching page of the schedules side by side (.html)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the results (with provenance) as JSON")
    out.add_argument("--csv", action="store_true", help="print the results as CSV, one row per algorithm")


def theory_line(d: int, M: int) -> str:
    winner, reason = bounds.theory_winner(d, M)
    return f"theory says {winner} should move the fewest words: {reason}"


CSV_COLUMNS = (
    "rank", "algorithm", "pass", "N", "d", "M", "causal", "dtype", "seed", "scale", "tiling", "reads", "writes",
    "total", "init_writes", "peak", "predicted_total", "exact", "lower_bound", "lower_bound_name", "max_abs_error",
    "finite", "iosim_version",
)  # fmt: skip


def _page_runs(args, results) -> list | None:
    """``--html FILE``: the traced runs of the page of the schedules that ran, in rank order, checked against the
    page's caps (an InputError naming the largest N that fits) before anything is printed or written."""
    if args.html is None:
        return None
    from iosim.views import html

    return html.check_fits([r.algorithm for r in results], problem_run_kwargs(args))


def _html(args, runs) -> None:
    """Write the page of the traced runs (:func:`_page_runs`), side by side (iosim.views.html)."""
    from iosim.views import html

    names = [r.algorithm for r in runs]
    html.schedule_page(runs, args.html)
    quiet = args.json or args.csv  # stdout is the JSON or CSV: the note goes to stderr
    print(f"wrote {args.html}: {', '.join(names)} side by side", file=sys.stderr if quiet else sys.stdout)


def command(args) -> int:
    """``iosim compare``: check the options that must fail before any work (:func:`_check_args`); over a problem,
    :func:`_compare_problem`; for one head, the lower bound (:func:`_lower_bound`), every algorithm run
    (:func:`_run_all`) and ranked by words moved, then printed as JSON or CSV (:func:`_print_records`) or as a
    table (:func:`_print_table`), and the page written last (``--html``). Exit 1 when an output is not finite."""
    _check_args(args)
    if problem_of(args) is not None or args.gqa != "per-head" or args.splits != 1 or args.Br or args.Bc or args.B:
        if args.html is not None:
            raise InputError(
                "--html", "applies to one head (N, d); over a problem: iosim show ALGO ... --html", args.html
            )
        return _compare_problem(args)
    lb, lb_name = _lower_bound(args)
    results, failures = _run_all(args)
    results.sort(key=lambda r: r.stats.total)
    runs = _page_runs(args, results)  # the page's cap, before any output
    if args.json or args.csv:
        _print_records(args, results, failures, lb, lb_name)
    else:
        _print_table(args, results, failures, lb, lb_name)
    if args.html is not None:  # the page too: --html is not a format, it is a file beside the output
        _html(args, runs)
    return 0 if all(r.finite for r in results) else 1


def _check_args(args) -> None:
    """Before any work: ``--splits`` only on the forward pass (split-KV splits the forward's keys; the backward has
    no such kernel), and the ``--html`` output path."""
    if args.backward and args.splits != 1:
        raise InputError("--splits", "applies to the forward pass (split-KV); the backward runs unsplit", args.splits)
    if args.html is not None:
        from iosim.views import html

        output_file("--html", args.html, html.SUFFIXES)


def _lower_bound(args) -> tuple[float, str]:
    """The papers' lower bound for one head (:func:`iosim.theory.bounds.lower_bound`), under a sparse mask counted
    over the mask (compiled, and its estimated cost checked, before any run): (value, name)."""
    sparse = args.mask not in (None, "none", "dense") and args.mask != "causal"
    mask = masks.compile_mask(args.mask, args.N, allow_long=args.yes) if sparse else None
    if mask is not None:  # the lower bound, then each algorithm's estimate, closed form and run count the mask
        from iosim.runner import estimate

        estimate.check_mask(mask, passes=1 + 3 * len(registry.algorithms()), allow_long=args.yes)
    causal = args.causal or args.mask == "causal"
    return bounds.lower_bound(args.N, args.d, args.M, backward=args.backward, mask=mask, causal=causal)


def _run_all(args) -> tuple[list, list[str]]:
    """Every registered algorithm (with a backward pass, under --backward) run once: (the results, a line per
    algorithm not run). An algorithm that does not fit M is a line, a bad argument is raised; when none fits, M is
    refused naming the smallest M that serves one. On a cold Numba cache, a second process compiles standard
    attention (about half the first run's compile time: 15 of 30 s of compiling on the development machine) while
    this one runs the others: :mod:`iosim.runner.warmup`."""
    kwargs = run_kwargs(args)
    names = [n for n in registry.algorithms() if not args.backward or registry.get(n).has_backward]
    failures = [f"{n}: no backward pass" for n in registry.algorithms() if n not in names]
    key = f"compare-{args.dtype}-{'b' if args.backward else 'f'}-{'c' if args.count_only else 'n'}"
    later = [n for n in names if n in ("standard",)]
    worker = warmup.start(later, kwargs, key) if len(names) > 1 else None
    order = [n for n in names if n not in later] + later if worker else names
    results = []
    for name in order:
        if name in later and worker is not None:
            worker.join()
        try:
            results.append(api.run_keywords(name, **kwargs))
        except (CapacityError, InputError) as e:
            if isinstance(e, InputError) and e.parameter not in ("M", "tiling"):
                raise  # a bad argument, not an algorithm that does not fit
            failures.append(f"{name}: {e}")
    warmup.finish(worker, key)
    if not results:
        need = [
            a.min_M(args.N, args.d, args.backward)
            for a in registry.REGISTRY.values()
            if a.has_backward or not args.backward
        ]
        need = [m for m in need if m is not None]
        smallest = f"; the smallest M that serves one is {min(need):,} words" if need else ""
        raise InputError("M", f"is too small for every algorithm at N={args.N}, d={args.d}{smallest}", args.M)
    return results, failures


def _print_records(args, results, failures, lb, lb_name) -> None:
    """``--json`` (the ranked records with provenance, the algorithms not run and the lower bound) or ``--csv``
    (one row per algorithm, :data:`CSV_COLUMNS`) on stdout."""
    records = [{"rank": i + 1, **r.as_dict()} for i, r in enumerate(results)]
    if args.json:
        print(
            json.dumps(
                {
                    "iosim_version": __version__,
                    "compare": records,
                    "not_run": failures,
                    "lower_bound": lb,
                    "lower_bound_name": lb_name,
                },
                indent=2,  # fmt: skip
            )
        )
        return
    writer = csv.DictWriter(sys.stdout, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for rec in records:
        writer.writerow({**rec, "tiling": ";".join(f"{k}={v}" for k, v in rec["tiling"].items())})


def _print_table(args, results, failures, lb, lb_name) -> None:
    """The header lines (sizes and regime, the lower bound, the fine-grained backward bound, the theory's winner),
    the ranked table and a line per algorithm not run."""
    print(
        f"N={args.N}, d={args.d}, M={args.M} words ({bounds.regime(args.d, args.M)}; d^2 = {args.d**2}), "
        f"{mask_words(args)}, {'backward' if args.backward else 'forward'}, "
        f"tiling={args.tiling}"
    )
    print(f"lower bound: {fmt_int(lb)} words ({lb_name})")
    if args.backward:
        thm = next(b for b in bounds.backward_bounds(args.N, args.d, args.M) if b.name == "fine-grained Thm 1.1")
        print(
            f"fine-grained backward bound (Li et al., Thm 1.1, Theta with constant 1): {fmt_int(thm.value)} words"
            f" = {thm.formula}"
        )
    print(theory_line(args.d, args.M))
    print(
        tabulate(
            [_ranked_row(i + 1, r, lb) for i, r in enumerate(results)],
            headers=TABLE_HEADERS,
            tablefmt=args.format,
            disable_numparse=True,
            colalign=("right", "left", "left", "right", "right", "right", "right", "right", "left", "right", "right"),
        )
    )
    for f in failures:
        print(f"not run: {f}")


TABLE_HEADERS = (
    "rank", "algorithm", "tiling", "reads", "writes", "total", "peak/M", "predicted", "exact", "total/LB", "max err",
)  # fmt: skip


def _ranked_row(rank: int, r, lb) -> list:
    """One algorithm's row of the table (:data:`TABLE_HEADERS`)."""
    return [
        rank,
        r.algorithm,
        str(r.tiling).replace("rule=", ""),
        *(fmt_int(x) for x in (r.stats.reads, r.stats.writes, r.stats.total)),
        f"{r.stats.peak / r.M:.3f}",
        "-" if r.predicted is None else fmt_int(r.predicted.total),
        exact(r.main.exact),
        f"{r.stats.total / lb:.2f}" if lb else "-",
        fmt_err(r.max_abs_error) if r.finite else "NOT FINITE",
    ]


ONE_HEAD = ("standard", "square-tiling")


def _blocks(r) -> str:
    """The thread blocks of a problem run ('-' for the head-by-head schedules, which launch no kernel grid)."""
    blocks = r.schedule.get("backward_thread_blocks" if "backward" in r.passes else "thread_blocks")
    return fmt_int(blocks) if blocks else "-"


def _compare_problem(args) -> int:
    """``iosim compare`` over a problem: the schedules that apply (:func:`_plans`) run and ranked by words moved,
    side by side against the compulsory traffic, printed as JSON or CSV or as a table
    (:func:`_print_problem`)."""
    from iosim.spec.problem import Problem

    kw = problem_run_kwargs(args)
    problem = kw.pop("problem", None) or Problem(N=args.N, d=args.d, causal=bool(args.causal))
    for k in ("N", "d", "causal", "gqa", "splits", "mla"):
        kw.pop(k, None)
    backward = bool(kw.get("backward"))
    plans, failures = _plans(problem, args.splits, backward)
    results = []
    for a, g, s, m in plans:
        try:
            results.append(api.run_keywords(a, problem=problem, gqa=g, splits=s, mla=m, **kw))
        except (CapacityError, InputError) as e:
            if isinstance(e, InputError) and e.parameter not in ("M", "tiling", "Br, Bc"):
                raise
            failures.append(f"{a} gqa={g} splits={s}: {e}")
    if not results:
        tiles = {k: v for k, v in (("--Br", args.Br), ("--Bc", args.Bc), ("--B", args.B)) if v}
        if tiles:  # the tiles asked for, not M, are what does not fit
            raise InputError(", ".join(tiles), f"give a working set above M = {args.M:,} words in every schedule "
                             f"of {problem}: choose smaller tiles (or a larger M)",
                             tuple(tiles.values()) if len(tiles) > 1 else next(iter(tiles.values())))  # fmt: skip
        raise InputError("M", f"is too small for every schedule of {problem}", args.M)
    results.sort(key=lambda r: r.stats.total)
    seen = api.problem_seen(problem, kw.get("mask"), allow_long=kw.get("allow_long", False))
    need = problem.compulsory_backward(seen) if backward else problem.compulsory(seen)
    _print_problem(args, problem, results, failures, need, kw.get("mask") not in (None, "none", "dense"), backward)
    return 0


def _plans(problem, splits: int, backward: bool) -> tuple[list[tuple], list[str]]:
    """The schedules that apply to ``problem``, as (algorithm, gqa, splits, mla), and a line per schedule that does
    not: flash2 and flash1 (GQA per-head and packed; the requested splits for flash2; MLA shared and naive), and
    standard attention and square tiling head by head where no split, page or latent is asked for, under any mask;
    the backward: flash1 and flash2 unsplit, and standard attention and square tiling head by head where N_q = N_k
    and d_qk = d_v."""
    mlas = ("shared", "naive") if problem.latent else ("shared",)
    plans = [
        (a, g, s, m)
        for a in ("flash2", "flash1")
        for g in (("per-head", "packed") if problem.g > 1 else ("packed",))
        for s in sorted({1, splits} if a == "flash2" else {1})
        for m in mlas
    ]
    if not problem.latent and problem.page_size is None and splits == 1:  # each query head its own problem
        plans += [(a, "per-head", 1, "shared") for a in ("standard", "square-tiling")]
    failures = []
    square = problem.N_q == problem.N_k and problem.d_qk == problem.d_v  # a query head is the one-head problem
    if backward:  # flash1, flash2's own problem schedules; standard, square tiling head by head
        plans = [(a, g, s, m) for a, g, s, m in plans if a in ("flash1", "flash2") and s == 1]
        if square and not problem.latent and problem.page_size is None:
            plans += [(a, "per-head", 1, "shared") for a in ("standard", "square-tiling")]
        else:
            failures = [f"{a}: a backward over a problem needs N_q = N_k, d_qk = d_v" for a in ONE_HEAD]
    return plans, failures


def _print_problem(args, problem, results, failures, need: dict, masked: bool, backward: bool) -> None:
    """``--json`` or ``--csv`` (the ranked records and the compulsory words), or the problem's lines (its shape,
    the compulsory traffic in words and bytes), the ranked table and a line per schedule not run."""
    floor = sum(need.values())
    if args.json or args.csv:
        records = [{"rank": i + 1, **r.as_dict()} for i, r in enumerate(results)]
        if args.json:
            doc = {"iosim_version": __version__, "compare": records, "not_run": failures, "compulsory": floor}
            print(json.dumps(doc, indent=2))
        else:
            cols = ("rank", "algorithm", "total", "total_bytes", "peak", "exact", "compulsory_words", "iosim_version")
            writer = csv.DictWriter(sys.stdout, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
            writer.writeheader()
            for rec in records:
                writer.writerow(rec)
        return
    print(f"{problem}; {f'mask {results[0].mask}; ' if masked else ''}M={args.M} words")
    what = (
        "read Q, O, dO, L, K/V once per KV head, write dQ, dK, dV"
        if backward
        else "read Q, K/V once per KV head, write O"
    )
    print(f"compulsory traffic ({what}): {fmt_int(floor)} words, "
          f"{fmt_int(sum(problem.bytes_of(a, w) for a, w in need.items()))} bytes")  # fmt: skip
    rows = [
        [
            i + 1, r.algorithm, r.schedule.get("gqa", "per-head"), r.schedule.get("splits", 1),
            r.schedule.get("mla") or "-",
            str(r.tiling).replace("rule=", ""), fmt_int(r.stats.total), fmt_int(r.total_bytes),
            f"{r.stats.total / floor:.2f}", _blocks(r), f"{r.stats.peak / r.M:.3f}",
            exact(r.main.exact), fmt_err(r.max_abs_error),
        ]
        for i, r in enumerate(results)
    ]  # fmt: skip
    headers = ["rank", "algorithm", "gqa", "splits", "mla", "tiling", "words", "bytes", "/floor", "blocks", "peak/M"]
    print(tabulate(rows, headers=[*headers, "exact", "max err"], tablefmt=args.format, disable_numparse=True))
    for f in failures:
        print(f"not run: {f}")

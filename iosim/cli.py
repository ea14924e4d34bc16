"""The ``iosim`` command line: run one algorithm, compare them all, or print the bounds.

A user mistake (bad size, unknown algorithm, a tiling that does not fit) prints one line on stderr and exits
with code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import warnings
from pathlib import Path

from tabulate import tabulate

from iosim import api, bounds, masks, registry, warmup
from iosim.errors import InputError
from iosim.memory_model import CapacityError, ScheduleError
from iosim.pebble import cli as pebble_cli
from iosim.replay import add_arguments as _replay_arguments
from iosim.replay import command as _cmd_replay
from iosim.show import add_arguments as _show_arguments
from iosim.show import command as _cmd_show

FORMATS = ("simple", "github", "latex", "plain")
COMPARE_DEFAULTS = {"N": 1024, "d": 64, "M": 16384}


def _fmt_int(x) -> str:
    return f"{int(x):,}"


def _fmt_err(x) -> str:
    return "-" if x is None else f"{x:.2e}"


def _positive(name: str, limit: int | None = None):
    """An argparse type: an integer from 1 (to ``limit``); a bad value is one line and exit code 2."""
    accepted = "a positive integer" if limit is None else f"an integer from 1 to {limit:,}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be {accepted}, got {text!r}") from None
        if value <= 0 or (limit is not None and value > limit):
            raise argparse.ArgumentTypeError(f"{name} must be {accepted}, got {value}")
        return value

    return parse


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seed must be an integer from 0 to 2^64 - 1, got {text!r}") from None
    if not 0 <= value < api.MAX_SEED:
        raise argparse.ArgumentTypeError(f"--seed must be an integer from 0 to 2^64 - 1, got {value}")
    return value


def _scale(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--scale must be a finite number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"--scale must be a finite number, got {text!r}")
    return value


SIZES = (("N", "sequence length"), ("d", "head dimension"), ("M", "fast-memory capacity in words"))
LIMITS = {"N": api.MAX_N, "d": api.MAX_D, "M": api.MAX_M}


def _add_sizes(p: argparse.ArgumentParser, defaults: dict | None = None) -> None:
    defaults = defaults or {}
    for name, what in SIZES:
        default = defaults.get(name)
        p.add_argument(
            f"--{name}",
            type=_positive(f"--{name}", LIMITS[name]),
            default=default,
            required=default is None,
            help=what + ("" if default is None else f" (default {default})"),
        )


def _add_mask_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--causal", action="store_true", help="causal masking (the same as --mask causal)")
    p.add_argument("--mask", default=None, help=f"a mask (iosim.masks): {masks.FORMS}")
    p.add_argument(
        "--kv-policy",
        choices=masks.POLICIES,
        default="paper",
        help="K_j, V_j (flash2 forward: Q_i) of an all-empty block: paper loads them (Algorithm 5), skip does not",
    )


def _add_run_options(p: argparse.ArgumentParser) -> None:
    _add_mask_options(p)
    p.add_argument(
        "--backward",
        action="store_true",
        help="run the forward, then the backward pass (dQ, dK, dV); report the backward's counts",
    )
    p.add_argument("--count-only", action="store_true", help="count I/O without arithmetic (scales to N = 2^20)")
    p.add_argument("--tiling", choices=("fit", "paper"), default="fit", help="block-size rule (default fit)")
    p.add_argument("--dtype", choices=api.DTYPES, default="float64", help="compute precision (default float64)")
    p.add_argument("--seed", type=_seed, default=0, help="random seed of the inputs (default 0)")
    p.add_argument("--scale", type=_scale, default=None, help="softmax scale (default 1/sqrt(d))")
    p.add_argument("--no-reference", action="store_true", help="skip the float64 reference check (counts only)")
    p.add_argument("--yes", action="store_true", help="allow a count-only run estimated at over a minute")
    p.add_argument("--format", choices=FORMATS, default="simple", help="table format (latex for papers)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="iosim",
        description="Exact I/O counts of attention algorithms in a two-level memory with fast-memory size M words.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run one algorithm and print its counts")
    p.add_argument("algorithm", help=f"one of: {', '.join(registry.algorithms())}")
    _add_sizes(p)
    _add_run_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")

    p = sub.add_parser("compare", help="every algorithm side by side against the bounds (the main job)")
    _add_sizes(p, COMPARE_DEFAULTS)
    _add_run_options(p)
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the results (with provenance) as JSON")
    out.add_argument("--csv", action="store_true", help="print the results as CSV, one row per algorithm")

    p = sub.add_parser("bounds", help="the papers' bounds at these sizes and the regime (M vs d^2)")
    _add_sizes(p)
    p.add_argument("--mask", default=None, help=f"sparse bounds for a mask: {masks.FORMS}")
    p.add_argument("--format", choices=FORMATS, default="simple")
    p.add_argument("--json", action="store_true", help="print the bounds as JSON")

    p = sub.add_parser("trace", help="record every load, store, alloc and free of a run and write it to a file")
    p.add_argument("algorithm", help=f"one of: {', '.join(registry.algorithms())}")
    _add_sizes(p)
    _add_run_options(p)
    p.add_argument("-o", "--output", required=True, help="the trace file: .csv, .npy or .parquet (iosim[parquet])")

    sub.add_parser("list", help="list the algorithms")

    p = sub.add_parser("check", help="check a GPU kernel against the float64 reference (CUDA simulator if no GPU)")
    p.add_argument("--kernel", required=True, help="one of: flash2, flash1, standard, square-tiling")
    p.add_argument("--quick", action="store_true", help="a few tiny shapes (under a minute on the CUDA simulator)")
    p.add_argument("--N", type=_positive("--N"), nargs="+", help="sequence lengths (default 1 17 113 203 1023)")
    p.add_argument("--d", type=_positive("--d"), nargs="+", help="head dimensions (default 16 59 64 128)")
    p.add_argument("--M", type=_positive("--M"), help="shared memory per block in words (default: ~N/3 blocks)")
    p.add_argument("--tiling", choices=("fit", "paper"), default="fit", help="block-size rule (default fit)")
    p.add_argument("--heads", type=_positive("--heads"), default=2, help="heads per batch (default 2)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the inputs (default 0)")
    p.add_argument("--format", choices=FORMATS, default="simple", help="table format")
    p.add_argument("--dtype", default="float32", help="float32 (default), float64, float16, bfloat16")
    p.add_argument("--layout", default="BHND", help="BHND (default; the kernels' layout) or BNHD")
    p.add_argument("--distribution", nargs="+", help="input distributions (default: all that apply)")

    p = sub.add_parser("gpu-resources", help="registers, spills, shared memory, occupancy of each GPU kernel (no GPU)")
    from iosim import gpu_resources as resources

    resources.add_arguments(p)
    p = sub.add_parser("experiments", help="list or run the papers' experiments (CSV, plot, LaTeX table, verdict)")
    p.add_argument("action", choices=("list", "run"), help="list them, or run one (NAME) or all")
    p.add_argument("name", nargs="?", help="with run: an experiment name or number, or all")
    p.add_argument("--quick", action="store_true", help="smaller smoke-run grids")
    p.add_argument("--out", default="results", help="output folder (default results/)")

    p = sub.add_parser("pebble", help="the red-blue pebble game: play a schedule, check a run, exact tiny optima")
    pebble_cli.add_arguments(p)

    p = sub.add_parser("sweep", help="count a grid of (algorithm, pass, N, d, M, causal, tiling) points")
    p.add_argument("--algorithm", nargs="+", help="algorithms (default: all)")
    p.add_argument("--pass", dest="passes", nargs="+", default=["forward"], help="forward and/or backward")
    for name, what in SIZES:
        p.add_argument(f"--{name}", type=int, nargs="+", required=True, help=what + " (one or more)")
    p.add_argument("--causal", choices=("no", "yes", "both"), default="no", help="causal masking (default no)")
    p.add_argument("--mask", nargs="+", default=["none"], help=f"masks (default none): {masks.FORMS}")
    p.add_argument("--kv-policy", nargs="+", default=["paper"], help="empty-block policies: paper and/or skip")
    p.add_argument("--tiling", nargs="+", default=["fit"], help="block-size rules: fit and/or paper (default fit)")
    p.add_argument("--numeric", action="store_true", help="run the arithmetic too (default: count-only)")
    p.add_argument("--jobs", type=_positive("--jobs"), help="worker processes (default: all cores)")
    p.add_argument("--executor", default="processes", help="processes (default), serial, dask:ADDRESS or dask:local")
    p.add_argument("--out", help="write the records to a .csv, .jsonl or .parquet file")
    p.add_argument(
        "--cache", default="results/.sweep_cache.jsonl", help="cache file (default results/.sweep_cache.jsonl)"
    )
    p.add_argument("--no-cache", action="store_true", help="recompute every point")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help="progress bar")
    p.add_argument("--format", choices=FORMATS, default="simple", help="table format")

    _show_arguments(sub.add_parser("show", help="draw a schedule: tile heat maps, residency timeline, steps, GIF"))
    _replay_arguments(sub.add_parser("replay", help="replay a schedule's computation through an LRU/FIFO/OPT cache"))
    return parser


def _run_kwargs(args) -> dict:
    return dict(
        M=args.M,
        N=args.N,
        d=args.d,
        causal=args.causal,
        mask=args.mask,
        kv_policy=args.kv_policy,
        backward=args.backward,
        count_only=args.count_only,
        tiling=args.tiling,
        dtype=args.dtype,
        seed=args.seed,
        scale=args.scale,
        reference=not args.no_reference,
        allow_long=args.yes,
    )


def _mask_words(args) -> str:
    if args.mask not in (None, "none", "dense"):
        return f"mask {args.mask} (kv policy {args.kv_policy})"
    return "causal" if args.causal else "non-causal"


def _exact(x) -> str:
    return "-" if x is None else "yes" if x else "NO"


def _cmd_run(args) -> int:
    r = api.run(args.algorithm, **_run_kwargs(args))
    if args.json:
        print(json.dumps(r.as_dict(), indent=2))
        return 0 if r.finite else 1
    s, p = r.stats, r.predicted
    rows = [
        ["algorithm", r.algorithm],
        ["pass", r.main.name],
        ["N, d, M", f"{r.N}, {r.d}, {r.M}"],
        ["regime", r.regime],
        ["mask", r.mask if r.mask in ("none", "causal") else f"{r.mask} (kv policy {r.kv_policy})"],
        ["tiling", str(r.tiling)],
        ["reads", _fmt_int(s.reads)],
        ["writes", _fmt_int(s.writes)],
        ["  of which initialisation", _fmt_int(s.init_writes)],
        ["total", _fmt_int(s.total)],
        ["predicted total (io_model)", "-" if p is None else _fmt_int(p.total)],
        ["exact (per array and peak)", _exact(r.main.exact)],
        ["peak / M", f"{s.peak} / {r.M}"],
        ["fast memory at the peak", ", ".join(f"{n} {w}" for n, w in s.at_peak.items()) or "-"],
        [f"lower bound ({r.main.lower_bound_name})", _fmt_int(r.lower_bound)],
        ["total / lower bound", f"{s.total / r.lower_bound:.2f}" if r.lower_bound else "-"],
        ["max abs error vs float64", _fmt_err(r.max_abs_error)],
        ["outputs finite", "yes" if r.finite else "NO (overflow: see the warning)"],
    ]
    if "backward" in r.passes:
        f = r.passes["forward"]
        rows += [
            *([name + " max abs error", _fmt_err(err)] for name, err in r.errors.items()),
            ["forward tiling", str(f.tiling)],
            ["forward total", _fmt_int(f.stats.total)],
            ["forward exact", _exact(f.exact)],
            ["total, both passes", _fmt_int(f.stats.total + s.total)],
        ]
    print(tabulate(rows, tablefmt=args.format))
    per = [[n, _fmt_int(c.reads), _fmt_int(c.writes), _fmt_int(c.init_writes)] for n, c in s.per_array.items()]
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


CSV_COLUMNS = (
    "rank", "algorithm", "pass", "N", "d", "M", "causal", "dtype", "seed", "scale", "tiling", "reads", "writes",
    "total", "init_writes", "peak", "predicted_total", "exact", "lower_bound", "lower_bound_name", "max_abs_error",
    "finite", "iosim_version",
)  # fmt: skip


def _cmd_compare(args) -> int:
    results = []
    failures = []
    sparse = args.mask not in (None, "none", "dense") and args.mask != "causal"
    mask = masks.compile_mask(args.mask, args.N) if sparse else None
    lb, lb_name = bounds.lower_bound(args.N, args.d, args.M, backward=args.backward, mask=mask)
    kwargs = _run_kwargs(args)
    names = [n for n in registry.algorithms() if not args.backward or registry.get(n).has_backward]
    failures += [f"{n}: no backward pass" for n in registry.algorithms() if n not in names]
    # On a cold Numba cache, a second process compiles standard attention and FlashAttention-1 (about half the
    # first run's compile time) while this one runs the others: iosim.warmup.
    key = f"compare-{args.dtype}-{'b' if args.backward else 'f'}-{'c' if args.count_only else 'n'}"
    later = [n for n in names if n in ("standard", "flash1")]
    worker = warmup.start(later, kwargs, key) if len(names) > 1 else None
    order = [n for n in names if n not in later] + later if worker else names
    for name in order:
        if name in later and worker is not None:
            worker.join()
        try:
            results.append(api.run(name, **kwargs))
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
    results.sort(key=lambda r: r.stats.total)
    if args.json or args.csv:
        records = [{"rank": i + 1, **r.as_dict()} for i, r in enumerate(results)]
        if args.json:
            print(
                json.dumps(
                    {"compare": records, "not_run": failures, "lower_bound": lb, "lower_bound_name": lb_name}, indent=2
                )
            )
        else:
            writer = csv.DictWriter(sys.stdout, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
            writer.writeheader()
            for rec in records:
                writer.writerow({**rec, "tiling": ";".join(f"{k}={v}" for k, v in rec["tiling"].items())})
        return 0 if all(r.finite for r in results) else 1
    ranked = [
        [
            i + 1,
            r.algorithm,
            str(r.tiling).replace("rule=", ""),
            *(_fmt_int(x) for x in (r.stats.reads, r.stats.writes, r.stats.total)),
            f"{r.stats.peak / r.M:.3f}",
            "-" if r.predicted is None else _fmt_int(r.predicted.total),
            _exact(r.main.exact),
            f"{r.stats.total / lb:.2f}" if lb else "-",
            _fmt_err(r.max_abs_error) if r.finite else "NOT FINITE",
        ]
        for i, r in enumerate(results)
    ]
    print(
        f"N={args.N}, d={args.d}, M={args.M} words ({bounds.regime(args.d, args.M)}; d^2 = {args.d**2}), "
        f"{_mask_words(args)}, {'backward' if args.backward else 'forward'}, "
        f"tiling={args.tiling}"
    )
    print(f"lower bound: {_fmt_int(lb)} words ({lb_name})")
    if args.backward:
        thm = next(b for b in bounds.backward_bounds(args.N, args.d, args.M) if b.name == "fine-grained Thm 1.1")
        print(
            f"fine-grained backward bound (Li et al., Thm 1.1, Theta with constant 1): {_fmt_int(thm.value)} words"
            f" = {thm.formula}"
        )
    print(_theory_line(args.d, args.M))
    headers = [
        "rank",
        "algorithm",
        "tiling",
        "reads",
        "writes",
        "total",
        "peak/M",
        "predicted",
        "exact",
        "total/LB",
        "max err",
    ]
    print(
        tabulate(
            ranked,
            headers=headers,
            tablefmt=args.format,
            disable_numparse=True,
            colalign=("right", "left", "left", "right", "right", "right", "right", "right", "left", "right", "right"),
        )
    )
    for f in failures:
        print(f"not run: {f}")
    return 0 if all(r.finite for r in results) else 1


def _theory_line(d: int, M: int) -> str:
    winner, reason = bounds.theory_winner(d, M)
    return f"theory says {winner} should move the fewest words: {reason}"


def _cmd_bounds(args) -> None:
    N, d, M = args.N, args.d, args.M
    if args.json:
        from iosim import __version__

        winner, reason = bounds.theory_winner(d, M)
        doc = {"iosim_version": __version__, "N": N, "d": d, "M": M, "regime": bounds.regime(d, M)}
        doc["theory_winner"], doc["reason"] = winner, reason
        groups = [("forward", bounds.forward_bounds(N, d, M)), ("backward", bounds.backward_bounds(N, d, M))]
        if args.mask is not None:
            doc["mask"] = args.mask
            groups.append(("sparse", bounds.sparse_bounds(N, d, M, masks.compile_mask(args.mask, N))))
        for title, bs in groups:
            doc[title] = [
                {k: getattr(b, k) for k in ("name", "kind", "value", "formula", "regime", "applies", "citation")}
                for b in bs
            ]
        print(json.dumps(doc, indent=2))
        return
    print(f"N={N}, d={d}, M={M}: {bounds.regime(d, M)}; d^2 = {d * d}, M/d^2 = {M / (d * d):.3g}")
    print(_theory_line(d, M))
    groups = [("forward", bounds.forward_bounds(N, d, M)), ("backward", bounds.backward_bounds(N, d, M))]
    if args.mask is not None:
        groups.append((f"sparse, mask {args.mask}", bounds.sparse_bounds(N, d, M, masks.compile_mask(args.mask, N))))
        sparse_note = f"note: the sparse nnz lower bound is {bounds.SPARSE_NOTE}"
    else:
        sparse_note = None
    for title, bs in groups:
        rows = [
            [b.name, b.kind, _fmt_int(b.value), b.formula, b.regime, "yes" if b.applies else "no", b.citation]
            for b in bs
        ]
        print()
        print(title)
        print(
            tabulate(
                rows,
                headers=["bound", "kind", "value", "formula", "regime", "applies", "source"],
                tablefmt=args.format,
                disable_numparse=True,
            )
        )
    if sparse_note:
        print()
        print(sparse_note)


def _cmd_list(args) -> None:
    print(
        tabulate(
            [[a.name, a.title, a.citation] for a in registry.REGISTRY.values()], headers=["name", "what", "source"]
        )
    )


def _cmd_check(args) -> int:
    """Numerical check of a built-in GPU kernel; on a machine without a GPU it runs on the CUDA simulator, selected
    in this process before numba.cuda is imported (iosim.gpu.select_target). Exit code 1 when a check fails."""
    from iosim import check as run_check
    from iosim import gpu
    from iosim.check import validate

    validate(args.dtype, args.layout, args.distribution)
    if args.kernel not in gpu.KERNELS:
        raise InputError("--kernel", f"must be one of {', '.join(gpu.KERNELS)}", args.kernel)
    target = gpu.select_target()
    if target == "gpu" and not gpu.gpu_available():
        raise InputError("NUMBA_ENABLE_CUDASIM", "must be unset or 1 on a machine without a CUDA GPU", "0")
    if target == "simulator" and not args.quick and args.N is None:
        raise InputError(
            "--quick",
            "(or small --N and --d) is needed on the CUDA simulator: the full grid of shapes "
            "up to N=1023, d=128 takes hours without a GPU",
            "no --quick",
        )
    where = "the CUDA simulator (no GPU found)" if target == "simulator" else "the GPU"
    memory = f"M = {args.M} words" if args.M else "M chosen for about 3 blocks along N"
    print(f"iosim check: kernel {args.kernel} on {where}; shared memory per block: {memory}")
    fn = gpu.attention(args.kernel, args.M, tiling=args.tiling)
    report = run_check(
        fn,
        N=args.N,
        d=args.d,
        quick=args.quick,
        heads=args.heads,
        seed=args.seed,
        name=args.kernel,
        dtype=args.dtype,
        layout=args.layout,
        distributions=args.distribution,
    )
    print(report.table(args.format))
    print(report.summary())
    return 0 if report.passed else 1


def _cmd_gpu_resources(args) -> int:
    """Registers, spills and shared memory from ptxas, and the occupancy they imply on sm_80 / sm_90 (no GPU)."""
    from iosim import gpu_resources as resources

    return resources.run(args)


def _experiments_package():
    """The experiments/ package of the source checkout, loaded as ``experiments`` (it is not installed: experiments
    sit on top of iosim). IOSIM_EXPERIMENTS=PATH points elsewhere."""
    import importlib.util
    from pathlib import Path

    root = Path(os.environ.get("IOSIM_EXPERIMENTS") or Path(__file__).resolve().parents[1] / "experiments")
    if "experiments" in sys.modules and Path(sys.modules["experiments"].__file__).parent == root:
        return sys.modules["experiments"]
    init = root / "__init__.py"
    if not init.exists():
        raise InputError(
            "experiments", "need a source checkout (experiments/ beside iosim/) or IOSIM_EXPERIMENTS=PATH", str(root)
        )
    spec = importlib.util.spec_from_file_location("experiments", init, submodule_search_locations=[str(root)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["experiments"] = mod
    spec.loader.exec_module(mod)
    return mod


def _cmd_experiments(args) -> int:
    """``iosim experiments list | run NAME | run all``: results/<stem>.{csv,png,tex,md}; ``all`` adds index.md."""
    import time
    from pathlib import Path

    ex = _experiments_package()
    if args.action == "list":
        rows = [
            [e.name, e.stem, e.item, e.title if not e.pending else f"{e.title} ({e.pending})"] for e in ex.EXPERIMENTS
        ]
        print(tabulate(rows, headers=["name", "file", "claim", "what"]))
        return 0
    if not args.name:
        raise InputError("experiments run", f"needs a NAME: one of {', '.join(ex.names())} or all")
    out = Path(args.out)
    try:
        if args.name == "all":
            t0 = time.perf_counter()
            ex.run_all(out, quick=args.quick)
            print(f"all experiments in {time.perf_counter() - t0:.0f} s; wrote {out / 'index.md'}")
            return 0
        v = ex.run(ex.get(args.name), out, quick=args.quick)
    except ex.MissingExtra as e:
        print(e, file=sys.stderr)
        return 2
    print(f"{v.name}: {v.line()}")
    for n in v.notes:
        print(f"  - {n}")
    print(f"wrote {', '.join(str(out / f) for f in v.files)} in {v.seconds:.1f} s")
    return 0


def _cmd_sweep(args) -> int:
    """``iosim sweep``: every point of the grid; invalid points are listed on stderr (exit 2), the rest still run."""
    from iosim.sweep import PASSES, sweep  # the module (iosim.sweep, the attribute, is the function)

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
    )
    ok = [r for r in recs if r["status"] == "ok"]
    if ok:
        cols = ["algorithm", "pass", "N", "d", "M", "causal", "tiling", "total", "exact", "total_over_lb"]
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


def _cmd_trace(args) -> int:
    """Run one algorithm with the event trace on and write it (.csv, .npy or .parquet), then replay it."""
    from iosim.trace_io import write_trace

    out = Path(args.output)
    kwargs = _run_kwargs(args)
    r = api.run(args.algorithm, **{**kwargs, "trace": True})
    write_trace(r.trace, out)  # checks the suffix and the parquet extra before anything is written
    replayed = r.trace.replay(r.M, strict=False)
    same = replayed == r.stats
    print(
        f"{r.algorithm} {r.main.name}: {len(r.trace):,} events written to {out} "
        f"({out.stat().st_size:,} bytes); reads {_fmt_int(r.stats.reads)}, writes {_fmt_int(r.stats.writes)}, "
        f"peak {r.stats.peak} of M={r.M}"
    )
    print(f"replay through a fresh model of M={r.M} words: {'equal counts and peak' if same else 'DIFFERENT'}")
    return 0 if same else 1


class _CompileNotice:
    """Prints one line on stderr when Numba starts compiling (a first run, or after a code change)."""

    def __init__(self) -> None:
        self.shown = False

    def __call__(self, *_) -> None:
        if not self.shown:
            self.shown = True
            print(
                "iosim: compiling Numba kernels for first use (cached for later runs; NUMBA_CACHE_DIR sets where) ...",
                file=sys.stderr,
                flush=True,
            )


def _watch_compiles():
    from numba.core import event

    notice = _CompileNotice()

    class Listener(event.Listener):
        def on_start(self, ev):
            notice()

        def on_end(self, ev):
            pass

    event.register("numba:compile", Listener())


COMMANDS = {
    "run": _cmd_run,
    "compare": _cmd_compare,
    "bounds": _cmd_bounds,
    "list": _cmd_list,
    "check": _cmd_check,
    "gpu-resources": _cmd_gpu_resources,
    "experiments": _cmd_experiments,
    "sweep": _cmd_sweep,
    "trace": _cmd_trace,
    "replay": _cmd_replay,
    "show": _cmd_show,
    "pebble": pebble_cli.command,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _watch_compiles()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RuntimeWarning)
            rc = COMMANDS[args.command](args)
        for w in caught:
            if issubclass(w.category, RuntimeWarning) and str(w.message).startswith(tuple(registry.REGISTRY)):
                print(f"iosim: warning: {w.message}", file=sys.stderr)
    except (InputError, CapacityError, ScheduleError) as e:
        print(f"iosim: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and closed early: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return rc or 0


if __name__ == "__main__":
    sys.exit(main())

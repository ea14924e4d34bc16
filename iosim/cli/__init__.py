"""The ``iosim`` command line: one module per subcommand, each with ``add_arguments(parser)`` and ``command(args)``.

The options they share (sizes, masks, the run options, formats, validators) live in :mod:`iosim.cli.options`, which
imports none of them. Nothing outside this package imports the command line. A user mistake (bad size, unknown
algorithm, a tiling that does not fit) prints one line on stderr and exits with code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

from iosim.base.errors import InputError
from iosim.cli import (
    bounds,
    check,
    compare,
    experiments,
    gpu_resources,
    hierarchy,
    kernel,
    listing,
    pebble,
    replay,
    run,
    show,
    sweep,
    trace,
)
from iosim.memory_model import CapacityError, ScheduleError, TraceTooLargeError
from iosim.runner import registry

# name -> (module, help): the order is the order of ``iosim --help``.
COMMANDS = {
    "run": (run, "run one algorithm and print its counts"),
    "compare": (compare, "every algorithm side by side against the bounds (the main job)"),
    "bounds": (bounds, "the papers' bounds at these sizes and the regime (M vs d^2)"),
    "trace": (trace, "record every load, store, alloc and free of a run and write it to a file"),
    "list": (listing, "list the algorithms"),
    "check": (check, "check a GPU kernel against the float64 reference (CUDA simulator if no GPU)"),
    "gpu-resources": (gpu_resources, "registers, spills, shared memory, occupancy of each GPU kernel (no GPU)"),
    "experiments": (experiments, "list or run the papers' experiments (CSV, plot, LaTeX table, verdict)"),
    "pebble": (pebble, "the red-blue pebble game: play a schedule, check a run, exact tiny optima"),
    "sweep": (sweep, "count a grid of (algorithm, pass, N, d, M, causal, tiling) points"),
    "show": (show, "draw a schedule: tile heat maps, residency timeline, steps, GIF"),
    "replay": (replay, "replay a schedule's computation through an LRU/FIFO/OPT cache"),
    "kernel": (kernel, "count a real kernel's I/O without a GPU (Triton, Pallas, numba.cuda) beside the closed form"),
    "hierarchy": (hierarchy, "a launch over many SMs, a shared L2 and DRAM: DRAM traffic per array and block order"),
}


def build_parser() -> argparse.ArgumentParser:
    from iosim.cli.options import Parser

    parser = Parser(
        prog="iosim",
        description="Exact I/O counts of attention algorithms in a two-level memory with fast-memory size M words.",
    )
    from iosim.base.version import __version__

    parser.add_argument("--version", action="version", version=f"iosim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name, (module, what) in COMMANDS.items():
        module.add_arguments(sub.add_parser(name, help=what))
    return parser


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


def _watch_compiles(command: str = ""):
    from numba.core import event

    from iosim.base import numba_cache as _numba_cache

    notice = _CompileNotice()
    # an empty cache: say so at once (within 2 s), not only when the first compile starts
    if command not in ("list", "experiments") and _numba_cache.cold():
        notice()

    class Listener(event.Listener):
        def on_start(self, ev):
            notice()

        def on_end(self, ev):
            pass

    listener = Listener()
    event.register("numba:compile", listener)
    return listener


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    listener = _watch_compiles(args.command)
    try:
        return _main(args)
    finally:  # one notice per command: main() called again in the same process (tests, notebooks) adds no listener
        from numba.core import event

        event.unregister("numba:compile", listener)


def _main(args) -> int:
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RuntimeWarning)
            rc = COMMANDS[args.command][0].command(args)
        for w in caught:
            if issubclass(w.category, RuntimeWarning) and str(w.message).startswith(tuple(registry.REGISTRY)):
                print(f"iosim: warning: {w.message}", file=sys.stderr)
    except (InputError, CapacityError, ScheduleError) as e:
        print(f"iosim: error: {e}", file=sys.stderr)
        return 2
    except TraceTooLargeError as e:  # a trace taken outside iosim.run (which names it as an InputError on trace)
        print(f"iosim: error: trace {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and closed early: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # a file that could not be written after all (a full disk, a folder removed meanwhile)
        where = f" {e.filename}" if e.filename else ""
        print(f"iosim: error: could not write{where}: {e.strerror or e}", file=sys.stderr)
        return 2
    return rc or 0

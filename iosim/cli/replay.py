"""``iosim replay ALGO ...``: a schedule's computation through LRU / FIFO / Belady OPT caches."""

from __future__ import annotations

import argparse
import json

from iosim.cli.options import (
    add_algorithm,
    add_problem_options,
    add_problem_sizes,
    add_run_options,
    positive,
    problem_run_kwargs,
)
from iosim.views import replay


def add_arguments(p) -> None:
    """``iosim replay ALGO --N --d --M [--policy lru,opt,fifo] [--line WORDS] [--no-write-allocate]``, or a problem
    (``--batch --heads --kv-heads --Nq --Nk --dqk --dv --gqa``: flash1 and flash2)."""
    add_algorithm(p)
    add_problem_sizes(p)
    add_run_options(p)
    add_problem_options(p)
    p.add_argument("--policy", default="lru,opt,fifo", help="replacement policies, comma-separated (lru, opt, fifo)")
    p.add_argument(
        "--line",
        type=positive("--line"),
        default=1,
        help="cache line in words (default 1; 8 = a 32-byte fp32 sector)",
    )
    p.add_argument(
        "--write-allocate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a write miss fetches the line (default); --no-write-allocate writes the word through",
    )
    p.add_argument("--cache-words", type=positive("--cache-words"), default=None, help="cache size (default M)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def command(args) -> int:
    kw = problem_run_kwargs(args)
    for k in ("count_only", "reference", "dtype"):
        kw.pop(k, None)
    if kw.get("problem") is not None:
        kw.pop("causal", None)
    r = replay.replay(
        args.algorithm,
        policy=args.policy,
        line=args.line,
        write_allocate=args.write_allocate,
        cache_words=args.cache_words,
        **kw,
    )
    if args.json:
        print(json.dumps(r.as_dict(), indent=2))
        return 0
    wa = "write-allocate" if r.write_allocate else "no write-allocate"
    shape = str(r.problem) if r.problem is not None else f"N={r.N}, d={r.d}"
    print(
        f"{r.algorithm} {'backward' if r.backward else 'forward'}{', causal' if r.causal else ''}: {shape}, "
        f"M={r.M} words; cache {r.cache_words:,} words, fully associative, line {r.line} word(s), {wa}; "
        f"{r.accesses:,} operand accesses"
    )
    print(r.table(args.format))
    for name, p in r.policies.items():
        print(f"{name}: {p.total:,} words, {r.ratio(name):.2f}x the explicit schedule")
    return 0

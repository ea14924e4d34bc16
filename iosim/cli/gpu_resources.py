"""``iosim gpu-resources``: registers, spills, shared memory and occupancy of each GPU kernel from ptxas (no GPU)."""

from __future__ import annotations

import argparse
import json

from iosim.base.errors import InputError
from iosim.cli.options import FORMATS, positive
from iosim.gpu import resources


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cc", nargs="+", default=list(resources.DEFAULT_CC), help="compute capabilities (default 8.0 9.0)")
    p.add_argument(
        "--N", type=positive("--N"), nargs="+", default=[resources.DEFAULT_N], help=f"(default {resources.DEFAULT_N})"
    )
    p.add_argument("--d", type=positive("--d"), nargs="+", default=list(resources.DEFAULT_D), help="(default 64)")
    p.add_argument(
        "--M",
        type=positive("--M"),
        nargs="+",
        default=list(resources.DEFAULT_M),
        help="shared memory per block in words (default 4096 16384 49152)",
    )
    p.add_argument("--threads", type=positive("--threads"), default=128, help="threads per block (default 128)")
    p.add_argument("--format", choices=FORMATS, default="simple", help="table format")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")


def command(args) -> int:
    """The report for parsed arguments; raises InputError on bad input."""
    ccs = [resources.parse_cc(c) for c in args.cc]
    if args.threads > 1024:
        raise InputError("--threads", "must be at most 1024 (threads per block)", args.threads)
    missing = resources.toolchain_missing()
    if missing:
        raise InputError("the cuda extra", f"is needed for the resource report: {missing}")
    from iosim.algorithms.cuda.ptx import real_target

    try:
        real_target()
    except RuntimeError as e:
        raise InputError("NUMBA_ENABLE_CUDASIM", f"must be off for the resource report: {e}", "1") from None
    rs = resources.rows(ccs, args.N, args.d, args.M, args.threads)
    if args.json:
        print(json.dumps(rs, indent=1))
        return 0
    kit = rs[0]["toolkit"] if rs else ""
    print(f"Kernel resources from ptxas ({kit}), no GPU used; N={args.N}, d={args.d}, M in float32 words.")
    kib = resources.KIB
    for cc in ccs:
        a = resources.ARCHS[cc]
        print(
            f"sm_{cc[0]}{cc[1]} ({a.gpu}): {a.regs_per_sm} registers/SM, {a.smem_per_sm // kib} KiB shared/SM, "
            f"{a.smem_optin_per_block // kib} KiB/block with the opt-in ({a.smem_default_per_block // kib} without), "
            f"{a.reserved_smem_per_block} B reserved/block, {a.max_threads_per_sm} threads, "
            f"{a.max_blocks_per_sm} blocks/SM"
        )
    print(resources.table(rs, args.format))
    return 0

"""``iosim hierarchy ALGO --N --d [--device H100 | --P --C --L] ...``: a launch over SMs, a shared L2 and DRAM."""

from __future__ import annotations

import argparse
import json

from iosim.cli.options import (
    FORMATS,
    add_algorithm,
    add_mask_options,
    add_yes,
    dtype_choice,
    positive,
    refuse_contradictions,
    schedule_of,
)
from iosim.runner import api


def _nonnegative(name: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a non-negative integer, got {text!r}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"{name} must be a non-negative integer, got {value}")
        return value

    return parse


def _partitions(text: str):
    """--l2-partitions: a positive integer or 'device'."""
    if text == "device":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"--l2-partitions must be a positive integer or 'device', got {text!r}")
    return value


def _sector_bytes(text: str):
    """--sector-bytes: a positive integer or 'device'."""
    if text == "device":
        return text
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--sector-bytes must be a positive integer or 'device', got {text!r}")
    return int(text)


def _kernel(text: str):
    """--kernel: a FlashAttention-2 kernel name (Nsight Compute's), or threads=T,smem=BYTES[,registers=R]."""
    if "<" in text:
        return text
    keys = {"threads": "threads", "smem": "smem_bytes", "registers": "registers"}
    out = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        if key.strip() not in keys or not value.strip().isdigit():
            raise argparse.ArgumentTypeError(
                f"--kernel must be a FlashAttention-2 kernel name or threads=T,smem=BYTES[,registers=R], got {text!r}"
            )
        out[keys[key.strip()]] = int(value)
    if not {"threads", "smem_bytes"} <= set(out):
        raise argparse.ArgumentTypeError(f"--kernel needs threads= and smem= (registers= optional), got {text!r}")
    return out


def add_arguments(p) -> None:
    """Sizes, the launch (B, H_q, H_kv), the machine (a device preset or P, C, L), block order and L2 policy."""
    from iosim.hierarchy import ORDERS, POLICIES

    add_algorithm(p)
    p.add_argument("--N", type=positive("--N"), default=None, help="sequence length (N_q = N_k = N)")
    p.add_argument("--d", type=positive("--d"), required=True, help="head dimension (d_qk)")
    p.add_argument("--Nq", type=positive("--Nq", api.MAX_N), default=None, help="query rows N_q (default N)")
    p.add_argument("--Nk", type=positive("--Nk", api.MAX_N), default=None, help="keys N_k (default N)")
    p.add_argument("--dv", type=positive("--dv", api.MAX_D), default=None, help="value width (default d)")
    p.add_argument("--page-size", type=positive("--page-size", api.MAX_N), default=None, help="paged KV: P tokens")
    p.add_argument(
        "--mla",
        choices=("shared", "naive"),
        default=None,
        help="MLA latent cache (H_kv = 1, V the first d_v columns of K): V read shared or naive",
    )
    p.add_argument("--gqa", choices=("per-head", "packed"), default="per-head",
                   help="per-head: a CTA family per query head; packed (flash1, flash2): per KV head, its g query "
                   "heads' rows together (default per-head)")  # fmt: skip
    # the spelling and range of iosim run's --splits (iosim.cli.options defines it inside the problem group)
    p.add_argument("--splits", type=positive("--splits", api.MAX_N), default=1,
                   help="split-KV splits (flash2's forward): the split kernel, then the combine kernel")  # fmt: skip
    p.add_argument("--pages", choices=("pieces", "gather"), default="pieces",
                   help="flash1 over a paged cache: an outer step per page piece, or each column block gathered from "
                   "its pages (default pieces)")  # fmt: skip
    p.add_argument(
        "--M", type=positive("--M"), default=None, help="shared memory per block in words (default: the device's)"
    )
    # the spellings of iosim run (--batch, --heads, --kv-heads; --H-q, --H-kv kept as aliases) and its explicit tiles
    p.add_argument("--batch", dest="batch", type=positive("--batch"), default=1, help="batch (default 1)")
    p.add_argument("--heads", "--H-q", dest="H_q", type=positive("--heads"), default=1, help="query heads (default 1)")
    p.add_argument("--kv-heads", "--H-kv", dest="H_kv", type=positive("--kv-heads"), default=None,
                   help="key/value heads (default H_q)")  # fmt: skip
    p.add_argument("--device", default=None, help="a preset of the devices table (A100, H100, H200, RTX 4090, ...)")
    p.add_argument("--P", type=positive("--P"), default=None, help="SMs (default: the device's, or 1)")
    p.add_argument("--C", type=_nonnegative("--C"), default=None, help="L2 words (0: no L2; default: the device's)")
    p.add_argument("--L", type=positive("--L"), default=None, help="L2 line in words (default: the device's, or 1)")
    p.add_argument("--blocks-per-sm", type=positive("--blocks-per-sm"), default=None, help="default: what fits")
    p.add_argument(
        "--kernel",
        type=_kernel,
        default=None,
        metavar="NAME|threads=T,smem=B[,registers=R]",
        help="with --device: the kernel whose threads, registers and shared memory give the blocks per SM "
        "(an FA2 kernel name as Nsight Compute prints it, or its figures; registers unknown: upper bound)",
    )
    p.add_argument("--bytes-per-word", type=positive("--bytes-per-word"), default=None,
                   help="every array's bytes per word (default 2: fp16/bf16); not with --dtype-*")  # fmt: skip
    # iosim run's dtype options: given, each array is priced at its dtype as the kernels move it (element_bytes kernel)
    p.add_argument("--dtype-q", type=dtype_choice("--dtype-q"), default=None, help="storage dtype of Q (bytes)")
    p.add_argument("--dtype-kv", type=dtype_choice("--dtype-kv"), default=None, help="storage dtype of K, V")
    p.add_argument("--dtype-o", type=dtype_choice("--dtype-o"), default=None, help="storage dtype of O")
    p.add_argument(
        "--l2-partitions",
        type=_partitions,
        default=None,
        help="L2 partitions, each serving its share of the SMs: a number, or 'device' for the preset's (the H100's "
        "and A100's 2); default 1, the single shared L2",
    )
    p.add_argument(
        "--home-lines",
        type=positive("--home-lines"),
        default=1,
        help="a line's home partition: (its line index in its array // this) mod partitions (default 1)",
    )
    p.add_argument(
        "--sector-bytes",
        type=_sector_bytes,
        default=None,
        metavar="BYTES|device",
        help="fill and write back the L2's lines by sectors of this size ('device': the preset's, 32 B on "
        "the H100); default whole lines",
    )
    p.add_argument("--order", choices=ORDERS, default="head-grouped", help="block order (default head-grouped)")
    p.add_argument("--scheduler", default=None, metavar="KEY=VALUE,...",
                   help="a tile scheduler (iosim.hierarchy.scheduler): order=grid|head-grouped|swizzled|sections:K|"
                   "lpt|lpt-sections:K, walk=ascending|descending|sawtooth[:W], persistent=static|dynamic, stall=W, "
                   "seed=S (docs/scheduler.md); its order replaces --order")  # fmt: skip
    p.add_argument("--policy", default="lru", metavar="|".join(POLICIES),
                   help="L2 replacement (default lru; opt = the floor; random[:SEED]; sets:W[:xor], W-way "
                   "set-associative LRU: iosim.hierarchy.replacement)")  # fmt: skip
    p.add_argument("--flush", choices=("per-kernel",), default=None,
                   help="write back and empty the L2 between launches (Nsight Compute's cache control); default: "
                   "the L2 kept across launches")  # fmt: skip
    p.add_argument("--backward", action="store_true", help="the backward pass's launch")
    add_mask_options(p)
    p.add_argument("--tiling", choices=("fit", "paper"), default="fit", help="block-size rule (default fit)")
    p.add_argument("--Br", type=positive("--Br", api.MAX_N), default=None, help="row block (flash1, flash2)")
    p.add_argument("--Bc", type=positive("--Bc", api.MAX_N), default=None, help="column block (flash1, flash2)")
    p.add_argument("--B", type=positive("--B", api.MAX_N), default=None, help="square tile (standard, square-tiling)")
    p.add_argument("--format", choices=FORMATS, default="simple", help="table format")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_yes(p, "a launch")


def command(args) -> int:
    from iosim.hierarchy import Machine, Scheduler, hierarchy

    shape = _shape(args)
    s = schedule_of(args, args.algorithm)  # the Schedule, checked once before any work, as every command's
    scheduler = None
    if args.scheduler is not None:
        from iosim.base.errors import InputError

        if args.order != "head-grouped":
            raise InputError("--order", "goes inside --scheduler when a scheduler is given (order=...)", args.order)
        scheduler = Scheduler.parse(args.scheduler)
    machine = Machine(args.device, P=args.P, C=args.C, L=args.L, blocks_per_sm=args.blocks_per_sm,
                      partitions=args.l2_partitions, home_lines=args.home_lines, sector_bytes=args.sector_bytes,
                      kernel=args.kernel, flush=args.flush)  # fmt: skip
    if scheduler is None:
        scheduler = Scheduler(order=args.order)
    r = hierarchy(s, **shape, M=args.M, device=machine, scheduler=scheduler, policy=args.policy, mask=args.mask,
                  allow_long=args.yes)  # fmt: skip
    if args.json:
        print(json.dumps(r.as_dict(), indent=2))
        return 0
    where = f"{r.device}: " if r.device else ""
    what = f"B={r.B}, H_q={r.H_q}, H_kv={r.H_kv}, N={r.N}, d={r.d}" if r.problem is None else f"{r.problem}"
    what += f", GQA {r.gqa}" if r.problem is not None and r.H_q > r.H_kv else ""
    what += f", split-KV {r.splits} splits" if r.splits > 1 else ""
    print(
        f"{r.algorithm} {'backward' if r.backward else 'forward'}: {what}; {where}P={r.P} SMs x {r.blocks_per_sm} "
        f"block(s) of M={r.M:,} words, L2 C={r.C:,} words "
        f"({r.policy}), lines of L={r.L} words, {r.bytes_per_word} bytes per word; order {r.order}"
    )
    if args.kernel is not None:  # (the samples of the docs pages print no such line where no kernel is named)
        print(f"blocks per SM: {r.blocks_per_sm} ({r.resident})")
    if r.sector_bytes is not None:
        print(f"L2 fills and write-backs by sectors of {r.sector_bytes} bytes")
    kernels = "; ".join(k["kernel"] for k in r.launches)
    print(
        f"{r.ctas:,} thread blocks in {len(r.launches)} launch(es) ({kernels}), waves "
        f"{', '.join(map(str, r.waves))}; {r.requests:,} tile requests; {r.tiling}"
    )
    print(r.table(args.format))
    if r.element_bytes == "kernel":
        print(r.bytes_table(args.format))
    if r.element_bytes == "kernel" or r.l2_partitions > 1:
        _levels(r)
    print(
        f"DRAM: {r.dram_read:,} words read + {r.dram_update:,} written = {r.dram:,} words = {r.dram_bytes:,} bytes; "
        f"{r.ratio:.4f} of the two-level count {r.two_level:,}"
    )
    for k in (k for k in r.launches if "read_bytes" in k):  # dQ's conversion: its own launch, its own dtypes
        (src, n_in), (dst, n_out) = next(iter(k["reads"].items())), next(iter(k["writes"].items()))
        print(
            f"= the schedule's launches {r.schedule_dram:,} words ({r.schedule_dram / r.two_level:.4f} of the "
            f"two-level count) + convert dQ {r.convert_dq_dram:,} words; convert dQ reads {n_in:,} words of {src} "
            f"({k['read_dtype']}, {k['read_bytes']:,} bytes) and writes {n_out:,} of {dst} ({k['write_dtype']}, "
            f"{k['write_bytes']:,} bytes)"
        )
    return 0


def _levels(r) -> None:
    """The levels as Nsight Compute counts them: L2 requests from the SMs, fabric traffic, DRAM writes both ways."""
    d = r.as_dict()
    print(
        f"L2 requests from the SMs: {d['l2_request_bytes']:,} bytes; between the {r.l2_partitions} L2 partition(s): "
        f"{d['fabric_bytes']:,} bytes; DRAM read {r.level_bytes('dram_read'):,} bytes"
    )
    if r.dram_writes:
        each = "; ".join(f"{w['kernel']} {w['during_bytes']:,}" for w in r.dram_writes)
        print(
            f"DRAM writes during the kernels: {each} bytes; with the final flush "
            f"{r.level_bytes('dram_update'):,} bytes ({r.final_flush_bytes:,} flushed after the last launch)"
        )


def _shape(args) -> dict:
    """N, d, the launch's heads and the word size, or a problem (iosim.Problem) when --Nq, --Nk, --dv,
    --page-size, --mla, --gqa packed, --splits, GQA heads (the backward's group sum) or a mask over several heads (a
    mask_mod may read b and h) asks for one beyond N x d: --N and --Nq/--Nk spell the same launch."""
    from iosim.base.errors import InputError
    from iosim.spec.problem import BYTES, Problem

    dtype_of_bytes = {BYTES[n]: n for n in ("fp8", "bf16", "fp32", "fp64")}  # the word size as a storage dtype

    fields = dict(B=args.batch, H_q=args.H_q, H_kv=args.H_kv, causal=args.causal)
    beyond = (args.Nq, args.Nk, args.dv, args.page_size, args.mla)
    dtypes = (args.dtype_q, args.dtype_kv, args.dtype_o)
    if any(x is not None for x in dtypes) and args.bytes_per_word is not None:
        raise InputError("--bytes-per-word", "goes without --dtype-q/--dtype-kv/--dtype-o (each array at its dtype)",
                         args.bytes_per_word)  # fmt: skip
    bytes_per_word = 2 if args.bytes_per_word is None else args.bytes_per_word
    gqa = args.H_kv is not None and args.H_kv < args.H_q  # a group sum in the backward: a problem's launch
    per_head_mask = args.mask not in (None, "none") and args.batch * args.H_q > 1  # a mask may read b and h
    if (all(x is None for x in (*beyond, *dtypes)) and args.gqa == "per-head" and args.splits == 1
            and args.pages == "pieces" and not gqa and not per_head_mask):  # fmt: skip
        if args.N is None:
            raise InputError("--N", "must be given (or --Nq and --Nk)", None)
        return dict(N=args.N, d=args.d, bytes_per_word=bytes_per_word, **fields)
    refuse_contradictions(args)  # as every command with a problem's options
    Nq, Nk = args.Nq or args.N, args.Nk or args.N
    if Nq is None or Nk is None:
        raise InputError("--Nq, --Nk", "must be given (or --N for both)", (Nq, Nk))
    if bytes_per_word not in dtype_of_bytes:
        raise InputError("--bytes-per-word", "must be 1, 2, 4 or 8 with a problem's options (a dtype)", bytes_per_word)
    dtype = dtype_of_bytes[bytes_per_word]
    p = Problem(B=args.batch, H_q=args.H_q, H_kv=args.H_kv, N_q=Nq, N_k=Nk, d_qk=args.d, d_v=args.dv,
                causal=bool(args.causal), latent=args.mla is not None, page_size=args.page_size,
                dtype_q=args.dtype_q or dtype, dtype_kv=args.dtype_kv, dtype_o=args.dtype_o)  # fmt: skip
    if any(x is not None for x in dtypes):  # each array at its dtype, as the kernels move it
        return dict(problem=p, element_bytes="kernel")
    return dict(problem=p)

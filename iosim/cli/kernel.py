"""``iosim kernel FILE.py[:LAUNCHER] --N --d [--like flash2 --Br --Bc] [--backend]``: count a real kernel's I/O.

The file defines a launcher (``launch`` unless named after the colon) that builds its inputs, launches the kernel
and returns a dict of its arrays by name (Q, K, V, O, L, ...; numbers such as ``scale``, ``Br`` may ride along).
It runs in a fresh process with the backend's interpreter on (Triton's ``TRITON_INTERPRET=1``, Pallas interpret
mode, numba-cuda's simulator); every global access is counted (see :mod:`iosim.kernels.counting`). With ``--like``
the counts are printed beside that schedule's closed form, the lower bound at the working set its block sizes
imply, a verdict per array, and the outputs' errors against the float64 reference with ``iosim.check``'s bound.
"""

from __future__ import annotations

import json
import sys

from tabulate import tabulate

from iosim.base.errors import InputError
from iosim.cli.options import FORMATS, LIMITS, fmt_int, positive

LIKE = ("flash2", "flash2-backward", "decode-splitkv", "block-sparse")
BACKENDS = ("auto", "triton", "pallas", "numba-cuda")
INDEX_READS = ("once", "template")  # iosim.masking.block_sparse.INDEX_READS (not imported: the CLI loads it lazily)


def _timeout(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--timeout must be a number of seconds from 1 to 3600, got {text!r}"
        ) from None
    if not 1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"--timeout must be a number of seconds from 1 to 3600, got {text!r}")
    return value


def add_arguments(p) -> None:
    p.add_argument("target", metavar="FILE.py[:LAUNCHER]", help="a Python file defining a launcher (default: launch)")
    p.add_argument("--N", type=positive("--N", 1 << 16), required=True, help="sequence length (keys)")
    p.add_argument("--d", type=positive("--d", LIMITS["d"]), required=True, help="head dimension")
    p.add_argument("--like", choices=LIKE, default=None, help="the schedule the kernel implements: its closed form")
    p.add_argument("--Br", type=positive("--Br", 1 << 14), default=None, help="row block (BLOCK_M)")
    p.add_argument("--Bc", type=positive("--Bc", 1 << 14), default=None, help="column block (BLOCK_N)")
    p.add_argument("--splits", type=positive("--splits", 1 << 14), default=None, help="KV splits (decode-splitkv)")
    p.add_argument("--H", type=positive("--H", 1 << 12), default=None, help="query heads (per batch item)")
    p.add_argument("--B", type=positive("--B", 1 << 12), default=None, help="batch (the launch's batch items)")
    p.add_argument("--kv-heads", type=positive("--kv-heads", 1 << 12), default=None,
                   help="key/value heads (GQA/MQA; default: --H)")  # fmt: skip
    p.add_argument("--N-q", type=positive("--N-q", 1 << 16), default=None, help="query rows (default: --N)")
    p.add_argument("--page-size", type=positive("--page-size", 1 << 16), default=None, help="paged KV cache")
    p.add_argument("--empty-splits", choices=("written", "skipped"), default=None,
                   help="decode-splitkv: what the kernel does with an empty split (default written)")  # fmt: skip
    p.add_argument("--causal", action="store_true", default=None, help="causal mask (passed to the launcher)")
    p.add_argument("--lsu", action="store_true",
                   help="triton: print the LSU level under the table (32-byte sectors per tl.load/tl.store "
                   "request, the bytes Nsight's l1tex__t_bytes_pipe_lsu_mem_global_op_ld/_st count)")  # fmt: skip
    p.add_argument("--mask", default=None,
                   help="--like block-sparse: the mask the kernel's BlockMask was built for (as iosim run's --mask: "
                   "mod:FILE.py:NAME for a FlexAttention mask_mod, causal, window:W, ...); --like flash2: the mask of "
                   "a kernel that skips the tiles it empties and reads no metadata (a sliding window)")  # fmt: skip
    p.add_argument("--indices", choices=INDEX_READS, default=None,
                   help="--like block-sparse: once (each listed block's index read once, the default) or template "
                   "(as torch's FlexAttention Triton template reads the indices and, at a ragged N, the captured "
                   "buffers at every padded position)")  # fmt: skip
    p.add_argument("--dtype", default=None, help="input dtype passed to the launcher (e.g. float16, float32)")
    _add_problem_options(p)
    p.add_argument(
        "--config", default=None, metavar="K=V,...|all",
        help="triton: the config of an @triton.autotune kernel to count (part of its label, e.g. BLOCK_M=64,"
        "num_warps=4); default all: each config counted in turn",
    )  # fmt: skip
    p.add_argument(
        "--gpu-standin", action="store_true",
        help="triton: answer the GPU queries a library makes at import (Triton's active driver, torch.cuda's device "
        "queries) as an H100 would, in the counting process only (iosim.kernels.standin)",
    )  # fmt: skip
    p.add_argument("--backend", choices=BACKENDS, default="auto", help="default: from what the file imports")
    p.add_argument("--timeout", type=_timeout, default=300.0, help="seconds before giving up (default 300)")
    p.add_argument("--no-numerics", action="store_true", help="skip the check against the float64 reference")
    p.add_argument(
        "--fast", action="store_true",
        help="triton: skip the arithmetic no address, mask, branch or loop bound depends on (the same counts; "
        "refuses, exit 2, a kernel whose control needs a skipped value; no numerics; iosim.kernels.fast)",
    )  # fmt: skip
    p.add_argument(
        "--shared-memory", action="store_true",
        help="triton: also compile each kernel for sm_90 (no GPU needed) and print the shared memory it allocates",
    )  # fmt: skip
    p.add_argument("--format", choices=FORMATS, default="simple")
    p.add_argument("--json", action="store_true", help="print the counts (and the comparison) as JSON")


def _add_problem_options(p) -> None:
    """The problem options of ``iosim run`` that the closed form needs beyond --N/--d/--H/--kv-heads/--N-q/
    --page-size: --dv, --mla, --dtype-q/kv/o, --gqa (parsed by iosim.cli.options' validators)."""
    from iosim.cli.options import dtype_choice
    from iosim.runner.api import MAX_D
    from iosim.spec.problem import GQA_POLICIES, MLA_POLICIES

    p.add_argument("--dv", type=positive("--dv", MAX_D), default=None, help="value width d_v (default --d)")
    p.add_argument("--mla", choices=MLA_POLICIES, default=None,
                   help="an MLA latent cache (V = K's first d_v columns; --kv-heads default 1): V read with K "
                   "(shared) or again (naive)")  # fmt: skip
    for arr, what in (("q", "Q"), ("kv", "K, V"), ("o", "O")):
        p.add_argument(f"--dtype-{arr}", type=dtype_choice(f"--dtype-{arr}"), default=None,
                       help=f"storage dtype of {what} in the closed form's bytes")  # fmt: skip
    p.add_argument(
        "--gqa",
        choices=GQA_POLICIES,
        default=None,
        help="the GQA schedule of the closed form (default: the one whose K reads the kernel's equal)",
    )


LAUNCH = ("N", "d", "Br", "Bc", "splits", "H", "causal", "dtype", "B", "kv_heads", "N_q", "page_size", "dv", "mla")
BLOCK_MASK = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")  # returned in every mode


def command(args) -> int:
    from iosim.kernels.counting import count_file, overlap_lines

    path, _, launcher = args.target.partition(":")
    if not path.endswith(".py"):
        raise InputError("FILE", "must be a Python file FILE.py[:LAUNCHER]", args.target)
    _check_model_options(args)
    _check_problem_options(args)
    params = {k: getattr(args, k) for k in LAUNCH}
    params = {k: v for k, v in params.items() if v is not None}
    backend = None if args.backend == "auto" else args.backend
    config = args.config  # "all" is count_file's: every config, refused before any work off Triton
    first = count_file(path, launcher or None, backend, params, args.timeout, arrays=not args.no_numerics,
                       shared_memory=90 if args.shared_memory else None, config=config,
                       gpu_standin=args.gpu_standin, strict=False, fast=args.fast, must_take=_must_take(args, params),
                       keep=BLOCK_MASK if args.like == "block-sparse" else ())  # fmt: skip
    runs = first[0].runs or [first]
    if first[0].output:  # the launcher's own output, before the counts (beside the JSON: on stderr)
        print(first[0].output, end="" if first[0].output.endswith("\n") else "\n",
              file=sys.stderr if args.json else sys.stdout)  # fmt: skip
    rc, docs = 0, []
    for k, (counts, numbers, arrays) in enumerate(runs):
        if args.lsu and counts.lsu() is None:
            raise InputError("--lsu", f"is counted for Triton kernels (tl.load/tl.store requests); this launcher ran "
                             f"{counts.backend}")  # fmt: skip
        if len(runs) > 1 and not args.json:
            print(f"{'' if k == 0 else chr(10)}autotune config {k + 1} of {len(runs)}: {counts.config.split(' (')[0]}")
        cmp = _compare(args, counts, numbers, arrays) if args.like else None
        problem = leftover(counts, cmp)
        if problem and problem.startswith("none of"):  # no verdict against arrays the kernel did not move
            cmp = None
        if args.json:
            docs.append(_json(counts, numbers, cmp, problem))
        else:
            _print(args, counts, cmp)
            if args.fast:
                print("note: --fast: the values no count depends on were not computed (no numerics checked)")
        notes, warnings = overlap_lines(counts)
        if not args.json:
            for line in notes:
                print(f"note: {line}")
        for line in warnings:
            print(f"iosim: warning: {line}", file=sys.stderr)
        if problem:
            print(f"iosim: error: {problem}", file=sys.stderr)
        rc = max(rc, 1 if problem or (cmp is not None and cmp.numerics_ok is False) else 0)
    if args.json:
        from iosim.base.version import __version__

        doc = docs[0] if len(docs) == 1 else {"configs": docs}
        print(json.dumps({"iosim_version": __version__, **doc}, indent=2))
    return rc


def _check_model_options(args) -> None:
    """The options only a --like model reads, refused (one line) where no model reads them."""
    if args.lsu and args.backend not in ("auto", "triton"):
        raise InputError("--lsu", "is counted for Triton kernels (tl.load/tl.store requests), not --backend "
                         f"{args.backend}")  # fmt: skip
    for opt in ("dtype_q", "dtype_kv", "dtype_o", "gqa"):  # read by the closed form alone
        if getattr(args, opt) is not None and args.like is None:
            raise InputError(f"--{opt.replace('_', '-')}", "is read by --like (the closed form the kernel is held "
                             "against)", getattr(args, opt))  # fmt: skip
    if args.gqa is not None and args.like == "block-sparse":
        raise InputError("--gqa", "is not read by --like block-sparse (its schedule runs one program per query head: "
                         "per-head)", args.gqa)  # fmt: skip
    if args.mla is not None and args.like not in (None, "flash2", "decode-splitkv"):
        raise InputError("--mla", "is modelled for --like flash2 and decode-splitkv (an MLA latent's forward)",
                         args.mla)  # fmt: skip
    if args.dv is not None and args.like == "block-sparse":
        raise InputError("--dv", "is modelled for --like flash2, flash2-backward and decode-splitkv", args.dv)
    if args.empty_splits is not None and args.like != "decode-splitkv":
        raise InputError("--empty-splits", "is read by --like decode-splitkv (what a split-KV decoding kernel does "
                         "with an empty split)", args.empty_splits)  # fmt: skip
    if args.page_size is not None and args.like in ("flash2-backward", "block-sparse"):
        what = "the backward" if args.like == "flash2-backward" else "block-sparse"
        raise InputError("--page-size", f"is modelled for flash2 and decode-splitkv, not {what}", args.page_size)
    if args.N_q is not None and args.like == "decode-splitkv":
        raise InputError("--N-q", "is not read by --like decode-splitkv (one query row per head)", args.N_q)
    if args.causal and args.like in ("block-sparse", "decode-splitkv"):
        why = ("the mask is --mask (e.g. --mask causal)" if args.like == "block-sparse" else
               "one query row per head, the last, sees every key")  # fmt: skip
        raise InputError("--causal", f"is not read by --like {args.like}: {why}")
    _check_mask_options(args)


def _check_mask_options(args) -> None:
    """--mask and --indices where a model reads them, spelled as iosim run's --mask."""
    from iosim.masking import masks

    if args.mask is not None and args.like == "flash2" and args.mask.strip() in ("causal", "none", "dense"):
        # flash2's causal closed form is --causal; without a mask it is flash2 itself (tests/test_flex_kernel.py)
        raise InputError("--mask", "is read by --like block-sparse (the mask of the kernel's BlockMask)", args.mask)
    if args.mask is not None and args.like not in ("block-sparse", "flash2"):
        raise InputError("--mask", "is read by --like block-sparse (the mask of the kernel's BlockMask) and flash2 "
                         "(a kernel skipping the tiles the mask empties, with no metadata)", args.mask)  # fmt: skip
    if args.indices is not None and args.like != "block-sparse":
        raise InputError("--indices", "is read by --like block-sparse (how the kernel reads its BlockMask)",
                         args.indices)  # fmt: skip
    if args.like == "block-sparse" and args.mask is None:
        raise InputError("--mask", f"is needed by --like block-sparse: the mask the kernel's BlockMask was built "
                         f"for ({masks.FORMS})")  # fmt: skip
    if args.mask is not None:
        masks.parse(args.mask)  # its spelling, before the count


def _check_problem_options(args) -> None:
    """--kv-heads against --H (when both are given): a divisor of H, 1..H (iosim.kernels.comparison.check_heads)."""
    if args.kv_heads is not None and args.H is not None:
        from iosim.kernels.comparison import check_heads

        check_heads(args.H, args.kv_heads)


def _must_take(args, params: dict) -> tuple:
    """The options given that the launcher must declare (or the launch would run without them while the command
    reads them as the launch's): all of them, except --Br/--Bc where --like reads the block sizes off the kernel's
    loads (and checks them there) and --mla where --like models it (how the kernel reads V, as --gqa)."""
    from iosim.kernels.comparison import BLOCKS

    own = set(BLOCKS.get(args.like, {})) | ({"mla"} if args.like in ("flash2", "decode-splitkv") else set())
    return tuple(k for k in params if k not in own)


def _compare(args, counts, numbers, arrays):
    from iosim.kernels.comparison import Whole, block_sizes, compare

    def pick(name, default=None):
        v = getattr(args, name, None)
        return v if v is not None else numbers.get(name, default)

    if args.like == "block-sparse" and not all(k in (arrays or {}) for k in BLOCK_MASK):
        raise InputError("--mask", "is checked against the kernel's BlockMask: the launcher must return its index "
                         f"tensors by name ({', '.join(BLOCK_MASK)})")  # fmt: skip
    given = {k: getattr(args, k) for k in ("Br", "Bc")}
    widths = (args.dv, args.d - args.dv) if args.dv else ()  # an MLA latent's two parts, loaded apart
    blocks = block_sizes(counts, args.like, args.d, numbers, given, widths)
    return compare(
        counts, args.like, args.N, args.d, blocks.get("Br"), blocks.get("Bc"), bool(pick("causal", False)),
        heads=int(pick("H", 1)), splits=pick("splits"), arrays=arrays or None, scale=numbers.get("scale"),
        whole=Whole(int(pick("B", 1)), int(pick("H", 1)), pick("kv_heads"), pick("N_q"), pick("page_size"),
                    pick("empty_splits", "written"), numbers.get("chunk_multiple"), numbers.get("metadata"),
                    args.mask, numbers.get("buffers"), numbers.get("dtype"), args.indices or "once", args.dv,
                    args.mla, (args.dtype_q, args.dtype_kv, args.dtype_o)),
        dtype=numbers.get("dtype"), layout=numbers.get("layout"), logsumexp=numbers.get("logsumexp"), gqa=args.gqa,
    )  # fmt: skip


def leftover(counts, cmp) -> str | None:
    """One line when data the kernel moved cannot be attributed: accesses out of bounds (outside every argument, or
    past the end of the argument they started in), stray accesses (a load/store site that moved one argument, then
    another), or, beside a model, none of the model's arrays moved at all."""
    from iosim.kernels.counting import access_problem

    problem = access_problem(counts)
    if problem:
        return problem
    if cmp is not None and counts.total and not any(r.reads or r.writes for r in cmp.rows if r.model_reads is not None):
        moved = ", ".join(r.array for r in cmp.rows if r.reads or r.writes)
        return (f"none of {cmp.like}'s arrays ({', '.join(r.array for r in cmp.rows if r.model_reads is not None)}) "
                f"was moved, only {moved}: name the kernel's arrays as the model does (the launcher's dict, or "
                f"'names': kernel's name -> model's name)")  # fmt: skip
    return None


def _json(counts, numbers, cmp, problem) -> dict:
    doc = {"counts": counts.to_dict(), "numbers": numbers, "error": problem}
    doc["counts"].pop("per_program")
    doc["counts"]["per_program_max"] = counts.per_program.max(axis=0).tolist() if counts.programs else [0, 0]
    if cmp is not None:
        doc["comparison"] = {
            "like": cmp.like, "M": cmp.M, "Br": cmp.Br, "Bc": cmp.Bc, "lower_bound": cmp.lower_bound,
            "bound": cmp.bound_name, "equal": cmp.equal, "rows": [vars(r) for r in cmp.rows], "numerics": cmp.numerics,
            "total": cmp.kernel_total, "model_total": cmp.model_total, "not_in_model": cmp.extra_arrays,
        }  # fmt: skip
    return doc


def _print(args, counts, cmp) -> None:
    for line in launches(counts):
        print(line)
    if cmp is not None:
        print(cmp.table(args.format, lsu=args.lsu))
        _print_shared(counts, cmp.M)
        return
    head = ["array", "reads", "writes", "read bytes", "write bytes", "atomics", "distinct reads", "distinct writes"]
    rows = [[k, *(fmt_int(x) for x in (a.reads, a.writes, a.read_bytes, a.write_bytes, a.atomics,
                                       a.distinct_reads, a.distinct_writes))]
            for k, a in counts.per_array.items()]  # fmt: skip
    pp = counts.per_program
    print(f"{counts.backend}: {counts.launches} launch(es), {counts.programs} programs, counted in "
          f"{counts.seconds:.2f} s; words per program: reads max {int(pp[:, 0].max()) if len(pp) else 0:,}, "
          f"writes max {int(pp[:, 1].max()) if len(pp) else 0:,}")  # fmt: skip
    print(tabulate(rows, head, tablefmt=args.format, disable_numparse=True))
    print(f"total: {counts.reads:,} reads, {counts.writes:,} writes (words: elements, whatever their dtype)")
    from iosim.kernels.counting import lsu_lines

    for line in lsu_lines(counts) if args.lsu else ():
        print(line)
    _print_shared(counts, None)


def launches(counts) -> list[str]:
    """One line per distinct launch: kernel, grid, constexprs, launch options, the autotune config that ran."""
    out, seen = [], set()
    for info in counts.launch_info:
        parts = [f"grid {tuple(info['grid'])}"] if info.get("grid") else []
        parts += [f"{k}={v}" for k, v in (info.get("constexprs") or {}).items()]
        parts += [f"{k}={v}" for k, v in (info.get("options") or {}).items()]
        if info.get("config"):
            parts.append(f"autotune {info['config'].partition(' (')[2].rstrip(')') or 'its one config'}")
        line = f"launch {info['kernel']}: " + ", ".join(parts)
        if parts and line not in seen:
            seen.add(line)
            out.append(line)
    return out


def _print_shared(counts, M) -> None:
    """The second figure: shared memory per program as Triton's compiler allocates it for sm_90."""
    for name, b in counts.shared_memory.items():
        if isinstance(b, int):
            beside = f"; the model's working set M = {M:,} words" if M else ""
            print(f"shared memory, Triton's compiler for sm_90: {name}: {b:,} bytes per program{beside}")
        else:
            print(f"shared memory, sm_90: {name}: {b}")

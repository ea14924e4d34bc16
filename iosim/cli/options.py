"""What the subcommands share: option parsers and validators, the run options, number formats.

Every parser here turns a bad value into one line naming the option and the accepted range (argparse prints it and
exits with code 2). This module imports nothing of the subcommands; every subcommand imports it.
"""

from __future__ import annotations

import argparse
import math

from iosim.masking import masks
from iosim.runner import api

FORMATS = ("simple", "github", "latex", "plain")
SIZES = (("N", "sequence length"), ("d", "head dimension"), ("M", "fast-memory capacity in words"))
LIMITS = {"N": api.MAX_N, "d": api.MAX_D, "M": api.MAX_M}


def fmt_int(x) -> str:
    return f"{int(x):,}"


def fmt_err(x) -> str:
    return "-" if x is None else f"{x:.2e}"


def exact(x) -> str:
    return "-" if x is None else "yes" if x else "NO"


def positive(name: str, limit: int | None = None):
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


def seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seed must be an integer from 0 to 2^64 - 1, got {text!r}") from None
    if not 0 <= value < api.MAX_SEED:
        raise argparse.ArgumentTypeError(f"--seed must be an integer from 0 to 2^64 - 1, got {value}")
    return value


def scale(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--scale must be a finite number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"--scale must be a finite number, got {text!r}")
    return value


class _Given(argparse.Action):
    """Stores the value and notes that it was typed (``given_N``): a default --N is no contradiction of --Nq."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, f"given_{self.dest}", True)


def add_sizes(p: argparse.ArgumentParser, defaults: dict | None = None) -> None:
    defaults = defaults or {}
    p.set_defaults(given_N=False, given_d=False)
    for name, what in SIZES:
        default = defaults.get(name)
        p.add_argument(
            f"--{name}",
            type=positive(f"--{name}", LIMITS[name]),
            action=_Given,
            default=default,
            required=default is None,
            help=what + ("" if default is None else f" (default {default})"),
        )


def add_mask_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--causal", action="store_true", help="causal masking (the same as --mask causal)")
    p.add_argument(
        "--mask",
        default=None,
        help=f"a mask (iosim.masking.masks): {masks.FORMS}; over a problem it covers the N_k positions and "
        "the queries are its "
        "last N_q rows (bottom-right, as --causal)",
    )
    p.add_argument(
        "--kv-policy",
        choices=masks.POLICIES,
        default=None,
        help="K_j, V_j (flash2 forward: Q_i) of an all-empty block: paper loads them (Algorithm 5), skip does not "
        "(default: paper for one head; over a problem flash1 and flash2 skip, as the kernels do)",
    )


def add_run_options(p: argparse.ArgumentParser) -> None:
    add_mask_options(p)
    p.add_argument(
        "--backward",
        action="store_true",
        help="run the forward, then the backward pass (dQ, dK, dV); report the backward's counts",
    )
    p.add_argument("--count-only", action="store_true", help="count I/O without arithmetic (scales to N = 2^20)")
    p.add_argument("--tiling", choices=("fit", "paper"), default="fit", help="block-size rule (default fit)")
    p.add_argument("--dtype", choices=api.DTYPES, default="float64", help="compute precision (default float64)")
    p.add_argument("--seed", type=seed, default=0, help="random seed of the inputs (default 0)")
    p.add_argument("--scale", type=scale, default=None, help="softmax scale (default 1/sqrt(d))")
    p.add_argument("--no-reference", action="store_true", help="skip the float64 reference check (counts only)")
    p.add_argument("--yes", action="store_true", help="allow a count-only run estimated at over a minute")
    p.add_argument("--format", choices=FORMATS, default="simple", help="table format (latex for papers)")


def add_algorithm(p: argparse.ArgumentParser) -> None:
    from iosim.runner import registry

    p.add_argument("algorithm", help=f"one of: {', '.join(registry.algorithms())}")


def run_kwargs(args) -> dict:
    """The keyword arguments of :func:`iosim.run` from the run options."""
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


def mask_words(args) -> str:
    if args.mask not in (None, "none", "dense"):
        return f"mask {args.mask} (kv policy {args.kv_policy or 'paper'})"
    return "causal" if args.causal else "non-causal"


# ---------------------------------------------------------------------------------------------------------------
# Whole problems (iosim.Problem): batch, heads, decoding, split-KV, paged KV, MLA, dtypes, explicit tiles.
# ---------------------------------------------------------------------------------------------------------------
PROBLEM_HELP = (
    "A problem beyond one head (flash1, flash2; standard and square-tiling: one head, any N_q, N_k, d_qk, d_v): "
    "--batch B, --heads H_q, --kv-heads H_kv (GQA; 1 = MQA), --Nq and "
    "--Nk (decoding: --Nq 1; chunked prefill: --Nq < --Nk; --causal aligns bottom-right), --dqk and --dv, "
    "--page-size P (paged KV), --mla shared|naive (one latent cache, V = first d_v columns of K), --dtype-q/kv/o "
    "(bytes). Schedule: --gqa per-head|packed, --splits S (split-KV, flash2), --pages pieces|gather (how flash1 reads "
    "a paged cache). Tiles: --Br/--Bc (flash), --B (square)."
)


def add_problem_sizes(p: argparse.ArgumentParser, defaults: dict | None = None) -> None:
    """--N and --d (optional when --Nq/--Nk and --dqk give the problem) and --M."""
    defaults = defaults or {}
    p.set_defaults(given_N=False, given_d=False)
    for name, what in SIZES:
        default = defaults.get(name)
        optional = name in ("N", "d")
        p.add_argument(
            f"--{name}",
            type=positive(f"--{name}", LIMITS[name]),
            action=_Given,
            default=default,
            required=default is None and not optional,
            help=what
            + ("" if default is None else f" (default {default})")
            + (" (N_q = N_k = N)" if name == "N" else ""),
        )


def dtype_choice(option: str):
    """An argparse type: a storage dtype name (iosim.spec.problem.BYTES)."""
    from iosim.spec.problem import ALIASES, BYTES

    def parse(text: str) -> str:
        name = ALIASES.get(text, text)
        if name not in BYTES:
            raise argparse.ArgumentTypeError(f"{option} must be one of {', '.join(BYTES)}, got {text!r}")
        return name

    return parse


# --- shared validators (output paths, counts, the long-run consent) --------------------------------------


def output_file(parameter: str, path, suffixes: tuple[str, ...], *, create_parent: bool = False):
    """An output file checked before any work (:func:`iosim.base.outputs.file`): a supported suffix (listed in the
    message), not an existing folder, in a writable folder. Every ``-o/--output/--out/--picture/--cache`` uses it."""
    from iosim.base import outputs

    return outputs.file(parameter, path, suffixes, create_parent=create_parent)


def output_folder(parameter: str, path):
    """An output folder (created if missing; not an existing file; writable)."""
    from iosim.base import outputs

    return outputs.folder(parameter, path)


def count(name: str, limit: int = 1 << 62):
    """An argparse type: an integer from 0 to ``limit`` (a count: never negative)."""
    accepted = f"an integer from 0 to {limit:,}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be {accepted}, got {text!r}") from None
        if not 0 <= value <= limit:
            raise argparse.ArgumentTypeError(f"{name} must be {accepted}, got {value}")
        return value

    return parse


def add_problem_shape(g) -> None:
    """The shape of a problem (--batch, --heads, --kv-heads, --Nq, --Nk, --dqk, --dv), each an integer in its range:
    every command that takes a problem adds these, so a zero or a negative is refused alike everywhere."""
    from iosim.spec.problem import MAX_BATCH, MAX_HEADS

    g.add_argument("--batch", type=positive("--batch", MAX_BATCH), default=None, help="batch size B (default 1)")
    g.add_argument("--heads", type=positive("--heads", MAX_HEADS), default=None, help="query heads H_q (default 1)")
    g.add_argument("--kv-heads", type=positive("--kv-heads", MAX_HEADS), default=None, help="key/value heads H_kv")
    g.add_argument("--Nq", type=positive("--Nq", api.MAX_N), default=None, help="query rows N_q (default N)")
    g.add_argument("--Nk", type=positive("--Nk", api.MAX_N), default=None, help="keys N_k (default N)")
    g.add_argument("--dqk", type=positive("--dqk", api.MAX_D), default=None, help="query/key width (default d)")
    g.add_argument("--dv", type=positive("--dv", api.MAX_D), default=None, help="value width (default d_qk)")


def add_problem_options(p: argparse.ArgumentParser) -> None:
    """The problem and schedule options of run, compare, trace (:data:`PROBLEM_HELP`)."""
    from iosim.spec.problem import GQA_POLICIES, MLA_POLICIES, PAGE_READS

    g = p.add_argument_group("problem (iosim.Problem)", PROBLEM_HELP)
    add_problem_shape(g)
    g.add_argument("--page-size", type=positive("--page-size", api.MAX_N), default=None, help="paged KV: P tokens")
    g.add_argument("--mla", choices=MLA_POLICIES, default=None, help="MLA latent cache; V read shared or naive")
    g.add_argument("--pages", choices=PAGE_READS, default="pieces",
                   help="flash1 over a paged cache: an outer step per page piece, or each column block gathered from "
                   "its pages (default pieces)")  # fmt: skip
    g.add_argument("--dtype-q", type=dtype_choice("--dtype-q"), default=None, help="storage dtype of Q (bytes)")
    g.add_argument("--dtype-kv", type=dtype_choice("--dtype-kv"), default=None, help="storage dtype of K, V")
    g.add_argument("--dtype-o", type=dtype_choice("--dtype-o"), default=None, help="storage dtype of O")
    g.add_argument("--gqa", choices=GQA_POLICIES, default="per-head", help="GQA schedule (default per-head)")
    g.add_argument("--splits", type=positive("--splits", api.MAX_N), default=1, help="split-KV splits (flash2)")
    g.add_argument("--Br", type=positive("--Br", api.MAX_N), default=None, help="row block (flash1, flash2)")
    g.add_argument("--Bc", type=positive("--Bc", api.MAX_N), default=None, help="column block (flash1, flash2)")
    g.add_argument("--B", type=positive("--B", api.MAX_N), default=None, help="square tile (standard, square-tiling)")
    g.add_argument("--bytes", action="store_true", help="report bytes per array (at each array's dtype) too")


PROBLEM_FIELDS = ("batch", "heads", "kv_heads", "Nq", "Nk", "dqk", "dv", "page_size", "mla", "dtype_q", "dtype_kv")


def refuse_contradictions(args) -> None:
    """--N stands for N_q = N_k and --d for d_qk: each is refused beside the options it would contradict (a default
    is not a contradiction: only a value the user typed counts)."""
    from iosim.base.errors import InputError

    opt = lambda name: getattr(args, name, None)  # noqa: E731 (commands add the options they take)
    typed = lambda name: getattr(args, f"given_{name}", opt(name) is not None)  # noqa: E731
    if typed("N") and (opt("Nq") is not None or opt("Nk") is not None):
        raise InputError("--N", "means N_q = N_k = N: give --N, or --Nq and --Nk, not both", opt("N"))
    if typed("d") and opt("dqk") is not None:
        raise InputError("--d", "means d_qk = d: give --d or --dqk, not both", opt("d"))


def problem_of(args, *, with_gqa: bool = False):
    """The iosim.Problem the options describe, or None for today's one-head --N --d run (``with_gqa``: a GQA policy
    other than per-head asks for a problem too). The one place a command's options become a problem: --N stands for
    N_q = N_k and --d for d_qk, so each is refused beside the options it would contradict."""
    from iosim.base.errors import InputError
    from iosim.spec.problem import Problem

    opt = lambda name: getattr(args, name, None)  # noqa: E731 (commands add the options they take)
    N, d = opt("N"), opt("d")
    refuse_contradictions(args)
    given = any(opt(f) is not None for f in (*PROBLEM_FIELDS, "dtype_o"))
    if not given and not (with_gqa and opt("gqa") not in (None, "per-head")):
        if N is None or d is None:
            raise InputError("--N and --d", "are required (or --Nq, --Nk and --dqk for a problem)")
        return None
    Nq = opt("Nq") if opt("Nq") is not None else N
    Nk = opt("Nk") if opt("Nk") is not None else N
    dqk = opt("dqk") if opt("dqk") is not None else d
    if Nq is None or Nk is None or dqk is None:
        raise InputError("--Nq, --Nk, --dqk", "must be given (or --N and --d for both)", (Nq, Nk, dqk))
    return Problem(
        B=opt("batch") or 1, H_q=opt("heads") or 1, H_kv=opt("kv_heads"), N_q=Nq, N_k=Nk, d_qk=dqk, d_v=opt("dv"),
        causal=bool(opt("causal")), latent=opt("mla") is not None, page_size=opt("page_size"),
        dtype_q=opt("dtype_q") or "fp64", dtype_kv=opt("dtype_kv"), dtype_o=opt("dtype_o"),
    )  # fmt: skip


def schedule_of(args, algorithm: str):
    """The iosim.Schedule the options describe for ``algorithm``: the one place a command's options become a
    schedule, checked once before any work (a command that takes no such option gets the Schedule's default)."""
    from iosim.spec.schedule import Schedule

    opt = lambda name, default=None: getattr(args, name, None) or default  # noqa: E731
    return Schedule(
        algorithm, backward=bool(opt("backward", False)), tiling=opt("tiling", "fit"), Br=opt("Br"), Bc=opt("Bc"),
        B=opt("B"), gqa=opt("gqa", "per-head"), splits=opt("splits", 1), mla=opt("mla", "shared"),
        kv_policy=opt("kv_policy"), pages=opt("pages", "pieces"),
    )  # fmt: skip


def problem_run_kwargs(args, algorithm: str | None = None) -> dict:
    """:func:`run_kwargs` with the problem (:func:`problem_of`) and the schedule (:func:`schedule_of` for
    ``algorithm``, default the command's own) as iosim.run's keywords."""
    kw = run_kwargs(args)
    problem = problem_of(args)
    if problem is not None:
        kw.update(problem=problem, N=None, d=None, causal=False)
    algorithm = algorithm or getattr(args, "algorithm", None)
    if algorithm is None:  # several algorithms (compare): each run builds its Schedule from these keywords
        kw.update(gqa=args.gqa, splits=args.splits, Br=args.Br, Bc=args.Bc, B=args.B, mla=args.mla or "shared")
    else:
        kw.update(schedule_of(args, algorithm).run_options())
    return kw


def bytes_rows(r) -> list[list[str]]:
    """Table rows: bytes per array at each array's dtype, the total and the compulsory bytes."""
    p = r.problem
    rows = [[f"bytes {n} ({p.dtype_of(n)})", fmt_int(b)] for n, b in r.bytes_per_array.items()]
    rows.append(["bytes total", fmt_int(r.total_bytes)])
    rows.append(["compulsory bytes (Q, K/V once per KV head, O)", fmt_int(p.compulsory_bytes())])
    return rows


def add_yes(p: argparse.ArgumentParser, what: str) -> None:
    """``--yes``: consent to a run estimated at over a minute (iosim.runner.estimate; over an hour is refused)."""
    p.add_argument("--yes", action="store_true", help=f"allow {what} estimated at over a minute (an hour: refused)")


class Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line (``iosim run: error: ...; see iosim run --help``) and exit 2,
    as every other bad input of the command line (the usage block is what --help is for)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# ---------------------------------------------------------------------------------------------------------------
# Sparse attention by top-k indices (iosim run topk-sparse) and quantized KV cache formats (--kv-format).
# ---------------------------------------------------------------------------------------------------------------
TOPK_HELP = (
    "iosim run topk-sparse: each query row attends to the k key blocks its indices select (iosim.masking.topk_sparse): "
    "--indices file:PATH.npy | mod:FILE.py:NAME (an integer array (B', H', ceil(N_q / q_block), k) or "
    "(ceil(N_q / q_block), k)), --index-block b keys per selected block (1: token level, DSA), --q-block (one "
    "selection per block of query rows, MoBA), --policy per-query | group:G | gqa | gather, --workspace-tile (gather), "
    "--invalid-index -1 (-1 entries select no block), --causal (bottom-right: blocks after a program's rows are not "
    "loaded, keys after a row are masked), --indexer H_I:d_I[:B_n] (DSA's lightning indexer scan counted first: "
    "H_I heads of width d_I, B_n keys per scoring program, default 64)."
)


def add_topk_options(p: argparse.ArgumentParser) -> None:
    """The options of ``iosim run topk-sparse`` (:data:`TOPK_HELP`)."""
    g = p.add_argument_group("sparse attention by top-k indices (iosim run topk-sparse)", TOPK_HELP)
    g.add_argument("--indices", default=None, help="the selection: file:PATH.npy or mod:FILE.py:NAME")
    g.add_argument("--index-block", type=positive("--index-block", 1 << 20), default=1,
                   help="keys per selected block (default 1: token level)")  # fmt: skip
    g.add_argument("--q-block", type=positive("--q-block", api.MAX_N), default=1,
                   help="query rows per selection (default 1)")  # fmt: skip
    g.add_argument("--policy", default="per-query", help="per-query (default), group:G, gqa or gather")
    g.add_argument("--workspace-tile", type=positive("--workspace-tile", 1 << 20), default=64,
                   help="gather: workspace rows per attention tile (default 64, FlashMLA's)")  # fmt: skip
    g.add_argument("--invalid-index", type=int, choices=(-1,), default=None,
                   help="-1: entries -1 select no block (fla's NSA top-k pads with -1); default refused")  # fmt: skip
    g.add_argument("--indexer", default=None,
                   help="H_I:d_I[:B_n]: count DSA's lightning indexer scan (q_I, w, K_I, k_scale, logits) that writes "
                   "the indices, before the attention (default off)")  # fmt: skip


def add_kv_format_option(p: argparse.ArgumentParser) -> None:
    from iosim.spec.kv_format import FORMS

    p.add_argument("--kv-format", default=None,
                   help=f"report the K/V reads in bytes per component of a quantized cache: {FORMS}")  # fmt: skip


def kv_format_rows(problem, reads: dict, spec: str) -> list[list[str]]:
    """Table rows: the K/V words read as the components of the cache format ``spec`` (iosim.spec.kv_format)."""
    from iosim.spec.kv_format import kv_bytes, kv_format

    fmt = kv_format(spec)
    comps = kv_bytes(fmt, problem, reads)
    rows = [[f"{name} ({where})", f"{fmt_int(words)} words, {fmt_bytes(b)} bytes"] for name, words, b, where in comps]
    width = problem.d_qk
    rows.append([f"KV bytes read at {fmt.name}", fmt_bytes(sum(c[2] for c in comps))])
    rows.append([f"bytes per K row at {fmt.name} ({width} values)", fmt_bytes(fmt.row_bytes(width))])
    return rows


def fmt_bytes(x) -> str:
    return fmt_int(x) if float(x).is_integer() else f"{x:,.1f}"

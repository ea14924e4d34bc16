"""What the subcommands share: option parsers and validators, the run options, number formats.

Every parser here turns a bad value into one line naming the option and the accepted range (argparse prints it and
exits with code 2). This module imports nothing of the subcommands; every subcommand imports it.
"""

from __future__ import annotations

import argparse
import math

from iosim import api, masks

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


def add_sizes(p: argparse.ArgumentParser, defaults: dict | None = None) -> None:
    defaults = defaults or {}
    for name, what in SIZES:
        default = defaults.get(name)
        p.add_argument(
            f"--{name}",
            type=positive(f"--{name}", LIMITS[name]),
            default=default,
            required=default is None,
            help=what + ("" if default is None else f" (default {default})"),
        )


def add_mask_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--causal", action="store_true", help="causal masking (the same as --mask causal)")
    p.add_argument("--mask", default=None, help=f"a mask (iosim.masks): {masks.FORMS}")
    p.add_argument(
        "--kv-policy",
        choices=masks.POLICIES,
        default="paper",
        help="K_j, V_j (flash2 forward: Q_i) of an all-empty block: paper loads them (Algorithm 5), skip does not",
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
    from iosim import registry

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
        return f"mask {args.mask} (kv policy {args.kv_policy})"
    return "causal" if args.causal else "non-causal"


# --- issue 21: shared validators (output paths, counts, the long-run consent) --------------------------------------


def output_file(parameter: str, path, suffixes: tuple[str, ...], *, create_parent: bool = False):
    """An output file checked before any work (:func:`iosim.outputs.file`): a supported suffix (listed in the
    message), not an existing folder, in a writable folder. Every ``-o/--output/--out/--picture/--cache`` uses it."""
    from iosim import outputs

    return outputs.file(parameter, path, suffixes, create_parent=create_parent)


def output_folder(parameter: str, path):
    """An output folder (created if missing; not an existing file; writable)."""
    from iosim import outputs

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


def add_yes(p: argparse.ArgumentParser, what: str) -> None:
    """``--yes``: consent to a run estimated at over a minute (iosim.estimate; over an hour is refused)."""
    p.add_argument("--yes", action="store_true", help=f"allow {what} estimated at over a minute (an hour: refused)")


class Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line (``iosim run: error: ...; see iosim run --help``) and exit 2,
    as every other bad input of the command line (the usage block is what --help is for)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

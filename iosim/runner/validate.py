"""The checks a run makes before any work: scalar arguments (sizes, flags, seed, scale, dtype), the memory a numeric
run needs and the time it will take (:mod:`iosim.runner.estimate`'s rule). One line naming the parameter when one
fails."""

from __future__ import annotations

import math
import numbers

import numpy as np

from iosim.algorithms.reference import default_scale
from iosim.base.errors import InputError
from iosim.memory_model import TraceTooLargeError
from iosim.runner import estimate
from iosim.theory.tiling import Tiling

DTYPES = ("float64", "float32")
# Sizes the counters and the loop indices serve: every count is an int64, and the closed forms are evaluated in
# Python integers, so the limits keep the largest count of any algorithm (standard attention's ~6 N^2 ceil(d/B)
# words) far below 2^63.
MAX_N = 1 << 26
MAX_D = 1 << 16
MAX_M = 1 << 40
MAX_SEED = 1 << 64


def positive_int(name: str, value, limit: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 < value <= limit:
        raise InputError(name, f"must be an integer from 1 to {limit:,}", value)
    return int(value)


def flag(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise InputError(name, "must be True or False", value)
    return bool(value)


def seed_arg(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < MAX_SEED:
        raise InputError("seed", "must be an integer from 0 to 2^64 - 1", seed)
    return int(seed)


def scale_arg(scale, d: int) -> float:
    if scale is None:
        return default_scale(d)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale):
        raise InputError("scale", "must be a finite real number (default 1/sqrt(d))", scale)
    return float(scale)


def dtype_arg(dtype) -> str:
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name if dtype is not None and _is_dtype(dtype) else None
    if name not in DTYPES:
        raise InputError("dtype", f"must be one of {', '.join(DTYPES)}", dtype)
    return name


def _is_dtype(x) -> bool:
    try:
        np.dtype(x)
    except (TypeError, ValueError):
        return False
    return True


def check_memory(algo, N: int, d: int, backward: bool, reference: bool, itemsize: int) -> None:
    """Refuse up front a numeric run whose arrays would not fit in this machine's memory, naming the sizes."""
    nd = (9 if backward else 5) * N * d  # inputs, dO, outputs and gradients, the forward's outputs
    nn = algo.square_arrays[1 if backward else 0] * N * N  # N x N slow arrays the schedule materialises
    need = (nd + nn) * itemsize + (nd * 8 if reference else 0) + (ref_bytes(N, d, backward) if reference else 0)
    have = estimate.available_bytes()
    if need > 0.8 * have:
        raise InputError(
            "N",
            f"needs about {need / 2**30:.1f} GiB for a numeric run of {algo.name} at N={N:,}, d={d} "
            f"({nn // (N * N) if N else 0} N x N arrays of {itemsize} bytes"
            f"{' and the float64 reference' if reference else ''}); {have / 2**30:.1f} GiB are available: "
            "use count_only=True (--count-only), reference=False (--no-reference) or a smaller N",
            N,
        )


def ref_bytes(N: int, d: int, backward: bool) -> int:
    """Bytes the float64 reference holds at once (its own accounting: row blocks of O(N * block) memory)."""
    from iosim.algorithms.reference import reference_memory

    return int(reference_memory(N, d, backward))


class OutOfMemory:
    """Turn a MemoryError inside a numeric run into an InputError naming the sizes (never a traceback)."""

    def __init__(self, algorithm: str, N: int, d: int, what: str) -> None:
        self.algorithm, self.N, self.d, self.what = algorithm, N, d, what

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if kind is not None and issubclass(kind, TraceTooLargeError):
            return (
                False  # the trace's own refusal, made before its buffer: an InputError on trace (iosim.runner.api.run)
            )
        if kind is not None and issubclass(kind, MemoryError):
            raise InputError(
                "N",
                f"ran out of memory in the {self.what} of a numeric run of {self.algorithm} at N={self.N:,}, "
                f"d={self.d} ({error or 'MemoryError'}; {estimate.available_bytes() / 2**30:.1f} GiB available now): "
                "use "
                "count_only=True (--count-only), reference=False (--no-reference) or a smaller N",
                self.N,
            ) from None
        return False


def estimated_steps(t: Tiling, N: int, d: int, backward: bool, mask=None) -> int:
    """Tile steps of a schedule with tiling ``t``: what a count-only run's time is proportional to. With a mask
    (other than none or causal) the schedule visits only the nonzero tiles (plus one test per block row and
    column): the steps scale by the mask's fraction of nonzero tiles on this tiling."""
    from iosim.theory.io_model import _is_structured_fast, tile_sums

    sparse = mask is not None and not _is_structured_fast(mask)
    if t.Br and t.Bc:
        Tr, Tc = -(-N // t.Br), -(-N // t.Bc)
        steps = tile_sums(N, t.Br, t.Bc, mask).tiles + Tr + Tc if sparse else Tr * Tc
    elif t.B:
        Tn = -(-N // t.B)
        tiles = tile_sums(N, t.B, t.B, mask).tiles if sparse else Tn * Tn
        steps = 3 * tiles * -(-d // t.B) + N
    else:
        steps = N * N
    return steps * (2 if backward else 1)


def check_time(t: Tiling, N: int, d: int, backward: bool, allow_long: bool, mask=None, count_only=True,
               algorithm: str | None = None) -> None:  # fmt: skip
    """The long-run rule (:mod:`iosim.runner.estimate`) for a count-only or a numeric run (with its reference)."""
    # a random mask is counted by the estimate below, the closed form and the run: that alone may be too long
    counting = estimate.check_mask(mask, passes=3, allow_long=allow_long, tiling=t) if mask is not None else 0.0
    steps = estimated_steps(t, N, d, backward, mask)
    if count_only:
        per_step = estimate.count_step(algorithm, backward, t)
        seconds, what = estimate.count_only_seconds(steps, per_step), f"a count-only run with {t}"
    else:
        seconds, what = estimate.numeric_seconds(N, d, steps, backward), f"a numeric run with {t}"
    seconds += counting
    remedy = "use a larger M or a smaller N" + ("" if count_only else ", or count_only=True (--count-only)")
    estimate.check(seconds, what, allow_long=allow_long, parameter="N", value=N, remedy=remedy)

"""Small @njit helpers shared by the algorithm drivers: tile views, score tiles, buffers."""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload


@njit(cache=True)
def cdiv(a, b):
    """Ceiling of a / b for positive integers."""
    return (a + b - 1) // b


def buffer(n, like):
    """A 1-D fast-memory buffer of n words of ``like``'s dtype; None in count-only mode (``like`` is None).

    Resolved by type at compile time (an ``@overload``), so the count-only specialisation holds no array at all.
    """
    return None if like is None else np.empty(n, dtype=like.dtype)


@overload(buffer, jit_options={"cache": True})
def _buffer(n, like):
    if isinstance(like, types.NoneType):
        return lambda n, like: None
    return lambda n, like: np.empty(n, dtype=like.dtype)


def tile(buf, r, c):
    """The contiguous r x c view at the start of a 1-D buffer; None in count-only mode (``buf`` is None)."""
    return None if buf is None else buf[: r * c].reshape(r, c)


@overload(tile, jit_options={"cache": True})
def _tile(buf, r, c):
    if isinstance(buf, types.NoneType):
        return lambda buf, r, c: None
    return lambda buf, r, c: buf[: r * c].reshape(r, c)


@njit(cache=True)
def score_tile(Qi, Kj, S, scale):
    """S = scale * Qi Kj^T (a partial tile's mask is applied after: :func:`iosim.algorithms.tile_masks.apply_mask`)."""
    np.dot(Qi, Kj.T, S)
    S *= scale


# exp(x) for x <= 0, the argument of every softmax exponential (a score minus its row maximum), in a form LLVM
# vectorises: Numba's math.exp is a call to libm per element and left the FlashAttention-2 row update at a third of
# the simulator's time. Cody-Waite reduction x = n ln2 + r (|r| <= ln2 / 2), a degree-13 Taylor polynomial for
# exp(r) (truncation below 1e-17 relative) and 2^n assembled from its bits in two halves (so 2^n stays a normal
# number down to n = -1076): within 1 ulp of libm (tests/test_tiles.py), exp(0) = 1 exactly, -inf -> 0, NaN -> NaN.
# Under NUMBA_DISABLE_JIT (the honesty witness) the Python body, math.exp, runs.
_LOG2E = 1.4426950408889634
_LN2_HI = 0.6931471803691238  # ln 2 split so that n * _LN2_HI is exact (fdlibm's constants)
_LN2_LO = 1.9082149292705877e-10


def exp_nonpos(x):
    """exp(x) for x <= 0 (NaN stays NaN); vectorisable when compiled."""
    return math.exp(x)


@intrinsic
def _float_from_bits(typingctx, bits):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


@overload(exp_nonpos, jit_options={"cache": True})
def _exp_nonpos(x):
    def impl(x):
        t = -746.0 if x < -746.0 else x  # exp(-746) underflows to 0; a NaN passes through
        nf = np.floor(t * _LOG2E + 0.5)
        r = (t - nf * _LN2_HI) - nf * _LN2_LO
        p = 1 / 6227020800  # Horner: sum of r^k / k! for k = 13 .. 0
        p = p * r + 1 / 479001600
        p = p * r + 1 / 39916800
        p = p * r + 1 / 3628800
        p = p * r + 1 / 362880
        p = p * r + 1 / 40320
        p = p * r + 1 / 5040
        p = p * r + 1 / 720
        p = p * r + 1 / 120
        p = p * r + 1 / 24
        p = p * r + 1 / 6
        p = p * r + 1 / 2
        p = p * r + 1.0
        p = p * r + 1.0
        n = np.int64(nf)
        half = n >> 1
        return p * _float_from_bits((half + 1023) << 52) * _float_from_bits((n - half + 1023) << 52)

    return impl

"""Small @njit helpers shared by the algorithm drivers: tile views, score tiles, buffers."""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload


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
    """S = scale * Qi Kj^T (a partial tile's mask is applied after: :func:`iosim.algorithms.masks.apply_mask`)."""
    np.dot(Qi, Kj.T, S)
    S *= scale

"""Golden attention: the reference every algorithm and kernel is checked against, in row blocks of O(N * block) memory.

O = softmax(scale * Q K^T + mask) V, with the row logsumexp L = logsumexp(scale * Q K^T + mask) (natural log).
Q is N_q x d, K and V are N_k x d (N_q = N_k for the simulated algorithms). The causal mask lets row r see columns
c <= r + offset: ``offset = 0`` is the top-left alignment (PyTorch's ``is_causal``; the only one when N_q = N_k),
``offset = N_k - N_q`` the bottom-right one of FlashAttention >= 2.1, under which the first N_q - N_k rows of a
query longer than its keys see no key at all. ``mask`` (optional: a boolean N_q x N_k array, True = allowed, or
an object whose ``rows(r0, r1)`` gives that array's rows, as :class:`iosim.algorithms.tile_masks.TileMask` does, so a
structured mask is never materialised whole) forbids scores as the causal mask does, applied to each row block
where the causal mask is. A row that sees no key has O = 0, L = -inf and zero gradients.

Backward (FlashAttention paper, appendix B.2), for an upstream gradient dO = dLoss/dO:
dV = P^T dO, dP = dO V^T, D = rowsum(dO o O), dS = P o (dP - D), dQ = scale dS K, dK = scale dS^T Q.

Scale. Neither pass builds an N_q x N_k matrix: both walk Q in row blocks [r0, r1) of ``block`` rows (default: as
many as keep one block's N_k-wide matrices near 64 MiB), recompute the block's scores S_i = scale Q_i K^T, its
softmax P_i from full rows (so m_i, l_i and L_i are exact, not running), O_i = P_i V and, backward, dQ_i = scale dS_i K
while dK and dV accumulate dS_i^T Q_i and P_i^T dO_i over the blocks. Memory is O(N_k * block + N d)
(:func:`reference_memory`); time is the dense O(N_q N_k d). The mask of a block is applied in one place
(:func:`_row_block_softmax`), so any boolean mask of rows [r0, r1) x all columns can be applied there too.

Precision. ``precision="float64"`` (the default) computes in float64 with BLAS. ``precision="extended"`` computes in
NumPy's ``longdouble`` (x86-64: 64-bit significand, unit roundoff 2^-64, against float64's 2^-53) with products
that are exact before their one rounding to longdouble: each factor is cut into slices of few enough bits that a
float64 BLAS product of two slices is exact (Ozaki's error-free splitting; :func:`matmul_extended`), and the slice
products are summed in longdouble. It is the golden result a float64 kernel is judged against: a float64 golden
cannot tell a float64 kernel's rounding from its own. Inputs are promoted to float64 (exactly) whatever their dtype.
"""

from __future__ import annotations

import math

import numpy as np

PRECISIONS = ("float64", "extended")
FLUSH = -60.0  # the naive baselines flush P = exp(S - m) < e^-60 to 0 (each output moves by < N e^-60 |V|)
BLOCK_BYTES = 64 << 20  # one N_k-wide float64 matrix of a row block holds about this many bytes


def default_scale(d: int) -> float:
    """FlashAttention's softmax scale tau = 1 / sqrt(d)."""
    return 1.0 / np.sqrt(d)


def default_block(N_k: int, budget: int = BLOCK_BYTES) -> int:
    """Rows per block: as many as keep one block x N_k float64 matrix within ``budget`` bytes (at least 1)."""
    return max(1, budget // (8 * max(N_k, 1)))


def reference_memory(N: int, d: int, backward: bool, N_k: int | None = None, block: int | None = None) -> int:
    """Bytes the float64 reference holds at once: its outputs (O and L; dQ, dK, dV) and a row block's
    N_k-wide matrices (forward: S/P and exp's temporary; backward: P, dS and one temporary)."""
    N_k = N if N_k is None else N_k
    b = min(N, default_block(N_k) if block is None else block)
    wide = (4 if backward else 3) * b * N_k * 8
    outputs = ((N + 2 * N_k) * d if backward else N * d + N) * 8
    return wide + outputs


def _row_blocks(N: int, block: int):
    for r0 in range(0, N, block):
        yield r0, min(N, r0 + block)


# --- exact products for the extended-precision golden -------------------------------------------------------------

_LD = np.longdouble
_LD_DIGITS = np.finfo(_LD).nmant + 1  # significand bits of longdouble (64 on x86-64)


def _slices(X: np.ndarray, axis: int, bits: int, parts: int) -> list[np.ndarray]:
    """Cut X (longdouble) into float64 slices X = sum(slices) + rest: each slice holds at most ``bits`` significant
    bits relative to the largest entry of its row (axis=1) or column (axis=0) of what remains, by the error-free
    rounding (R + sigma) - sigma with sigma = 0.75 * 2^(e + digits + 1 - bits), |R| <= 2^e; the rest is below
    2^-(bits * parts) of the largest entry."""
    R = np.array(X, dtype=_LD)
    out = []
    for _ in range(parts):
        mu = np.max(np.abs(R), axis=axis, keepdims=True)
        e = np.ceil(np.log2(np.where(mu > 0, mu, 1)))
        sigma = np.where(mu > 0, _LD(0.75) * np.exp2(e + (_LD_DIGITS + 1 - bits)), 0).astype(_LD)
        S = (R + sigma) - sigma
        out.append(S.astype(np.float64))  # exact: S has at most `bits` <= 26 significant bits
        R = R - S
    return out


def matmul_extended(A, B) -> np.ndarray:
    """A @ B in longdouble, each entry the exact sum of products rounded (about) once to longdouble.

    With k = A.shape[1], slices of ``bits = (53 - ceil(log2 k)) // 2`` bits make every float64 BLAS product of an
    A slice (per row) by a B slice (per column) exact: its k terms are multiples of one power of two and their
    sum needs at most 2 bits + log2 k <= 53 bits. Slice pairs whose product lies below 2^-(bits * parts) of the
    largest are dropped (parts = ceil(digits / bits)).
    """
    A = np.asarray(A)
    B = np.asarray(B)
    k = A.shape[-1]
    if k == 0:
        return np.zeros(A.shape[:-1] + B.shape[-1:], dtype=_LD)
    bits = (53 - math.ceil(math.log2(k))) // 2 if k > 1 else 26
    parts = -(-_LD_DIGITS // bits)
    As = _slices(A, 1, bits, parts)
    Bs = _slices(B, 0, bits, parts)
    out = np.zeros((A.shape[0], B.shape[1]), dtype=_LD)
    for p in range(parts):
        for q in range(parts - p):
            out += As[p] @ Bs[q]
    return out


def _arithmetic(precision: str):
    """(dtype, matmul) of ``precision``."""
    if precision == "float64":
        return np.float64, np.matmul
    if precision == "extended":
        return _LD, matmul_extended
    raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")


# --- the row-block passes -------------------------------------------------------------------------------------------


def _row_block_softmax(Q_i, K, r0: int, scale: float, causal: bool, offset: int, mm, mask_i=None):
    """P_i (normalised, rows [r0, r0 + len(Q_i)) x all N_k columns) and L_i for one row block.

    The masks are applied here, on S_i: causal keeps column c of row r when c <= r + offset; ``mask_i`` (the
    block's rows of a boolean mask) keeps the entries it marks True. A row that keeps no column gets P_i = 0 and
    L_i = -inf.
    """
    S_i = mm(Q_i, K.T)
    S_i *= scale
    if causal:
        rows = np.arange(r0, r0 + S_i.shape[0]) + offset
        S_i[np.arange(S_i.shape[1])[None, :] > rows[:, None]] = -np.inf
    if mask_i is not None:
        S_i[~mask_i] = -np.inf
    m_i = S_i.max(axis=1, keepdims=True) if S_i.shape[1] else np.full((S_i.shape[0], 1), -np.inf, S_i.dtype)
    seen = np.isfinite(m_i)
    S_i -= np.where(seen, m_i, 0)
    P_i = np.exp(S_i, out=S_i)
    l_i = P_i.sum(axis=1, keepdims=True)
    P_i /= np.where(seen, l_i, 1)
    with np.errstate(divide="ignore"):
        L_i = np.where(seen, m_i + np.log(np.where(seen, l_i, 1)), -np.inf)[:, 0]
    return P_i, L_i


def _promote(precision: str, *arrays):
    dtype, mm = _arithmetic(precision)
    return dtype, mm, [np.asarray(x, dtype=np.float64).astype(dtype, copy=False) for x in arrays]


def attention_forward(
    Q,
    K,
    V,
    scale: float | None = None,
    causal: bool = False,
    *,
    offset: int = 0,
    block: int | None = None,
    precision: str = "float64",
    mask=None,
):  # noqa: N803
    """Return (O, L): the attention output (N_q x d) and the row logsumexp (N_q,), in float64 (or longdouble with
    ``precision="extended"``), computed in row blocks of ``block`` query rows (module docstring)."""
    return attention_forward_backward(
        Q, K, V, None, scale, causal, offset=offset, block=block, precision=precision, mask=mask
    )[:2]


def attention_backward(
    Q,
    K,
    V,
    dO,
    scale: float | None = None,
    causal: bool = False,
    *,
    offset: int = 0,
    block: int | None = None,
    precision: str = "float64",
    mask=None,
):  # noqa: N803
    """Return (dQ, dK, dV), the gradients of sum(O o dO) with respect to Q, K and V, in row blocks.

    Masked entries have P = 0, hence dS = 0: the mask needs no separate treatment here.
    """
    return attention_forward_backward(
        Q, K, V, dO, scale, causal, offset=offset, block=block, precision=precision, mask=mask
    )[2:]


def attention_forward_backward(
    Q,
    K,
    V,
    dO=None,
    scale: float | None = None,
    causal: bool = False,
    *,
    offset: int = 0,
    block: int | None = None,
    precision: str = "float64",
    mask=None,
):  # noqa: N803
    """Return (O, L, dQ, dK, dV) in one walk over the row blocks (the backward recomputes O_i = P_i V anyway);
    with ``dO=None`` only the forward runs and the gradients are None."""
    dtype, mm, arrays = _promote(precision, Q, K, V, *(() if dO is None else (dO,)))
    Q, K, V = arrays[:3]
    N_q, d = Q.shape
    scale = default_scale(d) if scale is None else scale
    block = default_block(K.shape[0]) if block is None else block
    O = np.empty((N_q, V.shape[1]), dtype=dtype)  # noqa: E741
    L = np.empty(N_q, dtype=dtype)
    if dO is None:
        dQ = dK = dV = None
    else:
        dO = arrays[3]
        dQ, dK, dV = np.empty_like(Q), np.zeros_like(K), np.zeros_like(V)
    for r0, r1 in _row_blocks(N_q, block):
        mask_i = None if mask is None else mask.rows(r0, r1) if hasattr(mask, "rows") else mask[r0:r1]
        P_i, L[r0:r1] = _row_block_softmax(Q[r0:r1], K, r0, scale, causal, offset, mm, mask_i)
        O[r0:r1] = mm(P_i, V)
        if dO is None:
            continue
        dO_i = dO[r0:r1]
        D_i = np.sum(dO_i * O[r0:r1], axis=1, keepdims=True)  # D = rowsum(dO o O)
        dV += mm(P_i.T, dO_i)
        dS_i = mm(dO_i, V.T)  # dP_i, overwritten in place by dS_i
        dS_i -= D_i
        dS_i *= P_i
        dQ[r0:r1] = scale * mm(dS_i, K)
        dK += scale * mm(dS_i.T, Q[r0:r1])
    return O, L, dQ, dK, dV


# --- the same-precision naive baselines -----------------------------------------------------------------------------


def _round_bfloat16(x) -> np.ndarray:
    """Round float32 values to bfloat16 (to nearest, ties to even) and back, on the bits: bfloat16 is float32's
    upper half, so adding 0x7FFF plus the lowest kept bit and clearing the lower half rounds exactly."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    bits = x.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return np.where(np.isfinite(x), rounded.view(np.float32), x)


def working_precision(dtype) -> tuple[np.dtype, object]:
    """(compute dtype, rounding function) of the naive baseline in ``dtype``.

    float32 and float64 compute in themselves. float16 and bfloat16 have no BLAS: they compute in float32 and round
    to ``dtype`` where a kernel stores a value (S, P, O, dP, dS and the gradients), with float32 accumulation in
    the products (what a GPU kernel on tensor cores does, and what flash-attn's tests do with PyTorch's
    half-precision matmuls).
    """
    dtype = np.dtype(dtype)
    if dtype in (np.dtype(np.float32), np.dtype(np.float64)):
        return dtype, lambda x: x
    if dtype.name == "bfloat16":
        return np.dtype(np.float32), _round_bfloat16
    if dtype == np.dtype(np.float16):
        return np.dtype(np.float32), _round_float16
    raise ValueError(f"no naive baseline for {dtype}")


def _round_float16(x) -> np.ndarray:
    """Round float32 values to float16 (to nearest, ties to even) and back, several times faster than NumPy's astype:
    on the bits for float16's normal range (10 of float32's 23 fraction bits kept; infinities and NaN stay what
    they are), by scaling for its subnormals (a fixed quantum of 2^-24), and to infinity above its largest value
    65504."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    bits = x.view(np.uint32)
    r = ((bits + np.uint32(0x0FFF) + ((bits >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)).view(np.float32)
    a = np.abs(x)
    small = a < np.float32(2.0**-14)
    if small.any():
        r[small] = np.round(x[small] * np.float32(2.0**24)) * np.float32(2.0**-24)
    big = np.abs(r) > 65504
    if big.any():
        r[big] = np.copysign(np.float32(np.inf), x[big])
    return r


def naive_forward(Q, K, V, scale, causal, dtype, *, offset: int = 0):  # noqa: N803
    """Plain attention in ``dtype`` (the FlashAttention rule's same-precision baseline): O, L and P.

    Works on (..., N, d) arrays; float16/bfloat16 as :func:`working_precision` says. Rows that see no key: O = 0,
    L = -inf.
    """
    work, rnd = working_precision(dtype)
    Q, K, V = (rnd(np.asarray(x).astype(work)) for x in (Q, K, V))
    S = rnd((Q @ np.swapaxes(K, -1, -2)) * work.type(scale))
    if causal:
        n_q, n_k = S.shape[-2:]
        keep = np.arange(n_k)[None, :] <= (np.arange(n_q) + offset)[:, None]
        S = np.where(keep, S, work.type(-np.inf))
    m = S.max(axis=-1, keepdims=True) if S.shape[-1] else np.full(S.shape[:-1] + (1,), -np.inf, work)
    seen = np.isfinite(m)
    Z = S - np.where(seen, m, 0)
    Z[Z < FLUSH] = -np.inf  # as GPUs flush subnormals; it keeps P and its products out of slow subnormal arithmetic
    P = np.exp(Z)
    s = P.sum(axis=-1, keepdims=True)
    P = rnd(P / np.where(seen, s, 1))
    with np.errstate(divide="ignore"):
        L = np.where(seen, rnd(m + np.log(np.where(seen, s, 1))), -np.inf)[..., 0]
    return rnd(P @ V), L, P


def naive_backward(Q, K, V, dO, P, scale, dtype):  # noqa: N803
    """Plain attention backward in ``dtype`` from the naive forward's P: (dQ, dK, dV) on (..., N, d) arrays."""
    work, rnd = working_precision(dtype)
    Q, K, V, dO = (rnd(np.asarray(x).astype(work)) for x in (Q, K, V, dO))
    P = np.asarray(P).astype(work)
    O = rnd(P @ V)  # noqa: E741
    dV = rnd(np.swapaxes(P, -1, -2) @ dO)
    dP = rnd(dO @ np.swapaxes(V, -1, -2))
    D = rnd(np.sum(dO * O, axis=-1, keepdims=True))
    dS = rnd(P * (dP - D) * work.type(scale))
    return rnd(dS @ K), rnd(np.swapaxes(dS, -1, -2) @ Q), dV

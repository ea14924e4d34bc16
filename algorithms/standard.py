"""Standard attention (FlashAttention paper, Algorithm 0) under the two-level memory model.

Dao et al. (NeurIPS 2022), Algorithm 0: S = Q K^T and P = softmax(S) are materialised in slow memory, then
O = P V. Theorem 2 quotes Theta(Nd + N^2) HBM accesses, which silently assumes each product streams its operands
once (true only for M >~ N^2); Saha & Ye show any standard-matmul schedule needs Omega(N^2 d / sqrt(M)) when
M < d^2. So that the algorithm runs, and fits, at every M down to 3 words, each phase is tiled:

1. S = scale * Q K^T: square tiles of side B (an accumulator tile C, one tile of each operand per step of the
   inner dimension); reads R(N, d, N) = Nd ceil(N/B) + Nd ceil(N/B), writes N^2. Working set <= 3 B^2.
2. P = softmax(S) row by row (masked entries, causal or any mask, are set to -inf here; a row with none allowed
   is 0: the dense baseline computes every tile whatever the mask). When a whole row fits (N + 2 <= M) blocks of
   R = floor((M - 2) / N) rows are loaded once, normalised in place and stored: N^2 reads, N^2 writes.
   Otherwise each row is swept twice in chunks of M - 2 columns (pass 1: running max and sum, pass 2: normalise
   and store): 2 N^2 reads, N^2 writes. Either way the current row's max and sum take 2 words.
3. O = P V: square tiles again; reads R(N, N, d) = N^2 ceil(d/B) + Nd ceil(N/B), writes Nd.

Exact count: :func:`iosim.theory.io_model.standard_forward`. The backward (Algorithm 3, :func:`standard_backward`) is at
the end of this file; exact count: :func:`iosim.theory.io_model.standard_backward`.
"""

from __future__ import annotations

import math

import numpy as np
from iosim.algorithms._tiles import buffer, cdiv, exp_nonpos, tile
from iosim.algorithms.tile_masks import DENSE, mask_allows, query_rows, resolve
from iosim.memory_model import alloc, free, load, store, store_to
from iosim.memory_model.core import jitable
from numba import njit


@jitable(nrt=True)
def _transposed(A):
    """A^T as a new C-contiguous array (a temporary, as np.dot's result is)."""
    n, m = A.shape
    T = np.empty((m, n), dtype=A.dtype)
    for r in range(n):
        for c in range(m):
            T[c, r] = A[r, c]
    return T


@jitable(nrt=True)
def tiled_matmul(W, iA, A, iB, B, iC, C, m, k, n, T, a_transposed, b_transposed, scale):
    """C = scale * op(A) op(B) with square tiles of side T; C is m x n and the inner dimension is k.

    op(A) = A^T if a_transposed (A stored k x m) else A (m x k); op(B) = B^T if b_transposed (B stored n x k) else
    B (k x n); not both (attention never needs A^T B^T). Reads m k ceil(n/T) + k n ceil(m/T), writes m n. Fast
    memory: the accumulator ti x tj plus one tile of each operand, at most 3 T^2 words.
    """
    Ab, Bb, Cb = buffer(T * T, C), buffer(T * T, C), buffer(T * T, C)
    for i in range(cdiv(m, T)):
        r0 = i * T
        ti = min(T, m - r0)
        for j in range(cdiv(n, T)):
            c0 = j * T
            tj = min(T, n - c0)
            Cij = tile(Cb, ti, tj)
            hC = alloc(W, iC, r0, ti, c0, tj)  # the accumulator: C's tile (i, j)
            if C is not None:
                Cij[:, :] = 0.0
            for kk in range(cdiv(k, T)):
                k0 = kk * T
                tk = min(T, k - k0)
                # A's tile is stored tk x ti when transposed, ti x tk otherwise; likewise B's
                Ablk = tile(Ab, tk, ti) if a_transposed else tile(Ab, ti, tk)
                Bblk = tile(Bb, tj, tk) if b_transposed else tile(Bb, tk, tj)
                if a_transposed:
                    hA = load(W, iA, A, k0, tk, r0, ti, Ablk)
                else:
                    hA = load(W, iA, A, r0, ti, k0, tk, Ablk)
                if b_transposed:
                    hB = load(W, iB, B, c0, tj, k0, tk, Bblk)
                else:
                    hB = load(W, iB, B, k0, tk, c0, tj, Bblk)
                if C is not None:  # one branch per layout keeps every np.dot on contiguous views
                    if a_transposed:  # a transposed temporary: the (C, C) product, no third layout to compile
                        Cij += np.dot(_transposed(Ablk), Bblk)
                    elif b_transposed:  # (A^T B^T is never needed)
                        Cij += np.dot(Ablk, Bblk.T)
                    else:
                        Cij += np.dot(Ablk, Bblk)
                free(W, hA)
                free(W, hB)
            if C is not None and scale != 1.0:
                Cij *= scale
            store(W, hC, Cij, C)
            free(W, hC)


@jitable
def _row_max(x):
    m = -np.inf
    for c in range(x.size):
        m = max(m, x[c])
    return m


@jitable
def _exp_shift_sum(x, m, in_place):
    """sum_c exp(x_c - m), overwriting x_c with exp(x_c - m) when ``in_place`` (a row with no allowed entry, m =
    -inf, sums to 0 and, in place, becomes 0)."""
    s = 0.0
    if m == -np.inf:
        if in_place:
            for c in range(x.size):
                x[c] = 0.0
        return s
    for c in range(x.size):
        e = exp_nonpos(x[c] - m)
        s += e
        if in_place:
            x[c] = e
    return s


@jitable
def _normalise(x, total):
    """x /= total, leaving a row with no allowed entry (total = 0) at 0."""
    if total != 0.0:
        for c in range(x.size):
            x[c] /= total


@jitable(nrt=True)
def _mask_row(x, row, col0, mk, mp, mt, fill):
    """x[c] = fill where (row, col0 + c) is masked (-inf for scores, 0 for gradients)."""
    if mk != DENSE:
        for c in range(x.size):
            if not mask_allows(mk, mp, mt, row, col0 + c):
                x[c] = fill


@jitable(nrt=True)
def _softmax(W, iS, S, iP, P, im, Nr, N, M, off, mk, mp, mt):
    """P = softmax(S) row-wise (Nr rows of N columns), one pass when a row fits in fast memory, two otherwise; row r
    is the mask's row r + off."""
    hm = alloc(W, im, 0, 1, 0, 2)  # the current row's max and sum
    if N + 2 <= M:
        R = min(Nr, (M - 2) // N)
        Sb = buffer(R * N, S)
        for i in range(cdiv(Nr, R)):
            r0 = i * R
            br = min(R, Nr - r0)
            rows = tile(Sb, br, N)
            h = load(W, iS, S, r0, br, 0, N, rows)
            if S is not None:
                for r in range(br):
                    x = rows[r]
                    _mask_row(x, r0 + r + off, 0, mk, mp, mt, -np.inf)
                    m_r = _row_max(x)
                    l_r = _exp_shift_sum(x, m_r, True)
                    _normalise(x, l_r)
            store_to(W, h, rows, iP, P, r0, 0)  # P overwrites S on chip, written to P
            free(W, h)
    else:
        C = M - 2
        Sb = buffer(C, S)
        for r in range(Nr):
            m_r, l_r = -np.inf, 0.0
            for p in range(2):  # pass 0: running max and sum; pass 1: normalise and store
                for j in range(cdiv(N, C)):
                    c0 = j * C
                    bc = min(C, N - c0)
                    chunk = tile(Sb, 1, bc)
                    h = load(W, iS, S, r, 1, c0, bc, chunk)
                    if S is not None:
                        x = chunk[0]
                        _mask_row(x, r + off, c0, mk, mp, mt, -np.inf)
                        if p == 0:
                            m_new = max(m_r, _row_max(x))
                            if m_new > -np.inf:
                                l_r = l_r * math.exp(m_r - m_new) + _exp_shift_sum(x, m_new, False)
                                m_r = m_new
                        else:
                            _exp_shift_sum(x, m_r, True)
                            _normalise(x, l_r)
                    if p == 1:
                        store_to(W, h, chunk, iP, P, r, c0)
                    free(W, h)
    free(W, hm)


@njit(cache=True)
def _standard_forward(W, ids, Q, K, V, S, P, O, N, Nk, d, dv, M, B, scale, off, mk, mp, mt):  # noqa: N803
    iQ, iK, iV, iS, iP, iO, im = ids
    tiled_matmul(W, iQ, Q, iK, K, iS, S, N, d, Nk, B, False, True, scale)  # step 1: S = Q K^T
    _softmax(W, iS, S, iP, P, im, N, Nk, M, off, mk, mp, mt)  # step 2: P = softmax(S), masked
    tiled_matmul(W, iP, P, iV, V, iO, O, N, Nk, dv, B, False, False, 1.0)  # step 3: O = P V


def standard_forward(mem, Q, K, V, *, N, d, B, scale, causal=False, dtype=np.float64, N_k=None, d_v=None):  # noqa: N803
    """Standard attention (Algorithm 0) with tiled products on memory ``mem``.

    Count-only mode: pass Q = K = V = None. Returns (O, S, P) from slow memory (None in count-only mode, where no
    N x N array is allocated). ``N_k`` keys (default N: N_q = N rows of Q against N_k keys, S and P N x N_k;
    ``causal`` is then bottom-right, row r seeing keys c <= r + N_k - N) and ``d_v`` (default d) the width of V, O.
    A :class:`TileMask` over N_k != N keys covers the whole sequence; the queries are its last N rows.
    """
    Nk = N if N_k is None else N_k
    dv = d if d_v is None else d_v
    if Q is None:
        S = P = O = None
    else:
        Q, K, V = (np.ascontiguousarray(x, dtype=dtype) for x in (Q, K, V))
        S, P, O = (np.full(shape, np.nan, dtype) for shape in ((N, Nk), (N, Nk), (N, dv)))  # poisoned
    ids = mem.ids(Q=(N, d), K=(Nk, d), V=(Nk, dv), S=(N, Nk), P=(N, Nk), O=(N, dv), m=(1, 2))
    mk, off = query_rows(causal, N, Nk)
    mem.call(_standard_forward, ids, Q, K, V, S, P, O, N, Nk, d, dv, mem.M, B, float(scale), off, *mk)
    return O, S, P


# ---------------------------------------------------------------------------------------------------------------
# Backward pass: FlashAttention paper, Algorithm 3 (standard attention backward)
# ---------------------------------------------------------------------------------------------------------------
# Inputs in slow memory: Q, K, V, dO and the forward's P (N x N). dP and dS are materialised in slow memory.
# Every product is square-tiled with the forward's tile B (the backward's products have the forward's shapes,
# so the same B fits), and step 3 sweeps rows like the forward's softmax:
# 1. dV = P^T dO: reads R(N, N, d) = N^2 ceil(d/B) + Nd ceil(N/B), writes Nd.
# 2. dP = dO V^T: reads R(N, d, N) = 2 Nd ceil(N/B), writes N^2.
# 3. dS_ij = P_ij (dP_ij - D_i) with D_i = sum_l P_il dP_il (Algorithm 3 reduces over the row of P o dP; it does
#    not use D_i = dO_i . O_i). When a row of P and of dP fit together (2N + 1 <= M), blocks of
#    R = floor((M - 1) / 2N) rows of each are loaded once: reads 2 N^2, writes N^2 (docs/theory.md B0's 3N^2).
#    Otherwise each row is swept twice in chunks of floor((M - 1) / 2) columns of P and dP (pass 1: D_i,
#    pass 2: dS and store): reads 4 N^2, writes N^2. D_i takes one word. The causal mask is applied here
#    (masked dS = 0; P is already 0 there), which changes no count: the dense baseline computes every tile whatever
#    the mask (iosim.algorithms.tile_masks), and saves nothing.
# 4. dQ = scale dS K: reads R(N, N, d), writes Nd.
# 5. dK = scale dS^T Q: reads R(N, N, d), writes Nd.
# Exact count: :func:`iosim.theory.io_model.standard_backward`.


@jitable(nrt=True)
def _softmax_backward(W, iP, P, idP, dP, idS, dS, iD, N, M, mk, mp, mt):
    """Step 3 of Algorithm 3: dS = P o (dP - D) row-wise, D_i = rowsum(P o dP)_i; one pass when a row of P and of
    dP fit in fast memory, two passes otherwise."""
    hD = alloc(W, iD, 0, 1, 0, 1)  # the current row's D_i
    if 2 * N + 1 <= M:
        R = min(N, (M - 1) // (2 * N))
        Pb, dPb = buffer(R * N, dS), buffer(R * N, dS)
        for i in range(cdiv(N, R)):
            r0 = i * R
            br = min(R, N - r0)
            Prows, dProws = tile(Pb, br, N), tile(dPb, br, N)
            hP = load(W, iP, P, r0, br, 0, N, Prows)
            hdP = load(W, idP, dP, r0, br, 0, N, dProws)
            if dS is not None:
                for r in range(br):
                    pr, g = Prows[r], dProws[r]
                    D_i = np.dot(pr, g)
                    g -= D_i
                    g *= pr  # dS overwrites dP in place
                    _mask_row(g, r0 + r, 0, mk, mp, mt, 0.0)
            store_to(W, hdP, dProws, idS, dS, r0, 0)  # dS overwrites dP on chip, written to dS
            free(W, hP)
            free(W, hdP)
    else:
        C = (M - 1) // 2
        Pb, dPb = buffer(C, dS), buffer(C, dS)
        for r in range(N):
            D_i = 0.0
            for sweep in range(2):  # sweep 0: D_i = sum_l P_rl dP_rl; sweep 1: dS and store
                for j in range(cdiv(N, C)):
                    c0 = j * C
                    bc = min(C, N - c0)
                    Pc, dPc = tile(Pb, 1, bc), tile(dPb, 1, bc)
                    hP = load(W, iP, P, r, 1, c0, bc, Pc)
                    hdP = load(W, idP, dP, r, 1, c0, bc, dPc)
                    if dS is not None:
                        if sweep == 0:
                            D_i += np.dot(Pc[0], dPc[0])
                        else:
                            g = dPc[0]
                            g -= D_i
                            g *= Pc[0]
                            _mask_row(g, r, c0, mk, mp, mt, 0.0)
                    if sweep == 1:
                        store_to(W, hdP, dPc, idS, dS, r, c0)
                    free(W, hP)
                    free(W, hdP)
    free(W, hD)


@njit(cache=True)
def _standard_backward(W, ids, Q, K, V, P, dO, dP, dS, dQ, dK, dV, N, d, M, B, scale, mk, mp, mt):  # noqa: N803
    iQ, iK, iV, iP, idO, idP, idS, idQ, idK, idV, iD = ids
    tiled_matmul(W, iP, P, idO, dO, idV, dV, N, N, d, B, True, False, 1.0)  # step 1: dV = P^T dO
    tiled_matmul(W, idO, dO, iV, V, idP, dP, N, d, N, B, False, True, 1.0)  # step 2: dP = dO V^T
    _softmax_backward(W, iP, P, idP, dP, idS, dS, iD, N, M, mk, mp, mt)  # step 3: dS = P o (dP - D)
    tiled_matmul(W, idS, dS, iK, K, idQ, dQ, N, N, d, B, False, False, scale)  # step 4: dQ = scale dS K
    tiled_matmul(W, idS, dS, iQ, Q, idK, dK, N, N, d, B, True, False, scale)  # step 5: dK = scale dS^T Q


def standard_backward(mem, Q, K, V, P, dO, *, N, d, B, scale, causal=False, dtype=np.float64):  # noqa: N803
    """Standard attention backward (FlashAttention Algorithm 3) with tiled products on memory ``mem``.

    Inputs: Q, K, V, dO and the forward's P in slow memory. Count-only mode: every data array None (no N x N
    array is allocated). Returns (dQ, dK, dV) (None each in count-only mode).
    Reads 3 R(N, N, d) + R(N, d, N) + 2N^2 (4N^2 when a row of P and dP does not fit), writes 2N^2 + 3Nd; with one
    tile covering everything (B >= N, d) that is docs/theory.md B0, 7N^2 + 8Nd.
    See :func:`iosim.theory.io_model.standard_backward`.
    """
    if Q is None:
        P = dP = dS = dQ = dK = dV = None
    else:
        Q, K, V, P, dO = (np.ascontiguousarray(x, dtype=dtype) for x in (Q, K, V, P, dO))
        dP, dS = (np.full((N, N), np.nan, dtype) for _ in range(2))  # poisoned
        dQ, dK, dV = (np.full((N, d), np.nan, dtype) for _ in range(3))
    nd, nn = (N, d), (N, N)
    ids = mem.ids(Q=nd, K=nd, V=nd, P=nn, dO=nd, dP=nn, dS=nn, dQ=nd, dK=nd, dV=nd, D=(1, 1))
    mk = resolve(causal, N).args[:3]
    mem.call(_standard_backward, ids, Q, K, V, P, dO, dP, dS, dQ, dK, dV, N, d, mem.M, B, float(scale), *mk)
    return dQ, dK, dV

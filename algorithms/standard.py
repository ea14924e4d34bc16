"""Standard attention (FlashAttention paper, Algorithm 0) under the two-level memory model.

Dao et al. (NeurIPS 2022), Algorithm 0: S = Q K^T and P = softmax(S) are materialised in slow memory, then
O = P V. Theorem 2 quotes Theta(Nd + N^2) HBM accesses, which silently assumes each product streams its operands
once (true only for M >~ N^2); Saha & Ye show any standard-matmul schedule needs Omega(N^2 d / sqrt(M)) when
M < d^2. So that the algorithm runs, and fits, at every M down to 3 words, each phase is tiled:

1. S = scale * Q K^T: square tiles of side B (an accumulator tile C, one tile of each operand per step of the
   inner dimension); reads R(N, d, N) = Nd ceil(N/B) + Nd ceil(N/B), writes N^2. Working set <= 3 B^2.
2. P = softmax(S) row by row (causal entries masked here). When a whole row fits (N + 2 <= M) blocks of
   R = floor((M - 2) / N) rows are loaded once, normalised in place and stored: N^2 reads, N^2 writes.
   Otherwise each row is swept twice in chunks of M - 2 columns (pass 1: running max and sum, pass 2: normalise
   and store): 2 N^2 reads, N^2 writes. Either way the current row's max and sum take 2 words.
3. O = P V: square tiles again; reads R(N, N, d) = N^2 ceil(d/B) + Nd ceil(N/B), writes Nd.

Exact count: :func:`iosim.io_model.standard_forward`.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from algorithms._tiles import buffer, cdiv, tile
from memory_model import alloc, free, load, store

STANDARD_ARRAYS_FWD = ("Q", "K", "V", "S", "P", "O", "C", "m", "l")


@njit(cache=True)
def tiled_matmul(W, iA, A, iB, B, iC, C, iAcc, m, k, n, T, b_transposed, scale):
    """C = scale * A op(B) with square tiles of side T; op(B) = B^T if b_transposed (B is n x k) else B (k x n).

    Reads m k ceil(n/T) + k n ceil(m/T), writes m n. Fast memory: accumulator ti x tj plus one tile of each
    operand, at most 3 T^2 words.
    """
    Ab, Bb, Cb = buffer(T * T, C), buffer(T * T, C), buffer(T * T, C)
    for i in range(cdiv(m, T)):
        r0 = i * T
        ti = min(T, m - r0)
        for j in range(cdiv(n, T)):
            c0 = j * T
            tj = min(T, n - c0)
            Cij = tile(Cb, ti, tj)
            alloc(W, iAcc, ti * tj)
            if C is not None:
                Cij[:, :] = 0.0
            for kk in range(cdiv(k, T)):
                k0 = kk * T
                tk = min(T, k - k0)
                Aik = tile(Ab, ti, tk)
                load(W, iA, A, r0, ti, k0, tk, Aik)
                if b_transposed:
                    Bjk = tile(Bb, tj, tk)
                    load(W, iB, B, c0, tj, k0, tk, Bjk)
                    if C is not None:
                        Cij += np.dot(Aik, Bjk.T)
                else:
                    Bkj = tile(Bb, tk, tj)
                    load(W, iB, B, k0, tk, c0, tj, Bkj)
                    if C is not None:
                        Cij += np.dot(Aik, Bkj)
                free(W, ti * tk + tj * tk)
            if C is not None and scale != 1.0:
                Cij *= scale
            store(W, iC, Cij, C, r0, ti, c0, tj)
            free(W, ti * tj)


@njit(cache=True)
def _mask_row(x, row, col0, causal):
    if causal:
        for c in range(max(row + 1 - col0, 0), x.size):
            x[c] = -np.inf


@njit(cache=True)
def _softmax(W, iS, S, iP, P, im, N, M, causal):
    """P = softmax(S) row-wise, one pass when a row fits in fast memory, two passes otherwise."""
    alloc(W, im, 2)  # the current row's max and sum
    if N + 2 <= M:
        R = min(N, (M - 2) // N)
        Sb = buffer(R * N, S)
        for i in range(cdiv(N, R)):
            r0 = i * R
            br = min(R, N - r0)
            rows = tile(Sb, br, N)
            load(W, iS, S, r0, br, 0, N, rows)
            if S is not None:
                for r in range(br):
                    x = rows[r]
                    _mask_row(x, r0 + r, 0, causal)
                    x -= x.max()
                    np.exp(x, x)
                    x /= x.sum()
            store(W, iP, rows, P, r0, br, 0, N)
            free(W, br * N)
    else:
        C = M - 2
        Sb = buffer(C, S)
        for r in range(N):
            m_r, l_r = -np.inf, 0.0
            for p in range(2):  # pass 0: running max and sum; pass 1: normalise and store
                for j in range(cdiv(N, C)):
                    c0 = j * C
                    bc = min(C, N - c0)
                    chunk = tile(Sb, 1, bc)
                    load(W, iS, S, r, 1, c0, bc, chunk)
                    if S is not None:
                        x = chunk[0]
                        _mask_row(x, r, c0, causal)
                        if p == 0:
                            m_new = max(m_r, x.max())
                            if m_new > -np.inf:
                                l_r = l_r * math.exp(m_r - m_new) + np.exp(x - m_new).sum()
                                m_r = m_new
                        else:
                            x -= m_r
                            np.exp(x, x)
                            x /= l_r
                    if p == 1:
                        store(W, iP, chunk, P, r, 1, c0, bc)
                    free(W, bc)
    free(W, 2)


@njit(cache=True)
def _standard_forward(W, ids, Q, K, V, S, P, O, N, d, M, B, scale, causal):  # noqa: N803
    iQ, iK, iV, iS, iP, iO, iC, im, il = ids
    tiled_matmul(W, iQ, Q, iK, K, iS, S, iC, N, d, N, B, True, scale)  # step 1: S = Q K^T
    _softmax(W, iS, S, iP, P, im, N, M, causal)  # step 2: P = softmax(S)
    tiled_matmul(W, iP, P, iV, V, iO, O, iC, N, N, d, B, False, 1.0)  # step 3: O = P V


def standard_forward(mem, Q, K, V, *, N, d, B, scale, causal=False, dtype=np.float64):  # noqa: N803
    """Standard attention (Algorithm 0) with tiled products on memory ``mem``.

    Count-only mode: pass Q = K = V = None. Returns (O, S, P) from slow memory (None in count-only mode, where no
    N x N array is allocated).
    """
    if Q is None:
        S = P = O = None
    else:
        Q, K, V = (np.ascontiguousarray(x, dtype=dtype) for x in (Q, K, V))
        S, P, O = (np.full(shape, np.nan, dtype) for shape in ((N, N), (N, N), (N, d)))  # poisoned
    ids = mem.ids(*STANDARD_ARRAYS_FWD)
    mem.call(_standard_forward, ids, Q, K, V, S, P, O, N, d, mem.M, B, float(scale), bool(causal))
    return O, S, P

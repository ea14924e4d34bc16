"""FlashAttention forward passes under the two-level memory model.

* :func:`flash1_forward`: Dao et al., "FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness"
  (NeurIPS 2022), Algorithm 1 (Algorithm 2's softmax scale and causal mask included). K/V-outer loop; O, l and m
  make a round trip through slow memory on every inner step. Theorem 2: Theta(N^2 d^2 / M) slow-memory accesses.
  Exact count: :func:`iosim.io_model.flash1_forward`.
* :func:`flash2_forward`: Dao, "FlashAttention-2" (2023), forward. Q-outer loop; O_i, l_i, m_i stay on chip,
  O and the logsumexp L are written once. Exact count: :func:`iosim.io_model.flash2_forward`.

Both drivers take explicit (N, d) so that count-only mode (every data array None) runs the same loop nest
with no data at all. Working set of one inner step, in words (what ``fit`` tiling sizes against M):
Q_i, O_i (2 Br d) + K_j, V_j (2 Bc d) + l_i, m_i (2 Br) + S_ij (Br Bc; P~_ij overwrites it in place).
The per-row quantities m~, l~, m_new, l_new are scalars of one row's arithmetic and take no fast memory.
Causal masking skips a block (i, j) whose every entry lies above the diagonal with one ``continue``; such a
block is never loaded.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from algorithms._tiles import buffer, cdiv, score_tile, tile
from memory_model import alloc, free, init_slow, load, load_vec, store, store_vec

FLASH_ARRAYS_FWD1 = ("Q", "K", "V", "O", "l", "m", "S")
FLASH_ARRAYS_FWD2 = ("Q", "K", "V", "O", "L", "m", "l", "S")


@njit(cache=True)
def _flash1_row_update(S, Vj, Oi, l_i, m_i):
    """On-chip update of Algorithm 1, steps 10-13, one row at a time (P~ overwrites S in place)."""
    br, bc = S.shape
    d = Oi.shape[1]
    for r in range(br):
        m_tilde = -np.inf
        for c in range(bc):
            m_tilde = max(m_tilde, S[r, c])
        if m_tilde == -np.inf:  # every column of this row is masked in this block: nothing changes
            continue
        l_tilde = 0.0
        for c in range(bc):
            p = math.exp(S[r, c] - m_tilde)
            S[r, c] = p
            l_tilde += p
        m_new = max(m_i[r], m_tilde)
        a = l_i[r] * math.exp(m_i[r] - m_new) if m_i[r] != -np.inf else 0.0
        b = math.exp(m_tilde - m_new)
        l_new = a + b * l_tilde
        for k in range(d):
            Oi[r, k] *= a
        for c in range(bc):
            w = b * S[r, c]
            for k in range(d):
                Oi[r, k] += w * Vj[c, k]
        for k in range(d):
            Oi[r, k] /= l_new
        m_i[r] = m_new
        l_i[r] = l_new


@njit(cache=True)
def _flash1_forward(W, ids, Q, K, V, O, l, m, N, d, Br, Bc, scale, causal):  # noqa: E741, N803
    iQ, iK, iV, iO, il, im, iS = ids
    Tr = cdiv(N, Br)
    Tc = cdiv(N, Bc)
    # Step 2: initialise O = (0)_{N x d}, l = (0)_N, m = (-inf)_N in HBM.
    init_slow(W, iO, N * d)
    init_slow(W, il, N)
    init_slow(W, im, N)
    if Q is not None:
        O[:, :] = 0.0
        l[:] = 0.0
        m[:] = -np.inf
    Kb, Vb = buffer(Bc * d, Q), buffer(Bc * d, Q)
    Qb, Ob = buffer(Br * d, Q), buffer(Br * d, Q)
    lb, mb = buffer(Br, Q), buffer(Br, Q)
    Sb = buffer(Br * Bc, Q)
    for j in range(Tc):  # step 5
        c0 = j * Bc
        bc = min(Bc, N - c0)
        Kj, Vj = tile(Kb, bc, d), tile(Vb, bc, d)
        load(W, iK, K, c0, bc, 0, d, Kj)  # step 6
        load(W, iV, V, c0, bc, 0, d, Vj)
        for i in range(Tr):  # step 7
            r0 = i * Br
            br = min(Br, N - r0)
            if causal and c0 > r0 + br - 1:  # block entirely above the diagonal
                continue
            Qi, Oi, Sij = tile(Qb, br, d), tile(Ob, br, d), tile(Sb, br, bc)
            load(W, iQ, Q, r0, br, 0, d, Qi)  # step 8
            load(W, iO, O, r0, br, 0, d, Oi)
            load_vec(W, il, l, r0, br, lb)
            load_vec(W, im, m, r0, br, mb)
            alloc(W, iS, br * bc)
            if Q is not None:
                score_tile(Qi, Kj, Sij, scale, causal, r0, c0)  # step 9
                _flash1_row_update(Sij, Vj, Oi, lb[:br], mb[:br])  # steps 10-11
            store(W, iO, Oi, O, r0, br, 0, d)  # step 12
            store_vec(W, il, lb, l, r0, br)  # step 13
            store_vec(W, im, mb, m, r0, br)
            free(W, br * bc + 2 * br * d + 2 * br)
        free(W, 2 * bc * d)


@njit(cache=True)
def _flash2_row_update(S, Vj, Oi, l_i, m_i):
    """On-chip update of FlashAttention-2's forward inner step: unnormalised O_i, running m_i and l_i."""
    br, bc = S.shape
    for r in range(br):
        m_tilde = -np.inf
        for c in range(bc):
            m_tilde = max(m_tilde, S[r, c])
        m_new = max(m_i[r], m_tilde)
        if m_new == -np.inf:  # nothing unmasked seen yet in this row
            for c in range(bc):
                S[r, c] = 0.0
            continue
        alpha = math.exp(m_i[r] - m_new)
        s = 0.0
        for c in range(bc):
            p = math.exp(S[r, c] - m_new)
            S[r, c] = p
            s += p
        l_i[r] = alpha * l_i[r] + s
        m_i[r] = m_new
        Oi[r, :] *= alpha
    Oi += np.dot(S, Vj)  # BLAS temporary: an implementation detail; the model accumulates in place


@njit(cache=True)
def _flash2_forward(W, ids, Q, K, V, O, L, N, d, Br, Bc, scale, causal):  # noqa: N803
    iQ, iK, iV, iO, iL, im, il, iS = ids
    Tr = cdiv(N, Br)
    Tc = cdiv(N, Bc)
    Qb, Ob = buffer(Br * d, Q), buffer(Br * d, Q)
    lb, mb = buffer(Br, Q), buffer(Br, Q)
    Kb, Vb = buffer(Bc * d, Q), buffer(Bc * d, Q)
    Sb = buffer(Br * Bc, Q)
    for i in range(Tr):  # outer loop over row blocks
        r0 = i * Br
        br = min(Br, N - r0)
        Qi, Oi = tile(Qb, br, d), tile(Ob, br, d)
        load(W, iQ, Q, r0, br, 0, d, Qi)
        alloc(W, iO, br * d)  # on-chip O_i = 0
        alloc(W, il, br)  # l_i = 0
        alloc(W, im, br)  # m_i = -inf
        if Q is not None:
            Oi[:, :] = 0.0
            lb[:br] = 0.0
            mb[:br] = -np.inf
        for j in range(Tc):
            c0 = j * Bc
            bc = min(Bc, N - c0)
            if causal and c0 > r0 + br - 1:  # block entirely above the diagonal
                continue
            Kj, Vj, Sij = tile(Kb, bc, d), tile(Vb, bc, d), tile(Sb, br, bc)
            load(W, iK, K, c0, bc, 0, d, Kj)
            load(W, iV, V, c0, bc, 0, d, Vj)
            alloc(W, iS, br * bc)
            if Q is not None:
                score_tile(Qi, Kj, Sij, scale, causal, r0, c0)
                _flash2_row_update(Sij, Vj, Oi, lb[:br], mb[:br])
            free(W, br * bc + 2 * bc * d)
        if Q is not None:
            for r in range(br):
                Oi[r, :] /= lb[r]
                lb[r] = mb[r] + math.log(lb[r])  # L_i = m_i + log(l_i), computed in place of l_i
        store(W, iO, Oi, O, r0, br, 0, d)
        store_vec(W, iL, lb, L, r0, br)
        free(W, 2 * br * d + 2 * br)


def _inputs(Q, K, V, dtype):  # noqa: N803
    if Q is None:
        return None, None, None
    return tuple(np.ascontiguousarray(x, dtype=dtype) for x in (Q, K, V))


def _outputs(numeric, dtype, *shapes):
    """Output arrays poisoned with NaN so an unwritten element shows (None in count-only mode)."""
    return tuple(np.full(shape, np.nan, dtype) if numeric else None for shape in shapes)


def flash1_forward(mem, Q, K, V, *, N, d, Br, Bc, scale, causal=False, dtype=np.float64):  # noqa: N803
    """FlashAttention Algorithm 1 (with Algorithm 2's scale and causal mask) on memory ``mem``.

    Count-only mode: pass Q = K = V = None. Returns (O, l, m) in slow memory (None each in count-only mode).
    Reads 2Nd + Tc(2Nd + 2N), writes Tc(Nd + 2N) plus Nd + 2N for initialising O, l, m:
    see :func:`iosim.io_model.flash1_forward`.
    """
    Q, K, V = _inputs(Q, K, V, dtype)
    O, l, m = _outputs(Q is not None, dtype, (N, d), (N,), (N,))  # noqa: E741
    ids = mem.ids(*FLASH_ARRAYS_FWD1)
    mem.call(_flash1_forward, ids, Q, K, V, O, l, m, N, d, Br, Bc, float(scale), bool(causal))
    return O, l, m


def flash2_forward(mem, Q, K, V, *, N, d, Br, Bc, scale, causal=False, dtype=np.float64):  # noqa: N803
    """FlashAttention-2 forward on memory ``mem``. Count-only mode: Q = K = V = None. Returns (O, L).

    Reads Nd + Tr * 2Nd, writes Nd + N: see :func:`iosim.io_model.flash2_forward`.
    """
    Q, K, V = _inputs(Q, K, V, dtype)
    O, L = _outputs(Q is not None, dtype, (N, d), (N,))
    ids = mem.ids(*FLASH_ARRAYS_FWD2)
    mem.call(_flash2_forward, ids, Q, K, V, O, L, N, d, Br, Bc, float(scale), bool(causal))
    return O, L

"""FlashAttention forward passes under the two-level memory model.

* :func:`flash1_forward`: Dao et al., "FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness"
  (NeurIPS 2022), Algorithm 1 (Algorithm 2's softmax scale and causal mask included). K/V-outer loop; O, l and m
  make a round trip through slow memory on every inner step. Theorem 2: Theta(N^2 d^2 / M) slow-memory accesses.
  Exact count: :func:`iosim.theory.io_model.flash1_forward`.
* :func:`flash2_forward`: Dao, "FlashAttention-2" (2023), forward. Q-outer loop; O_i, l_i, m_i stay on chip,
  O and the logsumexp L are written once. Exact count: :func:`iosim.theory.io_model.flash2_forward`.
* :func:`flash1_backward`: FlashAttention Algorithm 4 (appendix B.4), K/V outer, S and P recomputed from l and m,
  D_i recomputed on every inner step, dQ_i read-modify-written every inner step. Theorem 5: Theta(N^2 d^2 / M).
  Exact count: :func:`iosim.theory.io_model.flash1_backward`.
* :func:`flash2_backward`: FlashAttention-2 backward (Algorithm 2), D = rowsum(dO o O) precomputed once, P from
  the logsumexp L. Exact count: :func:`iosim.theory.io_model.flash2_backward`.

Both drivers take explicit (N, d) so that count-only mode (every data array None) runs the same loop nest
with no data at all. Working set of one inner step, in words (what ``fit`` tiling sizes against M):
Q_i, O_i (2 Br d) + K_j, V_j (2 Bc d) + l_i, m_i (2 Br) + S_ij (Br Bc; P~_ij overwrites it in place).
The per-row quantities m~, l~, m_new, l_new are scalars of one row's arithmetic and take no fast memory.
Masks (:mod:`iosim.algorithms.tile_masks`; ``causal=True`` is the causal mask): a block (i, j) the mask empties is
skipped with one ``continue`` and never loaded (FlashAttention Algorithm 5); inside a partial block the element
mask sets the masked scores to -inf; a full block needs no test. Loops visit only the blocks ``mask_rows`` /
``mask_cols`` leave possible, so structured masks cost time in proportion to their nonzero blocks. The mask's
``policy`` decides the outer-loop operands of a block whose tiles are all empty: ``paper`` loads them (Algorithm 5
loads K_j, V_j before testing the mask), ``skip`` does not (FlashAttention's CUDA block-sparse kernel). A row
with no allowed entry ends with O = 0, L = -inf (l = 0, m = -inf) and zero gradients.
"""

from __future__ import annotations

import math

import numpy as np
from iosim.algorithms._tiles import buffer, cdiv, exp_nonpos, score_tile, tile
from iosim.algorithms.tile_masks import (
    apply_mask,
    block_nonempty,
    block_range,
    mask_cols,
    mask_rows,
    resolve,
    tile_nnz,
)
from iosim.memory_model import alloc, alloc_vec, free, init_slow, load, load_vec, store, store_vec
from numba import njit


@njit(cache=True)
def flash1_row_update(S, Vj, Oi, l_i, m_i):
    """On-chip update of Algorithm 1, steps 10-13, one row at a time (P~ overwrites S in place). ``Vj`` may be wider
    than O_i: its first columns are used (MLA's shared latent, algorithms/decoding.py)."""
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
def _flash1_forward(W, ids, Q, K, V, O, l, m, N, d, Br, Bc, scale, mk, mp, mt, skip):  # noqa: E741, N803
    iQ, iK, iV, iO, il, im, iS = ids
    Tc = cdiv(N, Bc)  # the row blocks come from the mask's range (mask_rows)
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
        if skip and not block_nonempty(mk, mp, mt, N, Br, c0, bc, True):  # policy skip: K_j, V_j never loaded
            continue
        Kj, Vj = tile(Kb, bc, d), tile(Vb, bc, d)
        hK = load(W, iK, K, c0, bc, 0, d, Kj)  # step 6
        hV = load(W, iV, V, c0, bc, 0, d, Vj)
        lo, hi = mask_rows(mk, mp, mt, c0, bc, N)
        i0, i1 = block_range(lo, hi, Br)
        for i in range(i0, i1):  # step 7 (row blocks the mask leaves possible)
            r0 = i * Br
            br = min(Br, N - r0)
            nnz = tile_nnz(mk, mp, mt, r0, br, c0, bc)
            if nnz == 0:  # Algorithm 5, step 8: a zero block is skipped
                continue
            Qi, Oi, Sij = tile(Qb, br, d), tile(Ob, br, d), tile(Sb, br, bc)
            hQ = load(W, iQ, Q, r0, br, 0, d, Qi)  # step 8
            hO = load(W, iO, O, r0, br, 0, d, Oi)
            hl = load_vec(W, il, l, r0, br, lb)
            hm = load_vec(W, im, m, r0, br, mb)
            hS = alloc(W, iS, r0, br, c0, bc)
            if Q is not None:
                score_tile(Qi, Kj, Sij, scale)  # step 9
                if nnz < br * bc:  # a partial block: the element mask
                    apply_mask(Sij, mk, mp, mt, r0, c0)
                flash1_row_update(Sij, Vj, Oi, lb[:br], mb[:br])  # steps 10-11
            store(W, hO, Oi, O)  # step 12
            store_vec(W, hl, lb, l)  # step 13
            store_vec(W, hm, mb, m)
            for h in (hS, hQ, hO, hl, hm):
                free(W, h)
        free(W, hK)
        free(W, hV)


@njit(cache=True)
def _flash2_row_update(S, Vj, Oi, l_i, m_i):
    """On-chip update of FlashAttention-2's forward inner step: unnormalised O_i, running m_i and l_i."""
    br, bc = S.shape
    for r in range(br):
        S_r = S[r]
        m_tilde = -np.inf
        for c in range(bc):
            m_tilde = max(m_tilde, S_r[c])
        m_new = max(m_i[r], m_tilde)
        if m_new == -np.inf:  # nothing unmasked seen yet in this row
            for c in range(bc):
                S_r[c] = 0.0
            continue
        alpha = math.exp(m_i[r] - m_new)
        for c in range(bc):  # P~_ij = exp(S_ij - m_new), in place (a vectorised loop)
            S_r[c] = exp_nonpos(S_r[c] - m_new)
        s = 0.0
        for c in range(bc):
            s += S_r[c]
        l_i[r] = alpha * l_i[r] + s
        m_i[r] = m_new
        Oi_r = Oi[r]  # a view: scaling it in place writes O_i's row (no temporary)
        Oi_r *= alpha
    Oi += np.dot(S, Vj)  # BLAS temporary: an implementation detail; the model accumulates in place


@njit(cache=True)
def _flash2_forward(W, ids, Q, K, V, O, L, N, d, Br, Bc, scale, mk, mp, mt, skip):  # noqa: N803
    iQ, iK, iV, iO, iL, im, iS = ids
    Tr = cdiv(N, Br)  # the column blocks come from the mask's range (mask_cols)
    Qb, Ob = buffer(Br * d, Q), buffer(Br * d, Q)
    lb, mb = buffer(Br, Q), buffer(Br, Q)
    Kb, Vb = buffer(Bc * d, Q), buffer(Bc * d, Q)
    Sb = buffer(Br * Bc, Q)
    for i in range(Tr):  # outer loop over row blocks
        r0 = i * Br
        br = min(Br, N - r0)
        Qi, Oi = tile(Qb, br, d), tile(Ob, br, d)
        # policy skip, a row block with no allowed entry: Q_i is never loaded, O_i = 0 and L_i = -inf are written
        load_Q = not skip or block_nonempty(mk, mp, mt, N, Bc, r0, br, False)
        hQ = load(W, iQ, Q, r0, br, 0, d, Qi) if load_Q else -1
        hO = alloc(W, iO, r0, br, 0, d)  # on-chip O_i = 0
        hl = alloc_vec(W, iL, r0, br)  # l_i = 0; becomes L_i = m_i + log(l_i) in place
        hm = alloc_vec(W, im, r0, br)  # m_i = -inf
        if Q is not None:
            Oi[:, :] = 0.0
            lb[:br] = 0.0
            mb[:br] = -np.inf
        lo, hi = mask_cols(mk, mp, mt, r0, br, N)
        j0, j1 = block_range(lo, hi, Bc) if load_Q else (0, 0)
        for j in range(j0, j1):  # column blocks the mask leaves possible
            c0 = j * Bc
            bc = min(Bc, N - c0)
            nnz = tile_nnz(mk, mp, mt, r0, br, c0, bc)
            if nnz == 0:  # a zero block is skipped
                continue
            Kj, Vj, Sij = tile(Kb, bc, d), tile(Vb, bc, d), tile(Sb, br, bc)
            hK = load(W, iK, K, c0, bc, 0, d, Kj)
            hV = load(W, iV, V, c0, bc, 0, d, Vj)
            hS = alloc(W, iS, r0, br, c0, bc)
            if Q is not None:
                score_tile(Qi, Kj, Sij, scale)
                if nnz < br * bc:
                    apply_mask(Sij, mk, mp, mt, r0, c0)
                _flash2_row_update(Sij, Vj, Oi, lb[:br], mb[:br])
            free(W, hS)
            free(W, hK)
            free(W, hV)
        if Q is not None:
            for r in range(br):
                if lb[r] == 0.0:  # no allowed entry in this row: O_r = 0 (never updated), L_r = -inf
                    lb[r] = -np.inf
                    continue
                Oi_r = Oi[r]
                Oi_r /= lb[r]
                lb[r] = mb[r] + math.log(lb[r])  # L_i = m_i + log(l_i), computed in place of l_i
        store(W, hO, Oi, O)
        store_vec(W, hl, lb, L)
        if load_Q:
            free(W, hQ)
        for h in (hO, hl, hm):
            free(W, h)


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
    see :func:`iosim.theory.io_model.flash1_forward`.
    """
    Q, K, V = _inputs(Q, K, V, dtype)
    O, l, m = _outputs(Q is not None, dtype, (N, d), (N,), (N,))  # noqa: E741
    ids = mem.ids(Q=(N, d), K=(N, d), V=(N, d), O=(N, d), l=(N,), m=(N,), S=(N, N))
    mem.call(_flash1_forward, ids, Q, K, V, O, l, m, N, d, Br, Bc, float(scale), *resolve(causal, N).args)
    return O, l, m


def flash2_forward(mem, Q, K, V, *, N, d, Br, Bc, scale, causal=False, dtype=np.float64):  # noqa: N803
    """FlashAttention-2 forward on memory ``mem``. Count-only mode: Q = K = V = None. Returns (O, L).

    Reads Nd + Tr * 2Nd, writes Nd + N: see :func:`iosim.theory.io_model.flash2_forward`.
    """
    Q, K, V = _inputs(Q, K, V, dtype)
    O, L = _outputs(Q is not None, dtype, (N, d), (N,))
    ids = mem.ids(Q=(N, d), K=(N, d), V=(N, d), O=(N, d), L=(N,), m=(N,), S=(N, N))
    mem.call(_flash2_forward, ids, Q, K, V, O, L, N, d, Br, Bc, float(scale), *resolve(causal, N).args)
    return O, L


# ---------------------------------------------------------------------------------------------------------------
# Backward passes
# ---------------------------------------------------------------------------------------------------------------
# Both backward passes keep the K/V-outer loop (FlashAttention Algorithm 4; FlashAttention-2 Algorithm 2):
# K_j, V_j and the on-chip accumulators dK~_j, dV~_j stay resident while the row blocks stream past; dQ_i makes a
# read-modify-write round trip through slow memory on every inner step. Working set of one inner step, in words
# (what the backward ``fit`` tiling sizes against M, :func:`iosim.theory.io_model.flash1_backward_working_set` and
# :func:`iosim.theory.io_model.flash2_backward_working_set`):
#   flash1: K_j, V_j, dK~_j, dV~_j (4 Bc d) + Q_i, O_i, dO_i, dQ_i (4 Br d) + l_i, m_i, D_i (3 Br)
#           + S_ij/P_ij and dP_ij/dS_ij (2 Br Bc);
#   flash2: K_j, V_j, dK~_j, dV~_j (4 Bc d) + Q_i, dO_i, dQ_i (3 Br d) + L_i, D_i (2 Br) + S_ij/P_ij, dP_ij/dS_ij
#           (2 Br Bc).
# P_ij overwrites S_ij in place and dS_ij overwrites dP_ij in place; the vector D_i counts (a row statistic of
# the block, computed at step 20 and used at step 21). The BLAS products allocate temporaries outside the model
# (an implementation detail: the model accumulates in place).


@njit(cache=True)
def _probabilities_from_stats(S, m_i, l_i):
    """P_ij = diag(l_i)^-1 exp(S_ij - m_i) in place (FlashAttention-2: m_i = L_i, l_i = None); masked -inf -> 0."""
    br, bc = S.shape
    for r in range(br):
        if m_i[r] == -np.inf:  # a row with no allowed entry: P = 0
            S[r, :] = 0.0
            continue
        inv = 1.0 if l_i is None else 1.0 / l_i[r]
        for c in range(bc):
            S[r, c] = math.exp(S[r, c] - m_i[r]) * inv


@njit(cache=True)
def _backward_tile(Pij, dPij, Qi, Kj, Vj, dOi, dQi, dKj, dVj, D_i, scale):
    """Steps 17-23 of Algorithm 4 on chip (D_i given): dV~_j, dP_ij, dS_ij (in place of dP_ij), dQ_i, dK~_j."""
    dVj += np.dot(Pij.T, dOi)  # step 17: dV~_j += P_ij^T dO_i
    np.dot(dOi, Vj.T, dPij)  # step 18: dP_ij = dO_i V_j^T
    br, bc = Pij.shape
    for r in range(br):  # step 21: dS_ij = P_ij o (dP_ij - D_i), scaled by tau here once for steps 22-23
        for c in range(bc):
            dPij[r, c] = scale * Pij[r, c] * (dPij[r, c] - D_i[r])
    dQi += np.dot(dPij, Kj)  # step 22: dQ_i += tau dS_ij K_j
    dKj += np.dot(dPij.T, Qi)  # step 23: dK~_j += tau dS_ij^T Q_i


@njit(cache=True)
def _rowsum_product(A, B, out):
    """out[r] = rowsum(A o B)[r]: D_i = rowsum(dO_i o O_i)."""
    for r in range(A.shape[0]):
        s = 0.0
        for k in range(A.shape[1]):
            s += A[r, k] * B[r, k]
        out[r] = s


@njit(cache=True)
def _flash1_backward(W, ids, Q, K, V, O, dO, l, m, dQ, dK, dV, N, d, Br, Bc, scale, mk, mp, mt, skip):  # noqa: E741
    iQ, iK, iV, iO, idO, il, im, idQ, idK, idV, iS, idP, iD = ids
    Tc = cdiv(N, Bc)
    # Step 6: initialise dQ, dK, dV = (0)_{N x d} in HBM.
    init_slow(W, idQ, N * d)
    init_slow(W, idK, N * d)
    init_slow(W, idV, N * d)
    if Q is not None:
        dQ[:, :] = 0.0
        dK[:, :] = 0.0
        dV[:, :] = 0.0
    Kb, Vb, dKb, dVb = buffer(Bc * d, Q), buffer(Bc * d, Q), buffer(Bc * d, Q), buffer(Bc * d, Q)
    Qb, Ob, dOb, dQb = buffer(Br * d, Q), buffer(Br * d, Q), buffer(Br * d, Q), buffer(Br * d, Q)
    lb, mb, Db = buffer(Br, Q), buffer(Br, Q), buffer(Br, Q)
    Sb, dPb = buffer(Br * Bc, Q), buffer(Br * Bc, Q)
    for j in range(Tc):  # step 7
        c0 = j * Bc
        bc = min(Bc, N - c0)
        if skip and not block_nonempty(mk, mp, mt, N, Br, c0, bc, True):  # policy skip: dK_j = dV_j = 0 from step 6
            continue
        Kj, Vj, dKj, dVj = tile(Kb, bc, d), tile(Vb, bc, d), tile(dKb, bc, d), tile(dVb, bc, d)
        hK = load(W, iK, K, c0, bc, 0, d, Kj)  # step 8
        hV = load(W, iV, V, c0, bc, 0, d, Vj)
        hdK = alloc(W, idK, c0, bc, 0, d)  # step 9: dK~_j = 0, dV~_j = 0 on chip
        hdV = alloc(W, idV, c0, bc, 0, d)
        if Q is not None:
            dKj[:, :] = 0.0
            dVj[:, :] = 0.0
        lo, hi = mask_rows(mk, mp, mt, c0, bc, N)
        i0, i1 = block_range(lo, hi, Br)
        for i in range(i0, i1):  # step 10
            r0 = i * Br
            br = min(Br, N - r0)
            nnz = tile_nnz(mk, mp, mt, r0, br, c0, bc)
            if nnz == 0:  # a zero block is skipped
                continue
            Qi, Oi, dOi, dQi = tile(Qb, br, d), tile(Ob, br, d), tile(dOb, br, d), tile(dQb, br, d)
            Sij, dPij = tile(Sb, br, bc), tile(dPb, br, bc)
            hQ = load(W, iQ, Q, r0, br, 0, d, Qi)  # step 11
            hO = load(W, iO, O, r0, br, 0, d, Oi)
            hdO = load(W, idO, dO, r0, br, 0, d, dOi)
            hdQ = load(W, idQ, dQ, r0, br, 0, d, dQi)
            hl = load_vec(W, il, l, r0, br, lb)
            hm = load_vec(W, im, m, r0, br, mb)
            hS = alloc(W, iS, r0, br, c0, bc)  # S_ij, then P_ij in place
            hdP = alloc(W, idP, r0, br, c0, bc)  # dP_ij, then dS_ij in place
            hD = alloc_vec(W, iD, r0, br)  # D_i
            if Q is not None:
                score_tile(Qi, Kj, Sij, scale)  # steps 12-13: S_ij = tau Q_i K_j^T, masked
                if nnz < br * bc:
                    apply_mask(Sij, mk, mp, mt, r0, c0)
                _probabilities_from_stats(Sij, mb[:br], lb[:br])  # step 14
                _rowsum_product(dOi, Oi, Db[:br])  # step 20: D_i = rowsum(dO_i o O_i), recomputed every step
                _backward_tile(Sij, dPij, Qi, Kj, Vj, dOi, dQi, dKj, dVj, Db[:br], scale)  # steps 17-23
            store(W, hdQ, dQi, dQ)  # step 22: write dQ_i <- dQ_i + tau dS_ij K_j to HBM
            for h in (hS, hdP, hD, hQ, hO, hdO, hdQ, hl, hm):
                free(W, h)
        store(W, hdK, dKj, dK)  # step 25: write dK_j <- dK~_j, dV_j <- dV~_j
        store(W, hdV, dVj, dV)
        for h in (hK, hV, hdK, hdV):
            free(W, h)


@njit(cache=True)
def d_pass(W, ids, dO, O, D, R, d, Br, dOb, Ob, Db):  # noqa: N803
    """FlashAttention-2's backward, step 4: D = rowsum(dO o O) in one pass over the R rows in blocks of Br, each
    block's dO_i and O_i read (d words a row each) and D_i written to HBM (flash-attn's preprocessing kernel)."""
    idO, iO, iD = ids
    for i in range(cdiv(R, Br)):
        r0 = i * Br
        br = min(Br, R - r0)
        dOi, Oi = tile(dOb, br, d), tile(Ob, br, d)
        hdO = load(W, idO, dO, r0, br, 0, d, dOi)
        hO = load(W, iO, O, r0, br, 0, d, Oi)
        hD = alloc_vec(W, iD, r0, br)
        if dO is not None:
            _rowsum_product(dOi, Oi, Db[:br])
        store_vec(W, hD, Db, D)
        for h in (hdO, hO, hD):
            free(W, h)


@njit(cache=True)
def _flash2_backward(W, ids, Q, K, V, O, dO, L, D, dQ, dK, dV, N, d, Br, Bc, scale, mk, mp, mt, skip):  # noqa: N803
    iQ, iK, iV, iO, idO, iL, iD, idQ, idK, idV, iS, idP = ids
    Tc = cdiv(N, Bc)
    # Step 3: initialise dQ = (0)_{N x d} in HBM (dK and dV are written once, step 18, and need no initialisation).
    init_slow(W, idQ, N * d)
    if Q is not None:
        dQ[:, :] = 0.0
    Qb, Ob, dOb, dQb = buffer(Br * d, Q), buffer(Br * d, Q), buffer(Br * d, Q), buffer(Br * d, Q)
    Lb, Db = buffer(Br, Q), buffer(Br, Q)
    d_pass(W, (idO, iO, iD), dO, O, D, N, d, Br, dOb, Ob, Db)  # step 4: D = rowsum(dO o O), the only read of O
    Kb, Vb, dKb, dVb = buffer(Bc * d, Q), buffer(Bc * d, Q), buffer(Bc * d, Q), buffer(Bc * d, Q)
    Sb, dPb = buffer(Br * Bc, Q), buffer(Br * Bc, Q)
    for j in range(Tc):  # step 5
        c0 = j * Bc
        bc = min(Bc, N - c0)
        Kj, Vj, dKj, dVj = tile(Kb, bc, d), tile(Vb, bc, d), tile(dKb, bc, d), tile(dVb, bc, d)
        if skip and not block_nonempty(mk, mp, mt, N, Br, c0, bc, True):  # policy skip: write dK_j = dV_j = 0 only
            hdK = alloc(W, idK, c0, bc, 0, d)
            hdV = alloc(W, idV, c0, bc, 0, d)
            if Q is not None:
                dKj[:, :] = 0.0
                dVj[:, :] = 0.0
            store(W, hdK, dKj, dK)
            store(W, hdV, dVj, dV)
            free(W, hdK)
            free(W, hdV)
            continue
        hK = load(W, iK, K, c0, bc, 0, d, Kj)  # step 6
        hV = load(W, iV, V, c0, bc, 0, d, Vj)
        hdK = alloc(W, idK, c0, bc, 0, d)  # step 7: dK_j = 0, dV_j = 0 on chip
        hdV = alloc(W, idV, c0, bc, 0, d)
        if Q is not None:
            dKj[:, :] = 0.0
            dVj[:, :] = 0.0
        lo, hi = mask_rows(mk, mp, mt, c0, bc, N)
        i0, i1 = block_range(lo, hi, Br)
        for i in range(i0, i1):  # step 8
            r0 = i * Br
            br = min(Br, N - r0)
            nnz = tile_nnz(mk, mp, mt, r0, br, c0, bc)
            if nnz == 0:  # a zero block is skipped
                continue
            Qi, dOi, dQi = tile(Qb, br, d), tile(dOb, br, d), tile(dQb, br, d)
            Sij, dPij = tile(Sb, br, bc), tile(dPb, br, bc)
            # Step 9 loads Q_i, O_i, dO_i, dQ_i, L_i, D_i; O_i is dropped here: with D precomputed (step 4) no
            # step of the inner loop uses it, so loading it would only cost Br d reads per step.
            hQ = load(W, iQ, Q, r0, br, 0, d, Qi)
            hdO = load(W, idO, dO, r0, br, 0, d, dOi)
            hdQ = load(W, idQ, dQ, r0, br, 0, d, dQi)  # step 15's read of dQ_i, hoisted into the step-9 loads
            hL = load_vec(W, iL, L, r0, br, Lb)
            hD = load_vec(W, iD, D, r0, br, Db)
            hS = alloc(W, iS, r0, br, c0, bc)  # S_ij, then P_ij in place
            hdP = alloc(W, idP, r0, br, c0, bc)  # dP_ij, then dS_ij in place
            if Q is not None:
                score_tile(Qi, Kj, Sij, scale)  # step 10: S_ij = tau Q_i K_j^T, masked
                if nnz < br * bc:
                    apply_mask(Sij, mk, mp, mt, r0, c0)
                _probabilities_from_stats(Sij, Lb[:br], None)  # step 11: P_ij = exp(S_ij - L_i)
                _backward_tile(Sij, dPij, Qi, Kj, Vj, dOi, dQi, dKj, dVj, Db[:br], scale)  # steps 12-16
            store(W, hdQ, dQi, dQ)  # step 15: write dQ_i back to HBM
            for h in (hS, hdP, hQ, hdO, hdQ, hL, hD):
                free(W, h)
        store(W, hdK, dKj, dK)  # step 18: write dK_j, dV_j to HBM
        store(W, hdV, dVj, dV)
        for h in (hK, hV, hdK, hdV):
            free(W, h)


def _grads(numeric, dtype, N, d):
    """dQ, dK, dV poisoned with NaN so an unwritten element shows (None each in count-only mode)."""
    return _outputs(numeric, dtype, (N, d), (N, d), (N, d))


def _vec(x, dtype):
    return None if x is None else np.ascontiguousarray(x, dtype=dtype)


def flash1_backward(mem, Q, K, V, O, dO, l, m, *, N, d, Br, Bc, scale, causal=False, dtype=np.float64):  # noqa: E741, N803
    """FlashAttention Algorithm 4 (backward; dropout omitted) on memory ``mem``.

    Inputs are the forward's outputs as the paper has them: O and the row statistics l, m of Algorithm 1. K/V-outer
    loop; S_ij and P_ij are recomputed from l and m; D_i = rowsum(dO_i o O_i) is recomputed on every inner step;
    dQ_i is read, updated and written on every inner step; dK_j and dV_j are written once. dQ, dK, dV are
    zero-initialised in HBM (step 6), counted as initialisation writes.
    Count-only mode: pass every data array as None. Returns (dQ, dK, dV) (None each in count-only mode).
    Reads 2Nd + Tc(4Nd + 2N), writes 2Nd + Tc Nd plus 3Nd initialisation, total 4Nd + Tc(5Nd + 2N) + 3Nd
    (docs/theory.md B1): see :func:`iosim.theory.io_model.flash1_backward`.
    """
    Q, K, V = _inputs(Q, K, V, dtype)
    O, dO, l, m = (_vec(x, dtype) for x in (O, dO, l, m))  # noqa: E741
    dQ, dK, dV = _grads(Q is not None, dtype, N, d)
    nd, n = (N, d), (N,)
    ids = mem.ids(Q=nd, K=nd, V=nd, O=nd, dO=nd, l=n, m=n, dQ=nd, dK=nd, dV=nd, S=(N, N), dP=(N, N), D=n)
    mk = resolve(causal, N).args
    mem.call(_flash1_backward, ids, Q, K, V, O, dO, l, m, dQ, dK, dV, N, d, Br, Bc, float(scale), *mk)
    return dQ, dK, dV


def flash2_backward(mem, Q, K, V, O, dO, L, *, N, d, Br, Bc, scale, causal=False, dtype=np.float64):  # noqa: N803
    """FlashAttention-2 backward (Dao 2023, Algorithm 2) on memory ``mem``.

    Inputs: O and the logsumexp L of the forward. D = rowsum(dO o O) is computed once in its own pass and written
    to HBM (N words); the K/V-outer loop recomputes P_ij = exp(S_ij - L_i) and read-modify-writes dQ_i on every
    inner step. The paper's inner loop also loads O_i; it is unused once D exists and is not loaded here
    (docs/theory.md B2, "dropping it"). Count-only mode: every data array None. Returns (dQ, dK, dV).
    Reads 4Nd + Tc(3Nd + 2N), writes 2Nd + N + Tc Nd plus Nd initialisation of dQ, total 6Nd + N + Tc(4Nd + 2N)
    + Nd: see :func:`iosim.theory.io_model.flash2_backward`.
    """
    Q, K, V = _inputs(Q, K, V, dtype)
    O, dO, L = (_vec(x, dtype) for x in (O, dO, L))
    D = None if Q is None else np.full(N, np.nan, dtype)
    dQ, dK, dV = _grads(Q is not None, dtype, N, d)
    nd, n = (N, d), (N,)
    ids = mem.ids(Q=nd, K=nd, V=nd, O=nd, dO=nd, L=n, D=n, dQ=nd, dK=nd, dV=nd, S=(N, N), dP=(N, N))
    mk = resolve(causal, N).args
    mem.call(_flash2_backward, ids, Q, K, V, O, dO, L, D, dQ, dK, dV, N, d, Br, Bc, float(scale), *mk)
    return dQ, dK, dV

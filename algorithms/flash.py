"""FlashAttention under the two-level memory model: one loop nest per algorithm and pass, over a whole problem.

* :func:`flash1_forward`: Dao et al., "FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness"
  (NeurIPS 2022), Algorithm 1 (Algorithm 2's softmax scale and causal mask included). K/V-outer loop; O, l and m
  make a round trip through slow memory on every inner step. Theorem 2: Theta(N^2 d^2 / M) slow-memory accesses.
* :func:`flash2_forward`: Dao, "FlashAttention-2" (2023), forward. Q-outer loop; O_i, l_i, m_i stay on chip,
  O and the logsumexp L are written once.
* :func:`flash1_backward`: FlashAttention Algorithm 4 (appendix B.4), K/V outer, S and P recomputed from l and m,
  D_i recomputed on every inner step, dQ_i read-modify-written every inner step. Theorem 5: Theta(N^2 d^2 / M).
* :func:`flash2_backward`: FlashAttention-2 backward (Algorithm 2), D = rowsum(dO o O) precomputed once, P from
  the logsumexp L.

Each algorithm is written once, over a :class:`iosim.spec.problem.Problem` (:func:`flash1_problem`,
:func:`flash2_problem`, :func:`flash2_backward_problem`, :func:`flash1_backward_problem`); the one-head functions
above are its B = H = 1, N_q = N_k case, with the paper's operands in the paper's order. A problem has B batch
items, H_q query heads sharing H_kv key/value heads (g = H_q / H_kv), N_q query rows against N_k keys (decoding:
N_q = 1; chunked prefill: N_q < N_k; causal aligned bottom-right, row r sees key c <= r + N_k - N_q), widths d_qk
and d_v. The loops over batch and heads are outermost, and what sits inside them decides what is shared:

* **GQA** ``per-head`` (G = g thread-block groups per key/value head, R = N_q rows each): every query head is its
  own problem and loads every K_j, V_j of its key/value head: g loads per KV head. ``packed`` (G = 1, R = g N_q
  rows): the g query heads of a group are packed into the row dimension of one row block (FlashAttention-3's
  ``pack_gqa``, FlashDecoding, FlashMLA), so one load of K_j, V_j serves all of them while the packed rows fit in
  one row block. Packed row r' is query row r' mod N_q of head r' div N_q (the causal limit follows the row).
* **Split-KV** (Flash-Decoding, Dao, Haziza, Massa, Sizov 2023): the column blocks of a row block are divided into
  s splits of ceil(T_c / s) blocks (flash-attn's ``num_splits``); each (row block, split) is a thread block that
  writes a partial O_i (fp32, d_v per row) and its logsumexp into Opart, Lpart; a split the mask empties writes
  O = 0, lse = -inf without loading Q_i. The combine step (:func:`_split_combine`, a second kernel) reads, per
  block of rows, the s logsumexps (one R x s tile) and the s partial outputs one after another and writes O, L.
* **Paged KV** (vLLM, :mod:`iosim.algorithms.paged`): a key tile is processed page piece by page piece (its
  page-table entry, then its rows from the page; the same online softmax over pieces). flash1 (K/V outer) runs each
  piece as an outer step of its own, with its own round trip of Q_i, O_i, l_i, m_i, or (``gather``) gathers the
  whole tile from its pages first and runs the row loop once per column block, paying only the table words.
* **Masks** (:mod:`iosim.algorithms.tile_masks`; ``causal=True`` is the causal mask): a mask covers the whole
  sequence, N_k x N_k, and query row q is its row q + N_k - N_q. A block (i, j) the mask empties is skipped with
  one ``continue`` and never loaded (FlashAttention Algorithm 5); inside a partial block the element mask sets the
  masked scores to -inf; a full block needs no test. Loops visit only the blocks the mask leaves possible. The
  mask's ``policy`` decides the outer operand of a thread block whose tiles are all empty (flash2's forward: Q_i;
  flash1 and the backward: K_j, V_j): ``paper`` loads it before the first test (Algorithm 5 loads K_j, V_j before
  testing the mask), ``skip`` does not (FlashAttention's CUDA block-sparse kernel; the default over a problem).
  A row with no allowed entry ends with O = 0, L = -inf (l = 0, m = -inf) and zero gradients.
* **MLA** (DeepSeek-V2/V3, absorbed form): the cache is one latent per token, K = [c_KV, k_rope] (d_qk wide) and
  V = c_KV, its first d_v columns. ``shared`` (FlashMLA, ``Share_KV``): V_j is read from the resident K_j tile,
  no V load and no V tile in fast memory. ``naive``: V_j is loaded separately (counted as array V).

Heads and batch items with the same shape are independent copies of one schedule; the nests still run every one of
them (a count-only step costs nanoseconds), which keeps the peak, the counts and the thread-block count literal.
Slow-memory layout: Q, O, L rows in (b, h_q, r) order; K, V rows in (b, h_kv, c) order, or paged
(:func:`iosim.algorithms.paged.kv_rows`). Count-only mode (every data array None) runs the same nests with no data.

Working set of a forward inner step (R_i rows, a piece of n keys; what ``fit`` tiling sizes against M): Q_i
(R_i d_qk) + O_i (R_i d_v) + l_i, m_i (2 R_i) + K piece (n d_qk) + V piece (n d_v; 0 under MLA shared) + S_ij
(R_i n; P~_ij overwrites it in place); the page-table word is freed before S. The per-row quantities m~, l~,
m_new, l_new are scalars of one row's arithmetic and take no fast memory.
Exact counts: :mod:`iosim.theory.io_model` (``flash1_forward``, ``flash2_forward``, ``flash1_backward``,
``flash2_backward`` and their ``_problem`` forms).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from iosim.algorithms._tiles import buffer, cdiv, exp_nonpos, score_tile, tile
from iosim.algorithms.paged import gather_tile, kv_rows, load_piece, piece_end
from iosim.algorithms.tile_masks import (
    block_range,
    causal_mask,
    cols_rows,
    dense_mask,
    resolve,
    rows_apply,
    rows_cols,
    rows_nnz,
)
from iosim.memory_model import alloc, alloc_vec, free, init_slow, load, load_vec, store, store_vec
from numba import njit, types
from numba.extending import overload


@njit(cache=True)
def flash1_row_update(S, Vj, Oi, l_i, m_i):
    """On-chip update of Algorithm 1, steps 10-13, one row at a time (P~ overwrites S in place). ``Vj`` may be wider
    than O_i: its first columns are used (MLA's shared latent)."""
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
def _online_update(S, Vs, Oi, l_i, m_i):
    """FlashAttention-2's on-chip step: P~_ij = exp(S_ij - m_new) in place of S_ij, the running l_i and m_i, and the
    unnormalised O_i = diag(exp(m_i - m_new)) O_i + P~_ij V_j. ``Vs`` may be wider than O_i (MLA shared: the
    resident K tile, whose first d_v columns are V)."""
    br, bc = S.shape
    dv = Oi.shape[1]
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
        for c in range(bc):  # a vectorised loop
            S_r[c] = exp_nonpos(S_r[c] - m_new)
        s = 0.0
        for c in range(bc):
            s += S_r[c]
        l_i[r] = alpha * l_i[r] + s
        m_i[r] = m_new
        Oi_r = Oi[r]  # a view: scaling it in place writes O_i's row
        Oi_r *= alpha
    if Vs.shape[1] == dv:
        Oi += np.dot(S, Vs)  # BLAS temporary: an implementation detail; the model accumulates in place
    else:  # V is the first d_v columns of the wider K tile
        for r in range(br):
            for c in range(bc):
                p = S[r, c]
                if p != 0.0:
                    for k in range(dv):
                        Oi[r, k] += p * Vs[c, k]


@njit(cache=True)
def _finish_rows(Oi, l_i, m_i, br):
    """O_i /= l_i, l_i <- L_i = m_i + log l_i in place; a row that saw no key keeps O = 0 and gets L = -inf."""
    for r in range(br):
        if l_i[r] == 0.0:
            l_i[r] = -np.inf
            continue
        for k in range(Oi.shape[1]):
            Oi[r, k] /= l_i[r]
        l_i[r] = m_i[r] + math.log(l_i[r])


@njit(cache=True)
def _first_seen(mk, mp, mt, x0, bx, k0, k1, B, n, Nq, off, column):  # noqa: N803
    """The first block k in [k0, k1) (side B, n in all) whose tile with the block [x0, x0 + bx) is not empty (k1:
    none): the row block's first column block (``column`` False) or the column block's first row block (True).
    Under the policy ``skip`` a thread block's outer operand is loaded only if there is one."""
    for k in range(k0, k1):
        y0 = k * B
        by = min(B, n - y0)
        nnz = rows_nnz(mk, mp, mt, y0, by, x0, bx, Nq, off) if column else rows_nnz(mk, mp, mt, x0, bx, y0, by, Nq, off)
        if nnz > 0:
            return k
    return k1


@njit(cache=True)
def _flash2_forward(  # noqa: N803
    W, ids, Q, K, V, O, L, Op, Lp, table, B, Hkv, g, G, Nq, Nk, dqk, dv, Br, Bc, s, P, scale, shared, Bm, mk, mp, mt,
    skip,
):  # fmt: skip
    iQ, iK, iV, iO, iL, iOp, iLp, iT, im, iS = ids  # the data arguments' ids in their order, then m, S
    pids = (iK, iV, iT)
    R = Nq * (g // G)  # rows of one thread block: N_q (per-head, G = g) or g N_q (packed, G = 1)
    Rtot = B * Hkv * g * Nq
    off = Nk - Nq
    Tr, Tc = cdiv(R, Br), cdiv(Nk, Bc)
    per_split = cdiv(Tc, s)  # column blocks per split (flash-attn's num_splits)
    pages = cdiv(Nk, P) if P > 0 else 0
    Qb, Ob = buffer(Br * dqk, Q), buffer(Br * dv, Q)
    lb, mb = buffer(Br, Q), buffer(Br, Q)
    Kb, Vb, Sb = buffer(Bc * dqk, Q), buffer(Bc * dv, Q), buffer(Br * Bc, Q)
    tb = buffer(1, table)
    Out = O if s == 1 else Op  # split-KV: each split writes a partial O_i and its lse (Opart, Lpart)
    for b in range(B):  # batch items, key/value heads and (per-head) query heads: outermost
        for hk in range(Hkv):
            kv = (b * Hkv + hk) * Nk
            at = (kv, b, pages, hk, Hkv, P)
            for h in range(G):
                qbase = ((b * Hkv + hk) * g + h) * Nq
                for i in range(Tr):  # outer loop over row blocks
                    r0 = i * Br
                    br = min(Br, R - r0)
                    lo, hi = rows_cols(mk, mp, mt, r0, br, Nq, off, Nk)
                    j_lo, j_hi = block_range(lo, hi, Bc)  # column blocks outside the mask's range are not visited
                    for k in range(s):  # one thread block per (row block, split)
                        j0, j1 = max(j_lo, k * per_split), min(j_hi, (k + 1) * per_split)
                        if skip:  # policy skip: from the first nonempty block; none: Q_i is never loaded
                            j0 = _first_seen(mk, mp, mt, r0, br, j0, j1, Bc, Nk, Nq, off, False)
                        load_Q = j0 < j1 if skip else k * per_split < Tc
                        out = qbase + r0 if s == 1 else k * Rtot + qbase + r0
                        Qi, Oi = tile(Qb, br, dqk), tile(Ob, br, dv)
                        hQ = load(W, iQ, Q, qbase + r0, br, 0, dqk, Qi) if load_Q else -1  # (no Q_i: O = 0, lse = -inf)
                        hO = alloc(W, iO if s == 1 else iOp, out, br, 0, dv)  # on-chip O_i = 0
                        hl = alloc_vec(W, iL, out, br) if s == 1 else alloc(W, iLp, qbase + r0, br, k, 1)  # l_i = 0
                        hm = alloc_vec(W, im, r0, br)  # m_i = -inf
                        if Q is not None:
                            Oi[:, :] = 0.0
                            lb[:br] = 0.0
                            mb[:br] = -np.inf
                        for j in range(j0, j1):  # the split's column blocks
                            c0 = j * Bc
                            c1 = min(c0 + Bc, Nk)
                            nnz = rows_nnz(mk, mp, mt, r0, br, c0, c1 - c0, Nq, off)
                            if nnz == 0:  # a zero block is skipped
                                continue
                            p0 = c0
                            while p0 < c1:  # the tile's page pieces (one piece when contiguous)
                                p1 = piece_end(p0, c1, P)
                                n = p1 - p0
                                Kj, Vj = tile(Kb, n, dqk), tile(Vb, n, dv)  # the piece (paged: its table entry first)
                                hK, hV = load_piece(W, pids, K, V, table, tb, Kj, Vj, at, p0, n, dqk, dv, shared)
                                Sij = tile(Sb, br, n)
                                hS = alloc(W, iS, r0, br, p0, n)
                                if Q is not None:
                                    score_tile(Qi, Kj, Sij, scale)  # S_ij = tau Q_i K_j^T
                                    if nnz < br * (c1 - c0):  # a partial block: the element mask
                                        rows_apply(Sij, mk, mp, mt, r0, p0, Nq, off)
                                    _online_update(Sij, Kj if shared else Vj, Oi, lb[:br], mb[:br])
                                free(W, hS)
                                free(W, hK)
                                if not shared:
                                    free(W, hV)
                                p0 = p1
                        if Q is not None:
                            _finish_rows(Oi, lb, mb, br)  # O_i /= l_i, L_i = m_i + log(l_i)
                        store(W, hO, Oi, Out)
                        if s == 1:
                            store_vec(W, hl, lb, L)
                        else:
                            store(W, hl, tile(lb, br, 1), Lp)
                        if hQ >= 0:
                            free(W, hQ)
                        for hh in (hO, hl, hm):
                            free(W, hh)
    if Bm is not None:  # split-KV: the combine kernel, after every split has written its partials
        _split_combine(W, (iOp, iLp, iO, iL), Op, Lp, O, L, Rtot, dv, s, Bm)


@njit(cache=True)
def _split_combine(W, ids, Op, Lp, O, L, Rtot, dv, s, Bm):  # noqa: N803
    """Flash-Decoding's combine kernel: per block of Bm rows, load the s logsumexps (one Bm x s tile), L_i =
    logsumexp over the splits, then O_i = sum_k exp(lse_k - L_i) Opart_k, loading the s partial tiles in turn."""
    iOp, iLp, iO, iL = ids
    Ob, Pb, lsb, Lb = buffer(Bm * dv, Op), buffer(Bm * dv, Op), buffer(Bm * s, Op), buffer(Bm, Op)
    for i in range(cdiv(Rtot, Bm)):
        r0 = i * Bm
        br = min(Bm, Rtot - r0)
        lse = tile(lsb, br, s)
        hl = load(W, iLp, Lp, r0, br, 0, s, lse)
        hO = alloc(W, iO, r0, br, 0, dv)
        hL = alloc_vec(W, iL, r0, br)
        Oi = tile(Ob, br, dv)
        if Op is not None:
            Oi[:, :] = 0.0
            for r in range(br):
                mx = -np.inf
                for k in range(s):
                    mx = max(mx, lse[r, k])
                if mx == -np.inf:
                    Lb[r] = -np.inf
                    continue
                t = 0.0
                for k in range(s):
                    t += math.exp(lse[r, k] - mx)
                Lb[r] = mx + math.log(t)
        for k in range(s):
            Pk = tile(Pb, br, dv)
            hP = load(W, iOp, Op, k * Rtot + r0, br, 0, dv, Pk)
            if Op is not None:
                for r in range(br):
                    if Lb[r] == -np.inf:
                        continue
                    w = math.exp(lse[r, k] - Lb[r])
                    for c in range(dv):
                        Oi[r, c] += w * Pk[r, c]
            free(W, hP)
        store(W, hO, Oi, O)
        store_vec(W, hL, Lb, L)
        for hh in (hl, hO, hL):
            free(W, hh)


@njit(cache=True)
def _load_kv(W, pids, K, V, table, tb, Kb, Vb, Kj, Vj, at, p0, p1, dqk, dv, shared, gather):  # noqa: N803
    """Algorithm 1's step 6 for the keys [p0, p1): one page piece (or the contiguous tile), or, ``gather`` (not
    None), the tile gathered from its pages. Returns the handles (hK, hV)."""
    if gather is not None:
        return gather_tile(W, pids, K, V, table, tb, Kb, Vb, at, p0, p1, dqk, dv, shared)
    return load_piece(W, pids, K, V, table, tb, Kj, Vj, at, p0, p1 - p0, dqk, dv, shared)


@njit(cache=True)
def _flash1_forward(  # noqa: N803
    W, ids, Q, K, V, O, l, m, table, B, Hkv, g, G, Nq, Nk, dqk, dv, Br, Bc, P, scale, shared, gather, mk, mp, mt,  # noqa: E741
    skip,
):  # fmt: skip
    iQ, iK, iV, iO, il, im, iS, iT = ids
    pids = (iK, iV, iT)
    R = Nq * (g // G)
    Rtot = B * Hkv * g * Nq
    off = Nk - Nq
    Tc = cdiv(Nk, Bc)
    pages = cdiv(Nk, P) if P > 0 else 0
    # Step 2: initialise O = (0), l = (0), m = (-inf) in HBM, for every row of the problem.
    init_slow(W, iO, Rtot * dv)
    init_slow(W, il, Rtot)
    init_slow(W, im, Rtot)
    if Q is not None:
        O[:, :] = 0.0
        l[:] = 0.0
        m[:] = -np.inf
    Kb, Vb = buffer(Bc * dqk, Q), buffer(Bc * dv, Q)
    Qb, Ob = buffer(Br * dqk, Q), buffer(Br * dv, Q)
    lb, mb, Sb = buffer(Br, Q), buffer(Br, Q), buffer(Br * Bc, Q)
    tb = buffer(1, table)
    for b in range(B):
        for hk in range(Hkv):
            kv = (b * Hkv + hk) * Nk
            at = (kv, b, pages, hk, Hkv, P)
            for h in range(G):
                qbase = ((b * Hkv + hk) * g + h) * Nq
                for j in range(Tc):  # step 5 (paged: each page piece of K_j, V_j is an outer step of its own,
                    c0 = j * Bc  # or, gather, the tile is gathered from its pages in one outer step)
                    c1 = min(c0 + Bc, Nk)
                    p0 = c0
                    while p0 < c1:
                        p1 = c1 if gather is not None else piece_end(p0, c1, P)
                        n = p1 - p0
                        Kj, Vj = tile(Kb, n, dqk), tile(Vb, n, dv)
                        lo, hi = cols_rows(mk, mp, mt, p0, n, Nq, off, R)
                        i0, i1 = block_range(lo, hi, Br)  # row blocks outside the mask's range are not visited
                        if skip:  # policy skip: from the first row block that sees a key of K_j
                            i0 = _first_seen(mk, mp, mt, p0, n, i0, i1, Br, R, Nq, off, True)
                        seen = i0 < i1 or not skip  # skip and no row sees K_j: K_j, V_j are never loaded
                        hK = hV = -1
                        if seen:  # step 6
                            hK, hV = _load_kv(
                                W, pids, K, V, table, tb, Kb, Vb, Kj, Vj, at, p0, p1, dqk, dv, shared, gather
                            )
                        for i in range(i0, i1):  # step 7
                            r0 = i * Br
                            br = min(Br, R - r0)
                            nnz = rows_nnz(mk, mp, mt, r0, br, p0, n, Nq, off)
                            if nnz == 0:  # a zero block is skipped
                                continue
                            Qi, Oi, Sij = tile(Qb, br, dqk), tile(Ob, br, dv), tile(Sb, br, n)
                            hQ = load(W, iQ, Q, qbase + r0, br, 0, dqk, Qi)  # step 8
                            hO = load(W, iO, O, qbase + r0, br, 0, dv, Oi)
                            hl = load_vec(W, il, l, qbase + r0, br, lb)
                            hm = load_vec(W, im, m, qbase + r0, br, mb)
                            hS = alloc(W, iS, r0, br, p0, n)
                            if Q is not None:
                                score_tile(Qi, Kj, Sij, scale)  # step 9
                                if nnz < br * n:  # a partial block: the element mask
                                    rows_apply(Sij, mk, mp, mt, r0, p0, Nq, off)
                                flash1_row_update(Sij, Kj if shared else Vj, Oi, lb[:br], mb[:br])  # steps 10-11
                            store(W, hO, Oi, O)  # step 12
                            store_vec(W, hl, lb, l)  # step 13
                            store_vec(W, hm, mb, m)
                            for hh in (hS, hQ, hO, hl, hm):
                                free(W, hh)
                        if hK >= 0:
                            free(W, hK)
                        if hV >= 0:
                            free(W, hV)
                        p0 = p1


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


class BackwardIds(NamedTuple):
    """The memory model's id of every array the backward names (-1: an array this run does not use)."""

    Q: int
    K: int
    V: int
    O: int
    dO: int
    L: int
    l: int  # noqa: E741 - the paper's l_i
    m: int
    D: int
    dQ: int
    dK: int
    dV: int
    dKpart: int
    dVpart: int
    S: int
    dP: int


class BackwardArrays(NamedTuple):
    """The backward's arrays in slow memory (HBM), rows in the module docstring's order; None each in count-only
    mode. Algorithm 4 reads l, m (L is a 1-word stand-in), FlashAttention-2 reads L and D (l, m stand-ins);
    dKpart, dVpart are per-head GQA's expanded partials (dK, dV themselves otherwise)."""

    Q: object
    K: object
    V: object
    O: object
    dO: object
    L: object
    l: object  # noqa: E741
    m: object
    D: object
    dQ: object
    dK: object
    dV: object
    dKpart: object
    dVpart: object


class BackwardShape(NamedTuple):
    """The schedule's sizes: B batch items, Hkv key/value heads of g query heads each, G thread-block groups per
    key/value head (g: per-head GQA; 1: packed), Nq query rows against Nk keys, widths dqk and dv, tiles Br x Bc,
    the softmax scale tau, ``alg1`` (FlashAttention's Algorithm 4, else FlashAttention-2's Algorithm 2) and the
    mask's policy ``skip`` (load no K_j, V_j that no row sees)."""

    B: int
    Hkv: int
    g: int
    G: int
    Nq: int
    Nk: int
    dqk: int
    dv: int
    Br: int
    Bc: int
    scale: float
    alg1: bool
    skip: bool


class Backward(NamedTuple):
    """All the backward nest reads: ids, slow-memory arrays, sizes and the mask's (kind, params, table)."""

    ids: BackwardIds
    hbm: BackwardArrays
    n: BackwardShape
    mask: tuple


class FastTiles(NamedTuple):
    """Fast memory's buffers for one inner step's tiles (1-D, viewed as tiles by :func:`tile`); None each in
    count-only mode."""

    Q: object
    O: object
    dO: object
    dQ: object
    L: object
    D: object
    l: object  # noqa: E741
    m: object
    K: object
    V: object
    dK: object
    dV: object
    S: object
    dP: object


def part(work, o, n):
    """Words [o, o + n) of a fast-memory buffer; None in count-only mode (``work`` None)."""
    return None if work is None else work[o : o + n]


@overload(part, jit_options={"cache": True})
def _part(work, o, n):
    if isinstance(work, types.NoneType):
        return lambda work, o, n: None
    return lambda work, o, n: work[o : o + n]


@njit(cache=True)
def _fast_tiles(n, like):
    """:class:`FastTiles` for the sizes ``n``, of ``like``'s dtype (None each in count-only mode: ``like`` None)."""
    q, v, r, kq, kv, s = n.Br * n.dqk, n.Br * n.dv, n.Br, n.Bc * n.dqk, n.Bc * n.dv, n.Br * n.Bc
    return FastTiles(
        buffer(q, like), buffer(v, like), buffer(v, like), buffer(q, like),  # Q_i, O_i, dO_i, dQ_i
        buffer(r, like), buffer(r, like), buffer(r, like), buffer(r, like),  # L_i, D_i, l_i, m_i
        buffer(kq, like), buffer(kv, like), buffer(kq, like), buffer(kv, like),  # K_j, V_j, dK~_j, dV~_j
        buffer(s, like), buffer(s, like),  # S_ij, dP_ij
    )  # fmt: skip


@njit(cache=True)
def _zero(a):
    """a = 0 on chip or in HBM (numeric runs; ``a`` None in count-only mode)."""
    if a is not None:
        a[:] = 0.0


@njit(cache=True)
def _probabilities(Sij, Qi, Kj, t, n, mask, r0, c0, br, partial):  # noqa: N803
    """Steps 10-11 on chip (Algorithm 4: 12-14): S_ij = tau Q_i K_j^T, the element mask in a partial block, then
    P_ij in place of S_ij, from L_i (Algorithm 4: from l_i and m_i). Nothing in count-only mode (Sij None)."""
    if Sij is None:
        return
    score_tile(Qi, Kj, Sij, n.scale)  # step 10: S_ij = tau Q_i K_j^T
    if partial:  # Algorithm 4, step 13: a partial block's element mask (-inf)
        mk, mp, mt = mask
        rows_apply(Sij, mk, mp, mt, r0, c0, n.Nq, n.Nk - n.Nq)
    if n.alg1:
        _probabilities_from_stats(Sij, t.m[:br], t.l[:br])  # Algorithm 4, step 14: diag(l_i)^-1 exp(S_ij - m_i)
    else:
        _probabilities_from_stats(Sij, t.L[:br], None)  # step 11: P_ij = exp(S_ij - L_i)


@njit(cache=True)
def _gradients(Pij, dPij, Qi, Oi, dOi, dQi, Kj, Vj, dKj, dVj, D_i, n):  # noqa: N803
    """Steps 12-16 on chip (Algorithm 4: 17-23): dV~_j, dP_ij, dS_ij, dQ_i, dK~_j; Algorithm 4 first recomputes
    D_i = rowsum(dO_i o O_i) (its step 20, on every inner step). Nothing in count-only mode (Pij None)."""
    if Pij is None:
        return
    if n.alg1:
        _rowsum_product(dOi, Oi, D_i)  # Algorithm 4, step 20: D_i, recomputed on every inner step
    _backward_tile(Pij, dPij, Qi, Kj, Vj, dOi, dQi, dKj, dVj, D_i, n.scale)


@njit(cache=True)
def _init_gradients(W, s, dQ):  # noqa: N803
    """Step 3: dQ = (0) in HBM, every query row of every head; Algorithm 4 (step 6) zeroes dK and dV there too (the
    expanded partials under per-head GQA). Counted as initialisation writes."""
    ids, n = s.ids, s.n
    init_slow(W, ids.dQ, n.B * n.Hkv * n.g * n.Nq * n.dqk)
    if n.alg1:
        expand = n.G > 1
        kvw = (n.B * n.Hkv * n.G if expand else n.B * n.Hkv) * n.Nk
        init_slow(W, ids.dKpart if expand else ids.dK, kvw * n.dqk)
        init_slow(W, ids.dVpart if expand else ids.dV, kvw * n.dv)
    if dQ is not None:  # numeric runs: the zeros themselves
        dQ[:] = 0.0


@njit(cache=True, inline="always")  # one nest: inlined into _backward
def _row_block(W, s, t, qbase, r0, br, c0, bc, partial):
    """Steps 9-16 for row block [r0, r0 + br) of the thread block's rows (its query rows start at ``qbase``) against
    the resident K_j, V_j: load the row tiles, recompute P_ij, accumulate dV~_j, dK~_j, write dQ_i back."""
    ids, hbm, n = s.ids, s.hbm, s.n
    q = qbase + r0
    Qi, Oi, dOi, dQi = tile(t.Q, br, n.dqk), tile(t.O, br, n.dv), tile(t.dO, br, n.dv), tile(t.dQ, br, n.dqk)
    Kj, Vj, dKj, dVj = tile(t.K, bc, n.dqk), tile(t.V, bc, n.dv), tile(t.dK, bc, n.dqk), tile(t.dV, bc, n.dv)
    Sij, dPij = tile(t.S, br, bc), tile(t.dP, br, bc)
    hQ = load(W, ids.Q, hbm.Q, q, br, 0, n.dqk, Qi)  # step 9
    if n.alg1:  # Algorithm 4, step 11: Q_i, O_i, dO_i, dQ_i, l_i, m_i; D_i computed on chip
        hO = load(W, ids.O, hbm.O, q, br, 0, n.dv, Oi)
        hdO = load(W, ids.dO, hbm.dO, q, br, 0, n.dv, dOi)
        hdQ = load(W, ids.dQ, hbm.dQ, q, br, 0, n.dqk, dQi)
        h1 = load_vec(W, ids.l, hbm.l, q, br, t.l)
        h2 = load_vec(W, ids.m, hbm.m, q, br, t.m)
    else:  # step 9 without O_i (unused once D exists): dO_i, dQ_i (step 15's read), L_i, D_i
        hO = -1
        hdO = load(W, ids.dO, hbm.dO, q, br, 0, n.dv, dOi)
        hdQ = load(W, ids.dQ, hbm.dQ, q, br, 0, n.dqk, dQi)
        h1 = load_vec(W, ids.L, hbm.L, q, br, t.L)
        h2 = load_vec(W, ids.D, hbm.D, q, br, t.D)
    hS = alloc(W, ids.S, r0, br, c0, bc)  # S_ij, then P_ij in place
    hdP = alloc(W, ids.dP, r0, br, c0, bc)  # dP_ij, then dS_ij in place
    hD = alloc_vec(W, ids.D, q, br) if n.alg1 else -1  # Algorithm 4: D_i on chip
    _probabilities(Sij, Qi, Kj, t, n, s.mask, r0, c0, br, partial)  # steps 10-11
    _gradients(Sij, dPij, Qi, Oi, dOi, dQi, Kj, Vj, dKj, dVj, part(t.D, 0, br), n)  # steps 12-16
    store(W, hdQ, dQi, hbm.dQ)  # step 15: dQ_i back to HBM (Algorithm 4, step 22)
    free(W, hS)
    free(W, hdP)
    if n.alg1:
        free(W, hD)
    free(W, hQ)
    if n.alg1:
        free(W, hO)
    for hh in (hdO, hdQ, h1, h2):
        free(W, hh)


@njit(cache=True, inline="always")  # one nest: inlined into _backward
def _column_block(W, s, t, kv, qbase, dkv, j):
    """Steps 6-18 (Algorithm 4: 8-25), one thread block: K_j, V_j loaded (step 6), dK~_j, dV~_j zeroed on chip
    (step 7), the row blocks the mask leaves (step 8), dK_j, dV_j written once (step 18). ``kv``: the key/value
    head's first key row; ``qbase``: the thread block's first query row; ``dkv``: its first row of dK, dV (of the
    expanded partials under per-head GQA)."""
    ids, hbm, n = s.ids, s.hbm, s.n
    mk, mp, mt = s.mask
    R, off, expand = n.Nq * (n.g // n.G), n.Nk - n.Nq, n.G > 1  # R: N_q rows (per-head) or g N_q (packed)
    c0 = j * n.Bc
    bc = min(n.Bc, n.Nk - c0)
    lo, hi = cols_rows(mk, mp, mt, c0, bc, n.Nq, off, R)
    i0, i1 = block_range(lo, hi, n.Br)  # row blocks outside the mask's range are not visited
    if n.skip:  # policy skip: from the first row block that sees a key of K_j
        i0 = _first_seen(mk, mp, mt, c0, bc, i0, i1, n.Br, R, n.Nq, off, True)
    seen = i0 < i1 or not n.skip  # skip and no row sees K_j: K_j, V_j are never loaded
    if n.alg1 and not seen:  # Algorithm 4: dK_j = dV_j = 0 from step 6 stand
        return
    Kj, Vj, dKj, dVj = tile(t.K, bc, n.dqk), tile(t.V, bc, n.dv), tile(t.dK, bc, n.dqk), tile(t.dV, bc, n.dv)
    hK = hV = -1
    if seen:
        hK = load(W, ids.K, hbm.K, kv + c0, bc, 0, n.dqk, Kj)  # step 6
        hV = load(W, ids.V, hbm.V, kv + c0, bc, 0, n.dv, Vj)
    hdK = alloc(W, ids.dKpart if expand else ids.dK, dkv + c0, bc, 0, n.dqk)  # step 7: dK~_j = dV~_j = 0 on chip
    hdV = alloc(W, ids.dVpart if expand else ids.dV, dkv + c0, bc, 0, n.dv)
    _zero(dKj)
    _zero(dVj)
    for i in range(i0, i1):  # step 8: row blocks (packed: the g heads' rows one after another)
        r0 = i * n.Br
        br = min(n.Br, R - r0)
        nnz = rows_nnz(mk, mp, mt, r0, br, c0, bc, n.Nq, off)
        if nnz == 0:  # no row of the block sees a key of K_j: skipped
            continue
        _row_block(W, s, t, qbase, r0, br, c0, bc, nnz < br * bc)
    store(W, hdK, dKj, hbm.dKpart if expand else hbm.dK)  # step 18: dK_j, dV_j written once
    store(W, hdV, dVj, hbm.dVpart if expand else hbm.dV)
    if seen:
        free(W, hK)
        free(W, hV)
    free(W, hdK)
    free(W, hdV)


@njit(cache=True)
def _backward(W, ids, Q, K, V, O, dO, L, l, m, D, dQ, dK, dV, dKpart, dVpart, n, mask):  # noqa: E741, N803
    """The K/V-outer backward over a problem: FlashAttention-2's Algorithm 2 (``n.alg1`` False: the D pass, P from
    L) or FlashAttention's Algorithm 4 (``n.alg1`` True: dK, dV zero-initialised in HBM, P from l and m, O_i loaded
    and D_i recomputed on every inner step). Step numbers are FlashAttention-2's; Algorithm 4's where they differ.
    Batch items, key/value heads and (per-head GQA) query heads are the outermost loops. The slow-memory arrays are
    arguments of their own, in ``ids``' order (None each in count-only mode), as the memory model's ``call`` and its
    witness take a driver's data; the nest's state is one :class:`Backward` (``n``: :class:`BackwardShape`,
    ``mask``: the mask's kind, params, table)."""
    s = Backward(ids, BackwardArrays(Q, K, V, O, dO, L, l, m, D, dQ, dK, dV, dKpart, dVpart), n, mask)
    B, Hkv, g, G, Nk = n.B, n.Hkv, n.g, n.G, n.Nk  # noqa: N806
    _init_gradients(W, s, dQ)  # step 3 (Algorithm 4: step 6)
    t = _fast_tiles(n, Q)
    if not n.alg1:  # step 4: D = rowsum(dO o O), its own pass over all B H_q N_q rows (flash-attn's preprocess)
        d_pass(W, (ids.dO, ids.O, ids.D), dO, O, D, B * Hkv * g * n.Nq, n.dv, n.Br, t.dO, t.O, t.D)
    for b in range(B):
        for hk in range(Hkv):
            kv = (b * Hkv + hk) * Nk
            for h in range(G):
                qbase = ((b * Hkv + hk) * g + h) * n.Nq
                dkv = ((b * Hkv + hk) * G + h) * Nk if G > 1 else kv  # per-head GQA: this head's partials
                for j in range(cdiv(Nk, n.Bc)):  # step 5: one thread block per column block
                    _column_block(W, s, t, kv, qbase, dkv, j)
    if G > 1:  # the group sum: dK = sum over the g query heads of their expanded partials (and dV)
        sum_group(W, (ids.dKpart, ids.dK), dKpart, dK, B * Hkv, g, Nk, n.dqk, n.Bc, t.K, t.dK)
        sum_group(W, (ids.dVpart, ids.dV), dVpart, dV, B * Hkv, g, Nk, n.dv, n.Bc, t.V, t.dV)


@njit(cache=True)
def sum_group(W, ids, part, out, heads, g, Nk, d, Bc, accb, tb):  # noqa: N803
    """Per key/value head and block of Bc keys: read the g partials (Bc d each) one after another into a resident
    accumulator, write the sum once: reads g, writes 1 words per word of dK (dV)."""
    ip, io = ids
    for hk in range(heads):
        for j in range(cdiv(Nk, Bc)):
            c0 = j * Bc
            bc = min(Bc, Nk - c0)
            acc, t = tile(accb, bc, d), tile(tb, bc, d)
            ha = alloc(W, io, hk * Nk + c0, bc, 0, d)
            if part is not None:
                acc[:, :] = 0.0
            for h in range(g):
                hp = load(W, ip, part, (hk * g + h) * Nk + c0, bc, 0, d, t)
                if part is not None:
                    acc += t
                free(W, hp)
            store(W, ha, acc, out)
            free(W, ha)


def problem_mask(problem, mask=None):
    """The nests' mask arguments (kind, params, table, skip) of a problem: ``mask`` (a TileMask over the whole
    sequence, N_k x N_k, whose last N_q rows are the queries' rows; its policy: skip loads no operand of a block the
    mask empties, paper loads a thread block's outer operand before testing), or the problem's causal field."""
    if mask is None:  # the causal field: no block is tested empty, and split-KV's splits past the diagonal are skipped
        mask = (causal_mask if problem.causal else dense_mask)(problem.N_k, "skip")
    if mask.N != problem.N_k:
        raise ValueError(f"a problem's mask is compiled for N_k = {problem.N_k}, not {mask.N}")
    return mask.args


def _ids(mem, shapes: dict, order: tuple) -> tuple:
    """Register the arrays a run uses (``shapes``, in the paper's order for one head, which a trace keeps); their ids
    in the nest's ``order``, -1 for an array this run does not use (split-KV's partials without splits, ...)."""
    got = dict(zip(shapes, mem.ids(**shapes), strict=True))
    return tuple(got.get(k, -1) for k in order)


def _full(numeric, dtype, shape):
    """An output array poisoned with NaN so an unwritten element shows (None in count-only mode)."""
    return np.full(shape, np.nan, dtype) if numeric else None


def _cast(x, dtype):
    return None if x is None else np.ascontiguousarray(x, dtype=dtype)


def flash2_problem(mem, problem, Q, K, V, table, *, Br, Bc, gqa, splits, mla, combine_rows, scale, dtype=np.float64,
                   mask=None, combine_mem=None):  # noqa: N803  # fmt: skip
    """FlashAttention-2's forward over ``problem`` (module docstring); count-only: Q = K = V = table = None.

    Returns (O, L) with O of shape (B H_q N_q, d_v) in (b, h_q, r) row order (None each in count-only mode).
    ``combine_rows``: the combine step's rows per block (split-KV only); ``combine_mem``: the memory the combine
    kernel runs on, when not ``mem`` (the split kernel's counts alone on ``mem``). Exact counts:
    :func:`iosim.theory.io_model.flash2_problem`.
    """
    p = problem
    G, _, R = p.groups(gqa)
    Rtot = p.B * p.H_q * p.N_q
    numeric = Q is not None
    Q, K, V = (_cast(x, dtype) for x in (Q, K, V))
    O, L = _full(numeric, dtype, (Rtot, p.d_v)), _full(numeric, dtype, Rtot)
    s = int(splits)
    Op = _full(numeric, dtype, (s * Rtot, p.d_v)) if s > 1 else O
    Lp = _full(numeric, dtype, (Rtot, s)) if s > 1 else (np.zeros((1, 1), dtype) if numeric else None)
    rows = kv_rows(p)
    shapes = dict(Q=(Rtot, p.d_qk), K=(rows, p.d_qk), V=(rows, p.d_v), O=(Rtot, p.d_v), L=(Rtot,), m=(R,), S=(R, p.N_k))
    if s > 1:
        shapes.update(Opart=(s * Rtot, p.d_v), Lpart=(Rtot, s))
    if p.page_size:
        shapes["page_table"] = (max(1, p.B * p.pages),)
    ids = _ids(mem, shapes, ("Q", "K", "V", "O", "L", "Opart", "Lpart", "page_table", "m", "S"))
    P = p.page_size or 0
    shared = p.latent and mla == "shared"
    bm = combine_rows if s > 1 and combine_mem is None else None  # None: no combine kernel here (none compiled)
    args = (p.B, p.H_kv, p.g, G, p.N_q, p.N_k, p.d_qk, p.d_v, Br, Bc, s, P, float(scale), shared, bm)
    mem.call(_flash2_forward, ids, Q, K, V, O, L, Op, Lp, table if numeric else None, *args, *problem_mask(p, mask))
    if s > 1 and combine_mem is not None:
        split_combine(combine_mem, Rtot, p.d_v, s, combine_rows, Op, Lp, O, L)
    return O, L


def split_combine(mem, Rtot, dv, s, rows, Op=None, Lp=None, O=None, L=None):  # noqa: N803
    """Split-KV's combine kernel on its own (:func:`_split_combine`) over Rtot rows of s partials Op (s Rtot x d_v)
    and Lp (Rtot x s), in blocks of ``rows``, into O, L (count-only: all None). Exact counts:
    :func:`iosim.theory.io_model.split_combine`."""
    ids = _ids(mem, dict(Opart=(s * Rtot, dv), Lpart=(Rtot, s), O=(Rtot, dv), L=(Rtot,)), ("Opart", "Lpart", "O", "L"))
    mem.call(_split_combine, ids, Op, Lp, O, L, Rtot, dv, s, min(rows, Rtot))


def flash1_problem(mem, problem, Q, K, V, table, *, Br, Bc, gqa, mla, scale, dtype=np.float64, mask=None,
                   gather=False):  # noqa: N803  # fmt: skip
    """FlashAttention Algorithm 1 over ``problem`` (module docstring); count-only: Q = K = V = table = None.

    ``gather`` (a paged cache): each column block is one outer step whose K_j, V_j are gathered from their pages
    (a table word and a load per page piece, one resident tile), in place of one outer step per page piece with its
    own round trip of Q_i, O_i, l_i, m_i. Returns (O, l, m) in (b, h_q, r) row order. Exact counts:
    :func:`iosim.theory.io_model.flash1_problem`."""
    p = problem
    G, _, R = p.groups(gqa)
    Rtot = p.B * p.H_q * p.N_q
    numeric = Q is not None
    Q, K, V = (_cast(x, dtype) for x in (Q, K, V))
    O, l_, m = _full(numeric, dtype, (Rtot, p.d_v)), _full(numeric, dtype, Rtot), _full(numeric, dtype, Rtot)
    rows = kv_rows(p)
    shapes = dict(Q=(Rtot, p.d_qk), K=(rows, p.d_qk), V=(rows, p.d_v), O=(Rtot, p.d_v), l=(Rtot,), m=(Rtot,))
    shapes["S"] = (R, p.N_k)
    if p.page_size:
        shapes["page_table"] = (max(1, p.B * p.pages),)
    ids = _ids(mem, shapes, ("Q", "K", "V", "O", "l", "m", "S", "page_table"))
    P = p.page_size or 0
    shared = p.latent and mla == "shared"
    args = (p.B, p.H_kv, p.g, G, p.N_q, p.N_k, p.d_qk, p.d_v, Br, Bc, P, float(scale), shared, True if gather else None)
    mem.call(_flash1_forward, ids, Q, K, V, O, l_, m, table if numeric else None, *args, *problem_mask(p, mask))
    return O, l_, m


def _backward_call(mem, p, Q, K, V, O, dO, L, l, m, Br, Bc, gqa, scale, dtype, alg1, mask):  # noqa: E741, N803
    """Both backward passes over a problem: the arrays registered and poisoned, :func:`_backward` run on ``mem``
    with the slow-memory arrays in ``ids``' order and the sizes (:class:`BackwardShape`). Returns (dQ, dK, dV)."""
    G, _, R = p.groups(gqa)
    Rtot = p.B * p.H_q * p.N_q
    numeric = Q is not None
    Q, K, V, O, dO = (_cast(x, dtype) for x in (Q, K, V, O, dO))
    unused = np.zeros(1, dtype) if numeric else None  # the other algorithm's row statistics: one type per branch
    L, l, m = (unused if x is None else _cast(x, dtype) for x in (L, l, m))  # noqa: E741
    kvr = p.B * p.H_kv * p.N_k
    expand = G > 1
    parts = p.B * p.H_q * p.N_k
    D, dQ = _full(numeric, dtype, Rtot), _full(numeric, dtype, (Rtot, p.d_qk))
    dK, dV = _full(numeric, dtype, (kvr, p.d_qk)), _full(numeric, dtype, (kvr, p.d_v))
    dKp = _full(numeric, dtype, (parts, p.d_qk)) if expand else dK
    dVp = _full(numeric, dtype, (parts, p.d_v)) if expand else dV
    if alg1 and numeric:  # step 6's zeros: a column block no row sees keeps them
        dKp[:] = 0.0
        dVp[:] = 0.0
    nd, n = (Rtot, p.d_qk), (Rtot,)
    shapes = dict(Q=nd, K=(kvr, p.d_qk), V=(kvr, p.d_v), O=(Rtot, p.d_v), dO=(Rtot, p.d_v))
    shapes.update(dict(l=n, m=n) if alg1 else dict(L=n, D=n))  # the row statistics read (the paper's order)
    shapes.update(dQ=nd, dK=(kvr, p.d_qk), dV=(kvr, p.d_v), S=(R, p.N_k), dP=(R, p.N_k))
    if alg1:
        shapes["D"] = n  # Algorithm 4: D_i on chip only
    if expand:
        shapes.update(dKpart=(parts, p.d_qk), dVpart=(parts, p.d_v))
    ids = BackwardIds(*_ids(mem, shapes, BackwardIds._fields))
    hbm = BackwardArrays(Q, K, V, O, dO, L, l, m, D, dQ, dK, dV, dKp, dVp)
    kind, params, table, skip = problem_mask(p, mask)
    sizes = (p.B, p.H_kv, p.g, G, p.N_q, p.N_k, p.d_qk, p.d_v, Br, Bc)
    shape = BackwardShape(*(int(x) for x in sizes), float(scale), bool(alg1), bool(skip))
    mem.call(_backward, ids, *hbm, shape, (kind, params, table))
    return dQ, dK, dV


def flash2_backward_problem(mem, problem, Q, K, V, O, dO, L, *, Br, Bc, gqa, scale, dtype=np.float64, mask=None):  # noqa: N803
    """FlashAttention-2's backward over ``problem`` (docs/theory.md, "The backward over a problem"); count-only:
    every data array None. K/V outer per (b, key/value head[, query head]); ``per-head`` GQA (g > 1) writes dK, dV
    expanded to H_q heads (dKpart, dVpart) and sums each group afterwards (flash-attn's GQA backward); ``packed``
    loops over the g N_q packed rows of the group with dK_j, dV_j on chip, written once. D = rowsum(dO o O) in a
    pass of its own; dQ_i read-modify-written on every inner step. Returns (dQ, dK, dV) with dQ in (b, h_q, r) and
    dK, dV in (b, h_kv, c) row order. Exact counts: :func:`iosim.theory.io_model.flash2_backward_problem`."""
    return _backward_call(mem, problem, Q, K, V, O, dO, L, None, None, Br, Bc, gqa, scale, dtype, False, mask)


def flash1_backward_problem(mem, problem, Q, K, V, O, dO, l, m, *, Br, Bc, gqa, scale, dtype=np.float64, mask=None):  # noqa: E741, N803
    """FlashAttention's Algorithm 4 over ``problem``: the schedule of :func:`flash2_backward_problem` with
    Algorithm 4's steps: dQ, dK, dV (the expanded partials under per-head GQA) zero-initialised in HBM, P_ij from
    l_i and m_i, O_i loaded and D_i recomputed on every inner step, no D pass. Exact counts:
    :func:`iosim.theory.io_model.flash1_backward_problem`."""
    return _backward_call(mem, problem, Q, K, V, O, dO, None, l, m, Br, Bc, gqa, scale, dtype, True, mask)


# ---------------------------------------------------------------------------------------------------------------
# One head, as the papers write it: the B = H = 1, N_q = N_k case of the nests above (the paper's operand order).
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Head:
    """One head of N x d as the problem drivers read a problem (the fields of :class:`iosim.Problem` they use; the
    algorithms import nothing of iosim's front door): B = H_q = H_kv = 1, N_q = N_k = N, d_qk = d_v = d."""

    N: int
    d: int
    B, H_q, H_kv, g, pages, page_size, latent, causal = 1, 1, 1, 1, 0, None, False, False

    N_q = N_k = property(lambda self: self.N)
    d_qk = d_v = property(lambda self: self.d)

    def groups(self, gqa):  # (G, groups, R): one group of N rows
        return 1, 1, self.N


def _one_head(N, d, causal):  # noqa: N803
    return _Head(N, d), resolve(causal, N)


def flash1_forward(mem, Q, K, V, *, N, d, Br, Bc, scale, causal=False, dtype=np.float64):  # noqa: N803
    """FlashAttention Algorithm 1 (with Algorithm 2's scale and causal mask) on memory ``mem``.

    Count-only mode: pass Q = K = V = None. Returns (O, l, m) in slow memory (None each in count-only mode).
    Reads 2Nd + Tc(2Nd + 2N), writes Tc(Nd + 2N) plus Nd + 2N for initialising O, l, m:
    see :func:`iosim.theory.io_model.flash1_forward`.
    """
    p, mask = _one_head(N, d, causal)
    return flash1_problem(mem, p, Q, K, V, None, Br=Br, Bc=Bc, mla="shared", scale=scale, dtype=dtype, mask=mask,
                          gqa="per-head")  # fmt: skip


def flash2_forward(mem, Q, K, V, *, N, d, Br, Bc, scale, causal=False, dtype=np.float64):  # noqa: N803
    """FlashAttention-2 forward on memory ``mem``. Count-only mode: Q = K = V = None. Returns (O, L).

    Reads Nd + Tr * 2Nd, writes Nd + N: see :func:`iosim.theory.io_model.flash2_forward`.
    """
    p, mask = _one_head(N, d, causal)
    return flash2_problem(mem, p, Q, K, V, None, Br=Br, Bc=Bc, splits=1, mla="shared", combine_rows=1, scale=scale,
                          dtype=dtype, mask=mask, gqa="per-head")  # fmt: skip


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
    p, mask = _one_head(N, d, causal)
    return flash1_backward_problem(mem, p, Q, K, V, O, dO, l, m, Br=Br, Bc=Bc, scale=scale, dtype=dtype, mask=mask,
                                   gqa="per-head")  # fmt: skip


def flash2_backward(mem, Q, K, V, O, dO, L, *, N, d, Br, Bc, scale, causal=False, dtype=np.float64):  # noqa: N803
    """FlashAttention-2 backward (Dao 2023, Algorithm 2) on memory ``mem``.

    Inputs: O and the logsumexp L of the forward. D = rowsum(dO o O) is computed once in its own pass and written
    to HBM (N words); the K/V-outer loop recomputes P_ij = exp(S_ij - L_i) and read-modify-writes dQ_i on every
    inner step. The paper's inner loop also loads O_i; it is unused once D exists and is not loaded here
    (docs/theory.md B2, "dropping it"). Count-only mode: every data array None. Returns (dQ, dK, dV).
    Reads 4Nd + Tc(3Nd + 2N), writes 2Nd + N + Tc Nd plus Nd initialisation of dQ, total 6Nd + N + Tc(4Nd + 2N)
    + Nd: see :func:`iosim.theory.io_model.flash2_backward`.
    """
    p, mask = _one_head(N, d, causal)
    return flash2_backward_problem(mem, p, Q, K, V, O, dO, L, Br=Br, Bc=Bc, scale=scale, dtype=dtype, mask=mask,
                                   gqa="per-head")  # fmt: skip

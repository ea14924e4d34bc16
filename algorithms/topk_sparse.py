"""Sparse attention by top-k indices (DSA, NSA, MoBA) under the two-level memory: each query row attends only to
the keys its indices select, with FlashAttention-2's online softmax over the selected keys.

* **DSA** (DeepSeek-V3.2's sparse attention; FlashMLA's sparse kernels): a lightning indexer picks k key *tokens*
  per query token (block b = 1); the kernels take ``indices[s_q, h_kv, topk]``.
* **NSA** (Yuan et al. 2025, "Native Sparse Attention"): each query token selects k key *blocks* of b keys; the
  g query heads of a GQA group share one selection and the kernel loads it once for all of them (its
  "group-centric data loading").
* **MoBA** (Lu et al. 2025, "Mixture of Block Attention"): each block of queries selects k key blocks.

A *program* is what one thread block of a kernel does: a set of R query rows (of one key/value head) and the union
U of the key blocks they selected. :func:`topk_forward` runs, per program (the paper's step numbers):

1. load the program's query rows Q_i (R x d_qk, in runs of consecutive rows); alloc O_i (R x d_v), L_i (its l_i
   until the end) and m_i (R each); load the index rows the program reads (D rows of k words: its selection);
2. for each selected block j in U (ascending; U leaves out -1 entries and, under causal, a block that starts after
   the position of every row of the program): load K_j (c_j x d_qk, c_j = min(b, N_k - j b)), alloc S_ij
   (R x c_j), load V_j (c_j x d_v; none under MLA's shared latent: V_j is K_j's first d_v columns);
   S_ij = tau Q_i K_j^T, the rows that did not select j and (causal) the keys after a row's position set to -inf,
   FlashAttention-2's online update; free;
3. O_i /= l_i, L_i = m_i + log l_i; store O_i and L_i; free.

The policies differ only in what a program is (:mod:`iosim.masking.topk_sparse` builds them): ``per-query`` one query
row
of one head (R = 1), ``group:g`` g consecutive rows of one head, ``gqa`` the g query heads of a key/value head at
one position. ``gather`` (FlashMLA's packed path) first copies every program's selected K/V rows into a slow-memory
workspace (:func:`topk_gather`: load, store into Kws/Vws), then attends densely over the workspace in tiles of Bc
rows (:func:`workspace_attend`), so the workspace is written once and read once.

**The indexer's own scan** (DSA's lightning indexer, optional; :func:`indexer_scan`), run before the attention on
the same memory: per query token (b, r) and per block of B_n keys (one scoring program each, as
``iosim/kernels/examples/dsa_indexer.py``'s ``index_scores``): load q_I (its H_I d_I words), w (H_I), the block's
indexer keys K_I (c x d_I, c = min(B_n, N_k - j B_n)) and their scales k_scale (c); score s = sum_h w_h
relu(q_I[h] . K_I[s]) k_scale[s] (keys after the token's position: -inf, a score mask); store the c logits. Then
per query token (``top_k``): load its N_k logits, store the k highest as its row of ``indices`` (the array the
attention then reads).

Count-only mode: every data argument None; the same nests run. Exact counts: :func:`iosim.theory.io_model.
topk_sparse`; the compulsory floor: :func:`iosim.theory.bounds.topk_compulsory`.
"""

from __future__ import annotations

import numpy as np
from iosim.algorithms._tiles import buffer, score_tile, tile
from iosim.algorithms.flash import _finish_rows, _online_update
from iosim.algorithms.paged import tile_at
from iosim.memory_model import alloc, alloc_vec, free, load, load_vec, store, store_to, store_vec
from numba import njit, types
from numba.extending import overload


def vec_at(buf, t, e):
    """buf[t:e] of a 1-D fast buffer; None in count-only mode."""
    return None if buf is None else buf[t:e]


@overload(vec_at, jit_options={"cache": True})
def _ol_vec_at(buf, t, e):
    if isinstance(buf, types.NoneType):
        return lambda buf, t, e: None
    return lambda buf, t, e: buf[t:e]


@njit(cache=True)
def _run_end(rows, a, t, n):
    """The end of the run of consecutive slow rows that starts at rows[a + t] (rows a .. a + n - 1)."""
    e = t + 1
    while e < n and rows[a + e] == rows[a + e - 1] + 1:
        e += 1
    return e


@njit(cache=True)
def _load_rows(W, aid, src, rows, a, n, width, buf, hs):  # noqa: N803
    """Load slow rows rows[a .. a + n) of ``aid`` (``width`` columns) into buf's rows 0 .. n, one load per run of
    consecutive rows; the handles in hs. Returns the number of runs."""
    t = 0
    k = 0
    while t < n:
        e = _run_end(rows, a, t, n)
        hs[k] = load(W, aid, src, rows[a + t], e - t, 0, width, tile_at(buf, t, e - t, width))
        k += 1
        t = e
    return k


@njit(cache=True)
def _alloc_rows(W, aid, rows, a, n, width, hs):  # noqa: N803
    """Scratch for the rows rows[a .. a + n) of ``aid`` (a vector when width is 0), one tile per run."""
    t = 0
    k = 0
    while t < n:
        e = _run_end(rows, a, t, n)
        hs[k] = alloc_vec(W, aid, rows[a + t], e - t) if width == 0 else alloc(W, aid, rows[a + t], e - t, 0, width)
        k += 1
        t = e
    return k


@njit(cache=True)
def _store_rows(W, rows, a, n, width, buf, dst, hs):  # noqa: N803
    """Store the run tiles hs (from :func:`_alloc_rows`) from buf's rows to their own regions of ``dst``."""
    t = 0
    k = 0
    while t < n:
        e = _run_end(rows, a, t, n)
        store(W, hs[k], tile_at(buf, t, e - t, width), dst)
        k += 1
        t = e


@njit(cache=True)
def _store_vec_rows(W, rows, a, n, buf, dst, hs):  # noqa: N803
    """:func:`_store_rows` for a vector (L_i)."""
    t = 0
    k = 0
    while t < n:
        e = _run_end(rows, a, t, n)
        store_vec(W, hs[k], vec_at(buf, t, e), dst)
        k += 1
        t = e


@njit(cache=True)
def _free_n(W, hs, n):
    for k in range(n):
        free(W, hs[k])


@njit(cache=True)
def _mask_unselected(S, Ib, rsel, rpos, a, kk, j, c0):  # noqa: N803
    """-inf in S_ij (keys c0 ..) on the rows whose selection (row rsel[a + r] of the resident index tile Ib) does not
    hold block j, and on the keys after row r's position rpos[a + r] (causal: a score mask, the block is loaded)."""
    for r in range(S.shape[0]):
        row = rsel[a + r]
        hit = False
        for t in range(kk):
            if Ib[row * kk + t] == j:
                hit = True
        for c in range(S.shape[1]):
            if not hit or c0 + c > rpos[a + r]:
                S[r, c] = -np.inf


@njit(cache=True)
def _mask_after(S, rpos, a, wkey, t0):  # noqa: N803
    """-inf in a workspace tile S (workspace rows t0 ..) on the keys wkey[t0 + c] after row r's position."""
    for r in range(S.shape[0]):
        for c in range(S.shape[1]):
            if wkey[t0 + c] > rpos[a + r]:
                S[r, c] = -np.inf


@njit(cache=True)
def _open_program(W, ids, Q, Idx, plan, p, dims, Qb, Ib, hq, ho, hl, hi):  # noqa: N803
    """Step 1: Q_i, O_i, L_i (l_i), m_i, and the program's index rows. Returns (R, runs of Q, of O, of L, of the
    index rows, handle of m_i)."""
    iQ, iO, iL, iI, im = ids[0], ids[3], ids[4], ids[5], ids[6]
    rows, rptr, irows, iptr = plan[0], plan[1], plan[2], plan[3]
    dqk, dv, kk = dims[0], dims[1], dims[2]
    a, R = rptr[p], rptr[p + 1] - rptr[p]
    nq = _load_rows(W, iQ, Q, rows, a, R, dqk, Qb, hq)
    no = _alloc_rows(W, iO, rows, a, R, dv, ho)
    nl = _alloc_rows(W, iL, rows, a, R, 0, hl)
    hm = alloc_vec(W, im, 0, R)
    ni = 0 if kk == 0 else _load_rows(W, iI, Idx, irows, iptr[p], iptr[p + 1] - iptr[p], kk, Ib, hi)
    return R, nq, no, nl, ni, hm


@njit(cache=True)
def _close_program(W, O, L, plan, p, dims, Ob, lb, hq, ho, hl, hi, nq, no, nl, ni, hm):  # noqa: N803
    """Step 3: store O_i and L_i, free the program's tiles."""
    rows, rptr = plan[0], plan[1]
    a, R = rptr[p], rptr[p + 1] - rptr[p]
    _store_rows(W, rows, a, R, dims[1], Ob, O, ho)
    _store_vec_rows(W, rows, a, R, lb, L, hl)
    _free_n(W, hi, ni)
    free(W, hm)
    _free_n(W, hl, nl)
    _free_n(W, ho, no)
    _free_n(W, hq, nq)


@njit(cache=True)
def topk_forward(W, ids, Q, K, V, O, L, Idx, plan, dims, scale, shared, hq, ho, hl, hi):  # noqa: N803
    """The schedule of the module docstring (policies per-query, group:g, gqa). ids = (Q, K, V, O, L, indices, m,
    S); plan = (rows, rptr, irows, iptr, rsel, ublk, uptr, kvb, rpos): per program p its query rows rows[rptr[p] ..
    rptr[p + 1]], its index rows irows[iptr[p] ..], each query row's place in them rsel, its union of blocks
    ublk[uptr[p] ..] (-1 entries and, under causal, blocks after all its rows left out), its key/value head's first
    K/V row kvb[p] and each query row's position rpos (causal: r + N_k - N_q; else N_k); dims = (d_qk, d_v, k,
    b, N_k, R_max); hq, ho, hl, hi: handle slots (R_max each)."""
    iK, iV, iS = ids[1], ids[2], ids[7]
    rsel, ublk, uptr, kvb = plan[4], plan[5], plan[6], plan[7]
    dqk, dv, kk, b, Nk, Rmax = dims[0], dims[1], dims[2], dims[3], dims[4], dims[5]
    Qb, Ob, lb, mb = buffer(Rmax * dqk, Q), buffer(Rmax * dv, Q), buffer(Rmax, Q), buffer(Rmax, Q)
    Kb, Vb, Sb, Ib = buffer(b * dqk, Q), buffer(b * dv, Q), buffer(Rmax * b, Q), buffer(Rmax * kk, Idx)
    for p in range(uptr.size - 1):  # one program (thread block) after another
        R, nq, no, nl, ni, hm = _open_program(W, ids, Q, Idx, plan, p, dims, Qb, Ib, hq, ho, hl, hi)  # 1.
        Qi, Oi = tile(Qb, R, dqk), tile(Ob, R, dv)
        if Q is not None:
            Oi[:, :] = 0.0
            lb[:R] = 0.0
            mb[:R] = -np.inf
        for u in range(uptr[p], uptr[p + 1]):  # 2. the union of the program's selected blocks
            j = ublk[u]
            c0 = j * b
            c = min(b, Nk - c0)
            Kj, Vj, Sij = tile(Kb, c, dqk), tile(Vb, c, dv), tile(Sb, R, c)
            hK = load(W, iK, K, kvb[p] + c0, c, 0, dqk, Kj)
            hS = alloc(W, iS, 0, R, 0, c)
            hV = -1 if shared else load(W, iV, V, kvb[p] + c0, c, 0, dv, Vj)
            if Q is not None:
                score_tile(Qi, Kj, Sij, scale)  # S_ij = tau Q_i K_j^T
                _mask_unselected(Sij, Ib, rsel, plan[8], plan[1][p], kk, j, c0)
                _online_update(Sij, Kj if shared else Vj, Oi, lb[:R], mb[:R])
            if hV >= 0:
                free(W, hV)
            free(W, hS)
            free(W, hK)
        if Q is not None:
            _finish_rows(Oi, lb, mb, R)  # 3. O_i /= l_i, L_i = m_i + log l_i
        _close_program(W, O, L, plan, p, dims, Ob, lb, hq, ho, hl, hi, nq, no, nl, ni, hm)


@njit(cache=True)
def topk_gather(W, ids, K, V, Kws, Vws, Idx, plan, wptr, dims, shared, hi):  # noqa: N803
    """FlashMLA's packed path, first kernel: per program, load its index rows, then copy each selected block's K
    (and V) rows into the workspace Kws (Vws) at rows wptr[p] on: a load and a store of c_j rows each. ids = (K, V,
    Kws, Vws, indices)."""
    iK, iV, iKw, iVw, iI = ids[0], ids[1], ids[2], ids[3], ids[4]
    irows, iptr, ublk, uptr, kvb = plan[2], plan[3], plan[5], plan[6], plan[7]
    dqk, dv, kk, b, Nk = dims[0], dims[1], dims[2], dims[3], dims[4]
    Kb, Vb, Ib = buffer(b * dqk, K), buffer(b * dv, K), buffer(dims[5] * kk, Idx)
    for p in range(uptr.size - 1):
        ni = _load_rows(W, iI, Idx, irows, iptr[p], iptr[p + 1] - iptr[p], kk, Ib, hi)
        w = wptr[p]
        for u in range(uptr[p], uptr[p + 1]):
            c0 = ublk[u] * b
            c = min(b, Nk - c0)
            Kj = tile(Kb, c, dqk)
            hK = load(W, iK, K, kvb[p] + c0, c, 0, dqk, Kj)
            store_to(W, hK, Kj, iKw, Kws, w, 0)  # the gathered rows, packed
            free(W, hK)
            if not shared:
                Vj = tile(Vb, c, dv)
                hV = load(W, iV, V, kvb[p] + c0, c, 0, dv, Vj)
                store_to(W, hV, Vj, iVw, Vws, w, 0)
                free(W, hV)
            w += c
        _free_n(W, hi, ni)


@njit(cache=True)
def workspace_attend(W, ids, Q, Kws, Vws, O, L, plan, wptr, wkey, dims, Bc, scale, shared, hq, ho, hl, hi):  # noqa: N803
    """FlashMLA's packed path, second kernel: per program, FlashAttention-2 over its wptr[p + 1] - wptr[p] packed
    workspace rows in tiles of Bc (every row of the program selected all of them: no index reads; under causal the
    keys wkey[t] after a row's position plan[8] are masked). ids = (Q, Kws, Vws, O, L, -, m, S)."""
    iKw, iVw, iS = ids[1], ids[2], ids[7]
    dqk, dv, Rmax = dims[0], dims[1], dims[5]
    Qb, Ob, lb, mb = buffer(Rmax * dqk, Q), buffer(Rmax * dv, Q), buffer(Rmax, Q), buffer(Rmax, Q)
    Kb, Vb, Sb = buffer(Bc * dqk, Q), buffer(Bc * dv, Q), buffer(Rmax * Bc, Q)
    for p in range(wptr.size - 1):
        R, nq, no, nl, ni, hm = _open_program(W, ids, Q, None, plan, p, (dqk, dv, 0), Qb, None, hq, ho, hl, hi)
        Qi, Oi = tile(Qb, R, dqk), tile(Ob, R, dv)
        if Q is not None:
            Oi[:, :] = 0.0
            lb[:R] = 0.0
            mb[:R] = -np.inf
        for t0 in range(wptr[p], wptr[p + 1], Bc):
            n = min(Bc, wptr[p + 1] - t0)
            Kj, Vj, Sij = tile(Kb, n, dqk), tile(Vb, n, dv), tile(Sb, R, n)
            hK = load(W, iKw, Kws, t0, n, 0, dqk, Kj)
            hS = alloc(W, iS, 0, R, 0, n)
            hV = -1 if shared else load(W, iVw, Vws, t0, n, 0, dv, Vj)
            if Q is not None:
                score_tile(Qi, Kj, Sij, scale)
                _mask_after(Sij, plan[8], plan[1][p], wkey, t0)
                _online_update(Sij, Kj if shared else Vj, Oi, lb[:R], mb[:R])
            if hV >= 0:
                free(W, hV)
            free(W, hS)
            free(W, hK)
        if Q is not None:
            _finish_rows(Oi, lb, mb, R)
        _close_program(W, O, L, plan, p, (dqk, dv), Ob, lb, hq, ho, hl, hi, nq, no, nl, ni, hm)


@njit(cache=True)
def _score_block(q, wv, Kj, ks, out, H, d, c, c0, pos):  # noqa: N803
    """out[0, s] = sum_h w_h relu(q_h . K_s) ks_s for the c keys c0 .. of a block; -inf after position ``pos``."""
    for s in range(c):
        acc = 0.0
        for h in range(H):
            dot = 0.0
            for e in range(d):
                dot += q[h * d + e] * Kj[s, e]
            if dot > 0.0:
                acc += wv[h] * dot
        out[0, s] = acc * ks[s] if c0 + s <= pos else -np.inf


@njit(cache=True)
def _index_scores(W, ids, Qd, Wd, KI, KS, Lg, dims, pos):  # noqa: N803
    """Scoring: one program per (query token, block of B_n keys): load q_I, w, K_I's block and its scales, store the
    block's logits (the module docstring)."""
    iq, iw, ik, isc, il = ids[0], ids[1], ids[2], ids[3], ids[4]
    B, Nq, Nk, H, d, Bn = dims[0], dims[1], dims[2], dims[3], dims[4], dims[5]
    Qb, Wb, Kb, Sb, Lb = buffer(H * d, Qd), buffer(H, Qd), buffer(Bn * d, Qd), buffer(Bn, Qd), buffer(Bn, Qd)
    for b in range(B):
        for r in range(Nq):
            row = b * Nq + r
            for c0 in range(0, Nk, Bn):
                c = min(Bn, Nk - c0)
                hq = load(W, iq, Qd, row, 1, 0, H * d, tile(Qb, 1, H * d))
                hw = load(W, iw, Wd, row, 1, 0, H, tile(Wb, 1, H))
                hk = load(W, ik, KI, b * Nk + c0, c, 0, d, tile(Kb, c, d))
                hs = load_vec(W, isc, KS, b * Nk + c0, c, vec_at(Sb, 0, c))
                hl = alloc(W, il, row, 1, c0, c)
                if Qd is not None:
                    _score_block(Qb, Wb, tile(Kb, c, d), Sb, tile(Lb, 1, c), H, d, c, c0, pos[r])
                store(W, hl, tile(Lb, 1, c), Lg)
                free(W, hl)
                free(W, hs)
                free(W, hk)
                free(W, hw)
                free(W, hq)


@njit(cache=True)
def _top_k(W, ids, Lg, Sel, dims):  # noqa: N803
    """Selection: one program per query token: load its N_k logits, store the k highest (ties: the lower key first)
    as its row of ``indices``."""
    il, ii = ids[4], ids[5]
    B, Nq, Nk, kk = dims[0], dims[1], dims[2], dims[6]
    Lb, Ib = buffer(Nk, Lg), buffer(kk, Sel)
    for row in range(B * Nq):
        hl = load(W, il, Lg, row, 1, 0, Nk, tile(Lb, 1, Nk))
        hi = alloc(W, ii, row, 1, 0, kk)
        if Lg is not None:
            order = np.argsort(-Lb, kind="mergesort")
            for t in range(kk):
                Ib[t] = order[t]
        store(W, hi, tile(Ib, 1, kk), Sel)
        free(W, hi)
        free(W, hl)


@njit(cache=True)
def indexer_scan(W, ids, Qd, Wd, KI, KS, Lg, Sel, dims, pos):  # noqa: N803
    """DSA's lightning indexer (the module docstring): scoring, then top-k. ids = (q_I, w, K_I, k_scale, logits,
    indices); data q_I (B N_q, H_I d_I), w (B N_q, H_I), K_I (B N_k, d_I), k_scale (B N_k), logits (B N_q, N_k), the
    selection written (B N_q, k); dims = (B, N_q, N_k, H_I, d_I, B_n, k); pos: each query row's position."""
    _index_scores(W, ids, Qd, Wd, KI, KS, Lg, dims, pos)
    _top_k(W, ids, Lg, Sel, dims)

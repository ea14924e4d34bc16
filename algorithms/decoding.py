"""FlashAttention over a whole problem: batch and heads, GQA / MQA, N_q != N_k, split-KV, paged KV, MLA.

The drivers here run FlashAttention-2's forward (:func:`flash2_problem`, Q outer) and FlashAttention's Algorithm 1
(:func:`flash1_problem`, K/V outer) on a :class:`iosim.problem.Problem`: B batch items, H_q query heads sharing
H_kv key/value heads (g = H_q / H_kv), N_q query rows against N_k keys (decoding: N_q = 1; chunked prefill:
N_q < N_k; causal aligned bottom-right, row r sees key c <= r + N_k - N_q), widths d_qk and d_v. The loops over
batch and heads are part of the schedule, outermost, and what sits inside them decides what is shared:

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
* **Paged KV** (vLLM): K and V live in pages of P tokens located through a page table (one int32 entry per page
  of a sequence; pages are shared by the key/value heads of a batch item, as vLLM's cache is). A key tile is
  processed page piece by page piece: for each piece of the B_c-key grid cut at page boundaries the kernel reads
  its page-table entry (one word), loads the piece of K (and V) from the page, and updates the row statistics
  (the same online softmax over pieces). A tile inside one page is one piece; a tile straddling pages costs one
  load (and one table read) per page piece. flash1 (K/V outer) runs each piece as an outer step of its own, with
  its own round trip of Q_i, O_i, l_i, m_i, or (``gather``) gathers the whole tile from its pages first and runs
  the row loop once per column block, paying only the table words over the contiguous cache.
* **Masks** (:mod:`iosim.algorithms.tile_masks`, "A problem's rows"): a mask covers the whole sequence, N_k x N_k,
  and query row q is its row q + N_k - N_q (the causal field is the causal mask so aligned). A tile the mask
  empties is skipped with one ``continue``; a partial tile gets the element mask. The empty-block policy decides a
  thread block's outer operand (flash2: Q_i; flash1 and the backward: K_j, V_j): ``skip`` (the default over a
  problem, as the kernels) loads it at the block's first nonempty tile, ``paper`` before the first test.
* **MLA** (DeepSeek-V2/V3, absorbed form): the cache is one latent per token, K = [c_KV, k_rope] (d_qk wide) and
  V = c_KV, its first d_v columns. ``shared`` (FlashMLA, ``Share_KV``): V_j is read from the resident K_j tile,
  no V load and no V tile in fast memory. ``naive``: V_j is loaded separately (the latent's first d_v columns a
  second time, counted as array V).

Heads and batch items with the same shape are independent copies of one schedule; the drivers still run every
one of them (a count-only step costs nanoseconds, so a decoding batch of 2,048 heads x T_c tiles is a few
milliseconds), which keeps the peak, the counts and the thread-block count literal. Slow-memory layout: Q, O, L
rows in (b, h_q, r) order, (b, h_kv, g, r) = (b, h_q, r) since h_q = h_kv g + (its index in the group); K, V rows
in (b, h_kv, c) order, or paged: the rows of physical page p for key/value head h_kv are
[(p H_kv + h_kv) P, ... + P).

Exact counts: :func:`iosim.theory.io_model.flash2_problem` and :func:`iosim.theory.io_model.flash1_problem`.
On one head with N_q = N_k these drivers count what the paper's drivers of :mod:`iosim.algorithms.flash` count,
word for word and in peak, under every mask and both policies (tests/test_problems*.py); those stay as the papers
write them, and they compile in less time (the first run of ``iosim compare`` compiles them, not these).
Working set of an inner step (R_i rows, a piece of n keys): Q_i (R_i d_qk) + O_i (R_i d_v) + l_i, m_i (2 R_i)
+ K piece (n d_qk) + V piece (n d_v; 0 under MLA shared) + S (R_i n); the page-table word is freed before S.
"""

from __future__ import annotations

import math

import numpy as np
from iosim.algorithms._tiles import buffer, cdiv, exp_nonpos, score_tile, tile
from iosim.algorithms.flash import _backward_tile, _probabilities_from_stats, _rowsum_product, d_pass, flash1_row_update
from iosim.algorithms.tile_masks import block_range, causal_mask, cols_rows, dense_mask, rows_apply, rows_cols, rows_nnz
from iosim.memory_model import alloc, alloc_vec, free, init_slow, load, load_vec, store, store_vec
from numba import njit, types
from numba.extending import overload


@njit(cache=True)
def piece_end(p0, c1, P):  # noqa: N803
    """The end of the page piece that starts at key p0 of a tile ending at c1 (P = 0: contiguous, one piece)."""
    return c1 if P == 0 else min(c1, (p0 // P + 1) * P)


def _page_of(tb, logical):
    """The physical page of a piece: the page-table entry just loaded (numeric run), or, in a count-only run where
    nothing is copied, the logical page (the region it names has the same shape, so the counts are the same)."""
    return logical if tb is None else tb[0]


@overload(_page_of, jit_options={"cache": True})
def _ol_page_of(tb, logical):
    if isinstance(tb, types.NoneType):
        return lambda tb, logical: logical
    return lambda tb, logical: tb[0]


def tile_at(buf, r0, r, c):
    """Rows r0 : r0 + r of the r x c tiles at the start of a 1-D buffer (a piece of a gathered tile); None in
    count-only mode."""
    return None if buf is None else buf[r0 * c : (r0 + r) * c].reshape(r, c)


@overload(tile_at, jit_options={"cache": True})
def _ol_tile_at(buf, r0, r, c):
    if isinstance(buf, types.NoneType):
        return lambda buf, r0, r, c: None
    return lambda buf, r0, r, c: buf[r0 * c : (r0 + r) * c].reshape(r, c)


@njit(cache=True)
def _online_update(S, Vs, Oi, l_i, m_i):
    """FlashAttention-2's on-chip step with explicit loops: P~ = exp(S - m_new) in place, l_i, m_i, O_i += P~ V.
    ``Vs`` may be wider than O_i (MLA shared: the resident K tile, whose first d_v columns are V)."""
    br, bc = S.shape
    dv = Oi.shape[1]
    for r in range(br):
        S_r = S[r]
        m_tilde = -np.inf
        for c in range(bc):
            m_tilde = max(m_tilde, S_r[c])
        m_new = max(m_i[r], m_tilde)
        if m_new == -np.inf:
            continue
        alpha = math.exp(m_i[r] - m_new)
        s = 0.0
        for k in range(dv):
            Oi[r, k] *= alpha
        for c in range(bc):
            p = exp_nonpos(S_r[c] - m_new)
            s += p
            if p != 0.0:
                for k in range(dv):
                    Oi[r, k] += p * Vs[c, k]
        l_i[r] = alpha * l_i[r] + s
        m_i[r] = m_new


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


@njit(cache=True, inline="always")
def _load_piece(W, ids, K, V, table, tb, Kj, Vj, at, p0, n, dqk, dv, shared):  # noqa: N803
    """Algorithm 1's step 6 for a page piece: its page-table entry (paged), then K_j and V_j (none under MLA
    shared) from the piece's rows; ``at`` = (the head's first K/V row, batch item, pages per item, key/value head,
    H_kv, P). Returns the handles (hK, hV)."""
    iK, iV, iT = ids
    kv, b, pages, hk, Hkv, P = at
    row = kv + p0
    if P > 0:  # the page's table entry, then the piece from its page
        hT = load_vec(W, iT, table, b * pages + p0 // P, 1, tb)
        row = (_page_of(tb, b * pages + p0 // P) * Hkv + hk) * P + p0 % P
    hK = load(W, iK, K, row, n, 0, dqk, Kj)
    hV = -1 if shared else load(W, iV, V, row, n, 0, dv, Vj)
    if P > 0:
        free(W, hT)
    return hK, hV


@njit(cache=True, inline="always")
def _gather_tile(W, ids, K, V, table, tb, Kb, Vb, at, c0, c1, dqk, dv, shared):  # noqa: N803
    """A paged K/V-outer step that gathers the whole tile [c0, c1) from its pages (a kernel that looks each key's
    page up and copies it into one shared-memory tile): every page piece's table entry (one word) and its rows of
    K and V are loaded (:func:`_load_piece`), and the pieces are merged into one resident tile as they arrive
    (their handles freed, one handle of the rows so far taken: the same resident words). Returns (hK, hV)."""
    iK, iV, _ = ids
    hK = hV = -1
    p0 = c0
    while p0 < c1:
        p1 = piece_end(p0, c1, at[5])
        n = p1 - p0
        Kp, Vp = tile_at(Kb, p0 - c0, n, dqk), tile_at(Vb, p0 - c0, n, dv)
        hk, hv = _load_piece(W, ids, K, V, table, tb, Kp, Vp, at, p0, n, dqk, dv, shared)
        if hK < 0:  # the first piece is the tile so far
            hK, hV = hk, hv
        else:  # merged: the rows so far and this piece are one tile of p1 - c0 rows
            free(W, hK)
            free(W, hk)
            hK = alloc(W, iK, 0, p1 - c0, 0, dqk)
            if not shared:
                free(W, hV)
                free(W, hv)
                hV = alloc(W, iV, 0, p1 - c0, 0, dv)
        p0 = p1
    return hK, hV


@njit(cache=True)
def _flash2_problem(  # noqa: N803
    W, ids, Q, K, V, O, L, Op, Lp, table, B, Hkv, g, G, Nq, Nk, dqk, dv, Br, Bc, s, P, scale, shared, Bm, mk, mp, mt,
    skip,
):  # fmt: skip
    iQ, iK, iV, iO, iL, im, iS, iOp, iLp, iT = ids
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
                for i in range(Tr):  # row blocks of the thread block's R rows
                    r0 = i * Br
                    br = min(Br, R - r0)
                    lo, hi = rows_cols(mk, mp, mt, r0, br, Nq, off, Nk)
                    j_lo, j_hi = block_range(lo, hi, Bc)  # column blocks outside the mask's range are not visited
                    for k in range(s):  # one thread block per (row block, split)
                        j0, j1 = max(j_lo, k * per_split), min(j_hi, (k + 1) * per_split)
                        out = qbase + r0 if s == 1 else k * Rtot + qbase + r0
                        Qi, Oi = tile(Qb, br, dqk), tile(Ob, br, dv)
                        hO = alloc(W, iO if s == 1 else iOp, out, br, 0, dv)  # on-chip O_i = 0
                        hl = alloc_vec(W, iL, out, br) if s == 1 else alloc(W, iLp, qbase + r0, br, k, 1)
                        hm = alloc_vec(W, im, r0, br)
                        hQ = -1  # skip: Q_i loaded at the block's first nonempty tile (none: O = 0, lse = -inf)
                        if not skip and k * per_split < Tc:  # paper: Q_i loaded before the mask is tested
                            hQ = load(W, iQ, Q, qbase + r0, br, 0, dqk, Qi)
                        if Q is not None:
                            Oi[:, :] = 0.0
                            lb[:br] = 0.0
                            mb[:br] = -np.inf
                        for j in range(j0, j1):
                            c0 = j * Bc
                            c1 = min(c0 + Bc, Nk)
                            nnz = rows_nnz(mk, mp, mt, r0, br, c0, c1 - c0, Nq, off)
                            if nnz == 0:  # a zero block is skipped
                                continue
                            if hQ < 0:
                                hQ = load(W, iQ, Q, qbase + r0, br, 0, dqk, Qi)
                            p0 = c0
                            while p0 < c1:  # the tile's page pieces (one piece when contiguous)
                                p1 = piece_end(p0, c1, P)
                                n = p1 - p0
                                Kj, Vj = tile(Kb, n, dqk), tile(Vb, n, dv)  # the piece (paged: its table entry first)
                                hK, hV = _load_piece(W, pids, K, V, table, tb, Kj, Vj, at, p0, n, dqk, dv, shared)
                                Sij = tile(Sb, br, n)
                                hS = alloc(W, iS, r0, br, p0, n)
                                if Q is not None:
                                    score_tile(Qi, Kj, Sij, scale)
                                    if nnz < br * (c1 - c0):  # a partial block: the element mask
                                        rows_apply(Sij, mk, mp, mt, r0, p0, Nq, off)
                                    _online_update(Sij, Kj if shared else Vj, Oi, lb[:br], mb[:br])
                                free(W, hS)
                                free(W, hK)
                                if not shared:
                                    free(W, hV)
                                p0 = p1
                        if Q is not None:
                            _finish_rows(Oi, lb, mb, br)
                        store(W, hO, Oi, Out)
                        if s == 1:
                            store_vec(W, hl, lb, L)
                        else:
                            store(W, hl, tile(lb, br, 1), Lp)
                        if hQ >= 0:
                            free(W, hQ)
                        for hh in (hO, hl, hm):
                            free(W, hh)
    if s > 1:  # the combine kernel, after every split has written its partials
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
def _flash1_problem(  # noqa: N803
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
                        p1 = c1 if gather else piece_end(p0, c1, P)
                        n = p1 - p0
                        Kj, Vj = tile(Kb, n, dqk), tile(Vb, n, dv)
                        hK = hV = -1  # paper: K_j, V_j loaded first (step 6); skip: at the first row block that
                        lo, hi = cols_rows(mk, mp, mt, p0, n, Nq, off, R)  # sees one of their keys
                        i0, i1 = block_range(lo, hi, Br)
                        if not skip:
                            if gather:
                                hK, hV = _gather_tile(W, pids, K, V, table, tb, Kb, Vb, at, p0, p1, dqk, dv, shared)
                            else:
                                hK, hV = _load_piece(W, pids, K, V, table, tb, Kj, Vj, at, p0, n, dqk, dv, shared)
                        for i in range(i0, i1):  # step 7
                            r0 = i * Br
                            br = min(Br, R - r0)
                            nnz = rows_nnz(mk, mp, mt, r0, br, p0, n, Nq, off)
                            if nnz == 0:  # a zero block is skipped
                                continue
                            if hK < 0 and gather:
                                hK, hV = _gather_tile(W, pids, K, V, table, tb, Kb, Vb, at, p0, p1, dqk, dv, shared)
                            elif hK < 0:
                                hK, hV = _load_piece(W, pids, K, V, table, tb, Kj, Vj, at, p0, n, dqk, dv, shared)
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


def kv_rows(problem) -> int:
    """Rows of the K (and V) slow arrays: B H_kv N_k, or paged: every page of every batch item, P rows per head."""
    p = problem
    if p.page_size is None:
        return p.B * p.H_kv * p.N_k
    return p.B * p.pages * p.H_kv * p.page_size


def problem_mask(problem, mask=None):
    """The driver's mask arguments (kind, params, table, skip) of a problem: ``mask`` (a TileMask over the whole
    sequence, N_k x N_k, whose last N_q rows are the queries' rows; its policy: skip loads no operand of a block the
    mask empties, paper loads a thread block's outer operand before testing), or the problem's causal field."""
    if mask is None:  # the causal field: no block is tested empty, and split-KV's splits past the diagonal are skipped
        mask = (causal_mask if problem.causal else dense_mask)(problem.N_k, "skip")
    if mask.N != problem.N_k:
        raise ValueError(f"a problem's mask is compiled for N_k = {problem.N_k}, not {mask.N}")
    return mask.args


def flash2_problem(mem, problem, Q, K, V, table, *, Br, Bc, gqa, splits, mla, combine_rows, scale, dtype=np.float64,
                   mask=None):  # noqa: N803  # fmt: skip
    """FlashAttention-2's forward over ``problem`` (module docstring); count-only: Q = K = V = table = None.

    Returns (O, L) with O of shape (B H_q N_q, d_v) in (b, h_q, r) row order (None each in count-only mode).
    ``combine_rows``: the combine step's rows per block (split-KV only). Exact counts:
    :func:`iosim.theory.io_model.flash2_problem`.
    """
    p = problem
    G, _, R = p.groups(gqa)
    Rtot = p.B * p.H_q * p.N_q
    numeric = Q is not None
    O = np.full((Rtot, p.d_v), np.nan, dtype) if numeric else None
    L = np.full(Rtot, np.nan, dtype) if numeric else None
    s = int(splits)
    Op = np.full((s * Rtot, p.d_v), np.nan, dtype) if numeric and s > 1 else (O if numeric else None)
    Lp = np.full((Rtot, s), np.nan, dtype) if numeric and s > 1 else (np.zeros((1, 1), dtype) if numeric else None)
    rows = kv_rows(p)
    ids = mem.ids(
        Q=(Rtot, p.d_qk), K=(rows, p.d_qk), V=(rows, p.d_v), O=(Rtot, p.d_v), L=(Rtot,), m=(R,), S=(R, p.N_k),
        Opart=(s * Rtot, p.d_v), Lpart=(Rtot, s), page_table=(max(1, p.B * p.pages),),
    )  # fmt: skip
    P = p.page_size or 0
    shared = p.latent and mla == "shared"
    args = (p.B, p.H_kv, p.g, G, p.N_q, p.N_k, p.d_qk, p.d_v, Br, Bc, s, P, float(scale), shared, combine_rows)
    mem.call(_flash2_problem, ids, Q, K, V, O, L, Op, Lp, table if numeric else None, *args, *problem_mask(p, mask))
    return O, L


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
    O = np.full((Rtot, p.d_v), np.nan, dtype) if numeric else None
    l_ = np.full(Rtot, np.nan, dtype) if numeric else None
    m = np.full(Rtot, np.nan, dtype) if numeric else None
    rows = kv_rows(p)
    ids = mem.ids(
        Q=(Rtot, p.d_qk), K=(rows, p.d_qk), V=(rows, p.d_v), O=(Rtot, p.d_v), l=(Rtot,), m=(Rtot,), S=(R, p.N_k),
        page_table=(max(1, p.B * p.pages),),
    )  # fmt: skip
    P = p.page_size or 0
    shared = p.latent and mla == "shared"
    args = (p.B, p.H_kv, p.g, G, p.N_q, p.N_k, p.d_qk, p.d_v, Br, Bc, P, float(scale), shared, bool(gather))
    mem.call(_flash1_problem, ids, Q, K, V, O, l_, m, table if numeric else None, *args, *problem_mask(p, mask))
    return O, l_, m


@njit(cache=True)
def _backward_problem(  # noqa: N803
    W, ids, Q, K, V, O, dO, L, l, m, D, dQ, dK, dV, dKp, dVp, B, Hkv, g, G, Nq, Nk, dqk, dv, Br, Bc, scale, alg1,
    mk, mp, mt, skip,
):  # fmt: skip
    """The K/V-outer backward over a problem: FlashAttention-2 (alg1 False: D pass, P from L) or Algorithm 4 (alg1
    True: dK, dV zero-initialised in HBM, P from l and m, O_i loaded and D_i recomputed on every inner step)."""
    iQ, iK, iV, iO, idO, iL, il, im, iD, idQ, idK, idV, idKp, idVp, iS, idP = ids
    R = Nq * (g // G)  # rows of one thread block's row loop: N_q (per-head) or g N_q (packed)
    Rtot = B * Hkv * g * Nq
    off = Nk - Nq
    Tc = cdiv(Nk, Bc)
    expand = G > 1  # per-head GQA: dK, dV written per query head (expanded), summed over the group afterwards
    # Step 3: dQ = 0 in HBM (every query row of every head).
    init_slow(W, idQ, Rtot * dqk)
    if alg1:  # Algorithm 4, step 6: dK, dV (the expanded partials under per-head GQA) zero in HBM too
        kvw = (B * Hkv * G if expand else B * Hkv) * Nk
        init_slow(W, idKp if expand else idK, kvw * dqk)
        init_slow(W, idVp if expand else idV, kvw * dv)
    if Q is not None:
        dQ[:, :] = 0.0
    Qb, dOb, dQb, Ob = buffer(Br * dqk, Q), buffer(Br * dv, Q), buffer(Br * dqk, Q), buffer(Br * dv, Q)
    Lb, Db, lb, mb = buffer(Br, Q), buffer(Br, Q), buffer(Br, Q), buffer(Br, Q)
    if not alg1:  # step 4: D = rowsum(dO o O), its own pass over all B H_q N_q rows (flash-attn's preprocess)
        d_pass(W, (idO, iO, iD), dO, O, D, Rtot, dv, Br, dOb, Ob, Db)
    Kb, Vb, dKb, dVb = buffer(Bc * dqk, Q), buffer(Bc * dv, Q), buffer(Bc * dqk, Q), buffer(Bc * dv, Q)
    Sb, dPb = buffer(Br * Bc, Q), buffer(Br * Bc, Q)
    for b in range(B):  # batch items, key/value heads and (per-head) query heads: outermost
        for hk in range(Hkv):
            kv = (b * Hkv + hk) * Nk
            for h in range(G):
                qbase = ((b * Hkv + hk) * g + h) * Nq
                part = ((b * Hkv + hk) * G + h) * Nk  # this query head's rows of the expanded dK, dV
                for j in range(Tc):  # step 5: one thread block per column block
                    c0 = j * Bc
                    bc = min(Bc, Nk - c0)
                    Kj, Vj, dKj, dVj = tile(Kb, bc, dqk), tile(Vb, bc, dv), tile(dKb, bc, dqk), tile(dVb, bc, dv)
                    hdK = alloc(W, idKp if expand else idK, part + c0 if expand else kv + c0, bc, 0, dqk)  # step 7
                    hdV = alloc(W, idVp if expand else idV, part + c0 if expand else kv + c0, bc, 0, dv)
                    hK = hV = -1  # paper: K_j, V_j loaded here (step 6); skip: at the first row block that sees them
                    if not skip:
                        hK = load(W, iK, K, kv + c0, bc, 0, dqk, Kj)
                        hV = load(W, iV, V, kv + c0, bc, 0, dv, Vj)
                    if Q is not None:
                        dKj[:, :] = 0.0
                        dVj[:, :] = 0.0
                    lo, hi = cols_rows(mk, mp, mt, c0, bc, Nq, off, R)
                    i0, i1 = block_range(lo, hi, Br)
                    for i in range(i0, i1):  # step 8: row blocks (packed: the g heads' rows one after another)
                        r0 = i * Br
                        br = min(Br, R - r0)
                        nnz = rows_nnz(mk, mp, mt, r0, br, c0, bc, Nq, off)
                        if nnz == 0:  # no row of the block sees a key of K_j: skipped
                            continue
                        if hK < 0:
                            hK = load(W, iK, K, kv + c0, bc, 0, dqk, Kj)  # step 6
                            hV = load(W, iV, V, kv + c0, bc, 0, dv, Vj)
                        Qi, dOi, dQi = tile(Qb, br, dqk), tile(dOb, br, dv), tile(dQb, br, dqk)
                        Sij, dPij = tile(Sb, br, bc), tile(dPb, br, bc)
                        Oi = tile(Ob, br, dv)
                        hQ = load(W, iQ, Q, qbase + r0, br, 0, dqk, Qi)  # step 9 (flash2: O_i not loaded, D exists)
                        hO = load(W, iO, O, qbase + r0, br, 0, dv, Oi) if alg1 else -1
                        hdO = load(W, idO, dO, qbase + r0, br, 0, dv, dOi)
                        hdQ = load(W, idQ, dQ, qbase + r0, br, 0, dqk, dQi)
                        if alg1:  # Algorithm 4: l_i, m_i read; D_i computed on chip
                            hL = load_vec(W, il, l, qbase + r0, br, lb)
                            hm = load_vec(W, im, m, qbase + r0, br, mb)
                        else:
                            hL = load_vec(W, iL, L, qbase + r0, br, Lb)
                            hm = -1
                        hS = alloc(W, iS, r0, br, c0, bc)
                        hdP = alloc(W, idP, r0, br, c0, bc)
                        hD = alloc_vec(W, iD, qbase + r0, br) if alg1 else load_vec(W, iD, D, qbase + r0, br, Db)
                        if Q is not None:
                            score_tile(Qi, Kj, Sij, scale)  # step 10
                            if nnz < br * bc:  # a partial block: the element mask
                                rows_apply(Sij, mk, mp, mt, r0, c0, Nq, off)
                            if alg1:
                                _probabilities_from_stats(Sij, mb[:br], lb[:br])
                                _rowsum_product(dOi, Oi, Db[:br])  # D_i recomputed on every step
                            else:
                                _probabilities_from_stats(Sij, Lb[:br], None)  # step 11
                            _backward_tile(Sij, dPij, Qi, Kj, Vj, dOi, dQi, dKj, dVj, Db[:br], scale)  # 12-16
                        store(W, hdQ, dQi, dQ)  # step 15: dQ_i back to HBM
                        for hh in (hS, hdP, hQ, hdO, hdQ, hL, hD):
                            free(W, hh)
                        if alg1:
                            free(W, hO)
                            free(W, hm)
                    if hK >= 0 or not alg1:  # step 18: dK_j, dV_j written once (Algorithm 4: unseen keys keep 0)
                        store(W, hdK, dKj, dKp if expand else dK)
                        store(W, hdV, dVj, dVp if expand else dV)
                    for hh in (hdK, hdV):
                        free(W, hh)
                    if hK >= 0:
                        free(W, hK)
                        free(W, hV)
    if expand:  # the group sum: dK = sum over the g query heads of their expanded partials (and dV)
        sum_group(W, (idKp, idK), dKp, dK, B * Hkv, g, Nk, dqk, Bc, Kb, dKb)
        sum_group(W, (idVp, idV), dVp, dV, B * Hkv, g, Nk, dv, Bc, Vb, dVb)


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


def _backward_problem_call(mem, p, Q, K, V, O, dO, L, l, m, Br, Bc, gqa, scale, dtype, alg1, mask):  # noqa: E741, N803
    G, _, R = p.groups(gqa)
    Rtot = p.B * p.H_q * p.N_q
    numeric = Q is not None
    cast = (lambda x: np.ascontiguousarray(x, dtype=dtype)) if numeric else (lambda x: None)
    Q, K, V, O, dO = (cast(x) for x in (Q, K, V, O, dO))
    unused = np.zeros(1, dtype) if numeric else None  # the other algorithm's row statistics: one type per branch
    L, l, m = (unused if x is None else cast(x) for x in (L, l, m))  # noqa: E741
    kvr = p.B * p.H_kv * p.N_k
    expand = G > 1
    parts = p.B * p.H_q * p.N_k

    def full(shape):
        return np.full(shape, np.nan, dtype) if numeric else None

    D, dQ, dK, dV = full(Rtot), full((Rtot, p.d_qk)), full((kvr, p.d_qk)), full((kvr, p.d_v))
    dKp = full((parts, p.d_qk)) if expand else (dK if numeric else None)
    dVp = full((parts, p.d_v)) if expand else (dV if numeric else None)
    if alg1 and numeric:  # step 6's zeros: a column block no row sees keeps them
        dKp[:] = 0.0
        dVp[:] = 0.0
    ids = mem.ids(
        Q=(Rtot, p.d_qk), K=(kvr, p.d_qk), V=(kvr, p.d_v), O=(Rtot, p.d_v), dO=(Rtot, p.d_v), L=(Rtot,), l=(Rtot,),
        m=(Rtot,), D=(Rtot,), dQ=(Rtot, p.d_qk), dK=(kvr, p.d_qk), dV=(kvr, p.d_v), dKpart=(parts, p.d_qk),
        dVpart=(parts, p.d_v), S=(R, p.N_k), dP=(R, p.N_k),
    )  # fmt: skip
    args = (p.B, p.H_kv, p.g, G, p.N_q, p.N_k, p.d_qk, p.d_v, Br, Bc, float(scale), alg1, *problem_mask(p, mask))
    mem.call(_backward_problem, ids, Q, K, V, O, dO, L, l, m, D, dQ, dK, dV, dKp, dVp, *args)
    return dQ, dK, dV


def flash2_backward_problem(mem, problem, Q, K, V, O, dO, L, *, Br, Bc, gqa, scale, dtype=np.float64, mask=None):  # noqa: N803
    """FlashAttention-2's backward over ``problem`` (docs/theory.md, "The backward over a problem"); count-only:
    every data array None. K/V outer per (b, key/value head[, query head]); ``per-head`` GQA (g > 1) writes dK, dV
    expanded to H_q heads (dKpart, dVpart) and sums each group afterwards (flash-attn's GQA backward); ``packed``
    loops over the g N_q packed rows of the group with dK_j, dV_j on chip, written once. D = rowsum(dO o O) in a
    pass of its own; dQ_i read-modify-written on every inner step. Returns (dQ, dK, dV) with dQ in (b, h_q, r) and
    dK, dV in (b, h_kv, c) row order. Exact counts: :func:`iosim.theory.io_model.flash2_backward_problem`."""
    return _backward_problem_call(mem, problem, Q, K, V, O, dO, L, None, None, Br, Bc, gqa, scale, dtype, False, mask)


def flash1_backward_problem(mem, problem, Q, K, V, O, dO, l, m, *, Br, Bc, gqa, scale, dtype=np.float64, mask=None):  # noqa: E741, N803
    """FlashAttention's Algorithm 4 over ``problem``: the schedule of :func:`flash2_backward_problem` with
    Algorithm 4's steps: dQ, dK, dV (the expanded partials under per-head GQA) zero-initialised in HBM, P_ij from
    l_i and m_i, O_i loaded and D_i recomputed on every inner step, no D pass. Exact counts:
    :func:`iosim.theory.io_model.flash1_backward_problem`."""
    return _backward_problem_call(mem, problem, Q, K, V, O, dO, None, l, m, Br, Bc, gqa, scale, dtype, True, mask)

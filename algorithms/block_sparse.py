"""What FlexAttention's and FlashAttention's block-sparse forward kernels load: a BlockMask schedule, count-only.

FlexAttention (torch.nn.attention.flex_attention; Dong et al. 2024, "Flex Attention: A Programming Model for
Generating Optimized Attention Kernels") and FlashAttention's block-sparse kernels take, for each (b, h) and row
block i of BQ query rows, ``kv_num_blocks[b, h, i]`` partial column blocks listed in ``kv_indices[b, h, i]`` and
``full_kv_num_blocks[b, h, i]`` full ones in ``full_kv_indices[b, h, i]``, blocks of BKV keys. A program (one row
block of one head) does, in this schedule:

1. load Q_i (BQ x d_qk); alloc O_i (BQ x d_v), m_i, l_i (BQ each); load the two block counts (one word each);
2. for each partial block, then each full block: load its index (one word), K_j (BKV x d_qk), alloc S_ij
   (BQ x BKV), load the captured buffers it reads (below), load V_j (BKV x d_v); free them;
3. free the counts, m_i, l_i; alloc L_i (BQ), store O_i and L_i; free the rest.

A captured buffer (:data:`INDEX`) is read per visited block as the tile its index names: a per-query-position
vector (``q``: BQ words), a per-key-position vector (``kv``: BKV), one vector read at both (``q+kv``: document ids,
BQ + BKV), a (q, kv) bias broadcast over b and h (``qkv``: BQ x BKV), a full (b, h, q, kv) bias (``bhqkv``:
BQ x BKV) or a per-head scalar (``h``: 1 word). ``mask_mod``'s buffers are read in partial blocks only (full
blocks skip the mask), ``score_mod``'s in every visited block. A ragged block (N_q or N_k not a multiple of the
block) reads them at its r_i rows and c_j columns only; with ``template`` at all BQ x BKV positions, each index
taken mod N_q or N_k, as torch's FlexAttention Triton template does when the lengths do not divide
(``get_bounded_indices``: the padded lanes load real words, so every lane counts).

``dense`` is the kernel that loads every column block and masks afterwards: no metadata, every block visited and
treated as partial. Query head h reads key/value head h // g (GQA, per head, as FlexAttention's grid does). The
exact count of every array and the peak are in :mod:`iosim.theory.block_sparse`.
"""

from __future__ import annotations

import numpy as np
from iosim.algorithms.tile_masks import mask_nnz
from iosim.memory_model import alloc, free, load, store
from iosim.memory_model.core import alloc_vec, load_vec
from numba import njit

INDEX = ("q", "kv", "q+kv", "qkv", "bhqkv", "h")
Q_VEC, KV_VEC, QKV_VEC, QKV, BHQKV, HEAD = range(6)
MASK, SCORE = 0, 1  # a buffer's scope: partial blocks (mask_mod) or every visited block (score_mod)


@njit(cache=True)
def block_classes(kind, p, T, N_q, N_k, BQ, BKV):  # noqa: N803
    """An iosim mask's classes on BQ x BKV blocks as ``create_block_mask`` makes them (0 empty, 1 partial, 2 full:
    every one of the BQ x BKV positions allowed, so ragged blocks are never full); the mask covers N_k x N_k and the
    queries are its last N_q rows."""
    off = N_k - N_q
    Tr, Tc = (N_q + BQ - 1) // BQ, (N_k + BKV - 1) // BKV
    cls = np.zeros((Tr, Tc), dtype=np.int8)
    for i in range(Tr):
        a = i * BQ + off
        br = min(BQ, N_q - i * BQ)
        a1 = max(a, 0)
        if a + br <= a1:
            continue
        for j in range(Tc):
            nz = mask_nnz(kind, p, T, a1, a + br - a1, j * BKV, min(BKV, N_k - j * BKV))
            if nz > 0:
                cls[i, j] = 2 if nz == BQ * BKV else 1
    return cls


@njit(cache=True)
def _load_wrapped(W, aid, handles, at, row0, r0, nr, N_r, c0, nc, N_c, vec):  # noqa: N803
    """Load rows r0 .. r0 + nr - 1 (each taken mod N_r, after row0) by columns c0 .. c0 + nc - 1 (mod N_c) of
    ``aid`` as contiguous pieces, their handles from ``handles[at]`` on; return the next free slot. Without
    wrapping (r0 + nr <= N_r, c0 + nc <= N_c) it is one load."""
    i = 0
    while i < nr:
        r = (r0 + i) % N_r
        nr1 = min(nr - i, N_r - r)
        j = 0
        while j < nc:
            c = (c0 + j) % N_c
            nc1 = min(nc - j, N_c - c)
            if vec:
                handles[at] = load_vec(W, aid, None, row0 + r, nr1, None)
            else:
                handles[at] = load(W, aid, None, row0 + r, nr1, c, nc1, None)
            at += 1
            j += nc1
        i += nr1
    return at


@njit(cache=True)
def _buffers(W, bufs, handles, partial, b, h, H_q, N_q, N_k, r0, nr, c0, nc):  # noqa: N803
    """Load the buffers a block reads at its nr rows from r0 and nc columns from c0 (indices wrapped mod N_q and
    N_k: the template's padded positions); their handles in ``handles`` (slots per buffer; -1: none). bufs rows:
    (aid, index, scope)."""
    K = bufs.shape[0]
    slots = handles.size // K if K > 0 else 0
    for k in range(K):
        aid, index, scope = bufs[k, 0], bufs[k, 1], bufs[k, 2]
        at = k * slots
        for s in range(slots):
            handles[at + s] = -1
        if scope == MASK and not partial:
            continue
        if index == Q_VEC:
            _load_wrapped(W, aid, handles, at, 0, r0, nr, N_q, 0, 1, 1, True)
        elif index == KV_VEC:
            _load_wrapped(W, aid, handles, at, 0, c0, nc, N_k, 0, 1, 1, True)
        elif index == QKV_VEC:
            at = _load_wrapped(W, aid, handles, at, 0, r0, nr, N_q, 0, 1, 1, True)
            _load_wrapped(W, aid, handles, at, 0, c0, nc, N_k, 0, 1, 1, True)
        elif index == QKV:
            _load_wrapped(W, aid, handles, at, 0, r0, nr, N_q, c0, nc, N_k, False)
        elif index == BHQKV:
            _load_wrapped(W, aid, handles, at, (b * H_q + h) * N_q, r0, nr, N_q, c0, nc, N_k, False)
        else:
            handles[at] = load_vec(W, aid, None, h, 1, None)


def handle_slots(n_buffers: int, N_q: int, N_k: int, BQ: int, BKV: int) -> int:  # noqa: N803
    """The size of ``handles``: per buffer, room for the pieces of its widest read (a wrapped read of BQ rows over
    N_q is at most BQ // N_q + 2 pieces)."""
    return n_buffers * 2 * (BQ // N_q + 2) * (BKV // N_k + 2)


@njit(cache=True)
def _free_all(W, handles):
    for k in range(handles.size):
        if handles[k] >= 0:
            free(W, handles[k])


@njit(cache=True)
def block_sparse_forward(W, ids, dims, kv_num, kv_idx, full_num, full_idx, bufs, handles, dense, template=False):  # noqa: N803
    """The schedule above. ids = (Q, K, V, O, L, m, l, S, kv_num_blocks, kv_indices, full_kv_num_blocks,
    full_kv_indices); dims = (B, H_q, H_kv, N_q, N_k, d_qk, d_v, BQ, BKV); the BlockMask tensors (B', H', T_r[, C])
    with B', H' in {1, B}, {1, H_q} (broadcast); bufs (aid, index, scope) per buffer; handles
    :func:`handle_slots` long. ``template``: as torch's FlexAttention Triton template (one program per sparse row
    block) reads them, the captured buffers at the whole block (indices wrapped) and the indices: each list's first
    index before its loop (an empty list's too), then after each block its own index and, unless it is the last, the
    next one's (``get_offset_for_next_block``)."""
    B, H_q, H_kv, N_q, N_k, d_qk, d_v = dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6]
    BQ, BKV = dims[7], dims[8]
    Q, K, V, O, L, m, l, S = ids[0], ids[1], ids[2], ids[3], ids[4], ids[5], ids[6], ids[7]
    g = H_q // H_kv
    Tr, Tc = (N_q + BQ - 1) // BQ, (N_k + BKV - 1) // BKV
    Bm, Hm = kv_num.shape[0], kv_num.shape[1]
    for b in range(B):
        for h in range(H_q):
            bm, hm = min(b, Bm - 1), min(h, Hm - 1)
            for i in range(Tr):
                r0 = i * BQ
                br = min(BQ, N_q - r0)
                qrow = (b * H_q + h) * N_q + r0
                hQ = load(W, Q, None, qrow, br, 0, d_qk, None)  # 1. Q_i, O_i, m_i, l_i and the block counts
                hO = alloc(W, O, qrow, br, 0, d_v)
                hm_i = alloc_vec(W, m, qrow, br)
                hl_i = alloc_vec(W, l, qrow, br)
                meta = (bm * Hm + hm) * Tr + i
                hc = hf = -1
                if not dense:
                    hc = load(W, ids[8], None, meta, 1, 0, 1, None)
                    hf = load(W, ids[10], None, meta, 1, 0, 1, None)
                for full in range(2):  # 2. partial blocks, then full blocks
                    n = Tc if dense else (full_num[bm, hm, i] if full else kv_num[bm, hm, i])
                    if dense and full:
                        n = 0
                    lst = ids[11] if full else ids[9]
                    if template and not dense:  # the first block's index, loaded before the loop
                        free(W, load(W, lst, None, meta, 1, 0, 1, None))
                    for t in range(n):
                        hidx = -1
                        if dense:
                            j = t
                        else:
                            j = full_idx[bm, hm, i, t] if full else kv_idx[bm, hm, i, t]
                            if not template:
                                hidx = load(W, lst, None, meta, 1, t, 1, None)
                        c0 = j * BKV
                        bc = min(BKV, N_k - c0)
                        kvrow = (b * H_kv + h // g) * N_k + c0
                        hK = load(W, K, None, kvrow, bc, 0, d_qk, None)
                        hS = alloc(W, S, 0, br, 0, bc)
                        if template:  # the template reads captured buffers at the whole block, indices wrapped
                            _buffers(W, bufs, handles, full == 0, b, h, H_q, N_q, N_k, r0, BQ, c0, BKV)
                        else:
                            _buffers(W, bufs, handles, full == 0, b, h, H_q, N_q, N_k, r0, br, c0, bc)
                        hV = load(W, V, None, kvrow, bc, 0, d_v, None)
                        _free_all(W, handles)
                        free(W, hV)
                        free(W, hS)
                        free(W, hK)
                        if hidx >= 0:
                            free(W, hidx)
                        if template and not dense:  # this block's index and the next one's, for the jump
                            free(W, load(W, lst, None, meta, 1, t, 1, None))
                            if t + 1 < n:
                                free(W, load(W, lst, None, meta, 1, t + 1, 1, None))
                if not dense:  # 3. L_i, then O_i and L_i stored
                    free(W, hc)
                    free(W, hf)
                free(W, hm_i)
                free(W, hl_i)
                hL = alloc_vec(W, L, qrow, br)
                store(W, hO, None, None)
                store(W, hL, None, None)
                free(W, hL)
                free(W, hO)
                free(W, hQ)

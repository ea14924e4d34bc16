"""Square tiling for the small-cache regime (M < d^2): Saha & Ye's forward and a small-cache backward.

Forward -- :func:`square_tiling_forward`
----------------------------------------
Saha & Ye, "The I/O Complexity of Attention, or How Optimal is Flash Attention?" (ICML 2024), Algorithm 1
("SquareTilingAttention"), Theorem 3.5: O(N^2 d / sqrt(M)) I/O when M <= d^2, matching their lower bound
Omega(N^2 d / sqrt(M)) (Theorem 3.7). Every tile is a square of side B (the paper: B = floor(sqrt(M/4))).

* Phase 1, for each row tile i and column tile j: accumulate S_ij = Q_i K_j^T over ceil(d/B) slices l of the head
  dimension (one B x B tile of Q and of K resident per step), then write the N x N tile and update the row
  statistics of row tile i; after the last j, write the row statistic.
* Phase 2, for each row tile i and each output tile c of the head dimension: O_ic = sum_k A_ik V_kc, then write O_ic.

**Numerically stable form, and what it changes in the count.** The paper writes exp(Q K^T) and the row sums
D = rowsum(exp(Q K^T)) and normalises with diag(D)^-1 in phase 2; exp overflows for real inputs. Here phase 1
writes the *exponent* S_ij = scale * Q_i K_j^T (masked entries -inf) and keeps an online row max m_i and row sum
l_i (FlashAttention's running statistics) on chip; after the last j it writes the logsumexp L_i = m_i + log l_i
instead of D_i. Phase 2 forms the normalised A_ik = exp(S_ik - L_i) = diag(D_i)^-1 exp(S_ik) in its tile prologue
(recomputation is free in the model). **The word count is exactly the paper's S1**: the same N^2 tile writes, N
words of row statistic written and read back, nothing else moves. Only the fast-memory working set grows by B
words (m_i and l_i instead of d_B[i]): 3B^2 + 2B <= 4B^2 <= M for the paper's B >= 2.

Exact count (:func:`iosim.theory.io_model.square_tiling_forward`), non-causal, Tn = ceil(N/B), Td = ceil(d/B):
reads Q, K, V: Nd Tn each; S: written N^2, read N^2 Td; L: N written, N read; O: Nd written. Total
3 Nd Tn + N^2 (1 + Td) + Nd + 2N = docs/theory.md S1 to the word. Causal masking skips tile (i, j) with j > i (square
tiles: exactly the tiles entirely above the diagonal) in both phases with one ``continue``; those S entries are
never written or read. Any mask (:mod:`iosim.algorithms.tile_masks`) likewise: the tiles it empties are skipped in both
phases (and in every product of the backward), the element mask applies inside partial tiles, and a row with no
allowed entry gets L = -inf, O = 0 and zero gradients. This is a sparse small-cache algorithm: its I/O follows
the nonzero tiles, O(nnz_tiles B^2 (d / B)) = O(s N^2 d / sqrt(M)) for a fraction s of nonzero tiles.

Backward -- :func:`square_tiling_backward`
------------------------------------------
A small-cache backward reaching Theta(N^2 d / sqrt(M)) I/O when M < d^2, the small-cache bound of Li, Liang, Shi,
Song, Zhou, "Fine-grained Attention I/O Complexity" (arXiv 2410.09397, Theorems 4.3/4.4). **This is a
construction in that paper's regime, not a transcription of its Algorithm 6**, whose pseudo-code is not
available (docs/theory.md and B3). It follows docs/theory.md's B3 (square tiles everywhere, the
N x N intermediates materialised in slow memory, which is affordable because N^2 <= N^2 d / sqrt(M) when
M <= d^2) with three changes:

* it reads the forward's N x N exponent S (which this forward leaves in slow memory, as standard attention leaves
  P) instead of recomputing S = Q K^T: P = exp(S - L) is formed in tile prologues and never written. This saves
  B3's 2 Nd ceil(N/B) reads of Q and K and its N^2 writes of P;
* L_i and the row term D_i = rowsum(dO_i o O_i) stay on chip for the whole row tile (D never goes to slow
  memory);
* the tile pass holds one B x B accumulator at a time (S_ij is streamed in one row at a time), so the backward
  runs with the forward's B and has exactly the forward's working set.

Inputs in slow memory: Q, K, V, dO and the forward's O, L and S. Outputs: dQ, dK, dV (and dS, materialised).

* Phase 1, for each row tile i (L_i loaded once):
  1. D_i = rowsum(dO_i o O_i) from ceil(d/B) tiles of dO_i and O_i;
  then for each column tile j:
  2. dP_ij = dO_i V_j^T over the ceil(d/B) slices of d;
  3. read S_ij one row at a time, P = exp(S - L_i), dS_ij = scale * P o (dP_ij - D_i) in place of dP_ij (dS here
     includes the softmax scale, so the products below need none); write dS_ij.
* Phase 2, three square-tiled products whose N x N operand is read once per output tile of d:
  4. dV = P^T dO with P = exp(S - L) formed in each tile's prologue (the tile's B words of L read with it);
  5. dQ = dS K; 6. dK = dS^T Q. Causal: the all-zero tiles above the diagonal are skipped with one ``continue``.

Exact count (:func:`iosim.theory.io_model.square_tiling_backward`), non-causal:
5 Nd Tn + 3 N^2 Td + 2 N^2 + N Tn Td + 5 Nd + N, against docs/theory.md B3's 7 Nd Tn + 3 N^2 Td + 3 N^2 + 2 N Tn + 5 Nd
+ N. Working set: B^2 + 2B min(B, d) + 2B, the forward's.

Both drivers take explicit (N, d); count-only mode (every data array None) runs the same loop nest without data.
"""

from __future__ import annotations

import math

import numpy as np
from iosim.algorithms._tiles import buffer, cdiv, tile
from iosim.algorithms.tile_masks import (
    apply_mask,
    block_range,
    mask_cols,
    mask_rows,
    query_rows,
    resolve,
    tile_nnz,
)
from iosim.memory_model import alloc, alloc_vec, free, load, load_vec, store, store_to, store_vec
from iosim.memory_model.core import jitable
from numba import njit


@njit(cache=True)
def _scale_mask_update(Sij, scale, partial, mk, mp, mt, row0, col0, m_i, l_i):
    """Phase-1 epilogue: S_ij *= scale, masked entries -> -inf (a partial tile), online row max m_i and sum l_i."""
    br, bc = Sij.shape
    Sij *= scale
    if partial:
        apply_mask(Sij, mk, mp, mt, row0, col0)
    for r in range(br):
        m_tilde = -np.inf
        for c in range(bc):
            m_tilde = max(m_tilde, Sij[r, c])
        if m_tilde == -np.inf:  # the whole row of this tile is masked
            continue
        m_new = max(m_i[r], m_tilde)
        s = 0.0
        for c in range(bc):
            s += math.exp(Sij[r, c] - m_new)
        l_i[r] = l_i[r] * math.exp(m_i[r] - m_new) + s
        m_i[r] = m_new


@njit(cache=True)
def _normalised_probabilities(Sik, L_i):
    """A_ik = exp(S_ik - L_i) = diag(D_i)^-1 exp(S_ik), in place (masked -inf entries become 0)."""
    br, bc = Sik.shape
    for r in range(br):
        for c in range(bc):
            Sik[r, c] = math.exp(Sik[r, c] - L_i[r]) if L_i[r] != -np.inf else 0.0  # -inf: no allowed entry


@njit(cache=True)
def _square_forward(W, ids, Q, K, V, S, O, L, N, Nk, d, dv, B, scale, off, mk, mp, mt):  # noqa: N803
    iQ, iK, iV, iS, iO, iL, im = ids
    Tn = cdiv(N, B)  # tiles along N (rows of Q; N_k keys when N_q != N_k)
    Td = cdiv(d, B)  # tiles along the head dimension d (of V and O: d_v)
    Qb, Kb, Sb = buffer(B * B, Q), buffer(B * B, Q), buffer(B * B, Q)
    mb, lb = buffer(B, Q), buffer(B, Q)
    # Phase 1: the N x N exponent S = scale Q K^T tile by tile, with the row statistics (d_B[i] in the paper).
    for i in range(Tn):
        r0 = i * B
        bi = min(B, N - r0)
        hm = alloc_vec(W, im, r0, bi)  # m_i = -inf (running row max)
        hl = alloc_vec(W, iL, r0, bi)  # l_i = 0 (running row sum; the paper's d_B[i]); becomes L_i in place
        if Q is not None:
            mb[:bi] = -np.inf
            lb[:bi] = 0.0
        lo, hi = mask_cols(mk, mp, mt, r0 + off, bi, Nk)  # mask row r0 + off: the queries are its last N rows
        j0, j1 = block_range(lo, hi, B)
        for j in range(j0, j1):
            c0 = j * B
            bj = min(B, Nk - c0)
            nnz = tile_nnz(mk, mp, mt, r0 + off, bi, c0, bj)
            if nnz == 0:  # a tile the mask empties (causal: entirely above the diagonal)
                continue
            Sij = tile(Sb, bi, bj)
            hS = alloc(W, iS, r0, bi, c0, bj)  # A_B[i, j] = 0
            if Q is not None:
                Sij[:, :] = 0.0
            for ll in range(Td):  # slices of d
                k0 = ll * B
                bk = min(B, d - k0)
                Qil, Kjl = tile(Qb, bi, bk), tile(Kb, bj, bk)
                hQ = load(W, iQ, Q, r0, bi, k0, bk, Qil)  # Q tile (i, l)
                hK = load(W, iK, K, c0, bj, k0, bk, Kjl)  # K^T tile (l, j)
                if Q is not None:
                    Sij += np.dot(Qil, Kjl.T)
                free(W, hQ)
                free(W, hK)
            if Q is not None:
                _scale_mask_update(Sij, scale, nnz < bi * bj, mk, mp, mt, r0 + off, c0, mb[:bi], lb[:bi])
            store(W, hS, Sij, S)  # write the N x N tile (exponent form, see the docstring)
            free(W, hS)
        if Q is not None:
            for r in range(bi):  # L_i = m_i + log l_i, in place of l_i (-inf for a row with no allowed entry)
                lb[r] = mb[r] + math.log(lb[r]) if lb[r] > 0.0 else -np.inf
        store_vec(W, hl, lb, L)  # write d_B[i] (here: the logsumexp L_i)
        free(W, hm)
        free(W, hl)
    # Phase 2: O = diag(D)^-1 exp(S) V = exp(S - L) V, square tiles again.
    Pb, Vb, Ob, Lb = buffer(B * B, Q), buffer(B * B, Q), buffer(B * B, Q), buffer(B, Q)
    for i in range(Tn):
        r0 = i * B
        bi = min(B, N - r0)
        hL = load_vec(W, iL, L, r0, bi, Lb)  # read d_B[i]
        for c in range(cdiv(dv, B)):  # output column tile of d (d_v)
            c0 = c * B
            bc = min(B, dv - c0)
            Oic = tile(Ob, bi, bc)
            hO = alloc(W, iO, r0, bi, c0, bc)  # O tile = 0
            if Q is not None:
                Oic[:, :] = 0.0
            lo, hi = mask_cols(mk, mp, mt, r0 + off, bi, Nk)
            k0_, k1_ = block_range(lo, hi, B)
            for k in range(k0_, k1_):
                k0 = k * B
                bk = min(B, Nk - k0)
                if tile_nnz(mk, mp, mt, r0 + off, bi, k0, bk) == 0:  # A_ik is all zero
                    continue
                Aik, Vkc = tile(Pb, bi, bk), tile(Vb, bk, bc)
                hA = load(W, iS, S, r0, bi, k0, bk, Aik)  # A tile (i, k)
                hV = load(W, iV, V, k0, bk, c0, bc, Vkc)  # V tile (k, c)
                if Q is not None:
                    _normalised_probabilities(Aik, Lb[:bi])
                    Oic += np.dot(Aik, Vkc)
                free(W, hA)
                free(W, hV)
            store(W, hO, Oic, O)  # write the O tile
            free(W, hO)
        free(W, hL)


@jitable(nrt=True)
def _ds_row(dS_row, S_row, L_r, D_r, scale):
    """dS = scale * P o (dP - D) for one row, in place of dP, with P = exp(S - L_r) from the forward's S row.

    Masked entries (S = -inf) give P = 0 and dS = 0; a row with no allowed entry (L_r = -inf) is 0 throughout."""
    for c in range(dS_row.size):
        if L_r == -np.inf or S_row[c] == -np.inf:
            dS_row[c] = 0.0
        else:
            dS_row[c] = scale * math.exp(S_row[c] - L_r) * (dS_row[c] - D_r)


@jitable(nrt=True)
def _softmax_rows(A, L_k):
    """A = exp(A - L_k) in place (P from the forward's exponent S): masked entries (-inf) and rows with no allowed
    entry (L = -inf) 0."""
    br, bc = A.shape
    for r in range(br):
        for c in range(bc):
            A[r, c] = 0.0 if L_k[r] == -np.inf else math.exp(A[r, c] - L_k[r])


@jitable(nrt=True)
def _nn_product(W, iA, A, a_transposed, iX, X, iC, C, N, d, B, mk, mp, mt, iL, L, from_exponent):  # noqa: N803
    """C = op(A) X for an N x N matrix A in slow memory (op(A) = A^T if a_transposed) and an N x d matrix X.

    Square tiles of side B: an accumulator C_rc (B x B), one tile of A and one of X resident per step. Reads
    N^2 ceil(d/B) of A and Nd ceil(N/B) of X, writes Nd (no mask). A is zero on the tiles the mask empties (causal:
    above the diagonal); they are skipped (tile (r, k) of A for C = A X, tile (k, r) for C = A^T X). With
    ``from_exponent`` the slow array holds the exponent S and the tile prologue forms P = exp(S - L) with the rows'
    L (read per tile of A: N ceil(N/B) ceil(d/B) words of L, non-causal).
    """
    Tn, Td = cdiv(N, B), cdiv(d, B)
    Ab, Xb, Cb, Lb = buffer(B * B, C), buffer(B * B, C), buffer(B * B, C), buffer(B, C)
    for r in range(Tn):  # output row tile
        r0 = r * B
        br = min(B, N - r0)
        for c in range(Td):  # output column tile of d
            c0 = c * B
            bc = min(B, d - c0)
            Crc = tile(Cb, br, bc)
            hC = alloc(W, iC, r0, br, c0, bc)
            if C is not None:
                Crc[:, :] = 0.0
            hL = -1  # the handle of L's rows when the prologue forms P from the exponent
            if a_transposed:
                lo, hi = mask_rows(mk, mp, mt, r0, br, N)
            else:
                lo, hi = mask_cols(mk, mp, mt, r0, br, N)
            k0_, k1_ = block_range(lo, hi, B)
            for k in range(k0_, k1_):
                k0 = k * B
                bk = min(B, N - k0)
                ar0, anr, ac0, anc = (k0, bk, r0, br) if a_transposed else (r0, br, k0, bk)  # A's tile
                if tile_nnz(mk, mp, mt, ar0, anr, ac0, anc) == 0:  # an all-zero tile of A
                    continue
                Xkc = tile(Xb, bk, bc)
                if a_transposed:
                    Akr = tile(Ab, bk, br)
                    if from_exponent:
                        hL = load_vec(W, iL, L, k0, bk, Lb)  # L of the tile's rows k
                    hA = load(W, iA, A, k0, bk, r0, br, Akr)
                    hX = load(W, iX, X, k0, bk, c0, bc, Xkc)
                    if C is not None:
                        if from_exponent:
                            _softmax_rows(Akr, Lb[:bk])
                        Crc += np.dot(Akr.T, Xkc)
                else:
                    Ark = tile(Ab, br, bk)
                    if from_exponent:
                        hL = load_vec(W, iL, L, r0, br, Lb)
                    hA = load(W, iA, A, r0, br, k0, bk, Ark)
                    hX = load(W, iX, X, k0, bk, c0, bc, Xkc)
                    if C is not None:
                        if from_exponent:
                            _softmax_rows(Ark, Lb[:br])
                        Crc += np.dot(Ark, Xkc)
                free(W, hA)
                free(W, hX)
                if from_exponent:
                    free(W, hL)
            store(W, hC, Crc, C)
            free(W, hC)


@njit(cache=True)
def _square_backward(W, ids, Q, K, V, O, L, S, dO, dS, dQ, dK, dV, N, d, B, scale, mk, mp, mt):  # noqa: N803
    iQ, iK, iV, iO, iL, iS, idO, idS, idQ, idK, idV, iD, idP = ids
    Tn = cdiv(N, B)
    Td = cdiv(d, B)
    Xb, Yb, Tb, Rb = buffer(B * B, Q), buffer(B * B, Q), buffer(B * B, Q), buffer(B, Q)
    Lb, Db = buffer(B, Q), buffer(B, Q)
    # Phase 1: dS tile by tile, row tile i outer.
    for i in range(Tn):
        r0 = i * B
        bi = min(B, N - r0)
        hL = load_vec(W, iL, L, r0, bi, Lb)  # L_i, resident for the whole row tile
        hD = alloc_vec(W, iD, r0, bi)  # D_i = rowsum(dO_i o O_i), resident for the whole row tile
        if Q is not None:
            Db[:bi] = 0.0
        for ll in range(Td):  # step 1: D_i from ceil(d/B) tiles of dO_i and O_i
            k0 = ll * B
            bk = min(B, d - k0)
            dOil, Oil = tile(Xb, bi, bk), tile(Yb, bi, bk)
            hdO = load(W, idO, dO, r0, bi, k0, bk, dOil)
            hO = load(W, iO, O, r0, bi, k0, bk, Oil)
            if Q is not None:
                for r in range(bi):
                    for c in range(bk):
                        Db[r] += dOil[r, c] * Oil[r, c]
            free(W, hdO)
            free(W, hO)
        lo, hi = mask_cols(mk, mp, mt, r0, bi, N)
        j0, j1 = block_range(lo, hi, B)
        for j in range(j0, j1):
            c0 = j * B
            bj = min(B, N - c0)
            if tile_nnz(mk, mp, mt, r0, bi, c0, bj) == 0:  # a tile the mask empties: P_ij = dS_ij = 0
                continue
            # Step 2: dP_ij = dO_i V_j^T over the d slices.
            dPij = tile(Tb, bi, bj)
            hdP = alloc(W, idP, r0, bi, c0, bj)
            if Q is not None:
                dPij[:, :] = 0.0
            for ll in range(Td):
                k0 = ll * B
                bk = min(B, d - k0)
                dOil, Vjl = tile(Xb, bi, bk), tile(Yb, bj, bk)
                hdO = load(W, idO, dO, r0, bi, k0, bk, dOil)
                hV = load(W, iV, V, c0, bj, k0, bk, Vjl)
                if Q is not None:
                    dPij += np.dot(dOil, Vjl.T)
                free(W, hdO)
                free(W, hV)
            # Step 3: the forward's S_ij one row at a time, P = exp(S - L_i), dS_ij = scale P o (dP_ij - D_i).
            for r in range(bi):
                S_row = tile(Rb, 1, bj)
                hSr = load(W, iS, S, r0 + r, 1, c0, bj, S_row)
                if Q is not None:
                    _ds_row(dPij[r], S_row[0], Lb[r], Db[r], scale)
                free(W, hSr)
            store_to(W, hdP, dPij, idS, dS, r0, c0)  # write dS_ij (it overwrote dP_ij on chip)
            free(W, hdP)
        free(W, hL)
        free(W, hD)
    # Phase 2: steps 4-6, three square-tiled products.
    _nn_product(W, iS, S, True, idO, dO, idV, dV, N, d, B, mk, mp, mt, iL, L, True)  # step 4: dV = P^T dO
    _nn_product(W, idS, dS, False, iK, K, idQ, dQ, N, d, B, mk, mp, mt, iL, L, False)  # step 5: dQ = dS K
    _nn_product(W, idS, dS, True, iQ, Q, idK, dK, N, d, B, mk, mp, mt, iL, L, False)  # step 6: dK = dS^T Q


def _as_inputs(dtype, *arrays):
    if arrays[0] is None:
        return (None,) * len(arrays)
    return tuple(np.ascontiguousarray(x, dtype=dtype) for x in arrays)


def _poisoned(numeric, dtype, *shapes):
    """Output arrays filled with NaN so an unwritten element shows (None in count-only mode)."""
    return tuple(np.full(shape, np.nan, dtype) if numeric else None for shape in shapes)


def square_tiling_forward(mem, Q, K, V, *, N, d, B, scale, causal=False, dtype=np.float64, N_k=None, d_v=None):  # noqa: N803
    """Saha & Ye Algorithm 1 (numerically stable form) on memory ``mem``; tile side ``B``.

    Count-only mode: pass Q = K = V = None. Returns (O, L, S): the output, the row logsumexp and the N x N
    exponent S = scale Q K^T left in slow memory (None each in count-only mode). Exact count:
    :func:`iosim.theory.io_model.square_tiling_forward` (= docs/theory.md S1 when non-causal). ``N_k`` keys
    (default N; ``causal`` is then bottom-right: row r sees keys c <= r + N_k - N) and ``d_v`` the width of V and
    O (default d): :func:`iosim.theory.io_model.square_tiling_problem`. A :class:`TileMask` over N_k != N keys
    covers the whole sequence and the queries are its last N rows (aligned bottom-right, as the causal flag is).
    """
    Nk = N if N_k is None else N_k
    dv = d if d_v is None else d_v
    Q, K, V = _as_inputs(dtype, Q, K, V)
    S, O, L = _poisoned(Q is not None, dtype, (N, Nk), (N, dv), (N,))
    ids = mem.ids(Q=(N, d), K=(Nk, d), V=(Nk, dv), S=(N, Nk), O=(N, dv), L=(N,), m=(N,))
    mk, off = query_rows(causal, N, Nk)
    mem.call(_square_forward, ids, Q, K, V, S, O, L, N, Nk, d, dv, B, float(scale), off, *mk)
    return O, L, S


def square_tiling_backward(mem, Q, K, V, O, L, S, dO, *, N, d, B, scale, causal=False, dtype=np.float64):  # noqa: N803
    """The small-cache backward (a construction; see the module docstring) on memory ``mem``; tile side ``B``.

    Inputs: Q, K, V, the forward's O, L and S (the N x N exponent), and dO (all None for count-only mode).
    Returns (dQ, dK, dV, dS) (None each in count-only mode). Exact count:
    :func:`iosim.theory.io_model.square_tiling_backward`.
    """
    Q, K, V, O, L, S, dO = _as_inputs(dtype, Q, K, V, O, L, S, dO)
    dS, dQ, dK, dV = _poisoned(Q is not None, dtype, (N, N), (N, d), (N, d), (N, d))
    nd, n, nn = (N, d), (N,), (N, N)
    ids = mem.ids(Q=nd, K=nd, V=nd, O=nd, L=n, S=nn, dO=nd, dS=nn, dQ=nd, dK=nd, dV=nd, D=n, dP=nn)
    mk = resolve(causal, N).args[:3]
    mem.call(_square_backward, ids, Q, K, V, O, L, S, dO, dS, dQ, dK, dV, N, d, B, float(scale), *mk)
    return dQ, dK, dV, dS

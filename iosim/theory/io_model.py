"""Exact closed-form I/O counts of every algorithm's schedule, per array, to the word.

Each function here is derived by hand from the loop nest of the matching driver in ``algorithms/`` under the
conventions of :mod:`iosim.memory_model.core` (one word per entry, initialisation writes counted, partial final tiles
at their true size). The tests require simulated counts == these formulas on grids with ragged N, so a change to
a schedule without a change here fails loudly. Causal variants are exact finite sums over the Tc (or Tr) blocks
of the skipped dimension: O(N / B) terms, never O(N^2).

Notation: N rows, d head dimension, Br x Bc blocks, Tr = ceil(N/Br), Tc = ceil(N/Bc), B the square tile side.
The papers' forms for comparison (docs/theory.md): F1 = 2Nd + Tc(3Nd + 4N) (+ Nd + 2N
init), F2 = 2Nd(1 + Tr) + N, S0 = R(N,d,N) + N^2 + 2N^2 + R(N,N,d) + Nd with R(m,k,n) = mk ceil(n/B) + kn ceil(m/B).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from iosim.algorithms import tile_masks as _masks
from iosim.algorithms.tile_masks import TileMask
from iosim.memory_model.core import ArrayCounts, Tally


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Prediction(Tally):
    """Predicted counts: per-array reads / writes / init writes (totals derive from them) and the peak."""

    per_array: dict[str, ArrayCounts] = field(default_factory=dict)
    peak: int = 0


def _pred(peak: int, **arrays: tuple[int, ...]) -> Prediction:
    per = {name: ArrayCounts(*(int(x) for x in rw)) for name, rw in arrays.items() if any(rw)}
    return Prediction(per, int(peak))


def flash_working_set(d: int, Br: int, Bc: int) -> int:
    """Words resident in one inner step of FlashAttention 1 or 2: Q_i, O_i, K_j, V_j, l_i, m_i, S_ij."""
    return 2 * d * (Br + Bc) + 2 * Br + Br * Bc


def _causal_rows_per_column_block(N: int, Br: int, Bc: int) -> np.ndarray:
    """For each column block j, the rows of the row blocks not skipped by the causal mask: N - floor(jBc/Br) Br."""
    j = np.arange(cdiv(N, Bc), dtype=np.int64)
    return N - (j * Bc // Br) * Br


def _causal_cols_per_row_block(N: int, Br: int, Bc: int) -> np.ndarray:
    """For each row block i, the columns of the column blocks not skipped: min(N, (floor(last_i/Bc) + 1) Bc)."""
    i = np.arange(cdiv(N, Br), dtype=np.int64)
    last_row = np.minimum(i * Br + Br, N) - 1
    return np.minimum(N, (last_row // Bc + 1) * Bc)


# ---------------------------------------------------------------------------------------------------------------
# Masks (iosim.algorithms.tile_masks). ``causal`` below is True / False or a TileMask. Dense and causal masks keep their
# O(N / B) sums; any other mask is summarised on the algorithm's own tiling by
# :func:`iosim.algorithms.tile_masks.tile_summary` (a sum over the tiles the mask leaves nonempty, never over N^2
# entries): R = sum of the heights of the nonempty tiles (rows streamed through a K/V-outer inner loop), C = sum
# of their widths (columns streamed through a Q-outer inner loop), and which row and column blocks have any
# nonempty tile. The policy (``paper`` / ``skip``) decides whether an all-empty block's outer operands are loaded.
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TileSums:
    """A mask on a Br x Bc tiling: the nonempty tiles, R, C, words (sum of their areas), nnz, their shapes
    (pairs (br, bc)), the heights of the all-empty row blocks and the widths of the all-empty column blocks."""

    tiles: int
    R: int
    C: int
    words: int
    nnz: int
    shapes: tuple[tuple[int, int], ...]
    empty_rows: tuple[int, ...]
    empty_cols: tuple[int, ...]
    full: int  # nonempty tiles the mask leaves full (the others are partial: an element test inside)


def _sizes(N: int, B: int) -> np.ndarray:
    T = cdiv(N, B)
    return np.minimum(B, N - np.arange(T, dtype=np.int64) * B)


def tile_sums(N: int, Br: int, Bc: int, causal) -> TileSums:
    """The tile summary of ``causal`` (True / False or a TileMask) on the Br x Bc tiling of N x N."""
    mask = _masks.resolve(causal, N)
    if mask.kind == _masks.DENSE:
        shapes = {
            (min(Br, N - i), min(Bc, N - j)) for i in (0, (cdiv(N, Br) - 1) * Br) for j in (0, (cdiv(N, Bc) - 1) * Bc)
        }
        Tr, Tc = cdiv(N, Br), cdiv(N, Bc)
        return TileSums(Tr * Tc, Tc * N, Tr * N, N * N, N * N, tuple(sorted(shapes)), (), (), Tr * Tc)
    sums, row_ne, col_ne = _masks.tile_summary(mask.kind, mask.params, mask.table, N, Br, Bc)
    last_r, last_c = N - (cdiv(N, Br) - 1) * Br, N - (cdiv(N, Bc) - 1) * Bc
    shapes = tuple(
        (last_r if bit & 2 else Br, last_c if bit & 1 else Bc) for bit in range(4) if int(sums[5]) & (1 << bit)
    )
    rs, cs = _sizes(N, Br), _sizes(N, Bc)
    return TileSums(
        int(sums[0]), int(sums[1]), int(sums[2]), int(sums[3]), int(sums[4]), shapes,
        tuple(int(x) for x in rs[~row_ne]), tuple(int(x) for x in cs[~col_ne]), int(sums[6]),
    )  # fmt: skip


def _is_structured_fast(causal) -> bool:
    """Dense and causal masks (the flag) keep the O(N / B) closed forms of the causal sums."""
    return not isinstance(causal, TileMask) or causal.kind == _masks.DENSE or causal.is_causal


def _kv_outer_pieces(N: int, d: int, Br: int, Bc: int, mask: TileMask, ws, empty_col_words: int) -> tuple:
    """A K/V-outer schedule (flash1's forward, both backward passes) on the mask's tile summary: (R, kv, peak) with
    R the rows streamed through the inner loop (sum of the nonempty tiles' heights), kv the rows of K (and V)
    loaded (``skip``: not those of the all-empty column blocks) and the peak: the largest nonempty tile's working
    set ``ws(d, br, bc)`` or an all-empty column block's words, ``empty_col_words`` per column of it under the
    policy (flash1 forward, paper: K_j, V_j; backward paper: K_j, V_j, dK_j, dV_j; flash2 backward skip: dK_j, dV_j)."""
    t = tile_sums(N, Br, Bc, mask)
    kv = N - (sum(t.empty_cols) if mask.policy == "skip" else 0)
    peak = max([ws(d, br, bc) for br, bc in t.shapes] + [empty_col_words * max(t.empty_cols, default=0)])
    return t.R, kv, peak


def flash1_forward(N: int, d: int, Br: int, Bc: int, causal: bool | TileMask = False) -> Prediction:
    """FlashAttention Algorithm 1. Non-causal: reads 2Nd + Tc(2Nd + 2N), writes Tc(Nd + 2N) + (Nd + 2N) init.

    Causal: every Tc term becomes a sum over column blocks j of the rows R_j its unskipped row blocks cover.
    Any other mask: Algorithm 5 (block-sparse) on the mask's tile summary (:func:`tile_sums`): K_j, V_j per loaded
    column block, Q_i, O_i, l_i, m_i per nonempty tile; ``skip`` leaves the all-empty column blocks unloaded.
    """
    if _is_structured_fast(causal):
        causal = _masks.resolve(causal, N).is_causal
        rows = int(_causal_rows_per_column_block(N, Br, Bc).sum()) if causal else cdiv(N, Bc) * N
        kv, peak = N, flash_working_set(d, min(Br, N), min(Bc, N))
    else:
        rows, kv, peak = _kv_outer_pieces(
            N, d, Br, Bc, causal, flash_working_set, 2 * d if causal.policy == "paper" else 0
        )
    return _pred(
        peak,
        Q=(rows * d, 0),
        K=(kv * d, 0),
        V=(kv * d, 0),
        O=(rows * d, rows * d + N * d, N * d),
        l=(rows, rows + N, N),
        m=(rows, rows + N, N),
    )


def flash2_forward(N: int, d: int, Br: int, Bc: int, causal: bool | TileMask = False) -> Prediction:
    """FlashAttention-2 forward. Non-causal: reads Nd + 2Nd Tr, writes Nd + N (O and L once).

    Causal: K and V are read once per row block for the columns C_i its unskipped column blocks cover.
    Any other mask: the same on the mask's tile summary (:func:`tile_sums`): K_j, V_j per nonempty tile (C columns
    in all), Q_i per loaded row block; O and L are written for every row (an all-empty row block under ``skip``:
    O_i = 0, L_i = -inf written without loading Q_i, with O_i, l_i, m_i resident).
    """
    q_rows, peak = N, flash_working_set(d, min(Br, N), min(Bc, N))
    if _is_structured_fast(causal):
        causal = _masks.resolve(causal, N).is_causal
        cols = int(_causal_cols_per_row_block(N, Br, Bc).sum()) if causal else cdiv(N, Br) * N
    else:
        t = tile_sums(N, Br, Bc, causal)
        skip = causal.policy == "skip"
        cols, q_rows = t.C, N - (sum(t.empty_rows) if skip else 0)
        br = max(t.empty_rows, default=0)  # an all-empty row block: O_i, l_i, m_i (and Q_i under paper)
        peak = max([flash_working_set(d, bi, bj) for bi, bj in t.shapes] + [br * d * (1 if skip else 2) + 2 * br])
    return _pred(peak, Q=(q_rows * d, 0), K=(cols * d, 0), V=(cols * d, 0), O=(0, N * d), L=(0, N))


def matmul_reads(m: int, k: int, n: int, T: int) -> tuple[int, int]:
    """Reads of the A (m x k) and B (k x n) operands in a square-tiled product with tile side T."""
    return m * k * cdiv(n, T), k * n * cdiv(m, T)


def matmul_peak(m: int, k: int, n: int, T: int) -> int:
    """Fast-memory words of a square-tiled product: accumulator plus one tile of each operand (first, full tiles)."""
    ti, tj, tk = min(T, m), min(T, n), min(T, k)
    return ti * tj + ti * tk + tk * tj


def softmax_rows(N: int, M: int, rows: int | None = None) -> int:
    """Rows per block of the one-pass softmax over rows of N columns (``rows`` rows in all, default N; 0 when a
    row does not fit and the two-pass sweep is used)."""
    return min(N if rows is None else rows, (M - 2) // N) if N + 2 <= M else 0


def softmax_peak(N: int, M: int, rows: int | None = None) -> int:
    R = softmax_rows(N, M, rows)
    return 2 + (R * N if R else min(M - 2, N))


def standard_forward(
    N: int, d: int, M: int, B: int, causal: bool = False, N_k: int | None = None, d_v: int | None = None
) -> Prediction:
    """Standard attention with tiled products (see algorithms/standard.py); the causal mask changes no count.

    Reads R(N,d,N) + N^2 (or 2N^2 when a row of S does not fit) + R(N,N,d); writes N^2 + N^2 + Nd. With N_q = N
    query rows against N_k keys and V, O of width d_v: R(N,d,N_k) + N N_k (or 2 N N_k) + R(N,N_k,d_v); writes
    2 N N_k + N d_v.
    """
    Nk = N if N_k is None else N_k
    dv = d if d_v is None else d_v
    q_reads, k_reads = matmul_reads(N, d, Nk, B)
    p_reads, v_reads = matmul_reads(N, Nk, dv, B)
    s_reads = N * Nk * (1 if softmax_rows(Nk, M, N) else 2)
    peak = max(matmul_peak(N, d, Nk, B), softmax_peak(Nk, M, N), matmul_peak(N, Nk, dv, B))
    return _pred(
        peak,
        Q=(q_reads, 0),
        K=(k_reads, 0),
        V=(v_reads, 0),
        S=(s_reads, N * Nk),
        P=(p_reads, N * Nk),
        O=(0, N * dv),
    )


def square_tiling_peak(N: int, d: int, B: int) -> int:
    """Fast-memory words of square tiling (forward and backward alike): a B x B accumulator, one B x B tile of each
    operand (the head-dimension slice is min(B, d) wide) and two length-B row statistics (m_i, l_i forward; L_i, D_i
    backward), at the first, full tile."""
    b, w = min(B, N), min(B, d)
    return b * b + 2 * b * w + 2 * b


def _square_masked_peak(N: int, d: int, B: int, mask: TileMask, backward: bool) -> int:
    """Square tiling's peak under a mask: the largest nonempty tile's phase-1 working set (m_i, l_i or L_i, D_i:
    2 b_i; the accumulator b_i b_j; one slice of each operand, (b_i + b_j) min(B, d)), or the work every row tile
    does whatever the mask: forward L_i and an O tile (b (1 + w)), backward L_i, D_i and the D pass's dO, O slices
    (2 b (1 + w))."""
    w, b0 = min(B, d), min(B, N)
    t = tile_sums(N, B, B, mask)
    base = 2 * b0 * (1 + w) if backward else b0 * (1 + w)
    return max([2 * bi + bi * bj + (bi + bj) * w for bi, bj in t.shapes] + [base])


def _square_tile_sums(N: int, B: int, causal) -> tuple[int, int, int, int]:
    """Sums over the unskipped tiles (i, j) of the N x N matrix (causal: j <= i), with b_i the height of row tile i.

    Returns (rows, cols, rows_of_cols, words): rows = sum_i b_i (number of unskipped j), cols = sum_i (columns of
    row tile i's unskipped tiles), rows_of_cols = sum_j (rows of column tile j's unskipped tiles), words = sum of
    b_i b_j over the unskipped tiles. O(N / B) terms, never O(N^2). Any other mask: its tile summary (square tiles:
    rows = rows_of_cols = R, cols = C).
    """
    if not _is_structured_fast(causal):
        t = tile_sums(N, B, B, causal)
        return t.R, t.C, t.R, t.words
    causal = _masks.resolve(causal, N).is_causal
    Tn = cdiv(N, B)
    i = np.arange(Tn, dtype=np.int64)
    b = np.minimum(B, N - i * B)
    if not causal:
        return N * Tn, N * Tn, N * Tn, N * N
    cols = np.minimum(N, (i + 1) * B)  # row tile i sees column tiles 0..i
    rows = N - i * B  # column tile j is seen by row tiles j..Tn-1
    return int((b * (i + 1)).sum()), int(cols.sum()), int(rows.sum()), int((b * cols).sum())


def square_tiling_forward(N: int, d: int, B: int, causal: bool | TileMask = False) -> Prediction:
    """Saha & Ye Algorithm 1, stable form (algorithms/square_tiling.py); Tn = ceil(N/B), Td = ceil(d/B).

    Non-causal: Q, K, V read Nd Tn each; S written N^2 and read N^2 Td; L written N and read N; O written Nd:
    3 Nd Tn + N^2 (1 + Td) + Nd + 2N, docs/theory.md S1 to the word. Causal: Q is read d b_i per unskipped tile (i, j),
    K and V d (columns of row tile i's unskipped tiles) per row tile, S written / read on the unskipped tiles only.
    """
    Td = cdiv(d, B)
    rows, cols, _, words = _square_tile_sums(N, B, causal)
    fast = _is_structured_fast(causal)
    return _pred(
        square_tiling_peak(N, d, B) if fast else _square_masked_peak(N, d, B, causal, backward=False),
        Q=(rows * d, 0),
        K=(cols * d, 0),
        V=(cols * d, 0),
        S=(words * Td, words),
        L=(N, N),
        O=(0, N * d),
    )


def square_tiling_backward(N: int, d: int, B: int, causal: bool | TileMask = False) -> Prediction:
    """The small-cache backward of algorithms/square_tiling.py (reads the forward's S); Tn = ceil(N/B), Td = ceil(d/B).

    Non-causal: 5 Nd Tn + 3 N^2 Td + 2 N^2 + N Tn Td + 5 Nd + N. Per array: O Nd and dO Nd (D); dO Nd Tn and V
    Nd Tn (dP_ij); S N^2 (rows of S_ij for dS) + N^2 Td (dV = exp(S - L)^T dO); L N + N Tn Td (per A tile of dV);
    dS written N^2, read 2 N^2 Td (dQ, dK); dO Nd Tn (dV), K Nd Tn (dQ), Q Nd Tn (dK); dQ, dK, dV written Nd each.
    Compare docs/theory.md B3, 7 Nd Tn + 3 N^2 Td + 3 N^2 + 2 N Tn + 5 Nd + N, which recomputes P from Q and K.
    Causal: the same sums over the unskipped tiles (row tiles i >= column tiles j).
    """
    Td = cdiv(d, B)
    rows, cols, rows_of_cols, words = _square_tile_sums(N, B, causal)
    fast = _is_structured_fast(causal)
    return _pred(
        square_tiling_peak(N, d, B) if fast else _square_masked_peak(N, d, B, causal, backward=True),
        Q=(rows_of_cols * d, 0),
        K=(cols * d, 0),
        V=(cols * d, 0),
        O=(N * d, 0),
        L=(N + rows_of_cols * Td, 0),
        S=(words + words * Td, 0),
        dO=(N * d + rows * d + rows_of_cols * d, 0),
        dS=(2 * words * Td, words),
        dQ=(0, N * d),
        dK=(0, N * d),
        dV=(0, N * d),
    )


# ---------------------------------------------------------------------------------------------------------------
# Backward passes of standard attention and FlashAttention 1/2 (algorithms/standard.py, algorithms/flash.py).
# Papers' forms for comparison (docs/theory.md): B0 = 7N^2 + 8Nd, B1 = 4Nd + Tc(5Nd + 2N) (+ 3Nd init),
# B2 = 6Nd + N + Tc(5Nd + 2N) (+ Nd init), or 6Nd + N + Tc(4Nd + 2N) with the redundant inner load of O_i
# dropped, which is what flash2's backward does.
# ---------------------------------------------------------------------------------------------------------------


def flash1_backward_working_set(d: int, Br: int, Bc: int) -> int:
    """Words resident in one inner step of FlashAttention's Algorithm 4.

    K_j, V_j, dK~_j, dV~_j (4 Bc d) + Q_i, O_i, dO_i, dQ_i (4 Br d) + l_i, m_i, D_i (3 Br) + S_ij/P_ij and
    dP_ij/dS_ij (2 Br Bc).
    """
    return 4 * d * (Bc + Br) + 3 * Br + 2 * Br * Bc


def flash2_backward_working_set(d: int, Br: int, Bc: int) -> int:
    """Words resident in one inner step of FlashAttention-2's backward (O_i not loaded).

    K_j, V_j, dK_j, dV_j (4 Bc d) + Q_i, dO_i, dQ_i (3 Br d) + L_i, D_i (2 Br) + S_ij/P_ij, dP_ij/dS_ij (2 Br Bc).
    The D pass before the loop holds dO_i, O_i, D_i (2 Br d + Br), always less.
    """
    return 4 * d * Bc + 3 * d * Br + 2 * Br + 2 * Br * Bc


def _backward_rows(N: int, Br: int, Bc: int, causal: bool) -> int:
    """Rows streamed through the inner loop in total: Tc N, or under the causal mask sum_j (N - floor(j Bc/Br) Br)."""
    return int(_causal_rows_per_column_block(N, Br, Bc).sum()) if causal else cdiv(N, Bc) * N


def flash1_backward(N: int, d: int, Br: int, Bc: int, causal: bool | TileMask = False) -> Prediction:
    """FlashAttention Algorithm 4. Non-causal, with R = Tc N rows streamed through the inner loop:

    reads  K, V: Nd each; Q, O, dO, dQ: R d each; l, m: R each          = 2Nd + Tc(4Nd + 2N)
    writes dQ: R d; dK, dV: Nd each; initialisation of dQ, dK, dV: 3Nd  = 2Nd + Tc Nd + 3Nd
    total 4Nd + Tc(5Nd + 2N) + 3Nd, i.e. docs/theory.md B1 with its initialisation term.
    Causal: R = sum over column blocks j of the rows N - floor(j Bc / Br) Br of its unskipped row blocks.
    Any other mask: R from the tile summary; K_j, V_j loaded and dK_j, dV_j written for every loaded column block
    (``skip``: the all-empty ones keep their zero initialisation, nothing loaded or written).
    """
    if _is_structured_fast(causal):
        R, kv = _backward_rows(N, Br, Bc, _masks.resolve(causal, N).is_causal), N
        peak = flash1_backward_working_set(d, min(Br, N), min(Bc, N))
    else:
        words = 4 * d if causal.policy == "paper" else 0
        R, kv, peak = _kv_outer_pieces(N, d, Br, Bc, causal, flash1_backward_working_set, words)
    Nd = N * d
    return _pred(
        peak,
        Q=(R * d, 0),
        K=(kv * d, 0),
        V=(kv * d, 0),
        O=(R * d, 0),
        dO=(R * d, 0),
        l=(R, 0),
        m=(R, 0),
        dQ=(R * d, R * d + Nd, Nd),
        dK=(0, kv * d + Nd, Nd),
        dV=(0, kv * d + Nd, Nd),
    )


def flash2_backward(N: int, d: int, Br: int, Bc: int, causal: bool | TileMask = False) -> Prediction:
    """FlashAttention-2 backward with D precomputed and the inner load of O_i dropped. Non-causal, R = Tc N:

    reads  O: Nd (D pass); dO: Nd + R d; K, V: Nd each; Q, dQ: R d each; L, D: R each  = 4Nd + Tc(3Nd + 2N)
    writes D: N; dQ: R d + Nd initialisation; dK, dV: Nd each                         = 2Nd + N + Tc Nd + Nd
    total 6Nd + N + Tc(4Nd + 2N) + Nd (docs/theory.md B2 without O_i in the inner loop, plus dQ's initialisation).
    Causal: R as in :func:`flash1_backward`; the D pass reads all of O and dO. Any other mask: R from the tile
    summary; dK_j, dV_j are always written (they are not initialised); ``skip`` writes an all-empty column block's
    zeros without loading K_j, V_j.
    """
    if _is_structured_fast(causal):
        R, kv = _backward_rows(N, Br, Bc, _masks.resolve(causal, N).is_causal), N
        peak = flash2_backward_working_set(d, min(Br, N), min(Bc, N))
    else:
        words = 4 * d if causal.policy == "paper" else 2 * d
        R, kv, peak = _kv_outer_pieces(N, d, Br, Bc, causal, flash2_backward_working_set, words)
        peak = max(peak, 2 * min(Br, N) * d + min(Br, N))  # the D pass: dO_i, O_i, D_i
    Nd = N * d
    return _pred(
        peak,
        Q=(R * d, 0),
        K=(kv * d, 0),
        V=(kv * d, 0),
        O=(Nd, 0),
        dO=(Nd + R * d, 0),
        L=(R, 0),
        D=(R, N),
        dQ=(R * d, R * d + Nd, Nd),
        dK=(0, Nd),
        dV=(0, Nd),
    )


def softmax_backward_rows(N: int, M: int) -> int:
    """Rows per block of the one-pass dS sweep (rows of P and dP together), 0 when the two-pass sweep is used."""
    return min(N, (M - 1) // (2 * N)) if 2 * N + 1 <= M else 0


def softmax_backward_peak(N: int, M: int) -> int:
    """D_i (1 word) + R rows of P and of dP, or one chunk of floor((M - 1)/2) columns of each."""
    R = softmax_backward_rows(N, M)
    return 1 + 2 * (R * N if R else min((M - 1) // 2, N))


def standard_backward(N: int, d: int, M: int, B: int, causal: bool = False) -> Prediction:
    """Standard attention backward (FlashAttention Algorithm 3) with square-tiled products; causal changes nothing.

    With R(m,k,n) = mk ceil(n/B) + kn ceil(m/B): reads R(N,N,d) [dV = P^T dO] + R(N,d,N) [dP = dO V^T]
    + 2N^2 (4N^2 when 2N + 1 > M) [dS] + 2 R(N,N,d) [dQ = dS K, dK = dS^T Q]; writes N^2 (dP) + N^2 (dS) + 3Nd.
    Total 3N^2 ceil(d/B) + 5Nd ceil(N/B) + 4N^2 (6N^2) + 3Nd; B >= max(N, d) gives docs/theory.md B0 = 7N^2 + 8Nd.
    """
    p1, do1 = matmul_reads(N, N, d, B)  # dV = P^T dO
    do2, v2 = matmul_reads(N, d, N, B)  # dP = dO V^T
    ds4, k4 = matmul_reads(N, N, d, B)  # dQ = dS K (dK = dS^T Q reads the same)
    sweep = N * N * (1 if softmax_backward_rows(N, M) else 2)  # reads of P and of dP in step 3
    peak = max(matmul_peak(N, N, d, B), matmul_peak(N, d, N, B), softmax_backward_peak(N, M))
    Nd = N * d
    return _pred(
        peak,
        Q=(k4, 0),
        K=(k4, 0),
        V=(v2, 0),
        P=(p1 + sweep, 0),
        dO=(do1 + do2, 0),
        dP=(sweep, N * N),
        dS=(2 * ds4, N * N),
        dQ=(0, Nd),
        dK=(0, Nd),
        dV=(0, Nd),
    )


# ---------------------------------------------------------------------------------------------------------------
# Whole problems (iosim.spec.problem.Problem): batch and heads, GQA per-head / packed, N_q != N_k with the bottom-right
# causal mask, split-KV with its combine step, paged KV, MLA shared / naive (algorithms/flash.py).
# Notation: G thread-block groups per key/value head (g per-head, 1 packed), R = N_q g / G rows per group,
# T_r = ceil(R / B_r), T_c = ceil(N_k / B_c), s splits of ceil(T_c / s) column blocks, P the page size. Every
# group is the same schedule, so the counts are groups = B H_kv G times one group's sums; the sums run over the
# row blocks and splits (T_r s terms) with the columns of a split's unskipped blocks in closed form, and over the
# page pieces of the column tiling (T_c + pages terms, vectorised) when the cache is paged.
# ---------------------------------------------------------------------------------------------------------------


def problem_working_set(dqk: int, dv: int, Br: int, Bc: int, shared: bool = False) -> int:
    """Words of one inner step over a problem: Q_i (Br d_qk), O_i (Br d_v), l_i, m_i (2 Br), K_j (Bc d_qk),
    V_j (Bc d_v; none under MLA shared, V read from the resident K_j) and S_ij (Br Bc). With d_qk = d_v = d and
    no sharing it is :func:`flash_working_set`."""
    return Br * (dqk + dv + 2) + Bc * (dqk + (0 if shared else dv)) + Br * Bc


def combine_working_set(dv: int, s: int, rows: int) -> int:
    """Words of the split-KV combine step on a block of ``rows`` rows: the s logsumexps (rows x s), O_i and one
    partial O tile (2 rows d_v) and L_i (rows)."""
    return rows * (s + 2 * dv + 1)


def _causal_hi(r0: int, br: int, Nq: int, off: int, Nk: int) -> int:
    """The keys [0, hi) the packed rows [r0, r0 + br) can see under the bottom-right causal mask: packed row r is
    query row r mod N_q and sees keys c <= r mod N_q + off; a block crossing a head boundary holds row N_q - 1."""
    q0 = r0 % Nq
    last = q0 + br - 1 if q0 + br <= Nq else Nq - 1
    return min(Nk, max(0, last + off + 1))


def _structured(p, mask) -> bool | None:
    """A problem's mask in closed form: None for a mask summarised tile by tile, else the causal flag (no mask or
    the dense one: False; the causal mask, the problem's field or given as a mask: True)."""
    if mask is None:
        return p.causal
    if mask.kind == _masks.DENSE or mask.is_causal:
        return mask.is_causal
    return None


def _paper(mask) -> bool:
    """Whether a problem's schedule loads a thread block's outer operand before testing the mask (policy paper;
    the causal field and policy skip load none for a block the mask empties)."""
    return mask is not None and mask.policy == "paper"


def _q_outer_blocks(p, R: int, Br: int, Bc: int, s: int, npieces, longest, mask):
    """For each row block i of a group's R packed rows and split k (ceil(T_c / s) column blocks each): (k, R_i, the
    nonempty tiles, their keys, their page pieces, their longest piece). Causal or none: the blocks before
    ceil(hi_i / B_c); any other mask: its tile summary (:func:`iosim.algorithms.tile_masks.q_outer_summary`)."""
    Tr, Tc = cdiv(R, Br), cdiv(p.N_k, Bc)
    off = p.N_k - p.N_q
    causal = _structured(p, mask)
    if causal is None:
        summary = _masks.q_outer_summary(*mask.args[:3], p.N_q, off, p.N_k, R, Br, Bc, s, npieces, longest)
    per_split = cdiv(Tc, s)
    pre = np.concatenate(([0], np.cumsum(npieces)))
    for i in range(Tr):
        r0 = i * Br
        br = min(Br, R - r0)
        j_end = cdiv(_causal_hi(r0, br, p.N_q, off, p.N_k), Bc) if causal else Tc
        for k in range(s):
            if causal is None:
                yield (k, br, *(int(x) for x in summary[i, k]))
                continue
            j0, j1 = k * per_split, min(j_end, (k + 1) * per_split)
            if j0 >= j1:
                yield k, br, 0, 0, 0, 0
            else:
                yield k, br, j1 - j0, min(j1 * Bc, p.N_k) - j0 * Bc, int(pre[j1] - pre[j0]), int(longest[j0:j1].max())


def _kv_outer_met(p, R: int, Br: int, starts, ends, mask) -> np.ndarray:
    """For each piece of keys [starts[t], ends[t]) of a K/V-outer schedule over a group's R packed rows: (row blocks
    that see a key of it, their rows, the widest). Causal or none: the row blocks i with starts[t] < hi_i; any
    other mask: its tile summary (:func:`iosim.algorithms.tile_masks.kv_outer_summary`)."""
    off = p.N_k - p.N_q
    causal = _structured(p, mask)
    if causal is None:
        return _masks.kv_outer_summary(*mask.args[:3], starts, ends, p.N_q, off, R, Br)
    n = len(starts)
    count, rows, widest = np.zeros(n + 1, np.int64), np.zeros(n + 1, np.int64), np.zeros(n, np.int64)
    for i in range(cdiv(R, Br)):  # row block i meets the pieces [0, met): differences, summed below
        r0 = i * Br
        br = min(Br, R - r0)
        met = int(np.searchsorted(starts, _causal_hi(r0, br, p.N_q, off, p.N_k), side="left")) if causal else n
        count[0] += 1
        count[met] -= 1
        rows[0] += br
        rows[met] -= br
        if met:
            widest[met - 1] = max(widest[met - 1], br)
    widest = np.maximum.accumulate(widest[::-1])[::-1]  # the widest block among those meeting piece t or later
    return np.stack([np.cumsum(count)[:n], np.cumsum(rows)[:n], widest], axis=1)


def _pieces(Nk: int, Bc: int, P: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The column tiling cut at page boundaries: for each column block j, its number of pieces, its longest piece;
    and the starts of all pieces in order (P = 0: one piece per block)."""
    Tc = cdiv(Nk, Bc)
    c0 = np.arange(Tc, dtype=np.int64) * Bc
    c1 = np.minimum(c0 + Bc, Nk)
    if not P:
        return np.ones(Tc, dtype=np.int64), c1 - c0, c0
    n = (c1 - 1) // P - c0 // P + 1
    first = np.minimum(c1, (c0 // P + 1) * P) - c0  # the first piece; the middle ones are P; the last ends at c1
    last = c1 - np.maximum(c0, ((c1 - 1) // P) * P)
    longest = np.where(n == 1, c1 - c0, np.maximum(np.maximum(first, last), np.where(n > 2, P, 0)))
    bounds = np.union1d(np.arange(0, Nk, P, dtype=np.int64), c0)
    return n, longest, bounds


@dataclass(frozen=True)
class ProblemPrediction(Prediction):
    """A problem's prediction: the counts, the peak and the thread blocks the schedule launches."""

    thread_blocks: int = 0


def split_combine(Rtot: int, dv: int, s: int, rows: int) -> ProblemPrediction:
    """Split-KV's combine kernel over Rtot rows of s partials (algorithms/flash.py), in blocks of ``rows``: Lpart read
    s Rtot, Opart read s Rtot d_v, O and L written Rtot (d_v + 1); peak one block's working set; ceil(Rtot / rows)
    thread blocks."""
    bm = min(rows, Rtot)
    pred = _pred(combine_working_set(dv, s, bm), Opart=(s * Rtot * dv, 0), Lpart=(s * Rtot, 0), O=(0, Rtot * dv),
                 L=(0, Rtot))  # fmt: skip
    return ProblemPrediction(pred.per_array, pred.peak, cdiv(Rtot, bm))


def flash2_problem(p, Br: int, Bc: int, gqa: str = "per-head", splits: int = 1, mla: str = "shared",
                   combine_rows: int | None = 1, mask: TileMask | None = None) -> ProblemPrediction:  # fmt: skip
    """FlashAttention-2's forward over a problem (algorithms/flash.py), per group of R rows:

    for each row block i (R_i rows) and split k: the nonempty tiles among the split's column blocks (causal: those
    before ceil(hi_i / B_c), keys [0, hi_i) possible; any other ``mask``, a TileMask over N_k x N_k whose last N_q
    rows are the queries': its tile summary). If there is one, Q reads R_i d_qk; K reads C d_qk and V C d_v (none
    under MLA shared) with C the keys of those tiles; the page table one word per page piece of them. Every split
    writes O and L (s = 1) or Opart and Lpart (s > 1), R_i d_v and R_i words. Times groups = B H_kv G. Split-KV
    adds the combine step: Lpart read s B H_q N_q, Opart read s B H_q N_q d_v, O and L written B H_q N_q (d_v + 1).
    Peak: the largest inner step, R_i (d_qk + d_v + 2) + n (d_qk + d_v') + R_i n for the longest piece n of a
    split's nonempty tiles, or a split with none (O_i, l_i, m_i), or the combine step's block
    (:func:`split_combine`; ``combine_rows`` None: the split kernel alone, its combine counted apart).
    """
    _, groups, R = p.groups(gqa)
    s, P = int(splits), p.page_size or 0
    shared = p.latent and mla == "shared"
    dv_load = 0 if shared else p.d_v
    Tr = cdiv(R, Br)
    npieces, longest, _ = _pieces(p.N_k, Bc, P)
    q = kv = table = out_rows = 0
    peak = 0
    paper = _paper(mask)
    per_split = cdiv(cdiv(p.N_k, Bc), s)
    for k, br, tiles, keys, pieces, n in _q_outer_blocks(p, R, Br, Bc, s, npieces, longest, mask):
        out_rows += br
        if not tiles:  # O = 0, lse = -inf written; paper: Q_i loaded first if the split has a column block
            loaded = paper and k * per_split < cdiv(p.N_k, Bc)
            q += br if loaded else 0
            peak = max(peak, br * (p.d_v + 2 + (p.d_qk if loaded else 0)))
            continue
        q += br
        kv += keys
        table += pieces if P else 0
        peak = max(peak, problem_working_set(p.d_qk, p.d_v, br, n, shared))
    Rtot = p.B * p.H_q * p.N_q
    arrays = {
        "Q": (groups * q * p.d_qk, 0),
        "K": (groups * kv * p.d_qk, 0),
        "V": (groups * kv * dv_load, 0),
        "page_table": (groups * table, 0),
    }
    blocks = groups * Tr * s
    if s == 1:
        arrays.update(O=(0, groups * out_rows * p.d_v), L=(0, groups * out_rows))
    else:
        arrays.update(Opart=(0, groups * out_rows * p.d_v), Lpart=(0, groups * out_rows))
    pred = _pred(peak, **arrays)
    split = ProblemPrediction(pred.per_array, pred.peak, blocks)
    if s == 1 or combine_rows is None:
        return split
    return sum_predictions([split, split_combine(Rtot, p.d_v, s, combine_rows)])


def flash1_problem(p, Br: int, Bc: int, gqa: str = "per-head", mla: str = "shared",
                   mask: TileMask | None = None, gather: bool = False) -> ProblemPrediction:  # fmt: skip
    """FlashAttention Algorithm 1 over a problem (algorithms/flash.py), per group of R rows: for each page piece
    (a column block when contiguous) of n keys and each row block i whose tile with it is nonempty (causal: the
    piece starts before hi_i; any other ``mask``: its tile summary): Q_i, O_i read (R_i d_qk, R_i d_v), l_i, m_i
    read, O_i, l_i, m_i written. A piece some row block sees is loaded once: K n d_qk, V n d_v (none under MLA
    shared), one page-table word. Times groups; plus the initialisation of O, l, m (B H_q N_q (d_v + 2)).
    Peak: the largest inner step, the widest row block that meets a piece with that piece. ``gather`` (paged): the
    outer steps are the column blocks, each gathered from its pages (one table word per page piece of a loaded
    block): the contiguous cache's counts plus the table words."""
    _, groups, R = p.groups(gqa)
    P = p.page_size or 0
    shared = p.latent and mla == "shared"
    dv_load = 0 if shared else p.d_v
    npieces, _, starts = _pieces(p.N_k, Bc, P)
    if gather:
        starts = np.arange(0, p.N_k, Bc, dtype=np.int64)
    ends = np.append(starts[1:], p.N_k)
    lengths = ends - starts
    met = _kv_outer_met(p, R, Br, starts, ends, mask)
    seen = (met[:, 0] > 0) | _paper(mask)  # paper: every piece loaded before the mask is tested
    rows, keys = int(met[:, 1].sum()), int(lengths[seen].sum())
    w, n = met[met[:, 0] > 0, 2], lengths[met[:, 0] > 0]
    steps = problem_working_set(p.d_qk, p.d_v, w, n, shared)  # piece by piece (arrays)
    peak = max(int(steps.max(initial=0)), int(lengths[seen].max(initial=0)) * (p.d_qk + dv_load) + (1 if P else 0))
    Rtot = p.B * p.H_q * p.N_q
    pred = _pred(
        peak,
        Q=(groups * rows * p.d_qk, 0),
        K=(groups * keys * p.d_qk, 0),
        V=(groups * keys * dv_load, 0),
        page_table=(groups * int((npieces[seen] if gather else seen).sum()) if P else 0, 0),
        O=(groups * rows * p.d_v, groups * rows * p.d_v + Rtot * p.d_v, Rtot * p.d_v),
        l=(groups * rows, groups * rows + Rtot, Rtot),
        m=(groups * rows, groups * rows + Rtot, Rtot),
    )
    return ProblemPrediction(pred.per_array, pred.peak, groups)


def flash2_backward_problem_working_set(dqk: int, dv: int, Br: int, Bc: int) -> int:
    """Words of one inner step of FlashAttention-2's backward over a problem: K_j, dK_j (2 Bc d_qk), V_j, dV_j
    (2 Bc d_v), Q_i, dQ_i (2 Br d_qk), dO_i (Br d_v), L_i, D_i (2 Br), S_ij/P_ij and dP_ij/dS_ij (2 Br Bc). With
    d_qk = d_v = d it is :func:`flash2_backward_working_set`."""
    return 2 * Bc * (dqk + dv) + Br * (2 * dqk + dv + 2) + 2 * Br * Bc


def flash1_backward_problem_working_set(dqk: int, dv: int, Br: int, Bc: int) -> int:
    """Words of one inner step of Algorithm 4 over a problem: K_j, dK_j (2 Bc d_qk), V_j, dV_j (2 Bc d_v), Q_i, dQ_i
    (2 Br d_qk), O_i, dO_i (2 Br d_v), l_i, m_i, D_i (3 Br), S_ij, dP_ij (2 Br Bc). With d_qk = d_v = d it is
    :func:`flash1_backward_working_set`."""
    return 2 * Bc * (dqk + dv) + 2 * Br * (dqk + dv) + 3 * Br + 2 * Br * Bc


def _backward_problem_rows(p, Br: int, Bc: int, gqa: str, mask=None) -> tuple[int, int, int, np.ndarray, int]:
    """(G, groups, rho, tiles, seen): rho = the rows streamed past the column blocks per group, the sum over the
    nonempty tiles (i, j) of R_i (causal: c_j < hi_i; K/V outer); tiles = for each column block with a nonempty tile,
    (the largest R_i of its nonempty tiles, its width b_j): the shapes the peak is the largest working set of (a
    mask that leaves only the short last column block visible peaks at that block's width, not B_c); seen = the
    keys of the column blocks some row sees (K_j, V_j loaded; N_k unless a mask leaves a column block unseen)."""
    G, groups, R = p.groups(gqa)
    starts = np.arange(0, p.N_k, Bc, dtype=np.int64)
    ends = np.minimum(starts + Bc, p.N_k)
    met = _kv_outer_met(p, R, Br, starts, ends, mask)
    seen = (met[:, 0] > 0) | _paper(mask)  # paper: K_j, V_j loaded before the mask is tested
    tiles = np.stack([met[:, 2], ends - starts], axis=1)[met[:, 2] > 0]
    return G, groups, int(met[:, 1].sum()), tiles, int((ends - starts)[seen].sum())


def _backward_problem_kv(p, G: int, groups: int, Bc: int, init: bool, stored: int) -> tuple[dict, int]:
    """dK, dV (and the expanded dKpart, dVpart of per-head GQA with their group sum) and the sum's peak; ``stored``
    keys per group are written by the loop (the others keep the initialisation's zeros)."""
    kvrows, kv_out = groups * stored, p.B * p.H_kv * p.N_k
    if G == 1:
        n = kv_out if init else 0
        return {
            "dK": (0, kvrows * p.d_qk + n * p.d_qk, n * p.d_qk),
            "dV": (0, kvrows * p.d_v + n * p.d_v, n * p.d_v),
        }, 0
    n = groups * p.N_k if init else 0
    summed, peak = group_sum(p, Bc)
    arrays = {
        "dKpart": (summed["dKpart"][0], kvrows * p.d_qk + n * p.d_qk, n * p.d_qk),
        "dVpart": (summed["dVpart"][0], kvrows * p.d_v + n * p.d_v, n * p.d_v),
        "dK": summed["dK"],
        "dV": summed["dV"],
    }
    return arrays, peak


def group_sum_rows(p, M: int) -> int:
    """Keys per step of a group sum that fits M: an accumulator and one partial of R x max(d_qk, d_v) words."""
    return max(1, min(p.N_k, M // (2 * max(p.d_qk, p.d_v))))


def group_sum(p, rows: int) -> tuple[dict, int]:
    """The GQA backward's group sum (algorithms/flash.py ``sum_group``: per key/value head and block of ``rows``
    keys, the g partials read one after another into a resident accumulator, the sum written once): dKpart,
    dVpart read once (B H_q N_k d_qk, d_v words), dK, dV written once (B H_kv N_k d_qk, d_v); peak an accumulator
    and one partial of the wider array. Returns ({array: (reads, writes)}, peak)."""
    q, k = p.B * p.H_q * p.N_k, p.B * p.H_kv * p.N_k
    arrays = {"dKpart": (q * p.d_qk, 0), "dVpart": (q * p.d_v, 0), "dK": (0, k * p.d_qk), "dV": (0, k * p.d_v)}
    return arrays, 2 * min(rows, p.N_k) * max(p.d_qk, p.d_v)


def flash2_backward_problem(
    p, Br: int, Bc: int, gqa: str = "per-head", mask: TileMask | None = None
) -> ProblemPrediction:
    """FlashAttention-2's backward over a problem (algorithms/flash.py), per group of R rows (groups = B H_kv G):

    K_j, V_j read once per group (N_k d_qk, N_k d_v); for each column block j (starting at key c_j) and each row
    block i (R_i rows) with c_j < hi_i (some row sees a key of the block): Q_i, dQ_i read (R_i d_qk each), dO_i
    read (R_i d_v), L_i, D_i read (R_i each), dQ_i written (R_i d_qk). With rho = the sum of those R_i over
    (i, j), per group. Before the loop, over all B H_q N_q = R_tot rows: dQ initialised (R_tot d_qk), D pass
    reading O and dO (R_tot d_v each) and writing D (R_tot). dK_j, dV_j written once per group (N_k d_qk, N_k d_v):
    to dK, dV (``packed``, or g = 1) or to the expanded dKpart, dVpart (``per-head``, g > 1), then the group sum
    reads dKpart, dVpart (B H_q N_k (d_qk, d_v)) and writes dK, dV (B H_kv N_k (d_qk, d_v)).
    A one-head problem with N_q = N_k and d_qk = d_v is :func:`flash2_backward` word for word.
    """
    G, groups, rows, tiles, seen = _backward_problem_rows(p, Br, Bc, gqa, mask)
    Rtot = p.B * p.H_q * p.N_q
    peak = max((flash2_backward_problem_working_set(p.d_qk, p.d_v, int(w), int(n)) for w, n in tiles), default=0)
    br0 = min(Br, Rtot)
    alone = min(Bc, p.N_k) * (p.d_qk + p.d_v) * (2 if _paper(mask) else 1)  # a column block no row sees
    peak = max(peak, 2 * br0 * p.d_v + br0, alone)  # the D pass; dK_j, dV_j (paper: and K_j, V_j) alone
    kv, sum_peak = _backward_problem_kv(p, G, groups, Bc, init=False, stored=p.N_k)
    pred = _pred(
        max(peak, sum_peak),
        Q=(groups * rows * p.d_qk, 0),
        K=(groups * seen * p.d_qk, 0),
        V=(groups * seen * p.d_v, 0),
        O=(Rtot * p.d_v, 0),
        dO=(Rtot * p.d_v + groups * rows * p.d_v, 0),
        L=(groups * rows, 0),
        D=(groups * rows, Rtot),
        dQ=(groups * rows * p.d_qk, groups * rows * p.d_qk + Rtot * p.d_qk, Rtot * p.d_qk),
        **kv,
    )
    Tc = cdiv(p.N_k, Bc)
    return ProblemPrediction(pred.per_array, pred.peak, groups * Tc + (2 * p.B * p.H_kv * Tc if G > 1 else 0))


def flash1_backward_problem(
    p, Br: int, Bc: int, gqa: str = "per-head", mask: TileMask | None = None
) -> ProblemPrediction:
    """FlashAttention's Algorithm 4 over a problem: the rows rho of :func:`flash2_backward_problem`, with Q_i, O_i,
    dO_i, dQ_i read (R_i d_qk, R_i d_v, R_i d_v, R_i d_qk), l_i, m_i read (R_i each) and dQ_i written per inner
    step, no D pass (D_i computed on chip), and dQ and the arrays the loop writes dK_j, dV_j into (dK, dV, or
    the expanded dKpart, dVpart) zero-initialised in HBM. A one-head problem with N_q = N_k and d_qk = d_v is
    :func:`flash1_backward` word for word."""
    G, groups, rows, tiles, seen = _backward_problem_rows(p, Br, Bc, gqa, mask)
    Rtot = p.B * p.H_q * p.N_q
    peak = max((flash1_backward_problem_working_set(p.d_qk, p.d_v, int(w), int(n)) for w, n in tiles), default=0)
    peak = max(peak, min(Bc, p.N_k) * (p.d_qk + p.d_v) * (2 if _paper(mask) else 1))  # a column block no row sees
    kv, sum_peak = _backward_problem_kv(p, G, groups, Bc, init=True, stored=seen)
    pred = _pred(
        max(peak, sum_peak),
        Q=(groups * rows * p.d_qk, 0),
        K=(groups * seen * p.d_qk, 0),
        V=(groups * seen * p.d_v, 0),
        O=(groups * rows * p.d_v, 0),
        dO=(groups * rows * p.d_v, 0),
        l=(groups * rows, 0),
        m=(groups * rows, 0),
        dQ=(groups * rows * p.d_qk, groups * rows * p.d_qk + Rtot * p.d_qk, Rtot * p.d_qk),
        **kv,
    )
    Tc = cdiv(p.N_k, Bc)
    return ProblemPrediction(pred.per_array, pred.peak, groups * Tc + (2 * p.B * p.H_kv * Tc if G > 1 else 0))


def square_tiling_rect_peak(Nq: int, Nk: int, dqk: int, dv: int, B: int) -> int:
    """Square tiling's working set on N_q x N_k (no mask), at the first tile: phase 1 m_i, l_i (2 b_i), the
    accumulator b_i b_j and one slice of Q and K ((b_i + b_j) min(B, d_qk)); phase 2 L_i, the O tile, A_ik and a V
    tile (b_i + b_i b_j + (b_i + b_j) min(B, d_v)). With N_q = N_k and d_qk = d_v: :func:`square_tiling_peak`."""
    bi, bj, w, wv = min(B, Nq), min(B, Nk), min(B, dqk), min(B, dv)
    return max(2 * bi + bi * bj + (bi + bj) * w, bi + bi * bj + (bi + bj) * wv)


def heads_problem(one: Prediction, heads: int) -> Prediction:
    """A problem whose heads run one after another, each its own one-head schedule (standard attention and square
    tiling over batch and heads, GQA ``per-head``: each query head reads its key/value head's K and V itself):
    every array's counts times the B H_q heads; the peak is one head's, since a head frees its tiles before the
    next starts."""
    per = {n: ArrayCounts(c.reads * heads, c.writes * heads, c.init_writes * heads) for n, c in one.per_array.items()}
    return Prediction(per, one.peak)


def sum_predictions(parts: list) -> Prediction:
    """Parts of a problem run one after another, each its own schedule (a mask that differs per (b, h),
    :mod:`iosim.masking.head_masks`): every array's counts the parts' sums, the peak the largest part's (a part frees
    its
    tiles before the next starts), the thread blocks the parts' sum."""
    per: dict[str, ArrayCounts] = {}
    for one in parts:
        for n, c in one.per_array.items():
            t = per.get(n, ArrayCounts())
            per[n] = ArrayCounts(t.reads + c.reads, t.writes + c.writes, t.init_writes + c.init_writes)
    peak = max(one.peak for one in parts)
    if all(isinstance(one, ProblemPrediction) for one in parts):
        return ProblemPrediction(per, peak, sum(one.thread_blocks for one in parts))
    return Prediction(per, peak)


def square_tiling_problem(p, B: int, mask=None) -> Prediction:
    """Square tiling's forward on one head of N_q rows against N_k keys, widths d_qk and d_v (algorithms/
    square_tiling.py), under the problem's mask (causal bottom-right, or a TileMask over the N_k x N_k sequence
    whose last N_q rows are the queries'). Row tile i (b_i rows) meets n_i nonempty tiles of K_i keys in all (no
    mask: n_i = ceil(N_k / B), K_i = N_k; causal: the tiles before ceil(hi_i / B), hi_i = min(N_k, r_i + N_k -
    N_q + 1) for its last row r_i; any other mask: its tile summary, :func:`_q_outer_blocks` with B_r = B_c = B).
    Q reads b_i d_qk and K b_j d_qk per nonempty tile (sum_i b_i n_i d_qk, sum_i K_i d_qk); S written on the
    nonempty tiles (W = sum_i b_i K_i) and read ceil(d_v / B) times in phase 2, with V read K_i d_v per row tile;
    L written and read N_q; O written N_q d_v. Peak: the largest nonempty tile's working set (phase 1: m_i, l_i, the
    S tile, a slice of Q and of K; phase 2: L_i, the O tile, an A tile and a V tile), or an empty row tile's m_i,
    l_i (2 b_i) and its phase 2 (L_i, an O tile)."""
    Nq, Nk, dqk, dv = p.N_q, p.N_k, p.d_qk, p.d_v
    Tk = cdiv(Nk, B)
    widths = np.minimum(B, Nk - np.arange(Tk, dtype=np.int64) * B)  # b_j: the widest nonempty tile of a row tile
    w, wv = min(B, dqk), min(B, dv)
    rows = colsum = words = peak = 0
    for _, bi, n, keys, _, bj in _q_outer_blocks(p, Nq, B, B, 1, np.ones(Tk, np.int64), widths, mask):
        rows, colsum, words = rows + bi * n, colsum + keys, words + bi * keys
        if n:
            peak = max(peak, 2 * bi + bi * bj + (bi + bj) * w, bi + bi * bj + (bi + bj) * wv)
        else:
            peak = max(peak, 2 * bi, bi * (1 + wv))
    return _pred(
        peak,
        Q=(rows * dqk, 0),
        K=(colsum * dqk, 0),
        V=(colsum * dv, 0),
        S=(words * cdiv(dv, B), words),
        L=(Nq, Nq),
        O=(0, Nq * dv),
    )


# ---------------------------------------------------------------------------------------------------------------
# Sparse attention by top-k indices (algorithms/topk_sparse.py): words from the selections themselves.
# ---------------------------------------------------------------------------------------------------------------
TOPK_POLICIES = ("per-query", "group", "gqa", "gather")


def topk_index_rows(indices_shape: tuple, dims: tuple, q_block: int) -> np.ndarray:
    """The row of the index array (flattened to (B' H' T_q, k)) each query row (b, h, r) reads, shape (B, H_q, N_q):
    batch b (or 0 when B' = 1), head h (H' = H_q), its key/value head h // g (H' = H_kv) or 0 (H' = 1), and
    selection r // q_block (MoBA: one selection per block of q_block queries)."""
    B, H_q, H_kv, N_q = dims[:4]
    Bm, Hm, Tq = indices_shape[:3]
    g = H_q // H_kv
    b = np.arange(B, dtype=np.int64)[:, None, None]
    h = np.arange(H_q, dtype=np.int64)[None, :, None]
    r = np.arange(N_q, dtype=np.int64)[None, None, :]
    ib = b if Bm == B else 0 * b
    ih = h if Hm == H_q else (h // g if Hm == H_kv else 0 * h)
    return np.broadcast_to((ib * Hm + ih) * Tq + r // q_block, (B, H_q, N_q))


def topk_programs(policy: str, group: int, dims: tuple) -> np.ndarray:
    """The program (thread block) each query row (b, h, r) belongs to, shape (B, H_q, N_q): ``per-query`` one per
    row of each head, ``group`` one per ``group`` consecutive rows of a head, ``gqa`` and ``gather`` one per
    (b, key/value head, r), holding that position's g query heads."""
    B, H_q, H_kv, N_q = dims[:4]
    g = H_q // H_kv
    b = np.arange(B, dtype=np.int64)[:, None, None]
    h = np.arange(H_q, dtype=np.int64)[None, :, None]
    r = np.arange(N_q, dtype=np.int64)[None, None, :]
    if policy == "per-query":
        pid = (b * H_q + h) * N_q + r
    elif policy == "group":
        pid = (b * H_q + h) * cdiv(N_q, group) + r // group
    else:
        pid = (b * H_kv + h // g) * N_q + r
    return np.broadcast_to(pid, (B, H_q, N_q))


def topk_sparse(policy: str, group: int, indices: np.ndarray, dims: tuple, block: int, q_block: int, shared: bool,
                Bc: int = 64, causal: bool = False) -> Prediction:  # fmt: skip
    """The exact count of the top-k sparse schedule. ``indices`` (B', H', T_q, k) selects, for each query row, k
    blocks of ``block`` keys (block c_j = min(block, N_k - j block) keys wide; a negative entry, -1, selects none);
    dims = (B, H_q, H_kv, N_q, N_k, d_qk, d_v). Program p holds R_p query rows, reads D_p distinct index rows and
    loads the union U_p of their blocks; under ``causal`` (query row r at position r + N_k - N_q) U_p holds only the
    blocks with j block <= the largest position among its rows (whole blocks: the keys after a row are masked, not
    left unloaded):

    * Q: B H_q N_q d_qk reads; O: B H_q N_q d_v writes; L: B H_q N_q writes;
    * indices: k sum_p D_p reads; K: d_qk sum_p sum_{j in U_p} c_j; V: the same with d_v (none when ``shared``, MLA's
      latent: V is inside K);
    * ``gather``: the same K, V and index reads (the gather kernel), and the workspace Kws (Vws) written and read
      back once: d_qk (d_v) sum_p sum_{j in U_p} c_j each way;
    * peak: max_p R_p (d_qk + d_v + 2) + D_p k + max_{j in U_p} c_j (d_qk + d_v' + R_p), d_v' = 0 when shared;
      ``gather``: max_p of D_p k + max_j c_j max(d_qk, d_v') (gathering) and R_p (d_qk + d_v + 2) + n_p (d_qk + d_v'
      + R_p), n_p = min(Bc, sum_{U_p} c_j) (the first workspace tile)."""
    B, H_q, _, N_q, N_k, d_qk, d_v = dims
    k = indices.shape[3]
    nblk = cdiv(N_k, block)
    irow = topk_index_rows(indices.shape, dims, q_block).ravel()
    pid = topk_programs(policy, group, dims).ravel()
    P = int(pid.max()) + 1
    n_irows = int(irow.max()) + 1
    pairs = np.unique(pid * n_irows + irow)  # (program, index row) pairs: the rows each program reads
    sel = indices.reshape(-1, k)[pairs % n_irows]  # their selected blocks
    last = np.full(P, N_k, dtype=np.int64)  # each program's last position (N_k: every block)
    if causal:
        last[:] = -(1 << 62)
        np.maximum.at(last, pid, np.broadcast_to(np.arange(N_q) + N_k - N_q, (B, H_q, N_q)).ravel())
    seen = (sel >= 0) & (sel * block <= last[pairs // n_irows][:, None])
    keys = np.unique(((pairs // n_irows)[:, None] * nblk + sel)[seen])  # (program, block) pairs of the unions
    up, ub = keys // nblk, keys % nblk
    c = np.minimum(block, N_k - ub * block)
    R = np.bincount(pid, minlength=P)
    D = np.bincount(pairs // n_irows, minlength=P)
    width = np.bincount(up, weights=c, minlength=P).astype(np.int64)  # sum_{U_p} c_j
    cmax = np.zeros(P, dtype=np.int64)
    np.maximum.at(cmax, up, c)
    rows = B * H_q * N_q
    dvs = 0 if shared else d_v
    arrays = dict(Q=(rows * d_qk, 0), K=(int(width.sum()) * d_qk, 0), V=(int(width.sum()) * dvs, 0),
                  O=(0, rows * d_v), L=(0, rows), indices=(int(D.sum()) * k, 0))  # fmt: skip
    start = R * (d_qk + d_v + 2)
    if policy == "gather":
        arrays.update(Kws=(int(width.sum()) * d_qk, int(width.sum()) * d_qk), Vws=(int(width.sum()) * dvs,) * 2)
        gathering = D * k + cmax * max(d_qk, dvs)
        attending = start + np.minimum(Bc, width) * (d_qk + dvs + R)
        peak = int(max(gathering.max(), attending.max()))
    else:
        peak = int((start + D * k + cmax * (d_qk + dvs + R)).max())
    return _pred(peak, **arrays)

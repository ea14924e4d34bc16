"""Exact closed-form I/O counts of every algorithm's schedule, per array, to the word.

Each function here is derived by hand from the loop nest of the matching driver in ``algorithms/`` under the
conventions of :mod:`memory_model.core` (one word per entry, initialisation writes counted, partial final tiles
at their true size). The tests require simulated counts == these formulas on grids with ragged N, so a change to
a schedule without a change here fails loudly. Causal variants are exact finite sums over the Tc (or Tr) blocks
of the skipped dimension: O(N / B) terms, never O(N^2).

Notation: N rows, d head dimension, Br x Bc blocks, Tr = ceil(N/Br), Tc = ceil(N/Bc), B the square tile side.
The papers' forms for comparison (../shared/spec/papers.md section 6): F1 = 2Nd + Tc(3Nd + 4N) (+ Nd + 2N
init), F2 = 2Nd(1 + Tr) + N, S0 = R(N,d,N) + N^2 + 2N^2 + R(N,N,d) + Nd with R(m,k,n) = mk ceil(n/B) + kn ceil(m/B).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from memory_model.core import ArrayCounts


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Prediction:
    """Predicted counts: per-array reads / writes / init writes and the peak fast-memory words."""

    per_array: dict[str, ArrayCounts] = field(default_factory=dict)
    peak: int = 0

    @property
    def reads(self) -> int:
        return sum(c.reads for c in self.per_array.values())

    @property
    def writes(self) -> int:
        return sum(c.writes for c in self.per_array.values())

    @property
    def total(self) -> int:
        return self.reads + self.writes

    @property
    def init_writes(self) -> int:
        return sum(c.init_writes for c in self.per_array.values())


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


def flash1_forward(N: int, d: int, Br: int, Bc: int, causal: bool = False) -> Prediction:
    """FlashAttention Algorithm 1. Non-causal: reads 2Nd + Tc(2Nd + 2N), writes Tc(Nd + 2N) + (Nd + 2N) init.

    Causal: every Tc term becomes a sum over column blocks j of the rows R_j its unskipped row blocks cover.
    """
    rows = int(_causal_rows_per_column_block(N, Br, Bc).sum()) if causal else cdiv(N, Bc) * N
    peak = flash_working_set(d, min(Br, N), min(Bc, N))
    return _pred(
        peak,
        Q=(rows * d, 0),
        K=(N * d, 0),
        V=(N * d, 0),
        O=(rows * d, rows * d + N * d, N * d),
        l=(rows, rows + N, N),
        m=(rows, rows + N, N),
    )


def flash2_forward(N: int, d: int, Br: int, Bc: int, causal: bool = False) -> Prediction:
    """FlashAttention-2 forward. Non-causal: reads Nd + 2Nd Tr, writes Nd + N (O and L once).

    Causal: K and V are read once per row block for the columns C_i its unskipped column blocks cover.
    """
    cols = int(_causal_cols_per_row_block(N, Br, Bc).sum()) if causal else cdiv(N, Br) * N
    peak = flash_working_set(d, min(Br, N), min(Bc, N))
    return _pred(peak, Q=(N * d, 0), K=(cols * d, 0), V=(cols * d, 0), O=(0, N * d), L=(0, N))


def matmul_reads(m: int, k: int, n: int, T: int) -> tuple[int, int]:
    """Reads of the A (m x k) and B (k x n) operands in a square-tiled product with tile side T."""
    return m * k * cdiv(n, T), k * n * cdiv(m, T)


def matmul_peak(m: int, k: int, n: int, T: int) -> int:
    """Fast-memory words of a square-tiled product: accumulator plus one tile of each operand (first, full tiles)."""
    ti, tj, tk = min(T, m), min(T, n), min(T, k)
    return ti * tj + ti * tk + tk * tj


def softmax_rows(N: int, M: int) -> int:
    """Rows per block of the one-pass softmax (0 when a row does not fit and the two-pass sweep is used)."""
    return min(N, (M - 2) // N) if N + 2 <= M else 0


def softmax_peak(N: int, M: int) -> int:
    R = softmax_rows(N, M)
    return 2 + (R * N if R else min(M - 2, N))


def standard_forward(N: int, d: int, M: int, B: int, causal: bool = False) -> Prediction:
    """Standard attention with tiled products (see algorithms/standard.py); the causal mask changes no count.

    Reads R(N,d,N) + N^2 (or 2N^2 when a row of S does not fit) + R(N,N,d); writes N^2 + N^2 + Nd.
    """
    q_reads, k_reads = matmul_reads(N, d, N, B)
    p_reads, v_reads = matmul_reads(N, N, d, B)
    s_reads = N * N * (1 if softmax_rows(N, M) else 2)
    peak = max(matmul_peak(N, d, N, B), softmax_peak(N, M), matmul_peak(N, N, d, B))
    return _pred(
        peak,
        Q=(q_reads, 0),
        K=(k_reads, 0),
        V=(v_reads, 0),
        S=(s_reads, N * N),
        P=(p_reads, N * N),
        O=(0, N * d),
    )

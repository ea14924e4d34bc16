"""Standard attention (FlashAttention paper, Algorithm 0) in numba.cuda, the schedule of algorithms/standard.py.

Three phases, S and P materialised in global memory (float32, (B * H, N, N) each):

1. :func:`matmul_kernel` S = scale * Q K^T with square tiles of side B: one thread block per output tile
   (grid (ceil(N/B)^2, B * H)); the accumulator C_ij (ti x tj) and one tile of each operand live in shared memory
   (3 B^2 words at most: io_model.matmul_peak).
2. P = softmax(S) row by row, causal entries masked here. When a row fits (N + 2 <= M),
   :func:`softmax_rows_kernel` takes blocks of R = floor((M - 2) / N) rows (grid (ceil(N/R), B * H)), loads them
   once, normalises in place and stores. Otherwise :func:`softmax_chunks_kernel` sweeps one row per block twice in
   chunks of M - 2 columns (pass 1: running max and sum, pass 2: normalise and store). The current row's max and
   sum take the 2 reserved shared words; threads reduce into them with shared-memory atomics (max, then add), so
   no other scratch is needed.
3. :func:`matmul_kernel` O = P V, square tiles again.

Words moved: R(N, d, N) + N^2 (2 N^2 for two passes) + R(N, N, d) reads, 2 N^2 + Nd writes, per (b, h)
(:func:`iosim.theory.io_model.standard_forward`).
"""

from __future__ import annotations

import math

import numpy as np
from iosim.algorithms.cuda._common import (
    NEG_INF,
    block_ids,
    device_and_host,
    fill_shared,
    load_tile,
    span,
    store_tile,
    tile_product_acc,
)
from iosim.algorithms.cuda._host import Launcher, cdiv, check_capacity, f32_scale
from numba import cuda, float32

STANDARD_ARRAYS = ("Q", "K", "V", "S", "P", "O")
_Q, _K, _V, _S, _P, _O = range(6)


@device_and_host
def matmul_layout(m, k, n, T):
    """Offsets of the accumulator C_ij, the A tile and the B tile, and the total words (= io_model.matmul_peak)."""
    TI = min(T, m)
    TJ = min(T, n)
    TK = min(T, k)
    return 0, TI * TJ, TI * TJ + TI * TK, TI * TJ + TI * TK + TK * TJ


def matmul_words(m: int, k: int, n: int, T: int) -> int:
    """Shared words of one product's layout: accumulator + A tile + B tile (= io_model.matmul_peak)."""
    return matmul_layout.host(m, k, n, T)[-1]


def softmax_plan(N: int, M: int) -> tuple[int, int, int]:
    """(rows per block R, chunk C, shared words): one pass (R > 0, C = 0) when N + 2 <= M, else two (R = 0)."""
    if N + 2 <= M:
        R = min(N, (M - 2) // N)
        return R, 0, R * N + 2
    C = M - 2
    return 0, C, min(C, N) + 2


@cuda.jit
def matmul_kernel(A, Bm, C, T, b_transposed, scale, cnt, iA, iB, iC):
    """C = scale * A op(B) for output tile blockIdx.x of (b, h) = blockIdx.y; op(B) = B^T if b_transposed."""
    sm = cuda.shared.array(0, dtype=float32)
    tid, nt, blk, bh = block_ids()
    m = A.shape[1]
    k = A.shape[2]
    n = C.shape[2]
    ntj = (n + T - 1) // T
    i = blk // ntj
    c_off, a_off, b_off, _ = matmul_layout(m, k, n, T)
    r0, ti = span(i, T, m)
    c0, tj = span(blk - i * ntj, T, n)
    fill_shared(sm, c_off, ti * tj, np.float32(0.0))  # C_ij = 0 on chip
    for kk in range((k + T - 1) // T):
        k0, tk = span(kk, T, k)
        cuda.syncthreads()
        load_tile(A, bh, r0, ti, k0, tk, sm, a_off, cnt, iA)
        if b_transposed:
            load_tile(Bm, bh, c0, tj, k0, tk, sm, b_off, cnt, iB)  # B_jk, tj x tk
        else:
            load_tile(Bm, bh, k0, tk, c0, tj, sm, b_off, cnt, iB)  # B_kj, tk x tj
        cuda.syncthreads()
        # op(B)[x, c] is B_jk[c, x] (rows of tk, each element's loop rotated by c as in dot_rows) or B_kj[x, c].
        b_rs, b_cs = (1, tk) if b_transposed else (tj, 1)
        tile_product_acc(sm, c_off, ti, tj, tk, a_off, tk, 1, b_off, b_rs, b_cs, b_transposed)
    cuda.syncthreads()
    if scale != np.float32(1.0):
        for e in range(tid, ti * tj, nt):
            sm[c_off + e] *= scale
        cuda.syncthreads()
    store_tile(sm, c_off, C, bh, r0, ti, c0, tj, cnt, iC)


@cuda.jit(device=True)
def _reset_stats(sm, st):
    """The current row's max m_r = -inf and sum l_r = 0 (shared words st, st + 1)."""
    if cuda.threadIdx.x == 0:
        sm[st] = NEG_INF
        sm[st + 1] = np.float32(0.0)


@cuda.jit(device=True)
def _mask_and_max(sm, base, n, c0, row, causal, st):
    """Mask sm[base + c] (column c0 + c of row ``row``) to -inf above the diagonal; fold the max into sm[st]."""
    mx = NEG_INF
    for c in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        if causal and c0 + c > row:
            sm[base + c] = NEG_INF
        else:
            mx = max(mx, sm[base + c])
    if mx != NEG_INF:
        cuda.atomic.max(sm, st, mx)


@cuda.jit
def softmax_rows_kernel(S, P, R, causal, cnt):
    """One-pass softmax of rows [blockIdx.x R, +R) of (b, h) = blockIdx.y; the whole row block fits."""
    sm = cuda.shared.array(0, dtype=float32)
    tid, nt, i, bh = block_ids()
    N = S.shape[1]
    r0 = i * R
    br = min(R, N - r0)
    st = min(R, N) * N  # the current row's max and sum
    load_tile(S, bh, r0, br, 0, N, sm, 0, cnt, _S)
    for r in range(br):
        row = r0 + r
        base = r * N
        _reset_stats(sm, st)
        cuda.syncthreads()
        _mask_and_max(sm, base, N, 0, row, causal, st)
        cuda.syncthreads()
        m_r = sm[st]
        s = np.float32(0.0)
        for c in range(tid, N, nt):
            p = math.exp(sm[base + c] - m_r)
            sm[base + c] = p
            s += p
        cuda.atomic.add(sm, st + 1, s)
        cuda.syncthreads()
        inv = np.float32(1.0) / sm[st + 1]
        for c in range(tid, N, nt):
            sm[base + c] *= inv
        cuda.syncthreads()
    store_tile(sm, 0, P, bh, r0, br, 0, N, cnt, _P)


@cuda.jit
def softmax_chunks_kernel(S, P, C, causal, cnt):
    """Two-pass softmax of row blockIdx.x of (b, h) = blockIdx.y in chunks of C columns (a row does not fit)."""
    sm = cuda.shared.array(0, dtype=float32)
    tid, nt, row, bh = block_ids()
    N = S.shape[1]
    st = min(C, N)  # running max m_r and sum l_r
    _reset_stats(sm, st)
    for p in range(2):  # pass 0: running max and sum; pass 1: normalise and store
        for j in range((N + C - 1) // C):
            c0, bc = span(j, C, N)
            cuda.syncthreads()
            load_tile(S, bh, row, 1, c0, bc, sm, 0, cnt, _S)
            cuda.syncthreads()
            m_old = sm[st]
            l_old = sm[st + 1]
            cuda.syncthreads()  # every thread has read m_r, l_r before they change
            if p == 0:
                _mask_and_max(sm, 0, bc, c0, row, causal, st)
                cuda.syncthreads()
                m_new = sm[st]
                s = np.float32(0.0)
                if m_new != NEG_INF:
                    for c in range(tid, bc, nt):
                        s += math.exp(sm[c] - m_new)
                if tid == 0 and m_new != NEG_INF and m_old != NEG_INF:
                    sm[st + 1] = l_old * math.exp(m_old - m_new)
                cuda.syncthreads()
                if s != np.float32(0.0):
                    cuda.atomic.add(sm, st + 1, s)
            else:
                inv = np.float32(1.0) / l_old
                for c in range(tid, bc, nt):
                    x = sm[c]
                    if causal and c0 + c > row:
                        x = NEG_INF
                    sm[c] = math.exp(x - m_old) * inv
                cuda.syncthreads()
                store_tile(sm, 0, P, bh, row, 1, c0, bc, cnt, _P)


def standard_forward(Q, K, V, *, B, M, scale=None, causal=False, count=False, threads=None, poison=True, out=None):
    """Standard attention on the GPU with square tile side B and fast memory M (which sets the softmax's plan).

    Returns a KernelRun with outputs O (.., N, d), S and P (.., N, N).
    """
    job = Launcher(STANDARD_ARRAYS, count, threads, poison, out, Q=Q, K=K, V=V)
    N, d, BH, a, cnt = job.batch.N, job.batch.d, job.batch.BH, job.arrays, job.cnt
    R, C, sm_words = softmax_plan(N, M)
    mm1, mm2 = matmul_words(N, d, N, B), matmul_words(N, N, d, B)
    check_capacity(max(mm1, sm_words, mm2), M, "standard attention working set (tiles of a product, or softmax rows)")
    O, S, P = job.output("O", (N, d)), job.output("S", (N, N)), job.output("P", (N, N))
    nb = cdiv(N, B)
    job.launch(matmul_kernel, (nb * nb, BH), mm1, a["Q"], a["K"], S, B, True, f32_scale(scale, d), cnt, _Q, _K, _S)
    if R:
        job.launch(softmax_rows_kernel, (cdiv(N, R), BH), sm_words, S, P, R, bool(causal), cnt)
    else:
        job.launch(softmax_chunks_kernel, (N, BH), sm_words, S, P, C, bool(causal), cnt)
    job.launch(matmul_kernel, (nb * cdiv(d, B), BH), mm2, P, a["V"], O, B, False, np.float32(1.0), cnt, _P, _V, _O)
    return job.run({"B": B})

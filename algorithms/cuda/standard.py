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
(:func:`iosim.io_model.standard_forward`).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from algorithms.cuda._common import NEG_INF, dot_rows, fill_shared, load_tile, store_tile
from algorithms.cuda._host import (
    KernelRun,
    cdiv,
    check_capacity,
    counters,
    default_threads,
    device_array,
    f32_scale,
    launch,
    prepare,
    read_counters,
    result,
)

STANDARD_ARRAYS = ("Q", "K", "V", "S", "P", "O")
_Q, _K, _V, _S, _P, _O = range(6)


def matmul_words(m: int, k: int, n: int, T: int) -> int:
    """Shared words of one product's layout: accumulator + A tile + B tile (= io_model.matmul_peak)."""
    ti, tj, tk = min(T, m), min(T, n), min(T, k)
    return ti * tj + ti * tk + tk * tj


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
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    bh = cuda.blockIdx.y
    m = A.shape[1]
    k = A.shape[2]
    n = C.shape[2]
    ntj = (n + T - 1) // T
    i = cuda.blockIdx.x // ntj
    j = cuda.blockIdx.x - i * ntj
    TI = min(T, m)
    TJ = min(T, n)
    TK = min(T, k)
    c_off = 0
    a_off = TI * TJ
    b_off = a_off + TI * TK
    r0 = i * T
    ti = min(T, m - r0)
    c0 = j * T
    tj = min(T, n - c0)
    fill_shared(sm, c_off, ti * tj, np.float32(0.0))  # C_ij = 0 on chip
    for kk in range((k + T - 1) // T):
        k0 = kk * T
        tk = min(T, k - k0)
        cuda.syncthreads()
        load_tile(A, bh, r0, ti, k0, tk, sm, a_off, cnt, iA)
        if b_transposed:
            load_tile(Bm, bh, c0, tj, k0, tk, sm, b_off, cnt, iB)  # B_jk, tj x tk
        else:
            load_tile(Bm, bh, k0, tk, c0, tj, sm, b_off, cnt, iB)  # B_kj, tk x tj
        cuda.syncthreads()
        for e in range(tid, ti * tj, nt):
            r = e // tj
            c = e - r * tj
            if b_transposed:
                acc = dot_rows(sm, a_off, r, b_off, c, tk)
            else:
                acc = np.float32(0.0)
                pa = a_off + r * tk
                pb = b_off + c
                for x in range(tk):
                    acc += sm[pa + x] * sm[pb + x * tj]
            sm[c_off + e] += acc
    cuda.syncthreads()
    if scale != np.float32(1.0):
        for e in range(tid, ti * tj, nt):
            sm[c_off + e] *= scale
        cuda.syncthreads()
    store_tile(sm, c_off, C, bh, r0, ti, c0, tj, cnt, iC)


@cuda.jit
def softmax_rows_kernel(S, P, R, causal, cnt):
    """One-pass softmax of rows [blockIdx.x R, +R) of (b, h) = blockIdx.y; the whole row block fits."""
    sm = cuda.shared.array(0, dtype=float32)
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    bh = cuda.blockIdx.y
    N = S.shape[1]
    r0 = cuda.blockIdx.x * R
    br = min(R, N - r0)
    st = min(R, N) * N  # the current row's max and sum
    load_tile(S, bh, r0, br, 0, N, sm, 0, cnt, _S)
    for r in range(br):
        row = r0 + r
        base = r * N
        if tid == 0:
            sm[st] = NEG_INF
            sm[st + 1] = np.float32(0.0)
        cuda.syncthreads()
        mx = NEG_INF
        for c in range(tid, N, nt):
            if causal and c > row:
                sm[base + c] = NEG_INF
            else:
                mx = max(mx, sm[base + c])
        if mx != NEG_INF:
            cuda.atomic.max(sm, st, mx)
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
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    bh = cuda.blockIdx.y
    N = S.shape[1]
    row = cuda.blockIdx.x
    st = min(C, N)  # running max m_r and sum l_r
    if tid == 0:
        sm[st] = NEG_INF
        sm[st + 1] = np.float32(0.0)
    for p in range(2):  # pass 0: running max and sum; pass 1: normalise and store
        for j in range((N + C - 1) // C):
            c0 = j * C
            bc = min(C, N - c0)
            cuda.syncthreads()
            load_tile(S, bh, row, 1, c0, bc, sm, 0, cnt, _S)
            cuda.syncthreads()
            m_old = sm[st]
            l_old = sm[st + 1]
            cuda.syncthreads()  # every thread has read m_r, l_r before they change
            if p == 0:
                mx = NEG_INF
                for c in range(tid, bc, nt):
                    if causal and c0 + c > row:
                        sm[c] = NEG_INF
                    else:
                        mx = max(mx, sm[c])
                if mx != NEG_INF:
                    cuda.atomic.max(sm, st, mx)
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
    b = prepare(Q=Q, K=K, V=V)
    N, d, BH = b.N, b.d, b.BH
    R, C, sm_words = softmax_plan(N, M)
    mm1, mm2 = matmul_words(N, d, N, B), matmul_words(N, N, d, B)
    words = max(mm1, sm_words, mm2)
    check_capacity(words, M, "standard attention working set (tiles of a product, or softmax rows)")
    S = device_array((BH, N, N), poison, out, "S")
    P = device_array((BH, N, N), poison, out, "P")
    O = device_array((BH, N, d), poison, out, "O")
    cnt = counters(STANDARD_ARRAYS, count)
    a = b.arrays
    threads = threads or default_threads()
    nb = cdiv(N, B)
    launch(matmul_kernel, (nb * nb, BH), threads, mm1, a["Q"], a["K"], S, B, True, f32_scale(scale, d), cnt, _Q, _K, _S)
    if R:
        launch(softmax_rows_kernel, (cdiv(N, R), BH), threads, sm_words, S, P, R, bool(causal), cnt)
    else:
        launch(softmax_chunks_kernel, (N, BH), threads, sm_words, S, P, C, bool(causal), cnt)
    launch(matmul_kernel, (nb * cdiv(d, B), BH), threads, mm2, P, a["V"], O, B, False, np.float32(1.0), cnt, _P, _V, _O)
    outputs = {"O": result(b, O, (N, d)), "S": result(b, S, (N, N)), "P": result(b, P, (N, N))}
    return KernelRun(outputs, read_counters(cnt, STANDARD_ARRAYS), words, {"B": B})

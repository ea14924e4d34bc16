"""Saha & Ye's square tiling forward (ICML 2024, Algorithm 1, stable form) in numba.cuda.

The schedule of :func:`iosim.algorithms.square_tiling.square_tiling_forward`, B x B tiles everywhere, two kernels:

* :func:`square_phase1_kernel`, grid (ceil(N/B), B * H): one thread block per row tile i. The row statistics
  m_i, l_i stay in shared memory across the column tiles j; for each j the accumulator S_ij is built over the
  ceil(d/B) slices of d (one tile of Q and one of K resident per slice), scaled, masked, folded into m_i, l_i
  (one thread per row) and written to the N x N exponent S in global memory. After the last j the block writes
  L_i = m_i + log l_i.
* :func:`square_phase2_kernel`, grid (ceil(N/B), B * H): one block per row tile i reads L_i once, then for each
  output tile c of d accumulates O_ic = sum_k exp(S_ik - L_i) V_kc (A_ik formed in the tile prologue) and writes it.

Causal masking skips tile (i, j) with j > i in both phases. Shared words: B^2 + 2 B min(B, d) + 2 B
(io_model.square_tiling_peak; B = min(B, N) for one short tile). Words moved per (b, h):
:func:`iosim.theory.io_model.square_tiling_forward` (= docs/theory.md S1 when non-causal).
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
    load_vec,
    logsumexp_rows,
    span,
    store_tile,
    store_vec,
    tile_product_acc,
)
from iosim.algorithms.cuda._host import Launcher, cdiv, check_capacity, f32_scale
from numba import cuda, float32, types

SQUARE_ARRAYS = ("Q", "K", "V", "S", "O", "L")
_Q, _K, _V, _S, _O, _L = range(6)


@device_and_host
def square_layout(N, d, B):
    """Offsets of both phases' regions and the total words (= io_model.square_tiling_peak): a B x B tile (S_ij /
    A_ik), two B x min(B, d) tiles (Q, K / V, O), then m_i, l_i (phase 1) or L_i (phase 2); B = min(B, N)."""
    b = min(B, N)
    w = min(B, d)
    m = b * b + 2 * b * w
    return 0, b * b, b * b + b * w, m, m + b, m + 2 * b


def square_shared_words(N: int, d: int, B: int) -> int:
    """Shared words of both phases' layouts (= io_model.square_tiling_peak)."""
    return square_layout.host(N, d, B)[-1]


@cuda.jit
def square_phase1_kernel(Q, K, S, L, B, scale, causal, cnt):
    """Phase 1 for row tile i = blockIdx.x of (b, h) = blockIdx.y: S_ij for every j, then L_i."""
    sm = cuda.shared.array(0, dtype=float32)
    tid, nt, i, bh = block_ids()
    N, d = Q.shape[1], Q.shape[2]
    s_off, q_off, k_off, m_off, l_off, _ = square_layout(N, d, B)
    Tn = (N + B - 1) // B
    Td = (d + B - 1) // B
    r0, bi = span(i, B, N)
    fill_shared(sm, m_off, bi, NEG_INF)  # m_i = -inf, l_i = 0 on chip
    fill_shared(sm, l_off, bi, np.float32(0.0))
    for j in range(Tn):
        if causal and j > i:  # tile entirely above the diagonal
            continue
        c0, bj = span(j, B, N)
        cuda.syncthreads()
        fill_shared(sm, s_off, bi * bj, np.float32(0.0))  # A_B[i, j] = 0
        for ll in range(Td):  # slices of d
            k0, bk = span(ll, B, d)
            cuda.syncthreads()
            load_tile(Q, bh, r0, bi, k0, bk, sm, q_off, cnt, _Q)  # Q tile (i, l)
            load_tile(K, bh, c0, bj, k0, bk, sm, k_off, cnt, _K)  # K^T tile (l, j)
            cuda.syncthreads()
            tile_product_acc(sm, s_off, bi, bj, bk, q_off, bk, 1, k_off, 1, bk, True)  # S_ij += Q_il K_jl^T
        cuda.syncthreads()
        for r in range(tid, bi, nt):  # epilogue: scale, mask, online row max and sum (one thread per row)
            ps = s_off + r * bj
            m_tilde = NEG_INF
            for c in range(bj):
                x = sm[ps + c] * scale
                if causal and c0 + c > r0 + r:
                    x = NEG_INF
                sm[ps + c] = x
                m_tilde = max(m_tilde, x)
            if m_tilde == NEG_INF:  # the whole row of this tile is masked
                continue
            m_old = sm[m_off + r]
            m_new = max(m_old, m_tilde)
            s = np.float32(0.0)
            for c in range(bj):
                s += math.exp(sm[ps + c] - m_new)
            sm[l_off + r] = sm[l_off + r] * math.exp(m_old - m_new) + s
            sm[m_off + r] = m_new
        cuda.syncthreads()
        store_tile(sm, s_off, S, bh, r0, bi, c0, bj, cnt, _S)  # write the N x N tile (exponent form)
    cuda.syncthreads()
    logsumexp_rows(sm, m_off, l_off, bi)  # L_i = m_i + log l_i, in place of l_i
    cuda.syncthreads()
    store_vec(sm, l_off, L, bh, r0, bi, cnt, _L)


@cuda.jit
def square_phase2_kernel(S, V, L, O, B, causal, cnt):
    """Phase 2 for row tile i = blockIdx.x of (b, h) = blockIdx.y: O_ic = sum_k exp(S_ik - L_i) V_kc for every c."""
    sm = cuda.shared.array(0, dtype=float32)
    tid, nt, i, bh = block_ids()
    N, d = V.shape[1], V.shape[2]
    a_off, v_off, o_off, L_off, _, _ = square_layout(N, d, B)
    Tn = (N + B - 1) // B
    Td = (d + B - 1) // B
    r0, bi = span(i, B, N)
    load_vec(L, bh, r0, bi, sm, L_off, cnt, _L)  # read d_B[i] (here L_i)
    for cc in range(Td):  # output column tile of d
        c0, bc = span(cc, B, d)
        cuda.syncthreads()
        fill_shared(sm, o_off, bi * bc, np.float32(0.0))
        for k in range(Tn):
            if causal and k > i:  # A_ik is all zero above the diagonal
                continue
            k0, bk = span(k, B, N)
            cuda.syncthreads()
            load_tile(S, bh, r0, bi, k0, bk, sm, a_off, cnt, _S)  # A tile (i, k)
            load_tile(V, bh, k0, bk, c0, bc, sm, v_off, cnt, _V)  # V tile (k, c)
            cuda.syncthreads()
            for e in range(tid, bi * bk, nt):  # A_ik = exp(S_ik - L_i)
                r = e // bk
                sm[a_off + e] = math.exp(sm[a_off + e] - sm[L_off + r])
            cuda.syncthreads()
            tile_product_acc(sm, o_off, bi, bc, bk, a_off, bk, 1, v_off, bc, 1, False)  # O_ic += A_ik V_kc
        cuda.syncthreads()
        store_tile(sm, o_off, O, bh, r0, bi, c0, bc, cnt, _O)  # write the O tile


def square_tiling_forward(
    Q, K, V, *, B, scale=None, causal=False, M=None, count=False, threads=None, poison=True, out=None
):
    """Square tiling forward on the GPU, tile side B. Returns a KernelRun with outputs O, L and the exponent S."""
    job = Launcher(SQUARE_ARRAYS, count, threads, poison, out, Q=Q, K=K, V=V)
    N, d, BH, a = job.batch.N, job.batch.d, job.batch.BH, job.arrays
    words = square_shared_words(N, d, B)
    check_capacity(words, M, "square-tiling working set (B x B accumulator, two operand tiles, m_i, l_i)")
    O, L, S = job.output("O", (N, d)), job.output("L", (N,)), job.output("S", (N, N))
    grid = (cdiv(N, B), BH)
    job.launch(square_phase1_kernel, grid, words, a["Q"], a["K"], S, L, B, f32_scale(scale, d), bool(causal), job.cnt)
    job.launch(square_phase2_kernel, grid, words, S, a["V"], L, O, B, bool(causal), job.cnt)
    return job.run({"B": B})


def ptx_signatures() -> dict:
    F3 = types.Array(types.float32, 3, "C")
    F2 = types.Array(types.float32, 2, "C")
    I2 = types.Array(types.int64, 2, "C")
    I, F, Bo = types.int64, types.float32, types.boolean
    return {
        "square_phase1_kernel": (square_phase1_kernel, (F3, F3, F3, F2, I, F, Bo, I2)),
        "square_phase2_kernel": (square_phase2_kernel, (F3, F3, F2, F3, I, Bo, I2)),
    }

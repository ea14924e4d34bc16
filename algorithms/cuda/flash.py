"""FlashAttention kernels in numba.cuda: the simulator's schedules with shared memory as the fast memory.

Each kernel runs the loop nest of its simulator driver in :mod:`iosim.algorithms.flash` for one (batch, head) pair
``bh`` (inputs are (B * H, N, d) float32 views), with the same tiles, the same causal block skips and the same
loads and stores, so its global <-> shared traffic, counted by the helpers of :mod:`iosim.algorithms.cuda._common`,
equals the simulator's reads and writes array by array (times B * H).

* :func:`flash2_forward_kernel` (Dao, FlashAttention-2, forward): grid (Tr, B * H), one thread block per row
  block Q_i; O_i, l_i, m_i stay in shared memory while K_j, V_j stream past; O and L are written once. It takes a
  block mask on its own tiles (``blocks[i, j]`` = 0: tile (i, j) is empty and never loaded; the simulator's
  ``FromBlocks(blocks, (Br, Bc))`` with policy ``skip``): a row block with no nonzero tile loads nothing and
  writes O_i = 0, L_i = -inf, as FlashAttention's block-sparse kernel leaves it.
* :func:`flash1_forward_kernel` (Dao et al. 2022, Algorithm 1 with Algorithm 2's scale and mask): the paper's
  K/V-outer loop order. O, l and m make a round trip through global memory on every inner step, and the inner
  steps of one (b, h) for different j touch the same O_i, so they must run in order: the grid is (1, B * H), one
  thread block per (b, h) running the whole loop nest (j outer, i inner) exactly as the paper states it. Running
  the j's of one (b, h) in parallel blocks would race on O_i, l_i, m_i; giving each block its own i would reload
  K_j, V_j once per row block and change the schedule (that is FlashAttention-2's order). The block first zeroes
  O and l and sets m = -inf in global memory (initialisation writes, as the simulator counts them).
* :func:`flash2_backward_kernel` (FlashAttention-2 backward, the simulator's ``_flash2_backward``): a first kernel
  (:func:`flash2_backward_prep_kernel`, grid (Tr, B * H)) computes D = rowsum(dO o O) per row block, writes it,
  and zeroes dQ (initialisation writes); the main kernel keeps the K/V-outer order, one thread block per column
  block K_j, V_j (grid (Tc, B * H)) with dK_j, dV_j accumulated on chip and written once. dQ_i is
  read-modify-written on every inner step: with ``dq_atomic`` the block adds its dS_ij K_j to dQ_i in global
  memory with float32 atomics (a read-modify-write of every word, counted as one read and one write, exactly
  the simulator's load + store of dQ_i); without it the grid is (1, B * H) and one block runs every j in order,
  loading and storing dQ_i literally. Both give the same counts; the atomic one runs Tc blocks in parallel.

Shared-memory layout (float32 words, B = min(block, N)): flash2 forward Q_i, O_i (2 Br d), l_i, m_i (2 Br),
K_j, V_j (2 Bc d), S_ij (Br Bc): io_model.flash_working_set; flash1 the same words; flash2 backward K_j, V_j,
dK_j, dV_j (4 Bc d), Q_i, dO_i, dQ_i (3 Br d), L_i, D_i (2 Br), S_ij / P_ij and dP_ij / dS_ij (2 Br Bc).
Per-row scalars (m~, l~, alpha) live in registers of the thread that owns the row, as the model allows.
Work split: flash2's forward computes S_ij and P_ij V_j in register tiles (:func:`product_t`: 2 x 8 outputs per
thread, with Q_i, S_ij and O_i stored transposed on chip); the other kernels compute the score tile and the
products with one thread per output element. The row statistics take one thread per row.
"""

from __future__ import annotations

import math

import numpy as np
from iosim.algorithms.cuda._common import (
    NEG_INF,
    add_tile,
    block_ids,
    device_and_host,
    dot,
    dot_rows,
    fill_shared,
    init_tile,
    init_vec,
    load_tile,
    load_tile_t,
    load_vec,
    logsumexp_rows,
    product_t,
    span,
    store_tile,
    store_tile_t,
    store_vec,
    tile_product_acc,
)
from iosim.algorithms.cuda._host import Launcher, _as_array, cdiv, check_capacity, f32_scale, prepare
from numba import cuda, float32

# Array ids of the counters (names as the simulator's per-array tally has them).
FWD1_ARRAYS = ("Q", "K", "V", "O", "l", "m")
FWD2_ARRAYS = ("Q", "K", "V", "O", "L")
BWD2_ARRAYS = ("Q", "K", "V", "O", "dO", "L", "D", "dQ", "dK", "dV")
_Q, _K, _V, _O = 0, 1, 2, 3
_l1, _m1 = 4, 5  # flash1
_L2 = 4  # flash2 forward
_bQ, _bK, _bV, _bO, _bdO, _bL, _bD, _bdQ, _bdK, _bdV = range(10)


@device_and_host
def forward_layout(N, d, Br, Bc, kv_first):
    """Offsets of Q_i, O_i, l_i, m_i, K_j, V_j, S_ij and the total words (= io_model.flash_working_set).

    flash2 puts Q_i first; flash1 (``kv_first``) puts K_j, V_j first. Blocks are min(block, N).
    """
    BR = min(Br, N)
    BC = min(Bc, N)
    k = 0 if kv_first else 2 * BR * d + 2 * BR
    q = 2 * BC * d if kv_first else 0
    o = q + BR * d
    l = o + BR * d  # noqa: E741
    m = l + BR
    v = k + BC * d
    s = m + BR if kv_first else v + BC * d
    return q, o, l, m, k, v, s, s + BR * BC


@device_and_host
def backward_layout(N, d, Br, Bc):
    """Offsets of K_j, V_j, dK_j, dV_j, Q_i, dO_i, dQ_i, L_i, D_i, S_ij, dP_ij and the total words."""
    BR = min(Br, N)
    BC = min(Bc, N)
    q = 4 * BC * d
    do = q + BR * d
    dq = do + BR * d
    L = dq + BR * d
    s = L + 2 * BR
    return 0, BC * d, 2 * BC * d, 3 * BC * d, q, do, dq, L, L + BR, s, s + BR * BC, s + 2 * BR * BC


@device_and_host
def backward_prep_layout(N, d, Br):
    """Offsets of dO_i, O_i, D_i and the total words of the backward's first kernel."""
    BR = min(Br, N)
    return 0, BR * d, 2 * BR * d, 2 * BR * d + BR


@cuda.jit(device=True)
def _scores(sm, q_off, k_off, s_off, br, bc, d, scale, causal, r0, c0):
    """S_ij = scale * Q_i K_j^T in shared memory; causal: entries with column > row become -inf."""
    for e in range(cuda.threadIdx.x, br * bc, cuda.blockDim.x):
        r = e // bc
        c = e - r * bc
        s = dot_rows(sm, q_off, r, k_off, c, d) * scale
        if causal and c0 + c > r0 + r:
            s = NEG_INF
        sm[s_off + e] = s


@cuda.jit
def flash2_forward_kernel(Q, K, V, O, L, Br, Bc, scale, causal, blocks, cnt):
    """FlashAttention-2 forward for row block i = blockIdx.x of (b, h) = blockIdx.y; ``blocks`` (Tr x Tc) is the
    block mask (0: an empty tile, skipped), all ones without a mask.

    On chip, Q_i, S_ij and O_i are held transposed (row index fastest) so that the register-tiled products
    (:func:`product_t`) and the one-thread-per-row statistics read conflict-free; K_j and V_j stay row-major.
    The global <-> shared traffic is the schedule's, word for word."""
    sm = cuda.shared.array(0, dtype=float32)
    tid, nt, i, bh = block_ids()
    N, d = Q.shape[1], Q.shape[2]
    q_off, o_off, l_off, m_off, k_off, v_off, s_off, _ = forward_layout(N, d, Br, Bc, False)
    Tc = (N + Bc - 1) // Bc
    r0, br = span(i, Br, N)
    nonempty = False  # policy skip: a row block without a nonzero tile never loads Q_i
    for j in range(Tc):
        if blocks[i, j] != 0:
            nonempty = True
    if nonempty:
        load_tile_t(Q, bh, r0, br, d, sm, q_off, cnt, _Q)  # Q_i^T
    fill_shared(sm, o_off, br * d, np.float32(0.0))  # O_i = 0, l_i = 0, m_i = -inf on chip
    fill_shared(sm, l_off, br, np.float32(0.0))
    fill_shared(sm, m_off, br, NEG_INF)
    for j in range(Tc):
        c0, bc = span(j, Bc, N)
        if (causal and c0 > r0 + br - 1) or blocks[i, j] == 0:  # an empty block: never loaded
            continue
        cuda.syncthreads()  # previous step done with K_j, V_j, S_ij
        load_tile(K, bh, c0, bc, 0, d, sm, k_off, cnt, _K)
        load_tile(V, bh, c0, bc, 0, d, sm, v_off, cnt, _V)
        cuda.syncthreads()
        product_t(sm, s_off, br, bc, d, q_off, br, k_off, 1, d, scale, False, causal, r0, c0)  # S_ij^T
        cuda.syncthreads()
        for r in range(tid, br, nt):  # row statistics, one thread per row; P~ overwrites S in place
            m_tilde = NEG_INF
            for c in range(bc):
                m_tilde = max(m_tilde, sm[s_off + c * br + r])
            m_old = sm[m_off + r]
            m_new = max(m_old, m_tilde)
            if m_new == NEG_INF:  # nothing unmasked seen yet in this row
                for c in range(bc):
                    sm[s_off + c * br + r] = np.float32(0.0)
                continue
            alpha = math.exp(m_old - m_new)
            s, comp = np.float32(0.0), np.float32(0.0)  # rowsum(P~), compensated (Kahan)
            for c in range(bc):
                p = math.exp(sm[s_off + c * br + r] - m_new)
                sm[s_off + c * br + r] = p
                y = p - comp
                t = s + y
                comp = (t - s) - y
                s = t
            sm[l_off + r] = alpha * sm[l_off + r] + s
            sm[m_off + r] = m_new
            for k in range(d):
                sm[o_off + k * br + r] *= alpha
        cuda.syncthreads()
        product_t(sm, o_off, br, d, bc, s_off, br, v_off, d, 1, np.float32(1.0), True, False, 0, 0)  # O_i += P V_j
    cuda.syncthreads()
    for e in range(tid, br * d, nt):  # O_i = diag(l_i)^-1 O_i (l = 0: no allowed entry, O_i stays 0)
        r = e % br
        if sm[l_off + r] > 0:
            sm[o_off + e] /= sm[l_off + r]
    cuda.syncthreads()
    logsumexp_rows(sm, m_off, l_off, br)  # L_i = m_i + log(l_i), in place of l_i
    cuda.syncthreads()
    store_tile_t(sm, o_off, O, bh, r0, br, d, cnt, _O)
    store_vec(sm, l_off, L, bh, r0, br, cnt, _L2)


@cuda.jit
def flash1_forward_kernel(Q, K, V, O, l, m, Br, Bc, scale, causal, cnt):  # noqa: E741
    """FlashAttention Algorithm 1 for (b, h) = blockIdx.y, the whole K/V-outer loop nest in one block."""
    sm = cuda.shared.array(0, dtype=float32)
    tid, nt, _, bh = block_ids()
    N, d = Q.shape[1], Q.shape[2]
    q_off, o_off, l_off, m_off, k_off, v_off, s_off, _ = forward_layout(N, d, Br, Bc, True)
    Tr = (N + Br - 1) // Br
    Tc = (N + Bc - 1) // Bc
    # Step 2: O = 0, l = 0, m = -inf in HBM (initialisation writes).
    init_tile(O, bh, 0, N, d, np.float32(0.0), cnt, _O)
    init_vec(l, bh, 0, N, np.float32(0.0), cnt, _l1)
    init_vec(m, bh, 0, N, NEG_INF, cnt, _m1)
    for j in range(Tc):  # step 5
        c0, bc = span(j, Bc, N)
        cuda.syncthreads()
        load_tile(K, bh, c0, bc, 0, d, sm, k_off, cnt, _K)  # step 6
        load_tile(V, bh, c0, bc, 0, d, sm, v_off, cnt, _V)
        for i in range(Tr):  # step 7
            r0, br = span(i, Br, N)
            if causal and c0 > r0 + br - 1:  # block entirely above the diagonal
                continue
            cuda.syncthreads()  # the global O, l, m written by the last step are visible; shared tiles free
            load_tile(Q, bh, r0, br, 0, d, sm, q_off, cnt, _Q)  # step 8
            load_tile(O, bh, r0, br, 0, d, sm, o_off, cnt, _O)
            load_vec(l, bh, r0, br, sm, l_off, cnt, _l1)
            load_vec(m, bh, r0, br, sm, m_off, cnt, _m1)
            cuda.syncthreads()
            _scores(sm, q_off, k_off, s_off, br, bc, d, scale, causal, r0, c0)  # step 9
            cuda.syncthreads()
            for r in range(tid, br, nt):  # steps 10-11, one thread per row
                ps = s_off + r * bc
                m_tilde = NEG_INF
                for c in range(bc):
                    m_tilde = max(m_tilde, sm[ps + c])
                if m_tilde == NEG_INF:  # every column of this row is masked in this block: nothing changes
                    for c in range(bc):
                        sm[ps + c] = np.float32(0.0)
                    continue
                l_tilde = np.float32(0.0)
                for c in range(bc):
                    p = math.exp(sm[ps + c] - m_tilde)
                    sm[ps + c] = p
                    l_tilde += p
                m_i = sm[m_off + r]
                l_i = sm[l_off + r]
                m_new = max(m_i, m_tilde)
                a = np.float32(0.0)
                if m_i != NEG_INF:
                    a = l_i * math.exp(m_i - m_new)
                b = math.exp(m_tilde - m_new)
                l_new = a + b * l_tilde
                # O_i <- diag(l_new)^-1 (diag(l_i) e^{m_i - m_new} O_i + e^{m~ - m_new} P~ V_j): scale O_i here
                # and fold e^{m~ - m_new} / l_new into P~, so the product below is a plain O_i += P V_j.
                a = a / l_new
                for k in range(d):
                    sm[o_off + r * d + k] *= a
                b = b / l_new
                for c in range(bc):
                    sm[ps + c] *= b
                sm[l_off + r] = l_new
                sm[m_off + r] = m_new
            cuda.syncthreads()
            tile_product_acc(sm, o_off, br, d, bc, s_off, bc, 1, v_off, d, 1, False)  # O_i += P_ij V_j
            cuda.syncthreads()
            store_tile(sm, o_off, O, bh, r0, br, 0, d, cnt, _O)  # step 12
            store_vec(sm, l_off, l, bh, r0, br, cnt, _l1)  # step 13
            store_vec(sm, m_off, m, bh, r0, br, cnt, _m1)


@cuda.jit
def logsumexp_kernel(m, l, L):  # noqa: E741
    """L = m + log(l) elementwise (flash1's row statistics as a logsumexp; no shared memory, not counted)."""
    r = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    bh = cuda.blockIdx.y
    if r < m.shape[1]:
        L[bh, r] = m[bh, r] + math.log(l[bh, r])


@cuda.jit
def flash2_backward_prep_kernel(O, dO, D, dQ, Br, cnt):
    """FlashAttention-2 backward, steps 3-4 for row block i = blockIdx.x: D_i = rowsum(dO_i o O_i); dQ_i = 0."""
    sm = cuda.shared.array(0, dtype=float32)
    bh = cuda.blockIdx.y
    N, d = O.shape[1], O.shape[2]
    r0, br = span(cuda.blockIdx.x, Br, N)
    init_tile(dQ, bh, r0, br, d, np.float32(0.0), cnt, _bdQ)  # step 3, this block's rows of dQ
    do_off, o_off, d_off, _ = backward_prep_layout(N, d, Br)
    load_tile(dO, bh, r0, br, 0, d, sm, do_off, cnt, _bdO)
    load_tile(O, bh, r0, br, 0, d, sm, o_off, cnt, _bO)
    cuda.syncthreads()
    for r in range(cuda.threadIdx.x, br, cuda.blockDim.x):
        sm[d_off + r] = dot(sm, do_off + r * d, 1, o_off + r * d, 1, d, 0)
    cuda.syncthreads()
    store_vec(sm, d_off, D, bh, r0, br, cnt, _bD)


@cuda.jit
def flash2_backward_kernel(Q, K, V, dO, L, D, dQ, dK, dV, Br, Bc, scale, causal, dq_atomic, cnt):
    """FlashAttention-2 backward main loop: column blocks j = blockIdx.x (or all j in order), (b, h) = blockIdx.y."""
    sm = cuda.shared.array(0, dtype=float32)
    tid, nt, _, bh = block_ids()
    N, d = Q.shape[1], Q.shape[2]
    k_off, v_off, dk_off, dv_off, q_off, do_off, dq_off, L_off, D_off, s_off, dp_off, _ = backward_layout(N, d, Br, Bc)
    Tr = (N + Br - 1) // Br
    Tc = (N + Bc - 1) // Bc
    j_first = cuda.blockIdx.x if dq_atomic else 0
    j_step = Tc if dq_atomic else 1
    for j in range(j_first, Tc, j_step):  # step 5
        c0, bc = span(j, Bc, N)
        cuda.syncthreads()
        load_tile(K, bh, c0, bc, 0, d, sm, k_off, cnt, _bK)  # step 6
        load_tile(V, bh, c0, bc, 0, d, sm, v_off, cnt, _bV)
        fill_shared(sm, dk_off, bc * d, np.float32(0.0))  # step 7: dK_j = 0, dV_j = 0 on chip
        fill_shared(sm, dv_off, bc * d, np.float32(0.0))
        for i in range(Tr):  # step 8
            r0, br = span(i, Br, N)
            if causal and c0 > r0 + br - 1:  # block entirely above the diagonal
                continue
            cuda.syncthreads()
            load_tile(Q, bh, r0, br, 0, d, sm, q_off, cnt, _bQ)  # step 9 (O_i unused once D exists: not loaded)
            load_tile(dO, bh, r0, br, 0, d, sm, do_off, cnt, _bdO)
            if dq_atomic:  # dQ_i's read happens in the atomic add below; accumulate this step's dS K_j from 0
                fill_shared(sm, dq_off, br * d, np.float32(0.0))
            else:
                load_tile(dQ, bh, r0, br, 0, d, sm, dq_off, cnt, _bdQ)
            load_vec(L, bh, r0, br, sm, L_off, cnt, _bL)
            load_vec(D, bh, r0, br, sm, D_off, cnt, _bD)
            cuda.syncthreads()
            # Steps 10-11: P_ij = exp(scale Q_i K_j^T - L_i), masked entries 0.
            for e in range(tid, br * bc, nt):
                r = e // bc
                c = e - r * bc
                p = np.float32(0.0)
                if not (causal and c0 + c > r0 + r):
                    p = math.exp(dot_rows(sm, q_off, r, k_off, c, d) * scale - sm[L_off + r])
                sm[s_off + e] = p
            cuda.syncthreads()
            # Step 12: dV_j += P_ij^T dO_i.
            tile_product_acc(sm, dv_off, bc, d, br, s_off, 1, bc, do_off, d, 1, False)
            # Steps 13-14: dP_ij = dO_i V_j^T; dS_ij = P_ij o (dP_ij - D_i), scaled by tau once (in place of dP).
            for e in range(tid, br * bc, nt):
                r = e // bc
                c = e - r * bc
                dp = dot_rows(sm, do_off, r, v_off, c, d)
                sm[dp_off + e] = scale * sm[s_off + e] * (dp - sm[D_off + r])
            cuda.syncthreads()
            # Step 15: dQ_i += tau dS_ij K_j.
            tile_product_acc(sm, dq_off, br, d, bc, dp_off, bc, 1, k_off, d, 1, False)
            # Step 16: dK_j += tau dS_ij^T Q_i.
            tile_product_acc(sm, dk_off, bc, d, br, dp_off, 1, bc, q_off, d, 1, False)
            cuda.syncthreads()
            if dq_atomic:  # step 15's write: dQ_i <- dQ_i + tau dS_ij K_j, read-modify-write in global memory
                add_tile(sm, dq_off, dQ, bh, r0, br, d, cnt, _bdQ)
            else:
                store_tile(sm, dq_off, dQ, bh, r0, br, 0, d, cnt, _bdQ)
        cuda.syncthreads()
        store_tile(sm, dk_off, dK, bh, c0, bc, 0, d, cnt, _bdK)  # step 18
        store_tile(sm, dv_off, dV, bh, c0, bc, 0, d, cnt, _bdV)


# ----------------------------------------------------------------------------------------------------------------
# Host launchers: explicit tiles (iosim.gpu chooses them from M exactly as the simulator does).


def flash2_forward(
    Q,
    K,
    V,
    *,
    Br,
    Bc,
    scale=None,
    causal=False,
    M=None,
    count=False,
    threads=None,
    poison=True,
    out=None,
    block_mask=None,
):
    """FlashAttention-2 forward on the GPU. Returns a KernelRun with outputs O (.., N, d) and L (.., N).

    ``block_mask``: an optional boolean (Tr, Tc) array on the kernel's own Br x Bc tiles (False: the tile is
    empty and skipped, policy ``skip``)."""
    job = Launcher(FWD2_ARRAYS, count, threads, poison, out, Q=Q, K=K, V=V)
    N, d, BH, a = job.batch.N, job.batch.d, job.batch.BH, job.arrays
    words = forward_layout.host(N, d, Br, Bc, False)[-1]
    check_capacity(words, M, "flash2 forward working set (Q_i, O_i, K_j, V_j, l_i, m_i, S_ij)")
    O, L = job.output("O", (N, d)), job.output("L", (N,))
    shape = (cdiv(N, Br), cdiv(N, Bc))
    blocks = np.ones(shape, np.int64) if block_mask is None else np.ascontiguousarray(block_mask, dtype=np.int64)
    if blocks.shape != shape:  # iosim.gpu.forward checks it first, naming the parameter (InputError)
        raise ValueError(f"block_mask must have shape {shape} (the kernel's Tr x Tc tiles), got {blocks.shape}")
    blocks = cuda.to_device(blocks)
    args = (a["Q"], a["K"], a["V"], O, L, Br, Bc, f32_scale(scale, d), bool(causal), blocks, job.cnt)
    job.launch(flash2_forward_kernel, (cdiv(N, Br), BH), words, *args)
    return job.run({"Br": Br, "Bc": Bc})


def flash1_forward(
    Q, K, V, *, Br, Bc, scale=None, causal=False, M=None, count=False, threads=None, poison=True, out=None
):
    """FlashAttention (Algorithm 1) forward on the GPU. Returns a KernelRun with outputs O, l, m and L = m + log l."""
    job = Launcher(FWD1_ARRAYS, count, threads, poison, out, Q=Q, K=K, V=V)
    N, d, BH, a = job.batch.N, job.batch.d, job.batch.BH, job.arrays
    words = forward_layout.host(N, d, Br, Bc, True)[-1]
    check_capacity(words, M, "flash1 forward working set (K_j, V_j, Q_i, O_i, l_i, m_i, S_ij)")
    O, l_, m = job.output("O", (N, d)), job.output("l", (N,)), job.output("m", (N,))
    args = (a["Q"], a["K"], a["V"], O, l_, m, Br, Bc, f32_scale(scale, d), bool(causal), job.cnt)
    job.launch(flash1_forward_kernel, (1, BH), words, *args)
    L = job.output("L", (N,))
    job.launch(logsumexp_kernel, (cdiv(N, job.threads), BH), 0, m, l_, L)  # for checking only: not counted
    return job.run({"Br": Br, "Bc": Bc})


def flash2_backward(
    Q,
    K,
    V,
    O,
    dO,
    L,
    *,
    Br,
    Bc,
    scale=None,
    causal=False,
    M=None,
    count=False,
    threads=None,
    dq_atomic=True,
    poison=True,
    out=None,
):
    """FlashAttention-2 backward on the GPU from the forward's O and logsumexp L. Outputs dQ, dK, dV.

    ``dq_atomic=True`` (default): one block per column block, dQ_i updated with float32 atomics (parallel, the
    summation order of dQ varies from run to run); False: one block per (b, h) running every column block in
    order with a literal load and store of dQ_i. Both move the same words.
    """
    job = Launcher(BWD2_ARRAYS, count, threads, poison, out, Q=Q, K=K, V=V, O=O, dO=dO)
    N, d, BH, a = job.batch.N, job.batch.d, job.batch.BH, job.arrays
    Lb = prepare(Q=_lse_as_matrix(L, job.batch))
    words = backward_layout.host(N, d, Br, Bc)[-1]
    check_capacity(
        words, M, "flash2 backward working set (K_j, V_j, dK_j, dV_j, Q_i, dO_i, dQ_i, L_i, D_i, S_ij, dP_ij)"
    )
    dQ, dK, dV = job.output("dQ", (N, d)), job.output("dK", (N, d)), job.output("dV", (N, d))
    D = job.output("D", (N,))
    prep_words = backward_prep_layout.host(N, d, Br)[-1]
    job.launch(flash2_backward_prep_kernel, (cdiv(N, Br), BH), prep_words, a["O"], a["dO"], D, dQ, Br, job.cnt)
    grid = (cdiv(N, Bc), BH) if dq_atomic else (1, BH)
    L2 = Lb.arrays["Q"].reshape(BH, N)
    args = (a["Q"], a["K"], a["V"], a["dO"], L2, D, dQ, dK, dV, Br, Bc, f32_scale(scale, d), bool(causal))
    job.launch(flash2_backward_kernel, grid, words, *args, bool(dq_atomic), job.cnt)
    return job.run({"Br": Br, "Bc": Bc})


def _lse_as_matrix(L, b):
    """L (.., N) as an (.., N, 1) array so that prepare() moves it like the others."""
    a, dev = _as_array(L, "L")
    shape = (*b.lead, b.N, 1)
    return a.reshape(shape)

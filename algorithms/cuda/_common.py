"""Device helpers shared by the numba.cuda kernels: counted tile transfers between global and shared memory.

Fast memory is the block's dynamic shared memory, one float32 array ``sm`` of exactly the words the schedule's
working set needs (at most M; the host launcher refuses a layout larger than M). Every transfer between global and
shared memory goes through a helper here. In counting mode (``cnt`` has rows) each thread adds the number of
elements *it* copied to ``cnt[aid, READS]`` or ``cnt[aid, WRITES]`` with one int64 atomic per tile, so the
counters are a tally of the copies the kernel actually performed, not of what the schedule claims to do. With an
empty ``cnt`` (shape (0, 3)) nothing is counted. Columns: 0 reads (global -> shared), 1 writes (shared -> global),
2 initialisation writes (a global memset, also counted in column 1, as the simulator counts them).

Thread mapping: a block's ``blockDim.x`` threads stride over a tile's elements in row-major order, so consecutive
threads touch consecutive global addresses (coalesced). Helpers are ``@cuda.jit(device=True)``; global arrays are
3-D (batch * heads, rows, cols) or 2-D (batch * heads, rows).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int32

READS, WRITES, INIT = 0, 1, 2
NEG_INF = np.float32(-np.inf)


@cuda.jit(device=True)
def _tally(cnt, aid, col, moved):
    if cnt.shape[0] > 0 and moved > 0:
        cuda.atomic.add(cnt, (aid, col), moved)


@cuda.jit(device=True)
def load_tile(src, bh, r0, nr, c0, nc, sm, off, cnt, aid):
    """sm[off + r * nc + c] = src[bh, r0 + r, c0 + c] for r < nr, c < nc (row-major, leading dimension nc)."""
    moved = 0
    for e in range(cuda.threadIdx.x, nr * nc, cuda.blockDim.x):
        r = e // nc
        sm[off + e] = src[bh, r0 + r, c0 + e - r * nc]
        moved += 1
    _tally(cnt, aid, READS, moved)


@cuda.jit(device=True)
def store_tile(sm, off, dst, bh, r0, nr, c0, nc, cnt, aid):
    """dst[bh, r0 + r, c0 + c] = sm[off + r * nc + c] for r < nr, c < nc."""
    moved = 0
    for e in range(cuda.threadIdx.x, nr * nc, cuda.blockDim.x):
        r = e // nc
        dst[bh, r0 + r, c0 + e - r * nc] = sm[off + e]
        moved += 1
    _tally(cnt, aid, WRITES, moved)


@cuda.jit(device=True)
def load_tile_t(src, bh, r0, nr, d, sm, off, cnt, aid):
    """sm[off + c * nr + r] = src[bh, r0 + r, c] for r < nr, c < d: the tile stored transposed (column-major).

    The global reads are :func:`load_tile`'s (row-major, coalesced, the same count); only the on-chip
    arrangement differs, so that threads holding consecutive rows read consecutive shared-memory words."""
    moved = 0
    for e in range(cuda.threadIdx.x, nr * d, cuda.blockDim.x):
        r = e // d
        c = e - r * d
        sm[off + c * nr + r] = src[bh, r0 + r, c]
        moved += 1
    _tally(cnt, aid, READS, moved)


@cuda.jit(device=True)
def store_tile_t(sm, off, dst, bh, r0, nr, d, cnt, aid):
    """dst[bh, r0 + r, c] = sm[off + c * nr + r] for r < nr, c < d: a transposed on-chip tile, stored row-major."""
    moved = 0
    for e in range(cuda.threadIdx.x, nr * d, cuda.blockDim.x):
        r = e // d
        c = e - r * d
        dst[bh, r0 + r, c] = sm[off + c * nr + r]
        moved += 1
    _tally(cnt, aid, WRITES, moved)


@cuda.jit(device=True)
def add_tile(sm, off, dst, bh, r0, nr, nc, cnt, aid):
    """dst[bh, r0 + r, c] += sm[off + r * nc + c] with atomics: a read-modify-write of every word in global memory.

    Counted as one read and one write per word, exactly what a load of the tile, an on-chip add and a store of
    it cost in the two-level model (the simulator's ``load`` + ``store`` of the same tile).
    """
    moved = 0
    for e in range(cuda.threadIdx.x, nr * nc, cuda.blockDim.x):
        r = e // nc
        cuda.atomic.add(dst, (bh, r0 + r, e - r * nc), sm[off + e])
        moved += 1
    _tally(cnt, aid, READS, moved)
    _tally(cnt, aid, WRITES, moved)


@cuda.jit(device=True)
def load_vec(src, bh, r0, n, sm, off, cnt, aid):
    """sm[off + r] = src[bh, r0 + r] for r < n."""
    moved = 0
    for r in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        sm[off + r] = src[bh, r0 + r]
        moved += 1
    _tally(cnt, aid, READS, moved)


@cuda.jit(device=True)
def store_vec(sm, off, dst, bh, r0, n, cnt, aid):
    """dst[bh, r0 + r] = sm[off + r] for r < n."""
    moved = 0
    for r in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        dst[bh, r0 + r] = sm[off + r]
        moved += 1
    _tally(cnt, aid, WRITES, moved)


@cuda.jit(device=True)
def init_tile(dst, bh, r0, nr, nc, value, cnt, aid):
    """Initialise dst[bh, r0:r0+nr, :nc] = value in global memory (a memset): writes and initialisation writes."""
    moved = 0
    for e in range(cuda.threadIdx.x, nr * nc, cuda.blockDim.x):
        r = e // nc
        dst[bh, r0 + r, e - r * nc] = value
        moved += 1
    _tally(cnt, aid, WRITES, moved)
    _tally(cnt, aid, INIT, moved)


@cuda.jit(device=True)
def init_vec(dst, bh, r0, n, value, cnt, aid):
    """Initialise dst[bh, r0:r0+n] = value in global memory: writes and initialisation writes."""
    moved = 0
    for r in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        dst[bh, r0 + r] = value
        moved += 1
    _tally(cnt, aid, WRITES, moved)
    _tally(cnt, aid, INIT, moved)


@cuda.jit(device=True)
def fill_shared(sm, off, n, value):
    """sm[off:off+n] = value (on-chip initialisation: no I/O)."""
    for e in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        sm[off + e] = value


@cuda.jit(device=True)
def dot(sm, pa, sa, pb, sb, n, k0):
    """sum_k sm[pa + k * sa] * sm[pb + k * sb] over k < n, the k loop starting at k0 and wrapping around."""
    acc = np.float32(0.0)
    k = k0
    for _ in range(n):
        acc += sm[pa + k * sa] * sm[pb + k * sb]
        k += 1
        if k == n:
            k = 0
    return acc


@cuda.jit(device=True)
def dot_rows(sm, a_off, ra, b_off, rb, d):
    """sum_k sm[a_off + ra*d + k] * sm[b_off + rb*d + k] over k < d, the k loop rotated by rb.

    Threads of a warp that hold one row ra and consecutive rows rb of B read d-strided addresses of B; starting
    each thread's k loop at rb (mod d) spreads those reads over the shared-memory banks instead of making every
    thread hit the same bank (d = 64, 128). The sum is the same up to float32 rounding order.
    """
    return dot(sm, a_off + ra * d, 1, b_off + rb * d, 1, d, rb % d)


@cuda.jit(device=True)
def tile_product_acc(sm, dst, m, n, kk, a, a_rs, a_cs, b, b_rs, b_cs, rotate):
    """sm[dst + r * n + c] += sum_x A[r, x] B[x, c] for r < m, c < n, x < kk, one thread per output element.

    Operands are shared-memory tiles addressed by strides: A[r, x] = sm[a + r * a_rs + x * a_cs] and
    B[x, c] = sm[b + x * b_rs + c * b_cs], so one helper serves A B (B row-major: b_rs = ld, b_cs = 1), A^T B
    (A stored row-major as kk x m: a_rs = 1, a_cs = m) and A B^T (B stored n x kk: b_rs = 1, b_cs = kk). With
    ``rotate`` each element's x loop starts at c (mod kk), as :func:`dot_rows` does for A B^T.
    """
    for e in range(cuda.threadIdx.x, m * n, cuda.blockDim.x):
        r = e // n
        c = e - r * n
        k0 = c % kk if rotate else 0
        sm[dst + e] += dot(sm, a + r * a_rs, a_cs, b + c * b_cs, b_rs, kk, k0)


# Register tiles of the on-chip products: each thread owns TM x TN outputs, TM rows strided by the warp's 32
# lanes (consecutive lanes, consecutive rows: conflict-free shared-memory reads of row-contiguous operands) and TN
# columns strided by the warps (one column per warp at a time: a broadcast read). product_t's inner loop is written
# out for TM = 2 (a0, a1).
TM = 2
TN = 8


@cuda.jit(device=True)
def lanes():
    """(row lane, column lane, row lanes, column lanes) of this thread in the register tiling of a block."""
    nt = cuda.blockDim.x
    RT = 32 if nt >= 32 else nt
    tid = cuda.threadIdx.x
    return tid % RT, tid // RT, RT, nt // RT


@cuda.jit(device=True)
def product_t(sm, dst, m, n, kk, a, a_xs, b, b_xs, b_js, scale, accumulate, causal, i0, j0):
    """D[i, j] (+)= scale * sum_x A[x, i] B[x, j] for i < m, j < n, x < kk, in register tiles (TM x TN per thread).

    A[x, i] = sm[a + x * a_xs + i] (row-contiguous: transposed Q_i, or P_ij^T), B[x, j] = sm[b + x * b_xs + j * b_js]
    and D[i, j] = sm[dst + j * m + i] (stored transposed). ``accumulate``: D += (O_i^T += P_ij V_j); else D = (S_ij^T
    = scale Q_i K_j^T), with ``causal`` entries j0 + j > i0 + i set to -inf. The sums run in the order x = 0, 1, ...
    """
    ri, cj, RT, CT = lanes()
    if cj >= CT:
        return
    acc = cuda.local.array((TM, TN), float32)
    ia = cuda.local.array(TM, int32)
    jb = cuda.local.array(TN, int32)
    for I0 in range(0, m, RT * TM):
        for u in range(TM):
            ia[u] = min(I0 + ri + u * RT, m - 1)  # rows past the tile read a valid row; their sums are dropped
        for J0 in range(0, n, CT * TN):
            for v in range(TN):
                jb[v] = min(J0 + cj + v * CT, n - 1) * b_js
            for u in range(TM):
                for v in range(TN):
                    acc[u, v] = float32(0.0)
            for x in range(kk):
                ax = a + x * a_xs
                bx = b + x * b_xs
                a0 = sm[ax + ia[0]]
                a1 = sm[ax + ia[1]]
                for v in range(TN):
                    bv = sm[bx + jb[v]]
                    acc[0, v] += a0 * bv
                    acc[1, v] += a1 * bv
            for u in range(TM):
                i = I0 + ri + u * RT
                if i < m:
                    for v in range(TN):
                        j = J0 + cj + v * CT
                        if j < n:
                            if accumulate:
                                sm[dst + j * m + i] += acc[u, v]
                            elif causal and j0 + j > i0 + i:
                                sm[dst + j * m + i] = NEG_INF
                            else:
                                sm[dst + j * m + i] = acc[u, v] * scale


@cuda.jit(device=True)
def span(i, B, N):
    """(start, size) of block i of side B along an axis of N: (i B, min(B, N - i B))."""
    start = i * B
    return start, min(B, N - start)


def device_and_host(fn):
    """``fn`` as a device helper, with the plain Python function kept as ``.host`` (shared-memory layouts: one
    function gives the kernel its offsets and the host launcher its word count)."""
    dev = cuda.jit(device=True)(fn)
    dev.host = fn
    return dev


@cuda.jit(device=True)
def logsumexp_rows(sm, m_off, l_off, n):
    """sm[l_off + r] = sm[m_off + r] + log(sm[l_off + r]) for r < n: L = m + log l in place of l."""
    for r in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        l_r = sm[l_off + r]  # l = 0: a row with no allowed entry (a block mask), L = -inf
        sm[l_off + r] = sm[m_off + r] + math.log(l_r) if l_r > 0 else NEG_INF


@cuda.jit(device=True)
def block_ids():
    """(thread, threads per block, block x, block y): the kernels' tid, nt, the tile index and (b, h) = bh."""
    return cuda.threadIdx.x, cuda.blockDim.x, cuda.blockIdx.x, cuda.blockIdx.y

"""The global load/store bytes a numba.cuda kernel's tile accesses request, in 32-byte sectors (no GPU needed).

Nsight Compute's ``l1tex__t_bytes_pipe_lsu_mem_global_op_ld/st`` count the bytes of the 32-byte sectors each warp
instruction touches (Nsight Compute Kernel Profiling Guide, Memory Tables: L1TEX requests are split into sectors of
32 bytes). iosim's kernels move a tile with ``load_tile``/``store_tile`` (algorithms/cuda/_common.py): thread t of
a block of T threads handles the flat elements e = t, t + T, ... of an nr x nc tile, element e at row e // nc and
column e % nc, so one warp instruction covers 32 consecutive e. With rows whose length is a multiple of 8 words
(every array here: N and d are multiples of 8, allocations 256-byte aligned) two rows never share a sector, and a
warp instruction's bytes are 32 times its distinct (row, (c0 + column) // 8) pairs. A tile whose column start c0 or
width nc is not a multiple of 8 words therefore requests more bytes than it moves: that is the sector rounding.

Besides the attention arrays, flash2's forward kernel reads its block mask ``blocks[i, j]`` (all ones without a
mask) twice per tile pair (i, j), in every thread: once in the scan that decides whether Q_i is loaded at all and
once in the skip test before K_j, V_j are loaded (algorithms/cuda/flash.py, flash2_forward_kernel). Each such read
is one sector per warp. The explicit count leaves these reads out: the mask is not one of attention's arrays.

The model assumes every warp issues each access once with all its active lanes together.
"""

from __future__ import annotations

from functools import cache

WARP = 32
SECTOR_WORDS = 8  # 32 bytes of float32


def tile_sectors(c0: int, nr: int, nc: int) -> int:
    """Sectors requested by a load_tile/store_tile of an nr x nc tile starting at column c0 (summed over warps)."""
    return _tile(c0 % SECTOR_WORDS, nr, nc)


@cache
def _tile(offset: int, nr: int, nc: int) -> int:
    total = 0
    for w in range(0, nr * nc, WARP):  # one warp instruction: elements w .. w + 31
        last = min(w + WARP, nr * nc) - 1
        for r in range(w // nc, last // nc + 1):  # the rows it touches, each a run of columns
            lo, hi = max(w, r * nc) - r * nc, min(last, r * nc + nc - 1) - r * nc
            total += (offset + hi) // SECTOR_WORDS - (offset + lo) // SECTOR_WORDS + 1
    return total


def vec_sectors(r0: int, n: int) -> int:
    """Sectors requested by a load_vec/store_vec of n contiguous words from index r0."""
    return _tile(r0 % SECTOR_WORDS, 1, n)


def _span(i: int, B: int, N: int) -> tuple[int, int]:
    return i * B, min(B, N - i * B)


def square_tiling(N: int, d: int, B: int, BH: int) -> dict:
    """Bytes requested by square tiling's two kernels (algorithms/cuda/square_tiling.py, non-causal): phase 1
    loads the Q tile (i, l) and the K tile (j, l) for every (i, j, l), stores S_ij for every (i, j) and L_i; phase
    2 loads L_i, then the S tile (i, k) and the V tile (k, c) for every (i, c, k), and stores O_ic."""
    rows = [_span(i, B, N) for i in range(-(-N // B))]  # (start, size) of the row tiles of N
    cols = [_span(c, B, d) for c in range(-(-d // B))]  # and of the column tiles of d
    Tn = len(rows)
    qk = sum(tile_sectors(k0, b, bk) for _, b in rows for k0, bk in cols)  # every row tile's Q (or K) slices
    s_tiles = sum(tile_sectors(c0, bi, bj) for _, bi in rows for c0, bj in rows)  # every S_ij
    l_vec = sum(vec_sectors(r0, b) for r0, b in rows)
    v_tiles = sum(tile_sectors(c0, bk, bc) for _, bk in rows for c0, bc in cols)  # every V_kc
    o_tiles = sum(tile_sectors(c0, bi, bc) for _, bi in rows for c0, bc in cols)  # every O_ic
    s = 32 * BH
    return {"phase1 ld": s * 2 * Tn * qk, "phase1 st": s * (s_tiles + l_vec),
            "phase2 ld": s * (l_vec + len(cols) * s_tiles + Tn * v_tiles), "phase2 st": s * o_tiles}  # fmt: skip


def flash2_forward(N: int, d: int, Br: int, Bc: int, BH: int, threads: int = 128) -> dict:
    """Bytes requested by flash2's forward kernel, non-causal, no mask: Q_i once and K_j, V_j for every (i, j), all
    whole rows of d words (d a multiple of 8: no rounding); the two reads of ``blocks[i, j]`` per tile pair by every
    warp; O_i in whole rows and L_i as a vector (rounded to sectors)."""
    Tr, Tc = -(-N // Br), -(-N // Bc)
    warps = -(-threads // WARP)
    ld = 4 * (N * d + 2 * Tr * N * d) + 32 * 2 * warps * Tr * Tc
    st = 4 * N * d + 32 * sum(vec_sectors(r0, b) for r0, b in (_span(i, Br, N) for i in range(Tr)))
    return {"ld": BH * ld, "st": BH * st, "mask reads": BH * 32 * 2 * warps * Tr * Tc}

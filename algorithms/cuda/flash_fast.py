"""Faster FlashAttention-2 forward kernels in numba.cuda: the same I/O schedule, register-blocked on chip.

Schedule (unchanged, word for word): one thread block per row block Q_i (grid (Tr, B * H)); Q_i loaded once;
K_j, V_j loaded for j = 0, 1, ... (causal: up to the last block with c0 <= r0 + br - 1, the simulator's skip);
O_i and L_i stored once. Loads are :func:`_loader`'s (``load_tile`` of :mod:`iosim.algorithms.cuda._common`
with constant extents, tallied with its ``_tally``), stores are ``store_tile`` and ``store_vec``, so the counters
equal the simulator's flash2 forward per array (Q: N d, K and V: d times the columns each row block loads, O:
N d, L: N; times B * H) for the same (N, d, Br, Bc, causal). tests/test_cuda_fast.py checks that against a
closed form written in the test and against the simulator.

What differs from :func:`iosim.algorithms.cuda.flash.flash2_forward_kernel` is where the fast memory's words live
and how the arithmetic is spread over threads:

* Kernels are specialised per (BR, BC, d, thread layout, ownership) (:func:`build`): every extent is a
  compile-time constant, so micro-tile loops unroll and the per-thread arrays (``cuda.local.array``) are
  registers. Shared-memory indices are unsigned: numba wraps a negative signed index around, which costs integer
  instructions per load and hides the constant offsets from the compiler.
* Thread layout: ``TY`` row groups of ``TX`` lanes (``TX`` a power of two dividing 32: a row group lies in one
  warp). Thread (ty, tx) owns TM = BR / TY rows, TN = BC / TX columns of S_ij and TD = d / TX columns of O_i
  (:func:`ownership`: strided, r = ty + TY u, or contiguous, r = ty TM + u).
* On chip Q_i and K_j are stored transposed (Q_i^T, K_j^T) and P_ij as P_ij^T, so a thread's operands at one
  step of a product are one address plus compile-time offsets (contiguous ownership: consecutive, 16-byte aligned
  words, which the compiler loads with ld.shared.v4). S_ij = Q_i K_j^T and O_i += P_ij V_j are TM x TN and
  TM x TD register tiles, four steps written out per loop iteration.
* m_i, l_i and O_i stay in registers for the whole row block (the model's O_i, l_i, m_i words, held by the
  threads that own the rows); the row max and row sum of a tile are reduced over the TX lanes of a row group with
  ``cuda.shfl_xor_sync`` (log2 TX steps). P~ = exp(S - m) uses ``__nv_fast_expf``.
* At the end O_i / l_i is staged into Q_i's words and L_i = m_i + log l_i into P's, then stored coalesced.

Shared memory per block (float32 words, :func:`layout`): Q_i^T d BR + K_j^T d (BC + pad_k) + V_j BC d + P_ij^T
BC (BR + pad), plus TY TM - BR slack words when TY does not divide BR. Strided ownership: pad = pad_k = 1 (the
transposing stores spread over the banks). Contiguous: pad 4 (rows 16-byte aligned); K_j^T unpadded with its
4-word groups XOR-swizzled by (x / 4) mod (BC / 4) where each thread owns whole groups (:func:`_loader`), else
pad_k 4. Against the model's working set BR (2d + 2) + 2 BC d + BR BC this is BR d + 2 BR - pad BC - pad_k d -
slack words less (O_i, l_i, m_i sit in registers): the launch never asks for more than M (``check_capacity``);
the fast memory used, shared memory plus the registers holding O_i, l_i, m_i, is the working set plus the
padding and slack words.

Variants (:data:`VARIANTS`; ptxas (nvJitLink 13) figures for sm_90 from ``python
experiments/bench/gpu_variants.py --dry-run``; the lease measures the times):

* ``rt16x16``: 256 threads, 16 x 16 lanes, strided. Br = 128, Bc = 64, d = 64: S 8 x 4, O 8 x 4 per thread; 12
  scalar shared loads per 32 FMAs in each product (at one shared load instruction per clock per SM against four
  FMA instructions, shared-memory-bound at about 2/3 of the FMA rate); 24,704 words, 127 registers
  (``launch_bounds`` (256, 2)), no spills: 2 blocks / SM (16 warps). d = 128, Br = Bc = 64: S 4 x 4, O 4 x 8,
  28,864 words, 128 registers, no spills, 2 blocks / SM.
* ``rt16x16v``: the same threads with contiguous ownership: 3 128-bit loads per 32 FMAs (SASS: 158 instructions
  per 128 FFMA in S and 153 in P V, against 192 and 189 for ``rt16x16``). d = 64: 24,832 words, 128 registers,
  no spills, 2 blocks / SM. d = 128: 28,928 words (2 blocks fill the SM's 228 KiB exactly), 128 registers with
  56 bytes of spills (outside the product loops), 2 blocks / SM.
* ``rt16x16v1``: ``rt16x16v`` without the register cap: d = 128: 177 registers, no spills, 1 block / SM.
* ``rt32x8``: 256 threads, 32 rows x 8 lanes, strided: 4 x 8 S tiles, 3 shuffle steps per row (not in the plan).
  :func:`min_blocks_for` lowers launch_bounds' blocks per SM to what shared memory allows.

Under the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) ``cuda.shfl_xor_sync`` does not exist in numba-cuda 0.30;
:func:`simulator_shuffles` adds one to the simulator's fake ``cuda`` module (every thread posts its value, a block
barrier, each reads its partner lane's, a barrier), valid because every thread of these kernels reaches each
shuffle together. The simulator variants (:data:`SIM_VARIANTS`, 8 threads) run the same code.
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass

import numpy as np
from iosim.algorithms.cuda._common import NEG_INF, READS, _tally, span, store_tile, store_vec
from iosim.algorithms.cuda._host import SIMULATOR, Launcher, cdiv, check_capacity, f32_scale
from iosim.algorithms.cuda.flash import FWD2_ARRAYS
from iosim.memory_model.core import InputError
from numba import cuda, float32, uint64

_Q, _K, _V, _O, _L = range(5)  # counter rows, in FWD2_ARRAYS's order
FULL_MASK = 0xFFFFFFFF
SMEM_ALIGN = None if SIMULATOR else 16  # bytes; the simulator takes no alignment (vector loads need 16)
if SIMULATOR:  # libdevice's functions are stubs on the simulator
    _exp = math.exp
else:  # __nv_fast_expf: ex2.approx of x log2(e), about 2 ulp (CUDA Math API, "Intrinsic functions")
    from numba.cuda import libdevice

    _exp = libdevice.fast_expf


@dataclass(frozen=True)
class Variant:
    """A thread layout: ``TY`` row groups of ``TX`` lanes; ``min_blocks`` is launch_bounds' blocks per SM."""

    name: str
    TY: int
    TX: int
    min_blocks: int
    aim: str
    contiguous: bool = False  # ownership(): consecutive rows / columns per thread (vector loads) or strided

    @property
    def threads(self) -> int:
        return self.TY * self.TX


VARIANTS = {
    v.name: v
    for v in (
        Variant("rt16x16", 16, 16, 2, "256 threads, 8x4 S tiles at Br=128 Bc=64, O in registers, 2 blocks/SM"),
        Variant("rt32x8", 32, 8, 2, "256 threads, 4x8 S tiles at Br=128 Bc=64, 3 shuffle steps per row"),
        Variant("rt16x16v", 16, 16, 2, "rt16x16 with contiguous rows/columns per thread: 128-bit shared loads", True),
        Variant("rt16x16v1", 16, 16, 1, "rt16x16v with no register cap: 1 block/SM, no spills at d = 128", True),
        Variant("rt16x16v4", 16, 16, 4, "rt16x16v at 64 registers: 4 blocks/SM at d = 64, Br <= 32, no spills", True),
    )
}
# Thread layouts for the CUDA simulator (every thread a Python thread): same code, fewer lanes.
SIM_VARIANTS = {
    v.name: v
    for v in (
        Variant("sim2x4", 2, 4, 1, "8 threads"),
        Variant("sim4x2", 4, 2, 1, "8 threads"),
        Variant("sim2x4v", 2, 4, 1, "8 threads, contiguous", True),
        Variant("sim4x2v", 4, 2, 1, "8 threads, contiguous, K_j^T swizzled when 2 TN = Bc and 4 | TN", True),
    )
}


def variant(name: str) -> Variant:
    """The variant called ``name`` (real-GPU or simulator layouts); InputError naming the accepted ones."""
    known = {**VARIANTS, **SIM_VARIANTS}
    if name not in known:
        raise InputError("variant", f"must be one of {', '.join(known)}", name)
    return known[name]


def layout(BR: int, BC: int, D: int, pad: int = 1, slack: int = 0, pad_k: int | None = None) -> dict:
    """Shared-memory offsets (float32 words): Q_i^T (D x BR), K_j^T (D x (BC + pad)), V_j (BC x D), P_ij^T
    (BC x (BR + pad)), ``slack`` words after it, and the total. Q_i and K_j are stored transposed so that one
    thread's TM rows (TN columns) at step x are one address plus compile-time offsets. ``pad`` words per row of
    K_j^T and P_ij^T: 1 spreads the transposing stores over the banks (strided ownership); 4 keeps every row
    16-byte aligned for vector loads (contiguous ownership). Q_i^T, written once per row block, has none.
    ``slack``: the words a thread's clamped-free row reads may run past P_ij^T when TY does not divide BR."""
    q = 0
    k = q + D * BR
    pad_k = pad if pad_k is None else pad_k
    v = k + D * (BC + pad_k)
    p = v + BC * D
    words = p + BC * (BR + pad) + slack
    return {"Q": q, "K": k, "V": v, "P": p, "LDK": BC + pad_k, "LDP": BR + pad, "words": words}


def ownership(BR: int, BC: int, D: int, TY: int, TX: int, contiguous: bool) -> dict:
    """Which rows and columns thread (ty, tx) owns: row u = ty RB + RS u (u < TM), S column v = tx CB + CS v
    (v < TN), O column w = tx OB + OS w (w < TD). Strided: RB = 1, RS = TY (and CB = 1, CS = TX; OB = 1, OS = TX);
    contiguous: RB = TM, RS = 1 (CB = TN, CS = 1; OB = TD, OS = 1), so a thread's operands at a step are
    consecutive words (vector loads when the compiler can prove 16-byte alignment)."""
    TM, TN, TD = cdiv(BR, TY), cdiv(BC, TX), cdiv(D, TX)
    if contiguous:
        G = BC // 4  # 4-word groups per K_j^T row: swizzled instead of padded when they allow it
        swz = G if BC % 4 == 0 and G & (G - 1) == 0 and TN % 4 == 0 and D % 4 == 0 and TX * TN == BC else 0
        own = {"RB": TM, "RS": 1, "CB": TN, "CS": 1, "OB": TD, "OS": 1, "pad": 4, "pad_k": 0 if swz else 4}
        return {"TM": TM, "TN": TN, "TD": TD, "G": swz, **own}
    own = {"RB": 1, "RS": TY, "CB": 1, "CS": TX, "OB": 1, "OS": TX, "pad": 1, "pad_k": 1}
    return {"TM": TM, "TN": TN, "TD": TD, "G": 0, **own}


def shared_layout(BR: int, BC: int, D: int, TY: int, TX: int, contiguous: bool) -> dict:
    """The layout a kernel specialised to these extents and this ownership uses."""
    w = ownership(BR, BC, D, TY, TX, contiguous)
    return layout(BR, BC, D, w["pad"], TY * w["TM"] - BR, w["pad_k"])


def _device(fn):
    """A device helper inlined into the kernel at the NVVM level (so its local arrays become registers)."""
    if SIMULATOR:  # the simulator's jit takes no inlining options
        return cuda.jit(device=True)(fn)
    return cuda.jit(device=True, forceinline=True)(fn)


def _loader(ROWS, D, NT, off, ld, transposed, G=0):
    """A counted copy of rows r0 .. r0 + nr - 1 (nr <= ROWS) of a (.., N, D) array into shared memory at ``off``
    (the rows of one (b, h) are contiguous: the kernel takes Q, K, V flat, so a tile is one run of nr D words):
    row-major with leading dimension D, or transposed (sm[off + c * ld + r]). ``load_tile`` of
    :mod:`iosim.algorithms.cuda._common` with every extent a constant: each thread copies the elements
    e = tid + NT k (k < ceil(ROWS D / NT), unrolled, so its global loads are all in flight together), consecutive
    threads on consecutive global words; the tally is the elements copied (``_tally``), nr D in all. ``G`` > 0:
    transposed with the 4-word groups of row c XOR-swizzled, sm[off + c ld + 4 ((r / 4) ^ ((c / 4) mod G)) + r mod 4]
    (rows stay 16-byte aligned without padding, and a warp's transposing stores spread over 8 banks)."""
    PER = cdiv(ROWS * D, NT)

    @_device
    def load(src, base, nr, sm, cnt, aid):
        """src is the flat (B H N D) array; the tile starts at word ``base`` = (bh N + r0) D (unsigned)."""
        tid = uint64(cuda.threadIdx.x)
        lim = uint64(nr * D)
        moved = 0
        for k in range(PER):
            e = tid + uint64(NT * k)
            if e < lim:
                r = e // uint64(D)
                c = e - r * uint64(D)
                if G:
                    r = ((r >> uint64(2)) ^ ((c >> uint64(2)) & uint64(G - 1))) * uint64(4) + (r & uint64(3))
                at = uint64(off) + c * uint64(ld) + r if transposed else uint64(off) + e
                sm[at] = src[base + e]
                moved += 1
        _tally(cnt, aid, READS, moved)

    return load


def _unroll(n: int) -> int:
    """The steps of a reduction loop written out per iteration: 4, 2 or 1, whichever divides n."""
    return 4 if n % 4 == 0 else 2 if n % 2 == 0 else 1


def _rank1_step(TM, TN, RS, CS):
    """One step of a register-tiled product, acc += a b^T: a[u] = sm[ax + RS u] (u < TM), b[v] = sm[bx + CS v]
    (v < TN); S_ij's step x and O_i's step c are both this, with their own strides."""

    @_device
    def step(sm, acc, a, b, ax, bx):
        for u in range(TM):
            a[u] = sm[ax + uint64(RS * u)]
        for v in range(TN):
            b[v] = sm[bx + uint64(CS * v)]
        for u in range(TM):
            for v in range(TN):
                acc[u, v] += a[u] * b[v]

    return step


def _s_product(BR, BC, D, TY, TX, contiguous):
    """S_ij = Q_i K_j^T of one step as a register tile, specialised to constant extents.

    Thread (ty, tx)'s operands at step x are sm[base + x * ld + RS u] (rows) and sm[base' + x * ld' + CS v]
    (columns; :func:`ownership`): after unrolling, one address per step plus immediate offsets. Indices are
    unsigned (uint64): numba wraps a negative signed index around, which costs integer instructions per load and
    hides the offsets.
    Rows (columns) past the tile, when TY (TX) does not divide it, read another row's words; their sums are
    dropped (never written to P or O)."""
    w = ownership(BR, BC, D, TY, TX, contiguous)
    TM, TN, RB, RS, CB, CS = (w[k] for k in ("TM", "TN", "RB", "RS", "CB", "CS"))
    G = w["G"]  # > 0: K_j^T's 4-word groups swizzled (_loader); a thread's TN columns are TN / 4 whole groups
    NG = max(1, TN // 4)
    lay = shared_layout(BR, BC, D, TY, TX, contiguous)
    Q0, K0, LDK = lay["Q"], lay["K"], lay["LDK"]
    UX = _unroll(D)

    @_device
    def s_step_swizzled(sm, s, a, b, qx, kx, kg):
        """One step x of S with K_j^T swizzled: column group g of this thread at kx + kg[g] (4 words)."""
        for u in range(TM):
            a[u] = sm[qx + uint64(RS * u)]
        for v in range(TN):
            b[v] = sm[kx + kg[v // 4] + uint64(v % 4)]
        for u in range(TM):
            for v in range(TN):
                s[u, v] += a[u] * b[v]

    s_step = _rank1_step(TM, TN, RS, CS)  # a[u] = Q_i^T[x, ty + TY u], b[v] = K_j^T[x, tx + TX v]

    @_device
    def scores(sm, s, ty, tx):
        """s[u, v] = sum_x Q_i[ty + TY u, x] K_j[tx + TX v, x], UX steps written out per iteration (LLVM does not
        unroll a body this large by itself, and an unrolled body needs no address arithmetic but immediates)."""
        a = cuda.local.array(TM, float32)
        b = cuda.local.array(TN, float32)
        for u in range(TM):
            for v in range(TN):
                s[u, v] = float32(0.0)
        qb = uint64(Q0 + ty * RB)
        if G:  # UX = 4 (ownership() asks D % 4 == 0): the swizzle (x / 4) mod G is one value per iteration
            kg = cuda.local.array(NG, uint64)
            for x0 in range(D // 4):
                for g in range(NG):
                    kg[g] = uint64(4 * ((tx * NG + g) ^ (x0 & (G - 1))))
                qx = qb + uint64(x0 * (4 * BR))
                kx = uint64(K0 + x0 * (4 * LDK))
                s_step_swizzled(sm, s, a, b, qx, kx, kg)
                s_step_swizzled(sm, s, a, b, qx + uint64(BR), kx + uint64(LDK), kg)
                s_step_swizzled(sm, s, a, b, qx + uint64(2 * BR), kx + uint64(2 * LDK), kg)
                s_step_swizzled(sm, s, a, b, qx + uint64(3 * BR), kx + uint64(3 * LDK), kg)
            return
        kb = uint64(K0 + tx * CB)
        for x0 in range(D // UX):
            qx = qb + uint64(x0 * (UX * BR))
            kx = kb + uint64(x0 * (UX * LDK))
            s_step(sm, s, a, b, qx, kx)
            if UX > 1:
                s_step(sm, s, a, b, qx + uint64(BR), kx + uint64(LDK))
            if UX > 2:
                s_step(sm, s, a, b, qx + uint64(2 * BR), kx + uint64(2 * LDK))
                s_step(sm, s, a, b, qx + uint64(3 * BR), kx + uint64(3 * LDK))

    return scores


def _pv_product(BR, BC, D, TY, TX, contiguous):
    """O_i += P_ij V_j of one step as a register tile (:func:`_s_product`'s conventions)."""
    w = ownership(BR, BC, D, TY, TX, contiguous)
    TM, TD, RB, RS, OB, OS = (w[k] for k in ("TM", "TD", "RB", "RS", "OB", "OS"))
    lay = shared_layout(BR, BC, D, TY, TX, contiguous)
    V0, P0, LDP = lay["V"], lay["P"], lay["LDP"]

    pv_step = _rank1_step(TM, TD, RS, OS)  # a[u] = P_ij^T[c, ty + TY u], b[w] = V_j[c, tx + TX w]

    @_device
    def accumulate_pv(sm, o, ty, tx, bc):
        """o[u, w] += sum_{c < bc} P_ij[ty + TY u, c] V_j[c, tx + TX w], four steps written out per iteration."""
        a = cuda.local.array(TM, float32)
        b = cuda.local.array(TD, float32)
        pb = uint64(P0 + ty * RB)
        vb = uint64(V0 + tx * OB)
        full = bc // 4
        for c0 in range(full):
            pc = pb + uint64(c0 * (4 * LDP))
            vc = vb + uint64(c0 * (4 * D))
            pv_step(sm, o, a, b, pc, vc)
            pv_step(sm, o, a, b, pc + uint64(LDP), vc + uint64(D))
            pv_step(sm, o, a, b, pc + uint64(2 * LDP), vc + uint64(2 * D))
            pv_step(sm, o, a, b, pc + uint64(3 * LDP), vc + uint64(3 * D))
        for c in range(full * 4, bc):
            pv_step(sm, o, a, b, pb + uint64(c * LDP), vb + uint64(c * D))

    return accumulate_pv


def _softmax(BR, BC, D, TY, TX, contiguous):
    """Online softmax of one tile in registers: row max and sum over a row group's TX lanes by shuffles."""
    w = ownership(BR, BC, D, TY, TX, contiguous)
    TM, TN, TD, RB, RS, CB, CS = (w[k] for k in ("TM", "TN", "TD", "RB", "RS", "CB", "CS"))
    lay = shared_layout(BR, BC, D, TY, TX, contiguous)
    P0, LDP = lay["P"], lay["LDP"]

    @_device
    def lanes_max(x):
        off = TX // 2
        while off > 0:
            x = max(x, cuda.shfl_xor_sync(FULL_MASK, x, off))
            off //= 2
        return x

    @_device
    def lanes_sum(x):
        off = TX // 2
        while off > 0:
            x += cuda.shfl_xor_sync(FULL_MASK, x, off)
            off //= 2
        return x

    @_device
    def update(sm, s, o, m, l, ty, tx, r0, c0, bc, scale, causal):  # noqa: E741
        """S -> P~ = exp(scale S - m_new) (masked: 0), l = alpha l + rowsum P~, O *= alpha; P~ written to P_ij."""
        edge = bc < TX * TN or (causal and c0 + BC - 1 > r0 + ty * RB)
        for u in range(TM):
            r = r0 + ty * RB + RS * u
            mx = NEG_INF
            for v in range(TN):
                c = tx * CB + CS * v
                x = s[u, v] * scale
                if edge and (c >= bc or (causal and c0 + c > r)):
                    x = NEG_INF
                s[u, v] = x
                mx = max(mx, x)
            m_new = max(m[u], lanes_max(mx))
            m_use = m_new if m_new != NEG_INF else float32(0.0)  # a row with nothing allowed yet: P~ = 0
            alpha = _exp(m[u] - m_use)
            rs = float32(0.0)
            for v in range(TN):
                p = _exp(s[u, v] - m_use)
                rs += p
                c = tx * CB + CS * v
                if (TY * TM == BR or r - r0 < BR) and (TX * TN == BC or c < BC):  # (constant when they divide)
                    sm[uint64(P0 + c * LDP + r - r0)] = p
            l[u] = alpha * l[u] + lanes_sum(rs)
            m[u] = m_new
            for w in range(TD):
                o[u, w] *= alpha

    return update


def _finish(BR, BC, D, TY, TX, contiguous):
    w = ownership(BR, BC, D, TY, TX, contiguous)
    TM, TD, RB, RS, OB, OS = (w[k] for k in ("TM", "TD", "RB", "RS", "OB", "OS"))
    lay = shared_layout(BR, BC, D, TY, TX, contiguous)
    Q0, P0 = lay["Q"], lay["P"]

    @_device
    def finish(sm, o, m, l, ty, tx, br):  # noqa: E741
        """O_i = O_i / l_i into Q_i's words (BR x D, row-major), L_i = m_i + log l_i into P's (l = 0: O 0, L -inf)."""
        for u in range(TM):
            r = ty * RB + RS * u
            if r < br:
                inv = float32(1.0) / l[u] if l[u] > 0 else float32(0.0)
                for w in range(TD):
                    k = tx * OB + OS * w
                    if k < D:
                        sm[Q0 + r * D + k] = o[u, w] * inv
                if tx == 0:
                    sm[P0 + r] = m[u] + math.log(l[u]) if l[u] > 0 else NEG_INF

    return finish


@functools.cache
def build(BR: int, BC: int, D: int, TY: int, TX: int, min_blocks: int = 1, contiguous: bool = False):
    """(kernel, shared words) of the forward specialised to row block BR, column block BC, head dim D, TY x TX
    threads and the ownership :func:`ownership` names."""
    TM, TN, TD = cdiv(BR, TY), cdiv(BC, TX), cdiv(D, TX)
    lay = shared_layout(BR, BC, D, TY, TX, contiguous)
    Q0, K0, V0, P0, LDK = lay["Q"], lay["K"], lay["V"], lay["P"], lay["LDK"]
    scores = _s_product(BR, BC, D, TY, TX, contiguous)
    accumulate_pv = _pv_product(BR, BC, D, TY, TX, contiguous)
    update = _softmax(BR, BC, D, TY, TX, contiguous)
    finish = _finish(BR, BC, D, TY, TX, contiguous)
    load_q = _loader(BR, D, TY * TX, Q0, BR, True)
    load_k = _loader(BC, D, TY * TX, K0, LDK, True, ownership(BR, BC, D, TY, TX, contiguous)["G"])
    load_v = _loader(BC, D, TY * TX, V0, D, False)

    def kernel(Q, K, V, O, L, scale, causal, cnt):  # noqa: E741
        """FlashAttention-2 forward for row block blockIdx.x of (b, h) = blockIdx.y (module docstring)."""
        sm = cuda.shared.array(0, dtype=float32, alignment=SMEM_ALIGN)
        tid = cuda.threadIdx.x
        ty = tid // TX
        tx = tid - ty * TX
        bh = cuda.blockIdx.y
        N = O.shape[1]
        r0, br = span(cuda.blockIdx.x, BR, N)
        load_q(Q, uint64((bh * N + r0) * D), br, sm, cnt, _Q)
        for e in range(tid, (BR - br) * D, TY * TX):  # rows past a ragged last block: zeros (no I/O), never stored
            x = e // (BR - br)
            sm[Q0 + x * BR + br + e - x * (BR - br)] = float32(0.0)
        s = cuda.local.array((TM, TN), float32)
        o = cuda.local.array((TM, TD), float32)
        m = cuda.local.array(TM, float32)
        l = cuda.local.array(TM, float32)  # noqa: E741
        for u in range(TM):
            m[u] = NEG_INF
            l[u] = float32(0.0)
            for w in range(TD):
                o[u, w] = float32(0.0)
        for j in range((N + BC - 1) // BC):
            c0, bc = span(j, BC, N)
            if causal and c0 > r0 + br - 1:  # this and every later block lie above the diagonal: never loaded
                break
            cuda.syncthreads()  # the previous step is done with K_j, V_j, P_ij
            load_k(K, uint64((bh * N + c0) * D), bc, sm, cnt, _K)  # K_j^T; columns past bc: scores masked
            load_v(V, uint64((bh * N + c0) * D), bc, sm, cnt, _V)
            cuda.syncthreads()
            scores(sm, s, ty, tx)
            update(sm, s, o, m, l, ty, tx, r0, c0, bc, scale, causal)
            cuda.syncthreads()
            accumulate_pv(sm, o, ty, tx, bc)
        cuda.syncthreads()
        finish(sm, o, m, l, ty, tx, br)
        cuda.syncthreads()
        store_tile(sm, Q0, O, bh, r0, br, 0, D, cnt, _O)
        store_vec(sm, P0, L, bh, r0, br, cnt, _L)

    if SIMULATOR:
        return cuda.jit(kernel), lay["words"]
    return cuda.jit(launch_bounds=(TY * TX, min_blocks))(kernel), lay["words"]


SMEM_PER_SM = 228 * 1024  # bytes, compute capability 9.0 (iosim.gpu.resources.ARCHS, CUDA Programming Guide)
RESERVED_PER_BLOCK = 1024  # bytes of system-reserved shared memory per block (same sources)


def min_blocks_for(v: Variant, words: int) -> int:
    """launch_bounds' blocks per SM: the variant's, or 1 when that many blocks' shared memory cannot fit in an SM
    (then a register cap would buy no occupancy and only cost spills)."""
    fit = SMEM_PER_SM // (words * 4 + RESERVED_PER_BLOCK)
    return max(1, min(v.min_blocks, fit))


def kernel_for(v: Variant, BR: int, BC: int, D: int):
    """(kernel, shared words) of variant ``v`` at these extents (compiled on first launch, cached by :func:`build`)."""
    mb = min_blocks_for(v, kernel_words(v, BR, BC, D))
    return build(BR, BC, D, v.TY, v.TX, mb, v.contiguous)


def kernel_words(v: Variant, BR: int, BC: int, D: int) -> int:
    """The shared words variant ``v`` asks for at these extents (no compilation)."""
    return shared_layout(BR, BC, D, v.TY, v.TX, v.contiguous)["words"]


def simulator_shuffles() -> None:
    """Give the CUDA simulator's fake ``cuda`` module a ``shfl_xor_sync`` (idempotent; simulator only).

    Each thread posts its value on a board kept by its block's manager, waits at a block barrier, reads the value
    of lane ``lane ^ lane_mask`` of its own warp, and waits again (so no thread overwrites a value still unread).
    Correct only when every thread of the block calls it together, as the kernels here do."""
    from numba.cuda.simulator import kernelapi

    if hasattr(kernelapi.FakeCUDAModule, "shfl_xor_sync"):
        return

    def shfl_xor_sync(self, mask, value, lane_mask):
        t = threading.current_thread()
        board = t._manager.__dict__.setdefault("_iosim_shfl", {})
        board[t.thread_id] = value
        t.syncthreads()
        got = board[(t.thread_id & ~31) | ((t.thread_id & 31) ^ lane_mask)]
        t.syncthreads()
        return got

    kernelapi.FakeCUDAModule.shfl_xor_sync = shfl_xor_sync


def flash2_forward_fast(
    Q, K, V, *, variant_name: str, Br: int, Bc: int, scale=None, causal=False, M=None, count=False, poison=True,
    out=None,
):  # fmt: skip
    """FlashAttention-2 forward with a register-tiled variant. Returns a KernelRun with outputs O and L.

    ``Br``, ``Bc``: the schedule's tiles (the simulator's, for the same M); ``M`` (optional): the launch is refused
    (CapacityError) if the kernel's shared words exceed it."""
    v = variant(variant_name)
    if SIMULATOR:  # the caller installs iosim.gpu.simulator's thread-safe swap (algorithms import no iosim.gpu)
        simulator_shuffles()
    job = Launcher(FWD2_ARRAYS, count, v.threads, poison, out, Q=Q, K=K, V=V)
    N, d, BH, a = job.batch.N, job.batch.d, job.batch.BH, job.arrays
    for name, x in (("Br", Br), ("Bc", Bc)):
        if not isinstance(x, (int, np.integer)) or x < 1:
            raise InputError(name, "must be a positive integer", x)
    kernel, words = kernel_for(v, min(Br, N), min(Bc, N), d)
    check_capacity(words, M, f"{v.name} shared memory (Q_i, K_j padded, V_j, P_ij)")
    O, L = job.output("O", (N, d)), job.output("L", (N,))
    flat = [a[n].reshape(BH * N * d) for n in ("Q", "K", "V")]  # the kernel reads Q, K, V flat (C-contiguous)
    args = (*flat, O, L, f32_scale(scale, d), bool(causal), job.cnt)
    job.launch(kernel, (cdiv(N, Br), BH), words, *args)
    return job.run({"Br": Br, "Bc": Bc, "variant": v.name})

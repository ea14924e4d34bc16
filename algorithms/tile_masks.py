"""Attention masks as the algorithms see them: a tile oracle that never materialises N x N.

Semantics (written once; every algorithm, the reference and the closed forms follow them)
-------------------------------------------------------------------------------------------
A mask allows or forbids each score entry (r, c) of the N x N matrix. Forbidden scores are -inf before the
softmax, so P_rc = 0 there. A row with no allowed entry has O_r = 0, logsumexp L_r = -inf and zero gradients
(dQ_r = 0, and it contributes nothing to dK, dV), as FlashAttention's kernels leave it.

A tile [r0, r0 + nr) x [c0, c0 + nc) is *empty* (nnz 0: an algorithm skips it, loading nothing for it), *full*
(nnz = nr nc: no element test) or *partial* (the element test applies inside). ``mask_nnz`` answers in O(1) for
the structured kinds (band: causal and sliding windows; prefix-LM), O(documents met) for block-diagonal,
O(diagonals met / dilation) for dilated windows, O(blocks met) for a block mask and O(1) from a 2-D prefix-sum
table for an element mask (a user's array). ``mask_cols`` / ``mask_rows`` bound the columns a row
block (rows a column block) can touch, so a schedule visits O(nonzero tiles) tiles for structured masks.

Random kinds (``random:S``, ``random-blocks``, ``bigbird``) hold no table: whether an element or a block is allowed
is a pure function of (seed, position), a counter-based generator (SplitMix64's finaliser applied to the seed and
the coordinates, :func:`_draw`; a row's first two rounds are shared, :func:`_row_key`), so any tile is reproducible
on its own, whatever the tiling and whatever N, and counting a tile's nonzeros needs only that tile. ``random:S``
and ``random-blocks`` are Bernoulli(S) per element / per block (draw < round(S 2^53)); BigBird's r random blocks of
a block row are the first r distinct draws (seed, block row, k) mod n. Cost of counting a tile: one generator round
per element (random elements), one per block it meets (random blocks), and for BigBird O(r^2) comparisons to draw a
block row's columns plus O(r) per block row it meets (global columns and the window in closed form; a tile summary
draws a row block's columns once for all its tiles). A driver asks only empty / full / partial: a random-element
tile stops at its first allowed and first forbidden element. Nothing of size N x N (or blocks x blocks) is ever
allocated; counting a whole mask still visits every element (or block) and a schedule tests every tile, which the
long-run rule of :mod:`iosim.runner.estimate` prices up front (:attr:`TileMask.scan_tests`,
:meth:`TileMask.visit_tests`).

Representation (one compiled driver serves every kind): ``kind`` (an int code), ``params`` (int64 1-D) and
``table`` (int64 2-D; 1 x 1 when unused). A run without a mask passes None for both, and its driver compiles
without any mask code (the helpers at the end of this module). The mask is schedule metadata, like N or the
causal flag: reading it is not counted as I/O (Proposition 4 does not count the block mask either).
:class:`TileMask` bundles them with a label and the schedule policy for the outer-loop operands of a block whose
tiles are all empty (:data:`POLICIES`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from iosim.algorithms._tiles import cdiv
from numba import njit, types
from numba.extending import overload

DENSE, BAND, DILATED, BLOCKDIAG, PREFIX, ELEMENTS, BLOCKS, RANDOM, RANDOM_BLOCKS, BIGBIRD = range(10)
# MOD: a mask evaluated a block at a time from a FlexAttention-style mask_mod (iosim.masking.mask_mod): g x g blocks (g
# = 64,
# one int64 word per row of a block) classified empty / full / partial, and the element bits of the partial blocks
# only. p = (g, nbr, nbc, R, per); T (width W = g max(1, (nbc + 2) // g + 1)) rows [0, nbr): the class of each
# block (0 empty, -1 full, k >= 1 the k-th partial block) and in columns nbc, nbc + 1 the block columns
# [first, last + 1) a block row touches; rows nbr to nbr + R: the partial blocks, per = W / g to a row (block k at
# row nbr + (k - 1) // per, columns from g ((k - 1) % per)), g words each (bit c of word r: column c of the block
# allowed at row r); rows nbr + R, nbr + R + 1: the block rows [first, last + 1) each block column touches.
# Memory: about 8 W (nbr + 2) + 8 g K bytes for K partial blocks.
MOD = 10
MOD_G = 64
FAR = 1 << 40  # a diagonal offset beyond any N: BAND(-FAR, 0) is the causal mask
# What a K/V-outer schedule does with K_j, V_j of a column block whose tiles are all empty (and a Q-outer one with
# Q_i of an all-empty row block): "paper" loads them before testing the mask (FlashAttention Algorithm 5, line 6
# before line 8); "skip" never loads them (FlashAttention's CUDA block-sparse kernel returns first).
POLICIES = ("paper", "skip")


@dataclass(frozen=True, eq=False)
class TileMask:
    """A mask compiled for one N: the Numba triple (kind, params, table), a label and the empty-block policy."""

    kind: int
    params: np.ndarray
    table: np.ndarray
    N: int
    label: str = "none"
    policy: str = "paper"

    @property
    def args(self) -> tuple:
        """What a driver takes: (kind, params, table, skip); params and table are None for the dense mask, so the
        drivers' dense specialisation compiles no mask code (the helpers at the end of this module)."""
        if self.kind == DENSE:
            return self.kind, None, None, self.policy == "skip"
        return self.kind, self.params, self.table, self.policy == "skip"

    @property
    def packed_rows(self) -> int:
        """R when this is one group's mask over its R packed rows (the g query heads of a key/value head under
        masks of their own, :func:`iosim.masking.head_masks.packed_mask`), else 0."""
        return int(self.params[5]) if self.kind == MOD and self.params.size > 5 else 0

    def with_policy(self, policy: str) -> TileMask:
        return TileMask(self.kind, self.params, self.table, self.N, self.label, policy)

    @property
    def is_causal(self) -> bool:
        return self.kind == BAND and int(self.params[0]) <= -self.N and int(self.params[1]) == 0

    def dense(self) -> np.ndarray:
        """The N x N boolean mask (for tests; O(N^2))."""
        return self.rows(0, self.N)

    def rows(self, r0: int, r1: int) -> np.ndarray:
        """Rows [r0, r1) of the boolean mask, (r1 - r0) x N: what the row-block reference applies to one block."""
        return _dense_rows(self.kind, self.params, self.table, self.N, r0, r1)

    def nnz(self) -> int:
        return int(mask_nnz(self.kind, self.params, self.table, 0, self.N, 0, self.N))

    @property
    def scan_tests(self) -> int:
        """About how many generator draws one count of the whole mask makes, on any tiling (0 for the kinds counted
        in closed form or from a table): what a run, a closed form or a bound over a random mask costs beyond its
        tiles. An element of ``random:S`` is one draw (measured 0.6 ns); a block of random blocks is weighted as 16
        draws (the blocks a tile meets are tested again by its neighbours when tiles and blocks do not align;
        measured 4-9 ns a block); BigBird is weighted as 4 + r draws per block (a tile pays O(r) per block row it
        meets, and a row of tiles draws each block row's r columns once; measured 3-35 ns a tile)."""
        N = self.N
        if self.kind == RANDOM:
            return N * N
        if self.kind == RANDOM_BLOCKS:
            return -(-N // int(self.params[0])) * -(-N // int(self.params[1])) * 16
        if self.kind == BIGBIRD:
            n = int(self.params[6])
            return n * n * (4 + min(int(self.params[5]), n))
        return 0

    def visit_tests(self, Br: int, Bc: int) -> int:
        """About how many generator draws (of about 2 ns) a schedule's test of one Br x Bc tile costs beyond
        :attr:`scan_tests` (0 for the kinds whose ranges skip the tiles they empty): a random mask leaves no tile out
        of a schedule's ranges, so every tile is tested, empty or not. Random blocks: 25 a tile (a call and its
        loops; measured 40 ns); BigBird: 50 a tile (a call and its table of random columns) plus 15 + r^2 / 4 per
        block row the tile meets (its r columns drawn again; measured 130-300 ns a tile at r = 3, 2.4 us at r = 30
        with 5 block rows a tile); random elements: 0 (a tile's elements are priced by :attr:`scan_tests`, and a
        driver stops at the first allowed and forbidden element)."""
        if self.kind == RANDOM_BLOCKS:
            return 25
        if self.kind == BIGBIRD:
            r = min(int(self.params[5]), int(self.params[6]))
            return 50 + (min(Br, self.N) // int(self.params[0]) + 2) * (15 + r * r // 4)
        return 0

    def tile_tests(self, Br: int, Bc: int) -> int:
        """About how many generator draws (of about 2 ns) a problem's schedule (algorithms/flash.py), which never
        counts the whole mask, pays per Br x Bc tile it tests, calls and loops included (measured on the problem's
        tile summary at N = 65,536 with 295 x 64 tiles). Random elements: 28 plus about 1 / min(S, 1 - S) draws to
        meet the first allowed and first forbidden element (measured 60 ns at S = 0.5, 230 ns at 0.01, 1.8 us at
        0.001); random blocks: 25 plus 3 per block the tile meets (130 ns with 64 x 64 blocks, 615 ns with 16 x 16);
        BigBird: :meth:`visit_tests` (250-690 ns measured, 300-780 ns estimated)."""
        if self.kind == RANDOM:
            S = int(self.params[1]) / _ONE
            return 28 + min(Br * Bc, int(1 / max(min(S, 1 - S), 1 / _ONE)))
        if self.kind == RANDOM_BLOCKS:
            h, w = int(self.params[0]), int(self.params[1])
            return 25 + 3 * (min(Br, self.N) // h + 2) * (min(Bc, self.N) // w + 2)
        return self.visit_tests(Br, Bc)


_NO_TABLE = np.zeros((1, 1), dtype=np.int64)


def tile_mask(kind: int, params=(), table=None, *, N: int, label: str, policy: str = "paper") -> TileMask:
    p = np.ascontiguousarray(np.asarray(params, dtype=np.int64).reshape(-1))
    if p.size == 0:
        p = np.zeros(1, dtype=np.int64)
    t = _NO_TABLE if table is None else np.ascontiguousarray(table, dtype=np.int64)
    if kind != DENSE and not _WARM:
        _warm(p, t)
    return TileMask(int(kind), p, t, int(N), label, policy)


_WARM: list = []


def _warm(p, t) -> None:
    """Compile (or load) :func:`mask_nnz`, which every mask helper a count-only driver calls reaches, here, once per
    process, with Numba's runtime. Its BigBird branch allocates (a buffer of random columns); a count-only variant is
    compiled without the runtime, and mask_nnz compiled first from inside it was compiled without it too and failed
    to type (whatever the kind: the kind is a run-time value). Compiled here first, every variant reuses this
    compilation (one signature: int64 kind, params, table and sizes); the call counts nothing (an empty tile).
    Not while the module's functions are their plain Python (the pebble game's symbolic run patches them): a
    process whose first mask was made there compiled the count-only variant first and failed to type."""
    if not hasattr(mask_nnz, "py_func"):
        return
    _WARM.append(True)
    mask_nnz(BIGBIRD, p, t, 0, 0, 0, 0)  # the one that allocates; the helpers calling it reuse this compilation


def dense_mask(N: int, policy: str = "paper") -> TileMask:
    return tile_mask(DENSE, N=N, label="none", policy=policy)


def causal_mask(N: int, policy: str = "paper") -> TileMask:
    return tile_mask(BAND, (-FAR, 0), N=N, label="causal", policy=policy)


def resolve(causal, N: int) -> TileMask:
    """The mask a driver runs with: a :class:`TileMask` as given, True the causal mask, False none."""
    if isinstance(causal, TileMask):
        return causal
    return causal_mask(N) if causal else dense_mask(N)


def query_rows(causal, N: int, Nk: int) -> tuple[tuple, int]:  # noqa: N803
    """The mask triple a one-head schedule of N query rows against N_k keys runs with, and the mask row of its
    first query row. A :class:`TileMask` over N_k != N keys covers the whole sequence and the queries are its last
    N rows (offset N_k - N, aligned bottom-right); the causal flag with N_k != N is the bottom-right band
    c - r <= N_k - N on the N rows themselves (offset 0; for N > N_k the first N - N_k rows see no key); otherwise
    :func:`resolve` over N, offset 0."""
    if isinstance(causal, TileMask) and causal.N == Nk != N:
        return causal.args[:3], Nk - N
    if Nk != N and causal is True:
        return tile_mask(BAND, (-FAR, Nk - N), N=N, label="causal").args[:3], 0
    return resolve(causal, N).args[:3], 0


def prefix_table(allowed: np.ndarray) -> np.ndarray:
    """The (n+1) x (m+1) 2-D prefix sums of a boolean n x m array: nnz of any rectangle in O(1)."""
    P = np.zeros((allowed.shape[0] + 1, allowed.shape[1] + 1), dtype=np.int64)
    np.cumsum(np.cumsum(allowed, axis=0, dtype=np.int64), axis=1, out=P[1:, 1:])
    return P


@njit(cache=True)
def _upper(p, x):
    """The number of entries of the sorted vector p that are <= x (np.searchsorted(p, x, side="right"), written out:
    Numba's searchsorted costs about a second of first-run compile time)."""
    lo, hi = 0, p.size
    while lo < hi:
        mid = (lo + hi) // 2
        if p[mid] <= x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def _clamp_sum(a, n, cap):
    """sum of clamp(x, 0, cap) for x = a, a + 1, ..., a + n - 1."""
    if n <= 0:
        return 0
    b = a + n - 1
    lo, hi = max(a, 1), min(b, cap)
    s = (lo + hi) * (hi - lo + 1) // 2 if lo <= hi else 0
    over = b - max(a, cap + 1) + 1
    return s + (cap * over if over > 0 else 0)


@njit(cache=True)
def _band_count(r0, nr, c0, nc, lo, hi):
    """Entries (r, c) of the rectangle with lo <= c - r <= hi: F(hi) - F(lo - 1), F(t) = #{c - r <= t}."""
    if nr <= 0 or nc <= 0 or lo > hi:
        return 0
    return _clamp_sum(r0 + hi - c0 + 1, nr, nc) - _clamp_sum(r0 + lo - c0, nr, nc)


@njit(cache=True)
def _rect(P, r0, r1, c0, c1):
    return P[r1, c1] - P[r0, c1] - P[r1, c0] + P[r0, c0]


_MASK64 = (1 << 64) - 1
_ONE = 1 << 53  # a draw is uniform on [0, 2^53): allowed when below round(density 2^53)


def threshold(density: float) -> int:
    """The integer threshold of a density for :func:`_draw`: a draw is allowed with probability threshold / 2^53."""
    return int(round(float(density) * _ONE))


def seed_word(seed: int) -> int:
    """A seed in [0, 2^64) as the int64 with the same 64 bits (what a mask's int64 params hold)."""
    return seed - (1 << 64) if seed >= 1 << 63 else seed


def _splitmix(x):
    x &= _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _draw(seed, a, b):
    """A uniform integer on [0, 2^53) that depends only on (seed, a, b): SplitMix64's finaliser applied in turn
    to the seed and the two coordinates (Python integers here; 64-bit unsigned arithmetic when compiled)."""
    return _splitmix(_splitmix(_splitmix(int(seed) + 0x9E3779B97F4A7C15) + int(a)) + int(b)) >> 11


def _row_key(seed, a):
    """The generator's state after the seed and the first coordinate: ``_draw(seed, a, b) == _draw_at(_row_key(seed,
    a), b)``, so a row's (a block row's) draws share one key and cost one SplitMix64 round each."""
    return _splitmix(_splitmix(int(seed) + 0x9E3779B97F4A7C15) + int(a))


def _draw_at(key, b):
    """The draw of coordinate b under a key from :func:`_row_key`."""
    return _splitmix(int(key) + int(b)) >> 11


@overload(_row_key, jit_options={"cache": True})
def _ol_row_key(seed, a):
    def impl(seed, a):
        x = np.uint64(seed) + np.uint64(0x9E3779B97F4A7C15)
        for v in (np.uint64(0), np.uint64(a)):
            x += v
            x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            x = x ^ (x >> np.uint64(31))
        return x

    return impl


@overload(_draw_at, jit_options={"cache": True})
def _ol_draw_at(key, b):
    def impl(key, b):
        x = np.uint64(key) + np.uint64(b)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
        return np.int64(x >> np.uint64(11))

    return impl


@overload(_draw, jit_options={"cache": True})
def _ol_draw(seed, a, b):
    return lambda seed, a, b: _draw_at(_row_key(seed, a), b)


@njit(cache=True)
def _bigbird_random(seed, bi, bj, n, r):
    """Whether block column bj is one of block row bi's r random blocks: draws k = 0, 1, ... of (seed, bi, k) mod n,
    each kept unless an earlier draw gave the same column, until min(r, n) distinct columns are kept."""
    if r >= n:
        return True
    key = _row_key(seed, bi)
    kept = 0
    k = 0
    while kept < r:
        col = _draw_at(key, k) % n
        fresh = True
        for j in range(k):
            if _draw_at(key, j) % n == col:
                fresh = False
                break
        if fresh:
            if col == bj:
                return True
            kept += 1
        k += 1
    return False


@njit(cache=True)
def _overlap(a0, a1, c0, c1):
    """The length of [a0, a1) within [c0, c1)."""
    return max(0, min(a1, c1) - max(a0, c0))


@njit(cache=True)
def _bigbird_draw(p, bi, out):
    """Block row bi's r random block columns (BIGBIRD p = (b, b, seed, g, wb, r, n), r < n) into out[:r]: the draws
    of :func:`_bigbird_random`, each compared with the columns kept so far (O(r^2) comparisons, one draw each)."""
    n, r = p[6], p[5]
    key = _row_key(p[2], bi)
    kept = 0
    k = 0
    while kept < r:
        bj = _draw_at(key, k) % n
        fresh = True
        for j in range(kept):
            if out[j] == bj:
                fresh = False
                break
        if fresh:
            out[kept] = bj
            kept += 1
        k += 1


@njit(cache=True)
def _bigbird_row_nnz(p, bi, c0, c1, cols):
    """Allowed columns of [c0, c1) in a row of block row bi (BIGBIRD p = (b, b, seed, g, wb, r, n)), its random
    block columns ``cols`` drawn by :func:`_bigbird_draw`: the global columns and the window in closed form, then
    the random blocks outside them, O(r) whatever the width of [c0, c1)."""
    b, g, wb, r, n = p[0], p[3], p[4], p[5], p[6]
    if bi < g or r >= n:
        return c1 - c0
    ge = min(g, n) * b  # global columns [0, ge)
    w0, w1 = max(0, bi - wb) * b, (min(n - 1, bi + wb) + 1) * b  # the window's columns [w0, w1)
    s = _overlap(0, ge, c0, c1) + _overlap(w0, w1, c0, c1) - _overlap(w0, min(ge, w1), c0, c1)
    for k in range(r):
        bj = cols[k]
        if bj >= g and abs(bi - bj) > wb:
            s += _overlap(bj * b, (bj + 1) * b, c0, c1)
    return s


@njit(cache=True)
def _bigbird_nnz(p, r0, r1, c0, c1, cols, bi0):
    """Allowed entries of [r0, r1) x [c0, c1) for BIGBIRD, row k of ``cols`` holding block row bi0 + k's random
    columns."""
    b = p[0]
    s = 0
    for bi in range(r0 // b, (r1 - 1) // b + 1):
        rows = min(r1, (bi + 1) * b) - max(r0, bi * b)
        s += rows * _bigbird_row_nnz(p, bi, c0, c1, cols[bi - bi0])
    return s


@njit(cache=True)
def _bigbird_rows_nnz(p, r0, r1, c0, c1):
    """:func:`_bigbird_nnz` drawing each block row's random columns into one buffer of r (a whole-mask count holds
    r columns, not block rows x r)."""
    b, r, n = p[0], p[5], p[6]
    buf = np.zeros(r if r < n else 1, dtype=np.int64)
    s = 0
    for bi in range(r0 // b, (r1 - 1) // b + 1):
        if r < n and bi >= p[3]:
            _bigbird_draw(p, bi, buf)
        rows = min(r1, (bi + 1) * b) - max(r0, bi * b)
        s += rows * _bigbird_row_nnz(p, bi, c0, c1, buf)
    return s


@njit(cache=True)
def _bigbird_cols(p, r0, r1):
    """The random block columns of the block rows that rows [r0, r1) meet (one row of the result each; 1 column
    when the block rows need none: r >= n)."""
    b, r, n = p[0], p[5], p[6]
    bi0, bi1 = r0 // b, (r1 - 1) // b + 1
    cols = np.zeros((bi1 - bi0, r if r < n else 1), dtype=np.int64)
    if r < n:
        for bi in range(bi0, bi1):
            if bi >= p[3]:
                _bigbird_draw(p, bi, cols[bi - bi0])
    return cols


@njit(cache=True)
def _popcount(x):
    """The set bits of an int64 word (SWAR on its unsigned bits)."""
    v = np.uint64(x)
    v = v - ((v >> np.uint64(1)) & np.uint64(0x5555555555555555))
    v = (v & np.uint64(0x3333333333333333)) + ((v >> np.uint64(2)) & np.uint64(0x3333333333333333))
    v = (v + (v >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return np.int64((v * np.uint64(0x0101010101010101)) >> np.uint64(56))


@njit(cache=True)
def _mod_allows(p, T, r, c):
    g = p[0]
    k = T[r // g, c // g]
    if k <= 0:
        return k < 0
    return (T[p[1] + (k - 1) // p[4], (k - 1) % p[4] * g + r % g] >> (c % g)) & 1 == 1


@njit(cache=True)
def _mod_nnz(p, T, r0, r1, c0, c1):
    """Allowed entries of [r0, r1) x [c0, c1) of a MOD mask: whole blocks by class, partial blocks by popcount."""
    g, nbr, nbc = p[0], p[1], p[2]
    s = 0
    for bi in range(r0 // g, (r1 - 1) // g + 1):
        ra, rb = max(r0, bi * g), min(r1, (bi + 1) * g)
        for bj in range(max(c0 // g, T[bi, nbc]), min((c1 - 1) // g + 1, T[bi, nbc + 1])):
            k = T[bi, bj]
            if k == 0:
                continue
            ca, cb = max(c0, bj * g), min(c1, (bj + 1) * g)
            if k < 0:
                s += (rb - ra) * (cb - ca)
                continue
            w, sh = cb - ca, ca - bj * g
            bits = np.int64(-1) if w >= 64 else ((np.int64(1) << w) - 1) << sh
            row, col = nbr + (k - 1) // p[4], (k - 1) % p[4] * g - bi * g
            for r in range(ra, rb):
                s += _popcount(T[row, col + r] & bits)
    return s


@njit(cache=True)
def _mod_range(p, T, x0, x1, N, column):
    """The range [lo, hi) of columns (of rows, when ``column``: the rows a column range meets) outside which the
    block rows (block columns) of [x0, x1) allow nothing; (0, 0) when they allow nothing at all."""
    g, nbr, nbc, K = p[0], p[1], p[2], p[3]
    lo, hi = N, 0
    for b in range(x0 // g, (x1 - 1) // g + 1):
        a, e = (T[nbr + K, b], T[nbr + K + 1, b]) if column else (T[b, nbc], T[b, nbc + 1])
        if a < e:
            lo, hi = min(lo, a * g), max(hi, min(N, e * g))
    return (lo, hi) if lo < hi else (0, 0)


@njit(cache=True)
def _block_allowed(kind, p, bi, bj):
    """Whether block (bi, bj) of a random block kind is allowed. RANDOM_BLOCKS p = (h, w, seed, threshold);
    BIGBIRD p = (b, b, seed, g, wb, r, n)."""
    if kind == RANDOM_BLOCKS:
        return _draw(p[2], bi, bj) < p[3]
    if bi < p[3] or bj < p[3] or abs(bi - bj) <= p[4]:
        return True
    return _bigbird_random(p[2], bi, bj, p[6], p[5])


@njit(cache=True)
def _mask_allows(kind, p, T, r, c):
    """Whether score (r, c) is allowed."""
    if kind == DENSE:
        return True
    if kind == BAND:
        return p[0] <= c - r <= p[1]
    if kind == DILATED:
        return p[0] <= c - r <= p[1] and (c - r) % p[2] == 0
    if kind == BLOCKDIAG:
        k = _upper(p, r) - 1
        return p[k] <= c < p[k + 1]
    if kind == PREFIX:
        return c < p[0] or c <= r
    if kind == ELEMENTS:
        return _rect(T, r, r + 1, c, c + 1) != 0
    if kind == MOD:
        return _mod_allows(p, T, r, c)
    if kind == RANDOM:  # p = (seed, threshold)
        return _draw(p[0], r, c) < p[1]
    if kind == RANDOM_BLOCKS or kind == BIGBIRD:
        return _block_allowed(kind, p, r // p[0], c // p[1])
    # BLOCKS: p = (h, w); T = prefix sums of the block mask
    br, bc = r // p[0], c // p[1]
    return _rect(T, br, br + 1, bc, bc + 1) != 0


@njit(cache=True)
def mask_nnz(kind, p, T, r0, nr, c0, nc):
    """Allowed entries of the tile [r0, r0 + nr) x [c0, c0 + nc)."""
    if nr <= 0 or nc <= 0:
        return 0
    r1, c1 = r0 + nr, c0 + nc
    if kind == DENSE:
        return nr * nc
    if kind == BAND:
        return _band_count(r0, nr, c0, nc, p[0], p[1])
    if kind == DILATED:
        k = p[2]
        lo = max(p[0], c0 - (r1 - 1))
        hi = min(p[1], c1 - 1 - r0)
        first = -((-lo) // k) * k  # the smallest multiple of k >= lo
        s = 0
        for delta in range(first, hi + 1, k):  # rows r with r + delta in [c0, c1)
            s += max(0, min(r1, c1 - delta) - max(r0, c0 - delta))
        return s
    if kind == BLOCKDIAG:
        s = 0
        k = _upper(p, max(r0, c0)) - 1
        while k < p.size - 1 and p[k] < min(r1, c1):
            s += max(0, min(r1, p[k + 1]) - max(r0, p[k])) * max(0, min(c1, p[k + 1]) - max(c0, p[k]))
            k += 1
        return s
    if kind == PREFIX:
        split = min(max(p[0], c0), c1)  # columns [c0, split) are all allowed, [split, c1) causal
        return nr * (split - c0) + _band_count(r0, nr, split, c1 - split, -FAR, 0)
    if kind == ELEMENTS:
        return _rect(T, r0, r1, c0, c1)
    if kind == MOD:
        return _mod_nnz(p, T, r0, r1, c0, c1)
    if kind == RANDOM:  # one key per row, one SplitMix64 round per element
        s = 0
        for r in range(r0, r1):
            key = _row_key(p[0], r)
            for c in range(c0, c1):
                s += _draw_at(key, c) < p[1]
        return s
    if kind == BIGBIRD:  # each block row's random columns drawn once: O(block rows x r^2), not O(blocks x r^2)
        return _bigbird_rows_nnz(p, r0, r1, c0, c1)
    h, w = p[0], p[1]
    s = 0
    for bi in range(r0 // h, (r1 - 1) // h + 1):
        rows = min(r1, (bi + 1) * h) - max(r0, bi * h)
        key = _row_key(p[2], bi) if kind == RANDOM_BLOCKS else np.uint64(0)
        for bj in range(c0 // w, (c1 - 1) // w + 1):
            if _draw_at(key, bj) < p[3] if kind == RANDOM_BLOCKS else _rect(T, bi, bi + 1, bj, bj + 1) != 0:
                s += rows * (min(c1, (bj + 1) * w) - max(c0, bj * w))
    return s


@njit(cache=True)
def _random_class(p, r0, nr, c0, nc):
    """A random-element tile's class for the drivers: 0 (empty), nr nc (full) or 1 < nr nc (partial, found as soon
    as one allowed and one forbidden element are met: about 1 / min(S, 1 - S) draws, not nr nc)."""
    seen_in = seen_out = False
    for r in range(r0, r0 + nr):
        key = _row_key(p[0], r)
        for c in range(c0, c0 + nc):
            if _draw_at(key, c) < p[1]:
                seen_in = True
            else:
                seen_out = True
            if seen_in and seen_out:
                return 1
    return nr * nc if seen_in else 0


def _tile_nnz(kind, p, T, r0, nr, c0, nc):
    """:func:`mask_nnz` for the drivers' inner loops: inlined, so band (causal, sliding window) tiles cost no call
    (a count-only step takes a few nanoseconds, and a call would double it). A plain function, not a dispatcher of
    its own: the inlined overload caches its compiled forms under this function's name and line, and a cached
    dispatcher of the same name loaded them as its own (a segmentation fault when called from Python after a
    masked run had filled the cache). The drivers ask only whether a tile is
    empty (0), full (its area) or partial (anything between): a random-element tile answers that from its first
    allowed and first forbidden element (:func:`_random_class`) instead of counting every element."""
    if kind == DENSE:
        return max(nr, 0) * max(nc, 0)
    if kind == BAND:
        return _band_count(r0, nr, c0, nc, p[0], p[1])
    if kind == RANDOM and nr > 0 and nc > 0:
        return _random_class(p, r0, nr, c0, nc)
    return mask_nnz(kind, p, T, r0, nr, c0, nc)


@njit(cache=True)
def _mask_cols(kind, p, T, r0, nr, N):
    """A column range [lo, hi) outside which rows [r0, r0 + nr) allow nothing."""
    r1 = r0 + nr
    if kind == BAND or kind == DILATED:
        return max(0, min(N, r0 + p[0])), max(0, min(N, r1 + p[1]))
    if kind == BLOCKDIAG:
        a = _upper(p, r0) - 1
        b = _upper(p, r1 - 1)
        return p[a], p[b]
    if kind == PREFIX:
        return 0, min(N, max(p[0], r1))
    if kind == MOD:
        return _mod_range(p, T, r0, r1, N, False)
    return 0, N


@njit(cache=True)
def _mask_rows(kind, p, T, c0, nc, N):
    """A row range [lo, hi) outside which columns [c0, c0 + nc) are allowed in no row."""
    c1 = c0 + nc
    if kind == BAND or kind == DILATED:
        return max(0, min(N, c0 - p[1])), max(0, min(N, c1 - p[0]))
    if kind == BLOCKDIAG:
        return _mask_cols(kind, p, T, c0, nc, N)  # symmetric
    if kind == PREFIX:
        return (0, N) if c0 < p[0] else (c0, N)
    if kind == MOD:
        return _mod_range(p, T, c0, c1, N, True)
    return 0, N


@njit(cache=True)
def block_range(lo, hi, B):
    """The blocks of side B that meet [lo, hi): (first, last + 1); empty when lo >= hi."""
    if lo >= hi:
        return 0, 0
    return lo // B, cdiv(hi, B)


@njit(cache=True)
def _apply_mask(S, kind, p, T, r0, c0):
    """S[r, c] = -inf where (r0 + r, c0 + c) is not allowed (a partial tile)."""
    br, bc = S.shape
    for r in range(br):
        for c in range(bc):
            if not _mask_allows(kind, p, T, r0 + r, c0 + c):
                S[r, c] = -np.inf


@njit(cache=True)
def _dense_rows(kind, p, T, N, r0, r1):
    out = np.zeros((r1 - r0, N), dtype=np.bool_)
    for r in range(r0, r1):
        lo, hi = _mask_cols(kind, p, T, r, 1, N)
        for c in range(lo, hi):
            out[r - r0, c] = _mask_allows(kind, p, T, r, c)
    return out


_SUMMARIES: dict = {}  # the last few tile summaries of random masks (each one a count of the whole mask)


def tile_summary(kind, p, T, N, Br, Bc):
    """The mask on the Br x Bc tiling (:func:`_tile_summary`). A random mask's summary counts every element (every
    block) of the mask, so the last few are kept, keyed by the mask's parameters and the tiling: a run's time
    estimate and its closed form, which summarise the same tiling, count the mask once between them."""
    if kind not in (RANDOM, RANDOM_BLOCKS, BIGBIRD):
        return _tile_summary(kind, p, T, N, Br, Bc)
    key = (int(kind), np.asarray(p).tobytes(), int(N), int(Br), int(Bc))
    if key not in _SUMMARIES:
        if len(_SUMMARIES) >= 16:
            del _SUMMARIES[next(iter(_SUMMARIES))]
        _SUMMARIES[key] = _tile_summary(kind, p, T, N, Br, Bc)
    return tuple(a.copy() for a in _SUMMARIES[key])


@njit(cache=True)
def _tile_summary(kind, p, T, N, Br, Bc):
    """The mask on the Br x Bc tiling, in O(rows blocks + nonzero tiles) for structured masks.

    Returns (sums, row_nonempty, col_nonempty): sums = [tiles, R, C, words, nnz, shapes, full], with R = sum of the
    heights and C = sum of the widths of the nonempty tiles, words = sum of their areas, nnz the allowed entries,
    shapes a bit set of the nonempty tiles' shapes (bit 2 * ragged row + ragged column: 1 full x full, 2 full x
    last, 4 last x full, 8 last x last, where "last" is the final block when it is shorter than the others) and full
    the number of nonempty tiles the mask leaves full (no element test).
    """
    Tr, Tc = cdiv(N, Br), cdiv(N, Bc)
    row_ne = np.zeros(Tr, dtype=np.bool_)
    col_ne = np.zeros(Tc, dtype=np.bool_)
    sums = np.zeros(7, dtype=np.int64)
    # BigBird: a row block's random columns are drawn once for all its tiles (unless that table would be large)
    shared = kind == BIGBIRD and (Br // p[0] + 2) * min(p[5], p[6]) <= 1 << 20
    for i in range(Tr):
        r0 = i * Br
        br = min(Br, N - r0)
        lo, hi = _mask_cols(kind, p, T, r0, br, N)
        j0, j1 = block_range(lo, hi, Bc)
        cols = _bigbird_cols(p, r0, r0 + br) if shared else np.zeros((1, 1), dtype=np.int64)
        for j in range(j0, j1):
            c0 = j * Bc
            bc = min(Bc, N - c0)
            if shared:
                nz = _bigbird_nnz(p, r0, r0 + br, c0, c0 + bc, cols, r0 // p[0])
            else:
                nz = mask_nnz(kind, p, T, r0, br, c0, bc)
            if nz == 0:
                continue
            row_ne[i] = True
            col_ne[j] = True
            sums[0] += 1
            sums[1] += br
            sums[2] += bc
            sums[3] += br * bc
            sums[4] += nz
            sums[5] |= 1 << (2 * int(br < Br) + int(bc < Bc))
            sums[6] += nz == br * bc
    return sums, row_ne, col_ne


# ---------------------------------------------------------------------------------------------------------------
# What the drivers call. A run without a mask passes params and table as None (TileMask.args), and each helper
# below resolves by type at compile time: the dense specialisation of a driver is the plain loop nest, with no mask
# code compiled into it (the first run of ``iosim compare`` compiles no mask helper at all); a run with a mask
# compiles the specialisation that calls the helpers above. In plain Python (the schedule API, NUMBA_DISABLE_JIT)
# the same functions branch on None.
# ---------------------------------------------------------------------------------------------------------------


def tile_nnz(kind, p, T, r0, nr, c0, nc):
    """What a driver needs of the tile [r0, r0 + nr) x [c0, c0 + nc): 0 when it is empty (skipped), nr nc when it is
    full (no element test), otherwise a number in between (its allowed entries, except for random elements, where
    it is 1: counting them all is left to :func:`mask_nnz`)."""
    return max(nr, 0) * max(nc, 0) if p is None else _tile_nnz(kind, p, T, r0, nr, c0, nc)


def mask_cols(kind, p, T, r0, nr, N):
    """A column range [lo, hi) outside which rows [r0, r0 + nr) allow nothing."""
    return (0, N) if p is None else _mask_cols(kind, p, T, r0, nr, N)


def mask_rows(kind, p, T, c0, nc, N):
    """A row range [lo, hi) outside which columns [c0, c0 + nc) are allowed in no row."""
    return (0, N) if p is None else _mask_rows(kind, p, T, c0, nc, N)


def mask_allows(kind, p, T, r, c):
    """Whether score (r, c) is allowed."""
    return True if p is None else _mask_allows(kind, p, T, r, c)


def apply_mask(S, kind, p, T, r0, c0):
    """S[r, c] = -inf where (r0 + r, c0 + c) is not allowed (a partial tile; the dense mask has none)."""
    if p is not None:
        _apply_mask(S, kind, p, T, r0, c0)


def _dense(p) -> bool:
    return isinstance(p, types.NoneType)


@overload(tile_nnz, jit_options={"cache": True}, inline="always")
def _ol_tile_nnz(kind, p, T, r0, nr, c0, nc):
    if _dense(p):
        return lambda kind, p, T, r0, nr, c0, nc: max(nr, 0) * max(nc, 0)
    return _tile_nnz  # inlined itself (one level: an inline inside an inline trips Numba's SSA pass)


@overload(mask_cols, jit_options={"cache": True})
def _ol_mask_cols(kind, p, T, r0, nr, N):
    if _dense(p):
        return lambda kind, p, T, r0, nr, N: (0, N)
    return lambda kind, p, T, r0, nr, N: _mask_cols(kind, p, T, r0, nr, N)


@overload(mask_rows, jit_options={"cache": True})
def _ol_mask_rows(kind, p, T, c0, nc, N):
    if _dense(p):
        return lambda kind, p, T, c0, nc, N: (0, N)
    return lambda kind, p, T, c0, nc, N: _mask_rows(kind, p, T, c0, nc, N)


@overload(mask_allows, jit_options={"cache": True})
def _ol_mask_allows(kind, p, T, r, c):
    if _dense(p):
        return lambda kind, p, T, r, c: True
    return lambda kind, p, T, r, c: _mask_allows(kind, p, T, r, c)


@overload(apply_mask, jit_options={"cache": True})
def _ol_apply_mask(S, kind, p, T, r0, c0):
    if _dense(p):
        return lambda S, kind, p, T, r0, c0: None
    return lambda S, kind, p, T, r0, c0: _apply_mask(S, kind, p, T, r0, c0)


# ---------------------------------------------------------------------------------------------------------------
# A problem's rows (algorithms/flash.py). A problem of N_q query rows against N_k keys takes its mask over the
# whole sequence, N_k x N_k: query row q is the mask's row q + off (off = N_k - N_q; the queries are the last N_q
# positions, so every mask is aligned bottom-right as the causal one is). A thread block of packed GQA rows holds
# several heads' rows, packed row r being query row r mod N_q: its rows are at most three runs of the mask's rows
# (the end of a head, whole heads, the start of a head). Rows q + off < 0 (N_q > N_k) see no key. Without a mask
# (p None) every row sees every key. A MOD mask whose params carry a sixth entry R (:func:`packed_rows`) is a
# group's own mask over its R packed rows (the g heads of a group under masks of their own, iosim.masking.head_masks):
# its row r is packed row r, whatever N_q and off.
# ---------------------------------------------------------------------------------------------------------------


@njit(cache=True)
def _packed(kind, p):
    """Whether (kind, p) is a mask over a group's packed rows (a MOD mask with R in its params)."""
    return kind == MOD and p.size > 5


@njit(cache=True)
def _runs(r0, nr, Nq, off):  # noqa: N803
    """The packed rows [r0, r0 + nr) as mask rows: (a, n, heads, m): a first run [a, a + n), ``heads`` whole heads
    (mask rows [off, off + N_q)) and a last run [off, off + m)."""
    if r0 + nr <= Nq:  # rows of the first head (every row block of a per-head schedule): one run
        return r0 + off, nr, 0, 0
    q0 = r0 % Nq
    if q0 + nr <= Nq:
        return q0 + off, nr, 0, 0
    rest = nr - (Nq - q0)
    return q0 + off, Nq - q0, rest // Nq, rest % Nq


@njit(cache=True)
def _run_nnz(kind, p, T, a, n, c0, nc):
    """tile_nnz of the mask rows [a, a + n) (rows below 0 see nothing)."""
    a1 = max(a, 0)
    if a + n <= a1:
        return 0
    v = tile_nnz(kind, p, T, a1, a + n - a1, c0, nc)
    return v


@njit(cache=True)
def _rows_nnz(kind, p, T, r0, nr, c0, nc, Nq, off):  # noqa: N803
    if _packed(kind, p):
        return _run_nnz(kind, p, T, r0, nr, c0, nc)
    a, n, heads, m = _runs(r0, nr, Nq, off)
    s = _run_nnz(kind, p, T, a, n, c0, nc)
    if heads > 0:
        s += heads * _run_nnz(kind, p, T, off, Nq, c0, nc)
    if m > 0:
        s += _run_nnz(kind, p, T, off, m, c0, nc)
    return s


@njit(cache=True)
def _run_cols(kind, p, T, a, n, Nk, lo, hi):  # noqa: N803
    a1 = max(a, 0)
    if a + n <= a1:
        return lo, hi
    x, y = mask_cols(kind, p, T, a1, a + n - a1, Nk)
    return (min(lo, x), max(hi, y)) if x < y else (lo, hi)


@njit(cache=True)
def _rows_cols(kind, p, T, r0, nr, Nq, off, Nk):  # noqa: N803
    if _packed(kind, p):
        lo, hi = _run_cols(kind, p, T, r0, nr, Nk, Nk, 0)
        return (lo, hi) if lo < hi else (0, 0)
    a, n, heads, m = _runs(r0, nr, Nq, off)
    lo, hi = _run_cols(kind, p, T, a, n, Nk, Nk, 0)
    if heads > 0:
        lo, hi = _run_cols(kind, p, T, off, Nq, Nk, lo, hi)
    if m > 0:
        lo, hi = _run_cols(kind, p, T, off, m, Nk, lo, hi)
    return (lo, hi) if lo < hi else (0, 0)


@njit(cache=True)
def _cols_rows(kind, p, T, c0, nc, Nq, off, R):  # noqa: N803
    if _packed(kind, p):
        a, b = mask_rows(kind, p, T, c0, nc, R)
        return (a, b) if a < b else (0, 0)
    a, b = mask_rows(kind, p, T, c0, nc, Nq + off)
    qa, qb = max(0, a - off), min(Nq, b - off)
    if qa >= qb:
        return 0, 0
    return qa, (R // Nq - 1) * Nq + qb


@njit(cache=True)
def _rows_apply(S, kind, p, T, r0, c0, Nq, off):  # noqa: N803
    if _packed(kind, p):
        apply_mask(S, kind, p, T, r0, c0)
        return
    nr = S.shape[0]
    r = 0
    while r < nr:
        q = (r0 + r) % Nq
        n = min(nr - r, Nq - q)
        below = min(n, max(0, -(q + off)))
        for k in range(r, r + below):
            S[k, :] = -np.inf
        if n > below:
            apply_mask(S[r + below : r + n], kind, p, T, q + off + below, c0)
        r += n


# What the problem drivers call: without a mask (p None) each resolves at compile time to its one-line answer
# (rows_nnz inlined: no call per tile), with a mask to the helper above; in plain Python they branch on None.


def rows_nnz(kind, p, T, r0, nr, c0, nc, Nq, off):  # noqa: N803
    """:func:`tile_nnz` of a problem's packed rows [r0, r0 + nr) against keys [c0, c0 + nc): 0 empty, nr nc full,
    anything between partial."""
    return max(nr, 0) * max(nc, 0) if p is None else _rows_nnz(kind, p, T, r0, nr, c0, nc, Nq, off)


def rows_cols(kind, p, T, r0, nr, Nq, off, Nk):  # noqa: N803
    """A key range [lo, hi) outside which a problem's packed rows [r0, r0 + nr) see nothing ((0, 0): none)."""
    return (0, Nk) if p is None else _rows_cols(kind, p, T, r0, nr, Nq, off, Nk)


def cols_rows(kind, p, T, c0, nc, Nq, off, R):  # noqa: N803
    """A packed-row range [lo, hi) of a group's R rows outside which no row sees a key of [c0, c0 + nc)."""
    return (0, R) if p is None else _cols_rows(kind, p, T, c0, nc, Nq, off, R)


def rows_apply(S, kind, p, T, r0, c0, Nq, off):  # noqa: N803
    """The element mask on a partial tile of packed rows starting at r0 and keys starting at c0: S = -inf where
    the row's mask row does not allow the key (rows below the mask's first row: every key)."""
    if p is not None:
        _rows_apply(S, kind, p, T, r0, c0, Nq, off)


def _rows_tile_nnz(kind, p, T, r0, nr, c0, nc, Nq, off):  # noqa: N803
    """:func:`rows_nnz` in the drivers' inner loops, inlined as :func:`_tile_nnz` is: the rows of one head when
    N_q = N_k (every one-head run) are the mask's own rows, so a band tile costs no call; other rows are cut into
    runs (:func:`_rows_nnz`)."""
    if off == 0 and r0 + nr <= Nq:
        if kind == BAND:
            return _band_count(r0, nr, c0, nc, p[0], p[1])
        if kind == RANDOM and nr > 0 and nc > 0:
            return _random_class(p, r0, nr, c0, nc)
        return mask_nnz(kind, p, T, r0, nr, c0, nc)
    return _rows_nnz(kind, p, T, r0, nr, c0, nc, Nq, off)


@overload(rows_nnz, jit_options={"cache": True}, inline="always")
def _ol_rows_nnz(kind, p, T, r0, nr, c0, nc, Nq, off):  # noqa: N803
    if _dense(p):
        return lambda kind, p, T, r0, nr, c0, nc, Nq, off: max(nr, 0) * max(nc, 0)
    return _rows_tile_nnz  # inlined itself (one level, as tile_nnz)


@overload(rows_cols, jit_options={"cache": True})
def _ol_rows_cols(kind, p, T, r0, nr, Nq, off, Nk):  # noqa: N803
    if _dense(p):
        return lambda kind, p, T, r0, nr, Nq, off, Nk: (0, Nk)
    return lambda kind, p, T, r0, nr, Nq, off, Nk: _rows_cols(kind, p, T, r0, nr, Nq, off, Nk)


@overload(cols_rows, jit_options={"cache": True})
def _ol_cols_rows(kind, p, T, c0, nc, Nq, off, R):  # noqa: N803
    if _dense(p):
        return lambda kind, p, T, c0, nc, Nq, off, R: (0, R)
    return lambda kind, p, T, c0, nc, Nq, off, R: _cols_rows(kind, p, T, c0, nc, Nq, off, R)


@overload(rows_apply, jit_options={"cache": True})
def _ol_rows_apply(S, kind, p, T, r0, c0, Nq, off):  # noqa: N803
    if _dense(p):
        return lambda S, kind, p, T, r0, c0, Nq, off: None
    return lambda S, kind, p, T, r0, c0, Nq, off: _rows_apply(S, kind, p, T, r0, c0, Nq, off)


@njit(cache=True)
def q_outer_summary(kind, p, T, Nq, off, Nk, R, Br, Bc, s, npieces, longest):  # noqa: N803
    """A Q-outer schedule's tiles over a group's R packed rows (flash2's forward over a problem): for row block i
    and split k (ceil(T_c / s) column blocks each), out[i, k] = (nonempty tiles, their keys, their page pieces,
    their longest piece); npieces and longest are per column block."""
    Tr, Tc = cdiv(R, Br), cdiv(Nk, Bc)
    per = cdiv(Tc, s)
    out = np.zeros((Tr, s, 4), dtype=np.int64)
    for i in range(Tr):
        r0 = i * Br
        br = min(Br, R - r0)
        lo, hi = rows_cols(kind, p, T, r0, br, Nq, off, Nk)
        j0, j1 = block_range(lo, hi, Bc)
        for j in range(j0, j1):
            c0 = j * Bc
            bc = min(Bc, Nk - c0)
            if rows_nnz(kind, p, T, r0, br, c0, bc, Nq, off) == 0:
                continue
            k = j // per
            out[i, k, 0] += 1
            out[i, k, 1] += bc
            out[i, k, 2] += npieces[j]
            out[i, k, 3] = max(out[i, k, 3], longest[j])
    return out


@njit(cache=True)
def kv_outer_summary(kind, p, T, starts, ends, Nq, off, R, Br):  # noqa: N803
    """A K/V-outer schedule's tiles over a group's R packed rows (flash1's forward over page pieces, the backward
    over column blocks): for the keys [starts[t], ends[t]), out[t] = (row blocks with a nonempty tile, their rows,
    the widest of them)."""
    out = np.zeros((starts.size, 3), dtype=np.int64)
    for t in range(starts.size):
        c0 = starts[t]
        n = ends[t] - c0
        lo, hi = cols_rows(kind, p, T, c0, n, Nq, off, R)
        i0, i1 = block_range(lo, hi, Br)
        for i in range(i0, i1):
            r0 = i * Br
            br = min(Br, R - r0)
            if rows_nnz(kind, p, T, r0, br, c0, n, Nq, off) == 0:
                continue
            out[t, 0] += 1
            out[t, 1] += br
            out[t, 2] = max(out[t, 2], br)
    return out


@njit(cache=True)
def seen_counts(kind, p, T, Nq, off, Nk):  # noqa: N803
    """(query rows that see a key, keys that some query row sees) of a problem's mask rows [off, off + N_q): what
    its compulsory traffic must read (:func:`seen_keys`)."""
    rows, keys = seen_keys(kind, p, T, Nq, off, Nk)
    return rows, keys.sum()


@njit(cache=True)
def seen_keys(kind, p, T, Nq, off, Nk):  # noqa: N803
    """(query rows that see a key, for each key whether some query row sees it) of the mask rows [off, off + N_q)
    (a mask over packed rows, :func:`_packed`: call with its R rows and off = 0). One test per row and per key (a
    random element's stops at its first allowed element)."""
    a = max(off, 0)
    rows = 0
    keys = np.zeros(Nk, dtype=np.bool_)
    for r in range(a, off + Nq):
        lo, hi = mask_cols(kind, p, T, r, 1, Nk)
        if lo < hi and tile_nnz(kind, p, T, r, 1, lo, hi - lo) > 0:
            rows += 1
    for c in range(Nk):
        lo, hi = mask_rows(kind, p, T, c, 1, off + Nq)
        lo, hi = max(lo, a), min(hi, off + Nq)
        if lo < hi and tile_nnz(kind, p, T, lo, hi - lo, c, 1) > 0:
            keys[c] = True
    return rows, keys

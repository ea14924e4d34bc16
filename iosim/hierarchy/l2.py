"""The L2 and the clock, in Numba: thread blocks' tile requests interleaved in time into a shared L2 of LRU partitions.

**Lines and segments.** Array b's line holds ``Lw[b]`` of its words (the line's bytes over b's element bytes: every
array at one word size, as before, is ``Lw[b] = L``). Word (r, c) of copy k of array a sits at line ``lbase[b] + k *
nl[b] + (r * stride[a] + c) // Lw[b]`` where b = ``base[a]`` is the array whose storage a is (itself, or K for an MLA
latent's V: the latent's first d_v columns) and ``stride[a]`` its row stride (b's width); every copy starts on a
line. A request (one tile transfer) touches, row by row, the lines ``[w0 // Lw[b], (w1 - 1) // Lw[b]]`` of its
contiguous word ranges ``[w0, w1)``, in ascending order (one range for a tile of whole rows). Lines are grouped into
**segments**, the finest partition of an array's lines by the ends of every request's line ranges (and, with more
than one L2 partition, by every change of home partition): every request touches whole segments, each from its
first line to its last.

**Segment LRU = line LRU, exactly.** LRU over lines, fed a line stream in which every segment is always touched
whole and in order, keeps a segment's lines adjacent in recency order, oldest first. Eviction takes lines from the
tail, so at most one segment is partly resident (the tail one, holding its newest lines); touching it again misses
on every one of its lines (each miss evicts the segment's next line before it is reached). So an LRU that moves
whole segments (a partly resident one is dropped and refetched whole; eviction may leave the new tail segment
partly resident; a segment larger than the cache streams through and leaves its last C lines) fetches and writes
back exactly what the line LRU does, at a cost per tile instead of per line. Dropping a whole segment (an
invalidation, below) keeps the others adjacent. tests/test_hierarchy.py pins it against a naive line LRU on random
partitions and streams, and against :mod:`iosim.views.cache_sim`'s LRU on real launches; tests/test_hierarchy_levels.py
pins the partitions against a naive line LRU per partition.

**Requests** are reads (w = 0: loads), writes (w = 1: stores, memsets) and reductions (w = 2: an atomic add at the
L2, FlashAttention-2's fp32 dQ accumulation: the L2 needs the old value, so a miss fetches the line, and leaves it
dirty); w = -1 is a request that does not reach the L2 (a load the kernel does not make: the schedule's load of an
accumulator that the kernel adds to atomically instead). **Writes** are write-back and write-validate (a GPU L2
keeps per-sector valid masks): a write miss allocates its lines dirty without fetching them; a dirty line costs
``Lw`` words of DRAM writes when it is evicted or flushed at the end. ``cap = 0`` is no L2: every request goes to
DRAM word for word (the two-level count; a reduction is a read and a write of each word).

**Sectors** (``spl`` > 1 sectors per line; 1, the default, is whole-line fills as above). An H100 L2 line is 128
bytes in four 32-byte sectors (Nsight Compute's Memory Tables), each with its own valid bit, and DRAM moves sectors.
With sectors, a line is allocated and replaced whole (LRU over lines, as above) but holds a valid and a dirty mask of
its sectors: a read fills only the sectors it requests that are not valid (a **sector miss**, also on a resident
line); a write validates and dirties the sectors it touches (write-validate per sector: a partial write of a sector
makes the whole sector valid, the L2's byte masks are not modelled); a reduction fills its missing sectors and
dirties them; an evicted or flushed line writes back its dirty sectors only. A request's sectors on a line are
those its word range covers. To keep the segment LRU exact, every line a request covers only in part is a segment
of its own (:func:`mark_boundaries` with ``iso``), so a segment of several lines is always requested whole, every
sector; the one-line segments carry the masks (``vmask``, ``dmask``; :func:`touch_sectors`). A word count of a
sector is ``Lw[b] // spl``.

**Partitions** (an L2 as NVIDIA's A100 and H100 build it). The A100 whitepaper ("NVIDIA A100 Tensor Core GPU
Architecture", section "L2 cache"): the L2 is divided into two partitions; each partition localizes and caches data
for memory accesses from SMs in the GPCs directly connected to it, and hardware cache-coherence maintains the
CUDA programming model across them. Modelled, with ``parts`` partitions of ``cap`` lines each (C / parts):

* every slot (a resident CTA's place, on SM ``slot mod P``) belongs to the partition of its SM, ``slot_part``;
* every line has a **home** partition, ``seg_home``: an address hash that NVIDIA does not publish. The one chosen
  (:mod:`iosim.hierarchy.simulate`): (the line's index within its array copy // G) mod parts, G = ``home_lines``
  (1: lines alternate);
* a **read** goes to the SM's own (near) partition; on a miss of a line homed there, the line is filled from DRAM;
  on a miss of a line homed elsewhere, it crosses the fabric (``fabric``: what Nsight Compute's
  ``lts__t_sectors_srcunit_ltcfabric`` counts) from the home partition, which fills it from DRAM on its own miss;
  the near partition keeps a (clean) copy;
* a **write** is made dirty at the home only: a line homed elsewhere crosses the fabric to its home, and the
  writer's near partition keeps a clean copy of what it wrote; the copies in every other partition are invalidated
  (coherence). A **reduction** is done at the home (the fabric crossed where it is not the near partition), and
  every non-home copy is invalidated. Only a home holds dirty lines, so only homes write back to DRAM.

With ``parts = 1`` every line's home is the near partition: no fabric, no invalidation, the single shared LRU.

**Where a far-homed line is kept** (``far``; NVIDIA does not publish it: three named alternatives, the first the
default). 0, **both**: as above, the near partition keeps a copy and the home allocates it on its own miss, so a
line read from the far side holds a line in each partition. 1, **near**: the near partition keeps its copy; the home
serves the read from its own copy where it holds the line (the lines and sectors it holds; a read it forwards
changes nothing there, not even its recency) and otherwise fills it from DRAM without allocating it (the home
caches what its own SMs read and what is written or reduced there, not what it forwards), so a line read only from
the far side holds one line, in the reader's partition. Leaving the home's state as it is keeps the segment LRU
exact: a partly resident segment holds its last lines, which are the hits. A line the far side read first is
fetched from DRAM again when an SM of its home partition reads it (the home does not look into the other
partition's copy). 2, **home**: the near partition keeps no copy of a line homed elsewhere (not on a read, not on a
write): every far access crosses the fabric and is served by the home, which allocates it; a line holds one line,
at its home. 3, **shared**: as near, the reader's partition keeps the only copy a read makes, and a miss there is
served by any other partition that holds the line (across the fabric; its state untouched) before DRAM: a line
read by SMs of both partitions is fetched from DRAM once while a copy lives. A read crosses the fabric when the line
is homed elsewhere (DRAM sits behind its home) or when another partition's copy serves it. ``fabric`` counts the
words of every crossing in row 0, those of reads alone in row 1 (Nsight Compute's
``lts__t_sectors_srcunit_ltcfabric_op_read`` counts reads only) and those of reductions in row 2 (the L2's
``lts__t_sectors_op_red`` counts a reduction at each slice it visits: the near one and, across the fabric, the
home's).

**The clock.** ``slots`` thread blocks are resident at once (P SMs x blocks per SM). A launch starts its first
``slots`` blocks (in launch order) at the launch's start time; each block's clock starts there and advances by the
words of each request it issues; when a block finishes, the next block of the launch takes its slot at the
finishing block's clock. A block may wait ``delay[i]`` words of idle time before its first request (0: none). With
**static slots** (``static_slot[i] >= 0`` for every block of a launch) block i runs on slot ``static_slot[i]``, and
each slot runs its blocks in their launch order (a persistent kernel with a static tile schedule); ``-1`` for every
block of a launch is the dynamic rule above. The L2 sees the requests of all resident blocks in the order of the
clock value at which each is issued, ties by launch order (block id). A launch starts when the previous one has
finished. With the **flush between launches** (``flush_between``, the Machine's ``flush="per-kernel"``: Nsight
Compute's cache control before each kernel it profiles), every dirty line is written back after each launch but the
last (counted apart, per launch) and every partition emptied, so each launch starts from a clean L2.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_HEAD, _TAIL, _USED = 0, 1, 2
READ, WRITE, REDUCE, SKIP = 0, 1, 2, -1


@njit(cache=True)
def mark_boundaries(req, piece_lo, piece_hi, base, stride, loff, Lw, mark, iso=0):  # noqa: N803
    """mark[loff[b] + l] = 1 where some request of an array stored in b starts or ends a line range (requests
    piece_lo:piece_hi); ``Lw[b]``: b's words per line. ``iso`` = 1 (sectors) also makes every line a request covers
    only in part a segment of its own."""
    for k in range(piece_lo, piece_hi):
        a, r0, nr, c0, nc = req[k, 1], req[k, 2], req[k, 3], req[k, 4], req[k, 5]
        if nr <= 0 or nc <= 0 or req[k, 0] < 0:
            continue
        ca = stride[a]
        b = base[a]
        L = Lw[b]  # noqa: N806
        o = loff[b]
        if nc == ca:
            w0 = r0 * ca
            w1 = (r0 + nr) * ca
            mark[o + w0 // L] = 1
            mark[o + (w1 - 1) // L + 1] = 1
            if iso:
                _isolate(mark, o, w0, w1, L)
        else:
            for r in range(nr):
                w0 = (r0 + r) * ca + c0
                mark[o + w0 // L] = 1
                mark[o + (w0 + nc - 1) // L + 1] = 1
                if iso:
                    _isolate(mark, o, w0, w0 + nc, L)


@njit(cache=True, inline="always")
def _isolate(mark, o, w0, w1, L):  # noqa: N803
    """The first and last lines of the words [w0, w1), where covered only in part, become one-line segments."""
    if w0 % L:
        mark[o + w0 // L + 1] = 1
    if w1 % L:
        mark[o + (w1 - 1) // L] = 1


@njit(cache=True, inline="always")
def _unlink(p, s, h, prv, nxt):
    a, q = prv[p, s], nxt[p, s]
    if a >= 0:
        nxt[p, a] = q
    else:
        h[p, _HEAD] = q
    if q >= 0:
        prv[p, q] = a
    else:
        h[p, _TAIL] = a
    prv[p, s] = -1
    nxt[p, s] = -1


@njit(cache=True, inline="always")
def _push_head(p, s, h, prv, nxt):
    prv[p, s] = -1
    nxt[p, s] = h[p, _HEAD]
    if h[p, _HEAD] >= 0:
        prv[p, h[p, _HEAD]] = s
    h[p, _HEAD] = s
    if h[p, _TAIL] < 0:
        h[p, _TAIL] = s


@njit(cache=True, inline="always")
def popcount(m):
    n = 0
    while m:
        m &= m - 1
        n += 1
    return n


@njit(cache=True, inline="always")
def _dirty_words(p, t, dm, seg_aid, Lw, spl):  # noqa: N803
    """Words an evicted line of segment t writes back, the one difference between line and sector fills: ``dm`` its
    dirty sectors' mask with ``spl`` sectors a line (each ``Lw // spl`` words); a line cache passes its dirty bit
    and spl = 1 (the whole line, or nothing)."""
    return popcount(dm[p, t]) * (Lw[seg_aid[t]] // spl)


@njit(cache=True, inline="always")
def _evict_all(p, h, res, dm, prv, nxt, seg_aid, Lw, spl, wb):  # noqa: N803
    """Empty partition p (a segment larger than the cache streams through): every resident line is evicted, its
    dirty words (:func:`_dirty_words`) written back."""
    t = h[p, _TAIL]
    while t >= 0:
        wb[seg_aid[t]] += res[p, t] * _dirty_words(p, t, dm, seg_aid, Lw, spl)
        res[p, t] = 0
        u = prv[p, t]
        prv[p, t] = -1
        nxt[p, t] = -1
        t = u
    h[p, _HEAD] = -1
    h[p, _TAIL] = -1


@njit(cache=True, inline="always")
def _make_room(p, need, h, res, dm, prv, nxt, seg_aid, Lw, spl, wb):  # noqa: N803
    """Evict ``need`` lines from partition p's LRU end, whole segments first, the last one keeping its newest lines;
    each evicted line writes back its dirty words (:func:`_dirty_words`)."""
    while need > 0:
        t = h[p, _TAIL]
        rt = res[p, t]
        per = _dirty_words(p, t, dm, seg_aid, Lw, spl)
        if rt <= need:
            wb[seg_aid[t]] += rt * per
            _unlink(p, t, h, prv, nxt)
            res[p, t] = 0
            h[p, _USED] -= rt
            need -= rt
        else:  # the tail segment keeps its newest lines
            res[p, t] = rt - need
            wb[seg_aid[t]] += need * per
            h[p, _USED] -= need
            need = 0


@njit(cache=True)
def touch(s, k, d, a, cap, lw, Lw, p, h, res, dirty, prv, nxt, seg_aid, wb):  # noqa: N803
    """Segment s (k lines of ``lw`` words, requested as array a) touched whole in LRU partition p (row p of the
    state arrays); ``d`` = 1 leaves it dirty (a write or a reduction), 0 keeps its dirty bit on a hit and allocates
    it clean on a miss. Evicted dirty lines are written back (``wb``, words: ``Lw`` of the evicted segment's array).
    Returns 1 when the segment missed (not resident whole: every line misses), 0 on a hit; the caller counts what a
    miss fetches."""
    r = res[p, s]
    if r == k:  # resident whole: a hit
        if h[p, _HEAD] != s:
            _unlink(p, s, h, prv, nxt)
            _push_head(p, s, h, prv, nxt)
        if d:
            dirty[p, s] = 1
        return 0
    if r > 0:  # partly resident (the tail segment): every line misses; drop what is left
        if dirty[p, s]:
            wb[a] += r * lw
        _unlink(p, s, h, prv, nxt)
        h[p, _USED] -= r
        res[p, s] = 0
    if k > cap:  # larger than the cache: it streams through, leaving its last cap lines
        _evict_all(p, h, res, dirty, prv, nxt, seg_aid, Lw, 1, wb)
        if d:
            wb[a] += (k - cap) * lw
        res[p, s] = cap
        h[p, _USED] = cap
        dirty[p, s] = d
        _push_head(p, s, h, prv, nxt)
        return 1
    _make_room(p, h[p, _USED] + k - cap, h, res, dirty, prv, nxt, seg_aid, Lw, 1, wb)
    res[p, s] = k
    h[p, _USED] += k
    dirty[p, s] = d
    _push_head(p, s, h, prv, nxt)
    return 1


@njit(cache=True)
def drop(s, p, h, res, prv, nxt):
    """Invalidate segment s's lines in partition p (a clean copy: only homes hold dirty lines)."""
    r = res[p, s]
    if r > 0:
        _unlink(p, s, h, prv, nxt)
        h[p, _USED] -= r
        res[p, s] = 0


@njit(cache=True)
def touch_sectors(s, k, m, d, a, cap, sw, Lw, spl, p, h, res, dmask, vmask, prv, nxt, seg_aid, wb):  # noqa: N803
    """:func:`touch` with sectors (module docstring): segment s (k lines, sector mask ``m`` on each: a segment of
    several lines is always requested whole) in partition p; ``d`` = 1 dirties the sectors of ``m``. Evicted lines
    write back their dirty sectors (``Lw // spl`` words each). Returns the mask of the sectors that missed (on each
    of the k lines): the caller counts k x popcount x ``sw`` words."""
    r = res[p, s]
    if r == k:  # the line(s) resident: only the sectors not yet valid miss
        miss = m & ~vmask[p, s]
        vmask[p, s] |= m
        if d:
            dmask[p, s] |= m
        if h[p, _HEAD] != s:
            _unlink(p, s, h, prv, nxt)
            _push_head(p, s, h, prv, nxt)
        return miss
    if r > 0:  # partly resident (the tail segment of several lines): every line misses; drop what is left
        if dmask[p, s]:
            wb[a] += r * popcount(dmask[p, s]) * sw
        _unlink(p, s, h, prv, nxt)
        h[p, _USED] -= r
        res[p, s] = 0
    if k > cap:  # larger than the cache: it streams through, leaving its last cap lines
        _evict_all(p, h, res, dmask, prv, nxt, seg_aid, Lw, spl, wb)
        if d:
            wb[a] += (k - cap) * popcount(m) * sw
        res[p, s] = cap
        h[p, _USED] = cap
    else:
        _make_room(p, h[p, _USED] + k - cap, h, res, dmask, prv, nxt, seg_aid, Lw, spl, wb)
        res[p, s] = k
        h[p, _USED] += k
    vmask[p, s] = m
    dmask[p, s] = m if d else 0
    _push_head(p, s, h, prv, nxt)
    return m


@njit(cache=True)
def segment_sectors(s, k, m, w, a, q, hm, cap, sw, Lw, spl, st, vmask, dmask, fill, wb, fabric, far=0):  # noqa: N803
    """:func:`segment` with sectors: the sectors ``m`` of segment s's k lines (module docstring)."""
    h, res, _, prv, nxt, seg_aid = st
    if w == READ:
        if hm != q and far == 2:  # kept at home only: straight across
            fabric[0, a] += k * popcount(m) * sw
            fabric[1, a] += k * popcount(m) * sw
            miss = touch_sectors(s, k, m, 0, a, cap, sw, Lw, spl, hm, h, res, dmask, vmask, prv, nxt, seg_aid, wb)
            fill[a] += k * popcount(miss) * sw
            return
        miss = touch_sectors(s, k, m, 0, a, cap, sw, Lw, spl, q, h, res, dmask, vmask, prv, nxt, seg_aid, wb)
        if miss:
            if hm != q:
                fabric[0, a] += k * popcount(miss) * sw
                fabric[1, a] += k * popcount(miss) * sw
                if far == 1:  # near: the home serves the sectors it holds, its state untouched
                    r = res[hm, s]
                    fill[a] += ((k - r) * popcount(miss) + r * popcount(miss & ~vmask[hm, s])) * sw
                    return
            if far == 3:  # shared: any partition's copy serves it (across the fabric), else DRAM; no state changed
                r, held = _peers(s, q, res, vmask)
                if hm == q:
                    fabric[0, a] += r * popcount(miss & held) * sw
                    fabric[1, a] += r * popcount(miss & held) * sw
                fill[a] += ((k - r) * popcount(miss) + r * popcount(miss & ~held)) * sw
                return
            if hm != q:
                miss = touch_sectors(s, k, miss, 0, a, cap, sw, Lw, spl, hm, h, res, dmask, vmask, prv, nxt, seg_aid,
                                     wb)  # fmt: skip
            fill[a] += k * popcount(miss) * sw
        return
    if hm != q:
        fabric[0, a] += k * popcount(m) * sw
        fabric[2, a] += k * popcount(m) * sw * (w == REDUCE)
        if w == WRITE and far != 2:  # the writer keeps a clean copy of what it wrote
            touch_sectors(s, k, m, 0, a, cap, sw, Lw, spl, q, h, res, dmask, vmask, prv, nxt, seg_aid, wb)
    miss = touch_sectors(s, k, m, 1, a, cap, sw, Lw, spl, hm, h, res, dmask, vmask, prv, nxt, seg_aid, wb)
    if w == REDUCE:
        fill[a] += k * popcount(miss) * sw
    for p in range(h.shape[0]):
        if p != hm and (w == REDUCE or p != q):
            drop(s, p, h, res, prv, nxt)


@njit(cache=True, inline="always")
def _peers(s, q, res, vmask):
    """(lines, sectors) of segment s the partitions other than q hold: the most lines any holds (a partly resident
    segment holds its last lines, so the union of theirs is the longest) and the union of their valid sectors (a
    line cache passes ``res`` as ``vmask``: any nonzero)."""
    r = 0
    held = 0
    for p in range(res.shape[0]):
        if p != q and res[p, s] > 0:
            r = max(r, res[p, s])
            held |= vmask[p, s]
    return r, held


@njit(cache=True)
def segment(s, k, w, a, q, hm, cap, lw, Lw, st, fill, wb, fabric, far=0):  # noqa: N803
    """Segment s (k lines homed in partition hm) requested by an SM of partition q: read, write or reduction through
    the partitions, a far-homed line kept as ``far`` says (module docstring). ``fill``, ``wb``: words of array a
    (wb: of the evicted lines'); ``fabric[0, a]`` every crossing's words, ``fabric[1, a]`` the reads', ``fabric[2,
    a]`` the reductions'."""
    h, res, dirty, prv, nxt, seg_aid = st
    if w == READ:
        if hm != q and far == 2:  # kept at home only: straight across
            fabric[0, a] += k * lw
            fabric[1, a] += k * lw
            if touch(s, k, 0, a, cap, lw, Lw, hm, h, res, dirty, prv, nxt, seg_aid, wb):
                fill[a] += k * lw
            return
        if touch(s, k, 0, a, cap, lw, Lw, q, h, res, dirty, prv, nxt, seg_aid, wb):
            if hm != q:
                fabric[0, a] += k * lw
                fabric[1, a] += k * lw
                if far == 1:  # near: the home serves the lines it holds, its state untouched
                    fill[a] += (k - res[hm, s]) * lw
                elif far == 3:  # shared: a partition holding the line serves it, else DRAM; no state changed
                    fill[a] += (k - _peers(s, q, res, res)[0]) * lw
                elif touch(s, k, 0, a, cap, lw, Lw, hm, h, res, dirty, prv, nxt, seg_aid, wb):
                    fill[a] += k * lw
            elif far == 3:
                r = _peers(s, q, res, res)[0]
                fabric[0, a] += r * lw
                fabric[1, a] += r * lw
                fill[a] += (k - r) * lw
            else:
                fill[a] += k * lw
        return
    if hm != q:
        fabric[0, a] += k * lw
        fabric[2, a] += k * lw * (w == REDUCE)
        if w == WRITE and far != 2:  # the writer keeps a clean copy of what it wrote
            touch(s, k, 0, a, cap, lw, Lw, q, h, res, dirty, prv, nxt, seg_aid, wb)
    missed = touch(s, k, 1, a, cap, lw, Lw, hm, h, res, dirty, prv, nxt, seg_aid, wb)
    if w == REDUCE and missed:
        fill[a] += k * lw
    for p in range(h.shape[0]):
        if p != hm and (w == REDUCE or p != q):
            drop(s, p, h, res, prv, nxt)


@njit(cache=True)
def issue(k, copy, q, req, base, stride, nseg, gbase, loff, soff, seg_of_line, seg_start, seg_home, Lw, cap, st,
          fill, wb, fabric, spl, vmask, dmask, far=0):  # fmt: skip  # noqa: N803
    """Request k of a block on a slot of partition q, working on copy ``copy`` of its array: every segment it
    touches, in order (``spl`` > 1: the sectors it covers on each, with the masks ``vmask``, ``dmask``; ``far``: where
    a far-homed line is kept, module docstring)."""
    w, a, r0, nr, c0, nc = req[k, 0], req[k, 1], req[k, 2], req[k, 3], req[k, 4], req[k, 5]
    if nr <= 0 or nc <= 0 or w < 0:
        return
    if cap == 0:  # no L2: word for word
        if w != READ:
            wb[a] += nr * nc
        if w != WRITE:
            fill[a] += nr * nc
        return
    ca = stride[a]
    b = base[a]
    lw = Lw[b]
    g0 = gbase[b] + copy * nseg[b]
    whole = nc == ca
    for r in range(1 if whole else nr):
        if whole:
            w0 = r0 * ca
            w1 = (r0 + nr) * ca
        else:
            w0 = (r0 + r) * ca + c0
            w1 = w0 + nc
        l1 = (w1 - 1) // lw + 1
        s = seg_of_line[loff[b] + w0 // lw]
        while True:
            j = soff[b] + s
            le = seg_start[j + 1]
            if spl == 1:
                segment(g0 + s, le - seg_start[j], w, a, q, seg_home[j], cap, lw, Lw, st, fill, wb, fabric, far)
            else:
                m = _sector_mask(w0, w1, seg_start[j], le, lw, spl)
                segment_sectors(g0 + s, le - seg_start[j], m, w, a, q, seg_home[j], cap, lw // spl, Lw, spl, st,
                                vmask, dmask, fill, wb, fabric, far)  # fmt: skip
            if le >= l1:
                break
            s += 1


@njit(cache=True, inline="always")
def _sector_mask(w0, w1, ls, le, lw, spl):
    """The sectors of the words [w0, w1) on the one line ls (every sector of a segment of several lines)."""
    if le - ls > 1:
        return (1 << spl) - 1
    sw = lw // spl
    lo = max(w0, ls * lw) - ls * lw
    hi = min(w1, le * lw) - ls * lw
    return ((1 << ((hi - 1) // sw + 1)) - 1) & ~((1 << (lo // sw)) - 1)


@njit(cache=True)
def _less(t1, i1, t2, i2):
    return t1 < t2 or (t1 == t2 and i1 < i2)


@njit(cache=True)
def _sift_up(ht, hi, hs, i):
    while i > 0:
        p = (i - 1) >> 1
        if not _less(ht[i], hi[i], ht[p], hi[p]):
            break
        ht[i], ht[p] = ht[p], ht[i]
        hi[i], hi[p] = hi[p], hi[i]
        hs[i], hs[p] = hs[p], hs[i]
        i = p


@njit(cache=True)
def _sift_down(ht, hi, hs, n):
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and _less(ht[c + 1], hi[c + 1], ht[c], hi[c]):
            c += 1
        if not _less(ht[c], hi[c], ht[i], hi[i]):
            break
        ht[i], ht[c] = ht[c], ht[i]
        hi[i], hi[c] = hi[c], hi[i]
        hs[i], hs[c] = hs[c], hs[i]
        i = c


@njit(cache=True)
def _start(i, t, slot, n, ht, hi, hs, cur, end, inst_piece, piece_ptr, delay):
    """Block i takes ``slot`` at time t (its first request after its delay): heap entry n."""
    p = inst_piece[i]
    cur[slot] = piece_ptr[p]
    end[slot] = piece_ptr[p + 1]
    ht[n] = t + delay[i]
    hi[n] = i
    hs[n] = slot


@njit(cache=True)
def _first_wave(lo, hi_, t_start, slots, static, ht, hi, hs, cur, end, inst_piece, piece_ptr, delay, static_slot,
                next_on):  # fmt: skip
    """The launch's first blocks: slots 0.. in launch order (dynamic), or each slot's first block (static, with
    ``next_on[i]`` the block after i on its slot). Returns (blocks on the heap, the next dynamic block)."""
    n = 0
    if static:
        last = np.full(slots, -1, np.int64)
        for i in range(lo, hi_):
            s = static_slot[i]
            next_on[i] = -1
            if last[s] < 0:
                _start(i, t_start, s, n, ht, hi, hs, cur, end, inst_piece, piece_ptr, delay)
                _sift_up(ht, hi, hs, n)
                n += 1
            else:
                next_on[last[s]] = i
            last[s] = i
        return n, hi_
    nxt_inst = lo
    while n < slots and nxt_inst < hi_:
        _start(nxt_inst, t_start, n, n, ht, hi, hs, cur, end, inst_piece, piece_ptr, delay)
        _sift_up(ht, hi, hs, n)
        n += 1
        nxt_inst += 1
    return n, nxt_inst


@njit(cache=True)
def run_launches(
    inst_piece, inst_copy, launch_ptr, slots, slot_part, piece_ptr, req, kind, base, stride, nseg, gbase, loff, soff,
    seg_of_line, seg_start, seg_home, Lw, cap, st, fill, wb, fabric, l2_read, l2_update, l2_reduce, delay,
    static_slot, wb_launch, record, rec_inst, rec_req, clock, spl, vmask, dmask, far, fill_launch, flush_between,
    wb_flush,
):  # fmt: skip
    """Run the launches' blocks through the clock model into the L2 (module docstring). Block i works on copy
    ``inst_copy[i, kind[a]]`` of array a (kind 0: its head unit's, 1: its K/V head's, 2: its batch item's); its requests
    are rows ``piece_ptr[p]:piece_ptr[p + 1]`` for p = ``inst_piece[i]``; it waits ``delay[i]`` words before its first
    request and runs on slot ``static_slot[i]`` (-1 for every block of a launch: the next free slot). A slot's
    requests go to partition ``slot_part[slot]``. With ``record``, the order in which the L2 sees the requests: block
    ``rec_inst[n]``, request ``rec_req[n]``. ``clock[k]`` is the end time of launch k, ``wb_launch[k]`` the words
    written back per array by the end of launch k (before the final flush). ``spl`` sectors per line (1: whole
    lines), with the sector masks ``vmask``, ``dmask`` (module docstring); ``far`` where a far-homed line is kept and
    ``fabric`` of shape (2, arrays) (module docstring). ``fill_launch[k]`` is the words filled per array by the end of
    launch k. ``flush_between`` = 1 (Nsight Compute's cache control): after every launch but the last, every dirty
    line is written back (``wb``, and launch k's flush in ``wb_flush[k]``) and the L2 emptied, so each launch starts
    from a clean L2. Returns the number of requests issued."""
    ht = np.empty(slots, np.int64)
    hi = np.empty(slots, np.int64)
    hs = np.empty(slots, np.int64)
    cur = np.empty(slots, np.int64)
    end = np.empty(slots, np.int64)
    next_on = np.full(inst_piece.shape[0], -1, np.int64)
    n_rec = 0
    t_start = 0
    for lk in range(launch_ptr.shape[0] - 1):
        lo, hi_ = launch_ptr[lk], launch_ptr[lk + 1]
        static = hi_ > lo and static_slot[lo] >= 0
        n, nxt_inst = _first_wave(lo, hi_, t_start, slots, static, ht, hi, hs, cur, end, inst_piece, piece_ptr, delay,
                                  static_slot, next_on)  # fmt: skip
        t_end = t_start
        while n > 0:
            t, i, slot = ht[0], hi[0], hs[0]
            k = cur[slot]
            w, a = req[k, 0], req[k, 1]
            if w >= 0:
                issue(k, inst_copy[i, kind[a]], slot_part[slot], req, base, stride, nseg, gbase, loff, soff,
                      seg_of_line, seg_start, seg_home, Lw, cap, st, fill, wb, fabric, spl, vmask, dmask,
                      far)  # fmt: skip
                if w == WRITE:
                    l2_update[a] += req[k, 6]
                elif w == REDUCE:
                    l2_reduce[a] += req[k, 6]
                else:
                    l2_read[a] += req[k, 6]
                if record:
                    rec_inst[n_rec] = i
                    rec_req[n_rec] = k
                n_rec += 1
                t += req[k, 6]
            cur[slot] = k + 1
            if k + 1 >= end[slot]:  # the block is done: the next one takes its slot
                if t > t_end:
                    t_end = t
                j = next_on[i] if static else (nxt_inst if nxt_inst < hi_ else -1)
                if j >= 0:
                    _start(j, t, slot, 0, ht, hi, hs, cur, end, inst_piece, piece_ptr, delay)
                    if not static:
                        nxt_inst += 1
                    _sift_down(ht, hi, hs, n)
                else:
                    n -= 1
                    ht[0], hi[0], hs[0] = ht[n], hi[n], hs[n]
                    _sift_down(ht, hi, hs, n)
            else:
                ht[0] = t
                _sift_down(ht, hi, hs, n)
        clock[lk] = t_end
        wb_launch[lk, :] = wb
        fill_launch[lk, :] = fill
        if flush_between and cap > 0 and lk + 2 < launch_ptr.shape[0]:
            flush_between_launches(st, vmask, dmask, Lw, spl, wb, wb_flush[lk])
        t_start = t_end
    return n_rec


@njit(cache=True)
def flush(st, Lw, wb):  # noqa: N803
    """Write back every dirty resident line at the end (every partition's)."""
    h, res, dirty, prv, nxt, seg_aid = st
    for p in range(h.shape[0]):
        t = h[p, _TAIL]
        while t >= 0:
            if dirty[p, t] and res[p, t] > 0:
                wb[seg_aid[t]] += res[p, t] * Lw[seg_aid[t]]
            t = prv[p, t]


@njit(cache=True)
def flush_between_launches(st, vmask, dmask, Lw, spl, wb, flushed):  # noqa: N803
    """Nsight Compute's cache control between two launches: every dirty line (or sector) written back, counted in
    ``wb`` and apart in ``flushed`` (per array), then the L2 emptied."""
    before = wb.copy()
    if spl > 1:
        flush_sectors(st, dmask, Lw, spl, wb)
    else:
        flush(st, Lw, wb)
    flushed[:] = wb - before
    invalidate(st, vmask, dmask)


@njit(cache=True)
def invalidate(st, vmask, dmask):
    """Empty every partition (after :func:`flush` has written its dirty lines back): no segment resident."""
    h, res, dirty, prv, nxt, _ = st
    for p in range(h.shape[0]):
        h[p, _HEAD] = -1
        h[p, _TAIL] = -1
        h[p, _USED] = 0
    res[:] = 0
    dirty[:] = 0
    prv[:] = -1
    nxt[:] = -1
    vmask[:] = 0
    dmask[:] = 0


@njit(cache=True)
def flush_sectors(st, dmask, Lw, spl, wb):  # noqa: N803
    """:func:`flush` with sectors: every resident line writes back its dirty sectors."""
    h, res, _, prv, nxt, seg_aid = st
    for p in range(h.shape[0]):
        t = h[p, _TAIL]
        while t >= 0:
            if dmask[p, t] and res[p, t] > 0:
                wb[seg_aid[t]] += res[p, t] * popcount(dmask[p, t]) * (Lw[seg_aid[t]] // spl)
            t = prv[p, t]


@njit(cache=True)
def line_stream(rec_inst, rec_req, n_rec, inst_copy, req, kind, base, stride, lbase, nl, Lw, out_lines, out_flags):  # noqa: N803
    """The line addresses the recorded requests touch, in order (flags: 3 a write, 0 a read, as
    :func:`iosim.views.cache_sim.opt` takes them; a reduction is a read, then a write, of each of its lines); with
    ``out_lines`` empty, only their number."""
    n = 0
    fill_out = out_lines.shape[0] > 0
    for j in range(n_rec):
        i, k = rec_inst[j], rec_req[j]
        w, a, r0, nr, c0, nc = req[k, 0], req[k, 1], req[k, 2], req[k, 3], req[k, 4], req[k, 5]
        if nr <= 0 or nc <= 0 or w < 0:
            continue
        b = base[a]
        lw = Lw[b]
        first = lbase[b] + inst_copy[i, kind[a]] * nl[b]
        ca = stride[a]
        whole = nc == ca
        for r in range(1 if whole else nr):
            if whole:
                w0 = r0 * ca
                w1 = (r0 + nr) * ca
            else:
                w0 = (r0 + r) * ca + c0
                w1 = w0 + nc
            for ln in range(w0 // lw, (w1 - 1) // lw + 1):
                if w == REDUCE:  # a reduction reads the line (a fetch on a miss), then leaves it dirty
                    if fill_out:
                        out_lines[n] = first + ln
                        out_flags[n] = 0
                    n += 1
                if fill_out:
                    out_lines[n] = first + ln
                    out_flags[n] = 3 if w else 0
                n += 1
    return n

"""The L2 and the clock, in Numba: thread blocks' tile requests interleaved in time into one shared LRU cache.

**Lines and segments.** Word (r, c) of copy k of array a sits at line ``lbase[b] + k * nl[b] + (r * stride[a] + c) //
L`` where b = ``base[a]`` is the array whose storage a is (itself, or K for an MLA latent's V: the latent's first d_v
columns) and ``stride[a]`` its row stride (b's width); every copy starts on a line. A request (one tile transfer)
touches, row by row, the lines ``[w0 // L, (w1 - 1) // L]`` of its contiguous word ranges ``[w0, w1)``, in ascending
order (one range for a tile of whole rows). Lines are grouped into **segments**, the finest partition of an array's
lines by the ends of every request's line ranges: every request touches whole segments, each from its first line to its
last.

**Segment LRU = line LRU, exactly.** LRU over lines, fed a line stream in which every segment is always touched
whole and in order, keeps a segment's lines adjacent in recency order, oldest first. Eviction takes lines from the
tail, so at most one segment is partly resident (the tail one, holding its newest lines); touching it again misses
on every one of its lines (each miss evicts the segment's next line before it is reached). So an LRU that moves
whole segments (a partly resident one is dropped and refetched whole; eviction may leave the new tail segment
partly resident; a segment larger than the cache streams through and leaves its last C lines) fetches and writes
back exactly what the line LRU does, at a cost per tile instead of per line. tests/test_hierarchy.py pins it against
a naive line LRU on random partitions and streams, and against :mod:`iosim.views.cache_sim`'s LRU on real launches.

**Writes** are write-back and write-validate (a GPU L2 keeps per-sector valid masks): a write miss allocates its
lines dirty without fetching them; a dirty line costs L words of DRAM writes when it is evicted or flushed at the
end. ``C = 0`` is no L2: every request goes to DRAM word for word (the two-level count).

**The clock.** ``slots`` thread blocks are resident at once (P SMs x blocks per SM). A launch starts its first
``slots`` blocks (in launch order) at the launch's start time; each block's clock starts there and advances by the
words of each request it issues; when a block finishes, the next block of the launch takes its slot at the
finishing block's clock. The L2 sees the requests of all resident blocks in the order of the clock value at which
each is issued, ties by launch order (block id). A launch starts when the previous one has finished.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_HEAD, _TAIL, _USED = 0, 1, 2


@njit(cache=True)
def mark_boundaries(req, piece_lo, piece_hi, base, stride, loff, L, mark):  # noqa: N803
    """mark[loff[b] + l] = 1 where some request of an array stored in b starts or ends a line range (requests
    piece_lo:piece_hi)."""
    for k in range(piece_lo, piece_hi):
        a, r0, nr, c0, nc = req[k, 1], req[k, 2], req[k, 3], req[k, 4], req[k, 5]
        if nr <= 0 or nc <= 0:
            continue
        ca = stride[a]
        o = loff[base[a]]
        if nc == ca:
            w0 = r0 * ca
            w1 = (r0 + nr) * ca
            mark[o + w0 // L] = 1
            mark[o + (w1 - 1) // L + 1] = 1
        else:
            for r in range(nr):
                w0 = (r0 + r) * ca + c0
                mark[o + w0 // L] = 1
                mark[o + (w0 + nc - 1) // L + 1] = 1


@njit(cache=True, inline="always")
def _unlink(s, h, prv, nxt):
    p, q = prv[s], nxt[s]
    if p >= 0:
        nxt[p] = q
    else:
        h[_HEAD] = q
    if q >= 0:
        prv[q] = p
    else:
        h[_TAIL] = p
    prv[s] = -1
    nxt[s] = -1


@njit(cache=True, inline="always")
def _push_head(s, h, prv, nxt):
    prv[s] = -1
    nxt[s] = h[_HEAD]
    if h[_HEAD] >= 0:
        prv[h[_HEAD]] = s
    h[_HEAD] = s
    if h[_TAIL] < 0:
        h[_TAIL] = s


@njit(cache=True)
def access(s, k, w, a, cap, L, h, res, dirty, prv, nxt, seg_aid, fill, wb):  # noqa: N803
    """Segment s (k lines, array a) touched whole by a read (w = 0) or a write (w = 1): LRU, write-validate."""
    r = res[s]
    if r == k:  # resident whole: a hit
        if h[_HEAD] != s:
            _unlink(s, h, prv, nxt)
            _push_head(s, h, prv, nxt)
        if w:
            dirty[s] = 1
        return
    if r > 0:  # partly resident (the tail segment): every line misses; drop what is left
        if dirty[s]:
            wb[a] += r * L
        _unlink(s, h, prv, nxt)
        h[_USED] -= r
        res[s] = 0
    if w == 0:
        fill[a] += k * L
    if k > cap:  # larger than the cache: it streams through, leaving its last cap lines
        t = h[_TAIL]
        while t >= 0:
            if dirty[t]:
                wb[seg_aid[t]] += res[t] * L
            res[t] = 0
            p = prv[t]
            prv[t] = -1
            nxt[t] = -1
            t = p
        h[_HEAD] = -1
        h[_TAIL] = -1
        if w:
            wb[a] += (k - cap) * L
        res[s] = cap
        h[_USED] = cap
        dirty[s] = w
        _push_head(s, h, prv, nxt)
        return
    need = h[_USED] + k - cap
    while need > 0:
        t = h[_TAIL]
        rt = res[t]
        if rt <= need:
            if dirty[t]:
                wb[seg_aid[t]] += rt * L
            _unlink(t, h, prv, nxt)
            res[t] = 0
            h[_USED] -= rt
            need -= rt
        else:  # the tail segment keeps its newest lines
            res[t] = rt - need
            if dirty[t]:
                wb[seg_aid[t]] += need * L
            h[_USED] -= need
            need = 0
    res[s] = k
    h[_USED] += k
    dirty[s] = w
    _push_head(s, h, prv, nxt)


@njit(cache=True)
def issue(k, copy, req, base, stride, nseg, gbase, loff, soff, seg_of_line, seg_start, L, cap, st, fill, wb):  # noqa: N803
    """Request k of a block working on copy ``copy`` of its array: every segment it touches, in order."""
    h, res, dirty, prv, nxt, seg_aid = st
    w, a, r0, nr, c0, nc = req[k, 0], req[k, 1], req[k, 2], req[k, 3], req[k, 4], req[k, 5]
    if nr <= 0 or nc <= 0:
        return
    if cap == 0:  # no L2: word for word
        if w:
            wb[a] += nr * nc
        else:
            fill[a] += nr * nc
        return
    ca = stride[a]
    b = base[a]
    g0 = gbase[b] + copy * nseg[b]
    whole = nc == ca
    for r in range(1 if whole else nr):
        if whole:
            w0 = r0 * ca
            w1 = (r0 + nr) * ca
        else:
            w0 = (r0 + r) * ca + c0
            w1 = w0 + nc
        l1 = (w1 - 1) // L + 1
        s = seg_of_line[loff[b] + w0 // L]
        while True:
            le = seg_start[soff[b] + s + 1]
            access(g0 + s, le - seg_start[soff[b] + s], w, a, cap, L, h, res, dirty, prv, nxt, seg_aid, fill, wb)
            if le >= l1:
                break
            s += 1


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
def run_launches(
    inst_piece, inst_copy, launch_ptr, slots, piece_ptr, req, kind, base, stride, nseg, gbase, loff, soff,
    seg_of_line, seg_start, L, cap, st, fill, wb, l2_read, l2_update, record, rec_inst, rec_req, clock,
):  # fmt: skip
    """Run the launches' blocks through the clock model into the L2 (module docstring). Block i works on copy
    ``inst_copy[i, kind[a]]`` of array a (kind 0: its head unit's, 1: its K/V head's, 2: its batch item's); its requests
    are rows ``piece_ptr[p]:piece_ptr[p + 1]`` for p = ``inst_piece[i]``. With ``record``, the order in which the L2
    sees the requests: block ``rec_inst[n]``, request ``rec_req[n]``. ``clock[k]`` is the end time of launch k. Returns
    the number of requests issued."""
    ht = np.empty(slots, np.int64)
    hi = np.empty(slots, np.int64)
    hs = np.empty(slots, np.int64)
    cur = np.empty(slots, np.int64)
    end = np.empty(slots, np.int64)
    n_rec = 0
    t_start = 0
    for lk in range(launch_ptr.shape[0] - 1):
        lo, hi_ = launch_ptr[lk], launch_ptr[lk + 1]
        nxt_inst = lo
        n = 0
        t_end = t_start
        while n < slots and nxt_inst < hi_:  # the first wave, in launch order
            p = inst_piece[nxt_inst]
            cur[n] = piece_ptr[p]
            end[n] = piece_ptr[p + 1]
            ht[n] = t_start
            hi[n] = nxt_inst
            hs[n] = n
            _sift_up(ht, hi, hs, n)
            n += 1
            nxt_inst += 1
        while n > 0:
            t, i, slot = ht[0], hi[0], hs[0]
            k = cur[slot]
            a = req[k, 1]
            copy = inst_copy[i, kind[a]]
            issue(k, copy, req, base, stride, nseg, gbase, loff, soff, seg_of_line, seg_start, L, cap, st, fill, wb)
            if req[k, 0]:
                l2_update[a] += req[k, 6]
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
                if nxt_inst < hi_:
                    p = inst_piece[nxt_inst]
                    cur[slot] = piece_ptr[p]
                    end[slot] = piece_ptr[p + 1]
                    ht[0] = t
                    hi[0] = nxt_inst
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
        t_start = t_end
    return n_rec


@njit(cache=True)
def flush(st, L, wb):  # noqa: N803
    """Write back every dirty resident line at the end."""
    h, res, dirty, prv, nxt, seg_aid = st
    t = h[_TAIL]
    while t >= 0:
        if dirty[t] and res[t] > 0:
            wb[seg_aid[t]] += res[t] * L
        t = prv[t]


@njit(cache=True)
def line_stream(rec_inst, rec_req, n_rec, inst_copy, req, kind, base, stride, lbase, nl, L, out_lines, out_flags):  # noqa: N803
    """The line addresses the recorded requests touch, in order (flags: 3 a write, 0 a read, as
    :func:`iosim.views.cache_sim.opt` takes them); with ``out_lines`` empty, only their number."""
    n = 0
    fill_out = out_lines.shape[0] > 0
    for j in range(n_rec):
        i, k = rec_inst[j], rec_req[j]
        w, a, r0, nr, c0, nc = req[k, 0], req[k, 1], req[k, 2], req[k, 3], req[k, 4], req[k, 5]
        if nr <= 0 or nc <= 0:
            continue
        b = base[a]
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
            for ln in range(w0 // L, (w1 - 1) // L + 1):
                if fill_out:
                    out_lines[n] = first + ln
                    out_flags[n] = 3 if w else 0
                n += 1
    return n

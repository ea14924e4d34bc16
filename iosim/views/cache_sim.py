"""A fully associative, hardware-managed cache of C lines of L words, in Numba: LRU, FIFO and Belady's OPT.

The input is a list of *compute ops* (:mod:`iosim.views.replay` derives them from a schedule's event trace); the kernels
here turn each op into the word addresses it touches, in the op's documented order, and feed them to the cache one
at a time. For LRU and FIFO nothing is materialised: :func:`run_ops` generates the accesses' line numbers in
chunks of :data:`CHUNK` and the policy's loop consumes each chunk. OPT needs the future, so the same generator in
its recording mode first writes the line trace (one int32 line and one flag byte per access, a run of accesses to
one resident line merged into one record) and :func:`opt` replays it with a next-use array.

Ops (one int64 row of :data:`OP_WIDTH` columns each; an operand is ``(base, s0, s1)``: element (i, j) of the operand
is the word at ``base + i*s0 + j*s1``, so a transposed tile is its strides swapped):

* ``MATMUL`` ``[1, ti, tj, tk, acc, Cb, Cs0, Cs1, Ab, As0, As1, Bb, Bs0, Bs1]``: C (ti x tj) (+)= A (ti x tk) B
  (tk x tj). Order: row r of C, column c, then the inner index k: [read C[r, c] if acc], then for each k: read
  A[r, k], read B[k, c]; then write C[r, c] (the dot product accumulates in a register).
* ``ROWS`` ``[2, n, nseg, seg_1 .. seg_6]`` with ``seg = [mode, ncols, sb, ss0, ss1, db, ds0, ds1]``: for each row
  r < n, the segments in order, each over its columns c < ncols: mode ``R`` reads src[r, c]; ``W`` writes
  dst[r, c]; ``RW`` reads then writes dst[r, c]; ``RD`` reads src[r, c] then writes dst[r, c] (a transform that
  lands elsewhere: P = softmax(S) written to P).

Cache (the same for the three policies): C = capacity // L lines, fully associative; a line never straddles two
arrays (:mod:`iosim.views.replay` aligns every array to L). A read miss fetches L words; a write miss fetches L words
with write-allocate, and without it writes the one word through to slow memory and allocates nothing; with
``write_allocate=2`` (write-validate, a GPU L2's sector masks; :mod:`iosim.hierarchy`) it allocates the line dirty
without fetching it. A write hit
marks the line dirty; evicting a dirty line writes its L words back. Fetches and write-backs are counted per
array (``aid_of[line]``). LRU evicts the least recently used line, FIFO the line resident longest, OPT the line
whose next use is farthest in the future (Belady), ties among lines never used again broken arbitrarily.
"""

from __future__ import annotations

import numpy as np
from numba import njit

MATMUL, ROWS = 1, 2
R, W, RW, RD = 1, 2, 3, 4
MAX_SEGS = 6
SEG = 8
OP_WIDTH = 3 + MAX_SEGS * SEG
LRU, FIFO, EMIT = 1, 2, 3
POLICIES = ("lru", "opt", "fifo")

# The header of the state array ``h``.
_MODE, _CAP, _WALLOC, _USED, _HEAD, _TAIL, _PTR, _LAST, _LASTRES, _NOUT, _SHIFT, _L = range(12)
HEADER = 12


def new_state(mode: int, capacity_lines: int, write_allocate: bool, n_lines: int, L: int, n_aids: int):  # noqa: N803
    """The cache's state arrays: header, slot of each line, line/dirty/prev/next of each slot, counters."""
    h = np.zeros(HEADER, np.int64)
    h[_MODE], h[_CAP], h[_WALLOC], h[_L], h[_SHIFT] = mode, capacity_lines, int(write_allocate), L, L.bit_length() - 1
    h[_HEAD] = h[_TAIL] = h[_LAST] = -1
    slot_of = np.full(n_lines, -1, np.int32)
    cap = capacity_lines
    line_of, dirty = np.full(cap, -1, np.int64), np.zeros(cap, np.int8)
    prv, nxt = np.full(cap, -1, np.int32), np.full(cap, -1, np.int32)
    fetched, written = np.zeros(n_aids, np.int64), np.zeros(n_aids, np.int64)
    return h, slot_of, line_of, dirty, prv, nxt, fetched, written


CHUNK = 1 << 16  # accesses generated per chunk before the policy consumes them


@njit(cache=True)
def _lru_chunk(n, buf, wb, h, slot_of, line_of, dirty, prv, nxt, fetched, written, aid_of):
    """LRU over one chunk: a doubly linked list of slots, most recently used at the head."""
    last, lastres, head, tail = h[_LAST], h[_LASTRES], h[_HEAD], h[_TAIL]
    used, cap, walloc, L = h[_USED], h[_CAP], h[_WALLOC], h[_L]
    for i in range(n):
        line, w = buf[i], wb[i]
        if line == last and lastres != 0:  # the line just touched, still resident (and already most recent)
            if w:
                dirty[slot_of[line]] = 1
            continue
        last = line
        lastres = 1
        s = slot_of[line]
        if s >= 0:  # hit: move to the head
            if w:
                dirty[s] = 1
            if s != head:
                p, q = prv[s], nxt[s]
                nxt[p] = q  # s is not the head, so p >= 0
                if q >= 0:
                    prv[q] = p
                else:
                    tail = p
                prv[s] = -1
                nxt[s] = head
                prv[head] = s
                head = s
            continue
        if w and walloc == 0:  # write miss, no write-allocate: the word goes straight to slow memory
            written[aid_of[line]] += 1
            lastres = 0
            continue
        if not (w and walloc == 2):  # walloc 2, write-validate: a write miss allocates the line without a fetch
            fetched[aid_of[line]] += L
        if used < cap:
            s = used
            used += 1
        else:  # evict the tail
            s = tail
            old = line_of[s]
            slot_of[old] = -1
            if dirty[s]:
                written[aid_of[old]] += L
            p = prv[s]
            tail = p
            if p >= 0:
                nxt[p] = -1
            else:
                head = -1
        line_of[s] = line
        slot_of[line] = s
        dirty[s] = w
        prv[s] = -1
        nxt[s] = head
        if head >= 0:
            prv[head] = s
        head = s
        if tail < 0:
            tail = s
    h[_LAST], h[_LASTRES], h[_HEAD], h[_TAIL], h[_USED] = last, lastres, head, tail, used


@njit(cache=True)
def _fifo_chunk(n, buf, wb, h, slot_of, line_of, dirty, fetched, written, aid_of):
    """FIFO over one chunk: slots filled in order, each new line takes the oldest line's slot (a ring)."""
    last, lastres, ptr, used = h[_LAST], h[_LASTRES], h[_PTR], h[_USED]
    cap, walloc, L = h[_CAP], h[_WALLOC], h[_L]
    for i in range(n):
        line, w = buf[i], wb[i]
        if line == last and lastres != 0:
            if w:
                dirty[slot_of[line]] = 1
            continue
        last = line
        lastres = 1
        s = slot_of[line]
        if s >= 0:
            if w:
                dirty[s] = 1
            continue
        if w and walloc == 0:
            written[aid_of[line]] += 1
            lastres = 0
            continue
        if not (w and walloc == 2):
            fetched[aid_of[line]] += L
        if used < cap:
            s = used
            used += 1
        else:
            s = ptr
            ptr = ptr + 1 if ptr + 1 < cap else 0
            old = line_of[s]
            slot_of[old] = -1
            if dirty[s]:
                written[aid_of[old]] += L
        line_of[s] = line
        slot_of[line] = s
        dirty[s] = w
    h[_LAST], h[_LASTRES], h[_PTR], h[_USED] = last, lastres, ptr, used


@njit(cache=True)
def _emit_chunk(n, buf, wb, h, out_lines, out_flags):
    """Record the chunk for OPT, merging a run of accesses to one line that stays resident (a hit under every
    policy): flag bit 0, the first access is a write; bit 1, some access of the run writes."""
    last, lastres, k, walloc = h[_LAST], h[_LASTRES], h[_NOUT], h[_WALLOC]
    for i in range(n):
        line, w = buf[i], wb[i]
        if line == last and lastres != 0:
            if w:
                out_flags[k - 1] = out_flags[k - 1] | 2
            continue
        out_lines[k] = line
        out_flags[k] = 3 if w else 0
        k += 1
        last = line
        lastres = 1 if (w == 0 or walloc != 0) else 0
    h[_LAST], h[_LASTRES], h[_NOUT] = last, lastres, k


@njit(cache=True)
def _flush(n, buf, wb, h, slot_of, line_of, dirty, prv, nxt, fetched, written, aid_of, out_lines, out_flags):
    if h[_MODE] == LRU:
        _lru_chunk(n, buf, wb, h, slot_of, line_of, dirty, prv, nxt, fetched, written, aid_of)
    elif h[_MODE] == FIFO:
        _fifo_chunk(n, buf, wb, h, slot_of, line_of, dirty, fetched, written, aid_of)
    else:
        _emit_chunk(n, buf, wb, h, out_lines, out_flags)


@njit(cache=True)
def run_ops(ops, h, slot_of, line_of, dirty, prv, nxt, fetched, written, aid_of, out_lines, out_flags):
    """Walk the ops in order (see the module docstring for each op's order), generating the accesses' lines in
    chunks of :data:`CHUNK` that the state's policy (or the OPT recorder) consumes: the stream is never held whole."""
    sh = h[_SHIFT]  # the line is a power of two words: line = address >> sh
    buf = np.empty(CHUNK + 64, np.int64)
    wb = np.empty(CHUNK + 64, np.int8)
    n = 0
    for o in range(ops.shape[0]):
        op = ops[o]
        if op[0] == MATMUL:
            ti, tj, tk, acc = op[1], op[2], op[3], op[4]
            Cb, Cs0, Cs1, Ab, As0, As1, Bb, Bs0, Bs1 = op[5], op[6], op[7], op[8], op[9], op[10], op[11], op[12], op[13]
            for r in range(ti):
                for c in range(tj):
                    ca = (Cb + r * Cs0 + c * Cs1) >> sh
                    if acc:
                        buf[n] = ca
                        wb[n] = 0
                        n += 1
                    a = Ab + r * As0
                    b = Bb + c * Bs1
                    for k in range(tk):
                        buf[n] = (a + k * As1) >> sh
                        wb[n] = 0
                        buf[n + 1] = (b + k * Bs0) >> sh
                        wb[n + 1] = 0
                        n += 2
                        if n >= CHUNK:
                            _flush(n, buf, wb, h, slot_of, line_of, dirty, prv, nxt, fetched, written, aid_of,
                                   out_lines, out_flags)  # fmt: skip
                            n = 0
                    buf[n] = ca
                    wb[n] = 1
                    n += 1
                    if n >= CHUNK:
                        _flush(n, buf, wb, h, slot_of, line_of, dirty, prv, nxt, fetched, written, aid_of,
                               out_lines, out_flags)  # fmt: skip
                        n = 0
        else:
            rows, nseg = op[1], op[2]
            for r in range(rows):
                for g in range(nseg):
                    e = 3 + g * SEG
                    mode, nc = op[e], op[e + 1]
                    sb, ss0, ss1, db, ds0, ds1 = op[e + 2], op[e + 3], op[e + 4], op[e + 5], op[e + 6], op[e + 7]
                    for c in range(nc):
                        if mode == R or mode == RD:
                            buf[n] = (sb + r * ss0 + c * ss1) >> sh
                            wb[n] = 0
                            n += 1
                        if mode == RW:
                            buf[n] = (db + r * ds0 + c * ds1) >> sh
                            wb[n] = 0
                            n += 1
                        if mode != R:
                            buf[n] = (db + r * ds0 + c * ds1) >> sh
                            wb[n] = 1
                            n += 1
                        if n >= CHUNK:
                            _flush(n, buf, wb, h, slot_of, line_of, dirty, prv, nxt, fetched, written, aid_of,
                                   out_lines, out_flags)  # fmt: skip
                            n = 0
    _flush(n, buf, wb, h, slot_of, line_of, dirty, prv, nxt, fetched, written, aid_of, out_lines, out_flags)


def access_count(ops: np.ndarray) -> int:
    """The number of word accesses the ops make (before the run-merging of :func:`emit`)."""
    ops = np.asarray(ops, np.int64)
    mm = ops[ops[:, 0] == MATMUL]
    total = int(np.sum(mm[:, 1] * mm[:, 2] * (2 * mm[:, 3] + 1 + mm[:, 4])))
    rows = ops[ops[:, 0] == ROWS]
    for g in range(MAX_SEGS):
        e = 3 + g * SEG
        mode, nc = rows[:, e], rows[:, e + 1]
        per = np.where((mode == RW) | (mode == RD), 2 * nc, np.where(mode > 0, nc, 0))
        total += int(np.sum(np.where(g < rows[:, 2], rows[:, 1] * per, 0)))
    return total


@njit(cache=True)
def next_use(lines, n_lines):
    """nxt[i] = the index of the next access to lines[i]'s line after i (len(lines): never again)."""
    n = lines.shape[0]
    nxt = np.empty(n, np.int32)
    last = np.full(n_lines, n, np.int32)
    for i in range(n - 1, -1, -1):
        nxt[i] = last[lines[i]]
        last[lines[i]] = i
    return nxt


@njit(cache=True)
def _sift_up(key, heap, pos, i):
    while i > 0:
        p = (i - 1) >> 1
        if key[heap[p]] >= key[heap[i]]:
            break
        heap[p], heap[i] = heap[i], heap[p]
        pos[heap[p]] = p
        pos[heap[i]] = i
        i = p


@njit(cache=True)
def _sift_down(key, heap, pos, i, size):
    while True:
        lft = 2 * i + 1
        if lft >= size:
            break
        big = lft
        if lft + 1 < size and key[heap[lft + 1]] > key[heap[lft]]:
            big = lft + 1
        if key[heap[i]] >= key[heap[big]]:
            break
        heap[big], heap[i] = heap[i], heap[big]
        pos[heap[big]] = big
        pos[heap[i]] = i
        i = big


@njit(cache=True)
def opt(lines, flags, nxt, capacity, write_allocate, L, aid_of, n_lines, fetched, written):  # noqa: N803
    """Belady's OPT on an emitted line trace: a max-heap of the resident slots keyed by their next use.

    Returns (dirty lines left resident, as a line array) so the caller can flush the slow arrays' ones."""
    slot_of = np.full(n_lines, -1, np.int32)
    line_of = np.full(capacity, -1, np.int64)
    dirty = np.zeros(capacity, np.int8)
    key = np.zeros(capacity, np.int64)
    heap = np.zeros(capacity, np.int32)  # heap[i] = a slot; pos[slot] = its index in heap
    pos = np.zeros(capacity, np.int32)
    used = 0
    for i in range(lines.shape[0]):
        line = lines[i]
        f = flags[i]
        s = slot_of[line]
        if s >= 0:
            key[s] = nxt[i]
            _sift_up(key, heap, pos, pos[s])  # the next use only moves later: up in a max-heap
            if f & 2:
                dirty[s] = 1
            continue
        if (f & 1) and not write_allocate:
            written[aid_of[line]] += 1
            continue
        if not ((f & 1) and write_allocate == 2):
            fetched[aid_of[line]] += L
        if used < capacity:
            s = used
            heap[used] = s
            pos[s] = used
            used += 1
            line_of[s] = line
            slot_of[line] = s
            dirty[s] = 1 if f & 2 else 0
            key[s] = nxt[i]
            _sift_up(key, heap, pos, pos[s])
        else:
            s = heap[0]  # the resident line used farthest in the future
            old = line_of[s]
            slot_of[old] = -1
            if dirty[s]:
                written[aid_of[old]] += L
            line_of[s] = line
            slot_of[line] = s
            dirty[s] = 1 if f & 2 else 0
            key[s] = nxt[i]
            _sift_down(key, heap, pos, 0, used)
    out = np.empty(used, np.int64)
    k = 0
    for s in range(used):
        if dirty[s]:
            out[k] = line_of[s]
            k += 1
    return out[:k]


def access_ops(addresses, writes) -> np.ndarray:
    """Ops that touch the given word addresses in order (a write where ``writes`` is true): one ROWS op of one
    one-word segment per access. For driving the cache with an arbitrary trace (the tests' random traces)."""
    addresses = np.asarray(addresses, np.int64)
    ops = np.zeros((addresses.size, OP_WIDTH), np.int64)
    ops[:, 0], ops[:, 1], ops[:, 2] = ROWS, 1, 1
    ops[:, 3] = np.where(np.asarray(writes, bool), W, R)
    ops[:, 4] = 1
    ops[:, 5] = ops[:, 8] = addresses
    return ops


def simulate(addresses, writes, policy: str, capacity_lines: int, L: int = 1, write_allocate: bool = True):  # noqa: N803
    """Words (fetched, written) when the access trace runs through a cache of ``capacity_lines`` lines of ``L``
    words (a power of two) under ``policy``; dirty lines left at the end are written back."""
    ops = access_ops(addresses, writes)
    n_lines = int(np.max(addresses, initial=0)) // L + 1
    aid_of = np.zeros(n_lines, np.int32)
    if policy == "opt":
        fetched, written = np.zeros(1, np.int64), np.zeros(1, np.int64)
        state = new_state(EMIT, 1, write_allocate, n_lines, L, 1)
        lines, flags = np.empty(len(ops), np.int32), np.empty(len(ops), np.int8)
        run_ops(ops, *state, aid_of, lines, flags)
        n = int(state[0][_NOUT])
        nxt = next_use(lines[:n], n_lines)
        left = opt(lines[:n], flags[:n], nxt, capacity_lines, write_allocate, L, aid_of, n_lines, fetched, written)
    else:
        state = new_state(LRU if policy == "lru" else FIFO, capacity_lines, write_allocate, n_lines, L, 1)
        run_ops(ops, *state, aid_of, np.empty(0, np.int32), np.empty(0, np.int8))
        h, _s, line_of, dirty, _p, _n, fetched, written = state
        used = int(h[_USED])
        left = line_of[:used][dirty[:used] != 0]
    return int(fetched[0]), int(written[0]) + L * len(left)

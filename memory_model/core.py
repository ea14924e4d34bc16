"""The two-level memory: state, counters, capacity, resident tiles, and the event trace.

Conventions (every exact count in iosim follows them; iosim.theory.io_model derives its closed forms from them)
------------------------------------------------------------------------------------------------------
* **Word.** One word is one matrix entry, whatever its dtype. *Reads* are words moved slow -> fast, *writes* are
  words moved fast -> slow. There is no line or block size: every word is one I/O.
* **Slow arrays** are registered with a name and a shape (vectors are n x 1). Every tile names a rectangular
  region ``[r0, r0 + nr) x [c0, c0 + nc)`` of one of them.
* **Fast memory holds at most M words**, and what it holds is a set of *tiles*: every word resident in fast
  memory belongs to exactly one live tile. A **load** copies a region slow -> fast, counts its words as reads and
  returns a *handle*; an **alloc** reserves a region-shaped tile of scratch (an accumulator O_i, a score tile
  S_ij, row statistics m_i, l_i) and returns a handle; a **store** copies a live tile fast -> slow (to its own
  region, or with ``store_to`` to another region of the same shape: P overwriting S in place on chip) and counts
  writes; a **free** releases exactly that tile. Capacity is checked on what is actually resident: the words of
  the live tiles. Counting happens once per tile transfer, never per element.
* **Placing the inputs in slow memory is free.** Initialising a slow-memory array (FlashAttention 1 zeroes O, l and
  m in HBM) counts as writes, as a GPU memset writes HBM; those writes are also tallied per array in the
  ``init_writes`` column so a reader can subtract them.
* **Arithmetic on resident data is free**; recomputation is allowed.
* **Capacity.** With ``strict=True`` a transfer that would make more than M words resident raises
  :class:`CapacityError` naming the array, the words needed, the words free and M. With ``strict=False`` the
  overflow is recorded (``peak > M``, ``overflowed``) and the schedule runs on, to show a schedule that does not fit.

**What M bounds, and what it leaves out.** M bounds the words of the live tiles. It does not count (1) loop
indices and the scalars of one row's arithmetic (m~, l~, m_new, the running scalars of a softmax sweep), which a
GPU keeps in registers; (2) temporaries that NumPy or BLAS create for a product (``Oi += np.dot(S, Vj)`` makes a
Br x d temporary) that an in-place machine, accumulating into the resident tile, would not need; (3) the
Python/Numba bookkeeping itself. Everything else that an algorithm computes on must be inside a live tile: the test
suite's honesty witness (tests/witness.py) checks that independently of these counters.

**Schedule errors** (a bug in a schedule, not a capacity question) raise :class:`ScheduleError` naming the array
and region: freeing or storing a stale or foreign handle (freed twice, stored after its free), a region outside
its array or of negative size, a fast buffer smaller than its tile, more than ``MAX_TILES`` tiles resident at
once, or tiles left resident when the schedule ends.

Implementation
--------------
All state lives in one int64 array ``W`` owned by :class:`TwoLevelMemory`: a header, one row per registered array
(reads, writes, init writes, resident words, resident words at the peak, shape), a stack of free tile slots, the
tile table (one row per slot: sequence number, array, region, words) and, when tracing, the event rows. The
module-level ``@njit(cache=True)`` helpers take that array, so drivers written in Numba run against it with
Numba's on-disk cache (no jitclass, no closures), and plain Python calls the same helpers (:mod:`.schedule`).
A handle is ``seq * MAX_TILES + slot``; a handle whose slot holds another sequence number is stale.
Count-only mode passes ``None`` for every data array: the helpers count exactly as before and copy nothing
(``if dst is not None`` is pruned at compile time), so the same loop nest yields the same counts without data.
The helpers never raise (an exception path inside them slows every call and costs compile time): the first
overflow and the first schedule error are recorded in ``W`` and :meth:`TwoLevelMemory.call` raises them when the
driver returns. A helper that records an error does nothing else (no copy, no count) and returns handle -1.
Copies are explicit loops, not slice assignments (Numba compiles a string-formatting error path for every slice
assignment, seconds of first-run compile time).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

import numba
import numpy as np
from numba import njit, types
from numba.extending import overload, register_jitable

# The model's ops and their helpers are "jitable" functions: plain Python when called from Python (the schedule
# API, NUMBA_DISABLE_JIT), compiled when called from a Numba driver. Unlike an @njit dispatcher, a jitable function
# is compiled once per argument *type*, not once per combination of literal values at its call sites (Numba
# specialises an @njit callee on literal ints: load(..., 0, d, ...) and load(..., c0, d, ...) would be two
# compilations), which keeps the first run's compile time down. No runtime (``_nrt=False``): the ops allocate
# nothing, so they carry no reference counting.
_JITABLE: dict = {}  # this module's jitable functions by name
_JITABLE_FUNCS: set = set()  # every jitable function (drivers' helpers in iosim.algorithms too)


def jitable(fn=None, *, nrt: bool = False):
    """Make ``fn`` jitable (see above); ``nrt=True`` for a helper that allocates (a driver's tile products)."""
    if fn is None:
        return lambda f: jitable(f, nrt=nrt)
    if fn.__module__ == __name__:
        _JITABLE[fn.__name__] = fn
    _JITABLE_FUNCS.add(fn)
    return register_jitable(cache=True, _nrt=nrt)(fn) if not nrt else register_jitable(cache=True)(fn)


MAX_ARRAYS = 64
MAX_M = 1 << 40  # the largest fast memory (words): counts stay int64 (iosim.runner.api.MAX_M is the same)
MAX_TILES = 64  # a power of two: handle & (MAX_TILES - 1) is the slot
_SHIFT = 6  # log2(MAX_TILES)
# W is one flat int64 array. The header:
_RES, _PEAK, _M, _STRICT, _SEQ, _TOP, _TCAP, _NEV = 0, 1, 2, 3, 4, 5, 6, 7
_FAST = 20  # 1: a fast memory, counters only (see "Count-only variants" below)
_HEAD = 21  # the free slots are a ring (first freed, first reused): its head; _TOP counts the free slots
_FASTBIT = 1 << 62  # a fast handle: _FASTBIT | aid << 40 | words
_OVER, _OV_AID, _OV_NEED, _OV_FREE = 8, 9, 10, 11  # the first overflow
_ECODE, _EAID, _ER0, _ENR, _EC0, _ENC, _EHANDLE, _EWORDS = 12, 13, 14, 15, 16, 17, 18, 19  # the first error
_STRIDE = 8
# Per-array rows (_row(aid) + column), tile rows (T0 + slot * _STRIDE + column), event rows.
_READS, _WRITES, _INIT, _ARES, _APEAK, _ROWS, _COLS = 0, 1, 2, 3, 4, 5, 6
_TSEQ, _TAID, _TR0, _TNR, _TC0, _TNC, _TWORDS = 0, 1, 2, 3, 4, 5, 6
EVENT_WIDTH = 9  # op, array, r0, nr, c0, nc, words, resident after, handle
_EV_RES, _EV_HANDLE = 7, 8

S0 = 24  # the free-slot stack
A0 = S0 + MAX_TILES
T0 = A0 + MAX_ARRAYS * _STRIDE
E0 = T0 + MAX_TILES * _STRIDE

# Event ops, in trace order (and the schedule-error codes).
LOAD, STORE, ALLOC, FREE, INIT = 1, 2, 3, 4, 5
OPS = {LOAD: "load", STORE: "store", ALLOC: "alloc", FREE: "free", INIT: "init"}
E_STALE, E_REGION, E_FULL, E_BUFFER, E_SHAPE, E_FREED = 1, 2, 3, 4, 5, 6
_ERROR_TEXT = {
    E_STALE: "a stale or foreign tile handle (freed twice, stored after its free, or never issued)",
    E_REGION: "a region outside the array or of negative size",
    E_FULL: f"more than {MAX_TILES} tiles resident at once",
    E_BUFFER: "a fast-memory buffer smaller than its tile",
    E_SHAPE: "a store to a region of another shape or outside the target array",
    E_FREED: "a stale handle: its tile was freed (freed twice, or used after its free)",
}


class InputError(ValueError):
    """Bad input from a user: reported by the command line as one line and exit code 2, never a traceback. Defined
    in the lowest layer so that the memory model's own checks raise it too; ``iosim.InputError`` is this class."""

    def __init__(self, parameter: str, accepted: str, got=None, exit_code: int = 2) -> None:
        self.parameter, self.accepted, self.got, self.exit_code = parameter, accepted, got, exit_code
        shown = "" if got is None else f", got {got!r}"
        super().__init__(f"{parameter} {accepted}{shown}")


class CapacityError(RuntimeError):
    """A schedule tried to hold more than M words in fast memory."""

    def __init__(self, array, needed, free, M):  # noqa: N803 - M is the paper's symbol
        self.array, self.needed, self.free, self.M = array, int(needed), int(free), int(M)
        super().__init__(
            f"fast memory capacity exceeded while placing {array!s}: needs {self.needed} words, "
            f"{self.free} of M={self.M} are free"
        )

    def __reduce__(self):
        return (CapacityError, (self.array, self.needed, self.free, self.M))


class ScheduleError(RuntimeError):
    """A schedule broke the memory model's rules (a stale handle, a region outside its array, a leaked tile)."""

    def __init__(self, reason: str, array: str | None = None, region: tuple | None = None) -> None:
        self.reason, self.array, self.region = reason, array, region
        where = ""
        if array is not None:
            where = f" on array {array}"
            if region is not None:
                r0, nr, c0, nc = region
                where += f" region rows [{r0}, {r0 + nr}) x cols [{c0}, {c0 + nc})"
        super().__init__(f"schedule error{where}: {reason}")

    def __reduce__(self):
        return (ScheduleError, (self.reason, self.array, self.region))


# ---------------------------------------------------------------------------------------------------------------
# The @njit helpers: every load, store, alloc and free of every driver goes through these.
# ---------------------------------------------------------------------------------------------------------------


@jitable
def _row(aid):
    """Where array ``aid``'s row of W starts. The mask changes nothing (aid < MAX_ARRAYS always) but shows the
    compiler an index that is never negative, so Numba's negative-index wrap folds away on every counter update."""
    return A0 + (aid & (MAX_ARRAYS - 1)) * _STRIDE


@jitable
def _error(W, code, aid, r0, nr, c0, nc, handle, words):
    if W[_ECODE] == 0:
        W[_ECODE] = code
        W[_EAID] = aid
        W[_ER0] = r0
        W[_ENR] = nr
        W[_EC0] = c0
        W[_ENC] = nc
        W[_EHANDLE] = handle
        W[_EWORDS] = words


@jitable
def _event(W, op, aid, r0, nr, c0, nc, words, handle):
    k = W[_NEV]
    W[_NEV] = k + 1
    if k < W[_TCAP]:
        e = E0 + k * EVENT_WIDTH
        W[e] = op
        W[e + 1] = aid
        W[e + 2] = r0
        W[e + 3] = nr
        W[e + 4] = c0
        W[e + 5] = nc
        W[e + 6] = words
        W[e + _EV_RES] = W[_RES]
        W[e + _EV_HANDLE] = handle


@jitable
def _bad_region(W, aid, r0, nr, c0, nc):
    a = _row(aid)
    return r0 < 0 or nr < 0 or c0 < 0 or nc < 0 or r0 + nr > W[a + _ROWS] or c0 + nc > W[a + _COLS]


@jitable
def _new_peak(W, res):
    W[_PEAK] = res
    fast = W[_FAST] != 0  # a fast memory's tally leaves out the loaded words: they are the reads (see _acquire)
    for a in range(MAX_ARRAYS):  # the composition of fast memory at the peak
        row = A0 + a * _STRIDE
        W[row + _APEAK] = W[row + _ARES] + (W[row + _READS] if fast else 0)


@jitable
def _acquire(W, aid, words, tally):
    """Make ``words`` resident for array ``aid``; record the first overflow; track the peak.

    ``tally``: add them to the array's resident tally. A fast memory's loads do not: every word it loads is also a
    read, so there the tally holds resident minus read words, and a load updates one counter instead of two."""
    res = W[_RES] + words
    W[_RES] = res
    if tally:
        W[_row(aid) + _ARES] += words
    if res > W[_PEAK]:  # a new peak; the first overflow is one too (until then the peak was at most M)
        if res > W[_M] and W[_OVER] == 0:  # record the first overflow; TwoLevelMemory.call raises it
            W[_OVER] = 1
            W[_OV_AID] = aid
            W[_OV_NEED] = words
            W[_OV_FREE] = W[_M] - (res - words)
        _new_peak(W, res)
        if not tally:  # a fast memory's load counts its reads after this: its words join the snapshot here
            W[_row(aid) + _APEAK] += words


@jitable
def _open_fast(W, aid, words, tally):
    _acquire(W, aid, words, tally)
    return _FASTBIT | (aid << 40) | words


@jitable
def _open(W, aid, r0, nr, c0, nc, loaded):
    """Take a free slot for the region, make its words resident, check capacity; return the handle (-1: error)."""
    if W[_FAST] != 0:
        return _open_fast(W, aid, nr * nc, not loaded)
    if _bad_region(W, aid, r0, nr, c0, nc):
        _error(W, E_REGION, aid, r0, nr, c0, nc, -1, nr * nc)
        return -1
    if W[_TOP] == 0:
        _error(W, E_FULL, aid, r0, nr, c0, nc, -1, nr * nc)
        return -1
    W[_TOP] -= 1
    head = W[_HEAD]
    slot = W[S0 + head]
    W[_HEAD] = (head + 1) & (MAX_TILES - 1)
    seq = W[_SEQ] + 1
    W[_SEQ] = seq
    words = nr * nc
    t = T0 + slot * _STRIDE
    W[t + _TSEQ] = seq
    W[t + _TAID] = aid
    W[t + _TR0] = r0
    W[t + _TNR] = nr
    W[t + _TC0] = c0
    W[t + _TNC] = nc
    W[t + _TWORDS] = words
    _acquire(W, aid, words, True)
    return (seq << _SHIFT) | slot


@jitable
def _stale(W, h):
    """Record a stale-handle error, naming the freed tile while the table still remembers it (a freed tile keeps
    its row, its sequence number negated, until its slot is reused: free slots are reused oldest first)."""
    if 0 <= h < _FASTBIT:
        t = T0 + (h & (MAX_TILES - 1)) * _STRIDE
        if W[t + _TSEQ] == -(h >> _SHIFT):
            _error(W, E_FREED, W[t + _TAID], W[t + _TR0], W[t + _TNR], W[t + _TC0], W[t + _TNC], h, W[t + _TWORDS])
            return
    _error(W, E_STALE, -1, 0, 0, 0, 0, h, 0)


@jitable
def _slot(W, h):
    """The tile row of a live handle, or -1 (stale, foreign or freed)."""
    if h < 0:
        return -1
    t = T0 + (h & (MAX_TILES - 1)) * _STRIDE
    if W[t + _TSEQ] != h >> _SHIFT:
        return -1
    return t


# Data movement, resolved by type at compile time: with ``dst`` None (count-only) each is a no-op, so the count-only
# specialisation touches no array, also where an op is inlined into its caller.
def _fits(dst, nr, nc):
    """Whether fast buffer ``dst`` holds an nr x nc tile (always True in count-only mode)."""
    return dst is None or (dst.shape[0] >= nr and (dst.ndim == 1 or dst.shape[1] >= nc))


def _copy_in(src, r0, nr, c0, nc, dst):
    """dst[:nr, :nc] = src[r0:r0+nr, c0:c0+nc] (a vector: dst[:nr] = src[r0:r0+nr])."""
    if dst is None:
        return
    if dst.ndim == 1:
        dst[:nr] = src[r0 : r0 + nr]
    else:
        dst[:nr, :nc] = src[r0 : r0 + nr, c0 : c0 + nc]


def _copy_out(src, nr, nc, dst, r0, c0):
    """dst[r0:r0+nr, c0:c0+nc] = src[:nr, :nc] (a vector: dst[r0:r0+nr] = src[:nr])."""
    if dst is None:
        return
    if dst.ndim == 1:
        dst[r0 : r0 + nr] = src[:nr]
    else:
        dst[r0 : r0 + nr, c0 : c0 + nc] = src[:nr, :nc]


@overload(_fits, jit_options={"cache": True, "_nrt": False})
def _ol_fits(dst, nr, nc):
    if isinstance(dst, types.NoneType):
        return lambda dst, nr, nc: True
    if dst.ndim == 1:
        return lambda dst, nr, nc: dst.shape[0] >= nr
    return lambda dst, nr, nc: dst.shape[0] >= nr and dst.shape[1] >= nc


@overload(_copy_in, jit_options={"cache": True, "_nrt": False})
def _ol_copy_in(src, r0, nr, c0, nc, dst):
    if isinstance(dst, types.NoneType):
        return lambda src, r0, nr, c0, nc, dst: None
    if dst.ndim == 1:

        def copy_vec(src, r0, nr, c0, nc, dst):
            for r in range(nr):
                dst[r] = src[r0 + r]

        return copy_vec

    def copy(src, r0, nr, c0, nc, dst):  # loops, not slices: a slice assignment compiles an error path (seconds)
        for r in range(nr):
            for c in range(nc):
                dst[r, c] = src[r0 + r, c0 + c]

    return copy


@overload(_copy_out, jit_options={"cache": True, "_nrt": False})
def _ol_copy_out(src, nr, nc, dst, r0, c0):
    if isinstance(dst, types.NoneType):
        return lambda src, nr, nc, dst, r0, c0: None
    if dst.ndim == 1:

        def copy_vec(src, nr, nc, dst, r0, c0):
            for r in range(nr):
                dst[r0 + r] = src[r]

        return copy_vec

    def copy(src, nr, nc, dst, r0, c0):
        for r in range(nr):
            for c in range(nc):
                dst[r0 + r, c0 + c] = src[r, c]

    return copy


@jitable
def load(W, aid, src, r0, nr, c0, nc, dst):
    """Load the nr x nc region of slow array ``aid`` (data ``src``) at (r0, c0) into ``dst[:nr, :nc]``.

    Counts nr * nc reads and returns the tile's handle."""
    if not _fits(dst, nr, nc):
        _error(W, E_BUFFER, aid, r0, nr, c0, nc, -1, nr * nc)
        return -1
    h = _open(W, aid, r0, nr, c0, nc, True)
    if h < 0:
        return h
    W[_row(aid) + _READS] += nr * nc
    if W[_TCAP] > 0:
        _event(W, LOAD, aid, r0, nr, c0, nc, nr * nc, h)
    _copy_in(src, r0, nr, c0, nc, dst)
    return h


@jitable
def load_vec(W, aid, src, r0, n, dst):
    """Load ``src[r0:r0+n]`` of vector ``aid`` into ``dst[:n]``; count n reads; return the handle."""
    if not _fits(dst, n, 1):
        _error(W, E_BUFFER, aid, r0, n, 0, 1, -1, n)
        return -1
    h = _open(W, aid, r0, n, 0, 1, True)
    if h < 0:
        return h
    W[_row(aid) + _READS] += n
    if W[_TCAP] > 0:
        _event(W, LOAD, aid, r0, n, 0, 1, n, h)
    _copy_in(src, r0, n, 0, 1, dst)
    return h


@jitable
def alloc(W, aid, r0, nr, c0, nc):
    """Reserve a tile of scratch for the nr x nc region of array ``aid`` at (r0, c0) (no I/O); return its handle."""
    h = _open(W, aid, r0, nr, c0, nc, False)
    if h >= 0 and W[_TCAP] > 0:
        _event(W, ALLOC, aid, r0, nr, c0, nc, nr * nc, h)
    return h


@jitable
def alloc_vec(W, aid, r0, n):
    """Reserve scratch for ``n`` entries of vector ``aid`` from ``r0`` (row statistics m_i, l_i, D_i)."""
    h = _open(W, aid, r0, n, 0, 1, False)
    if h >= 0 and W[_TCAP] > 0:
        _event(W, ALLOC, aid, r0, n, 0, 1, n, h)
    return h


@jitable
def _store(W, t, h, aid, r0, c0, src, dst):
    nr, nc = W[t + _TNR], W[t + _TNC]
    if _bad_region(W, aid, r0, nr, c0, nc):
        _error(W, E_SHAPE, aid, r0, nr, c0, nc, h, nr * nc)
        return
    W[_row(aid) + _WRITES] += nr * nc
    if W[_TCAP] > 0:
        _event(W, STORE, aid, r0, nr, c0, nc, nr * nc, h)
    _copy_out(src, nr, nc, dst, r0, c0)


@jitable
def _live(W, h):
    """The tile row of live handle ``h``, or -1 after recording a stale handle as the schedule's error."""
    t = _slot(W, h)
    if t < 0:
        _stale(W, h)
    return t


@jitable
def store(W, h, src, dst):
    """Store live tile ``h`` (data ``src[:nr, :nc]``, a vector's ``src[:n]``) to its own region of its array (data
    ``dst``)."""
    if h >= _FASTBIT:  # a fast handle (h = -1, a failed op, is not one: it is stale)
        W[_row(h >> 40) + _WRITES] += h & 0xFFFFFFFFFF
        return
    t = _live(W, h)
    if t >= 0:
        _store(W, t, h, W[t + _TAID], W[t + _TR0], W[t + _TC0], src, dst)


store_vec = store  # a vector tile is an n x 1 region: the same operation


@jitable
def store_to(W, h, src, aid, dst, r0, c0):
    """Store live tile ``h`` to the region of the same shape at (r0, c0) of array ``aid`` (P overwriting S on chip,
    written to P)."""
    if h >= _FASTBIT:
        W[_row(aid) + _WRITES] += h & 0xFFFFFFFFFF
        return
    t = _live(W, h)
    if t >= 0:
        _store(W, t, h, aid, r0, c0, src, dst)


@jitable
def free(W, h):
    """Release exactly tile ``h`` (scratch or loaded)."""
    if h >= _FASTBIT:  # a fast handle (h = -1, a failed op, is not one: it is stale)
        words = h & 0xFFFFFFFFFF
        W[_RES] -= words
        W[_row(h >> 40) + _ARES] -= words
        return
    t = _live(W, h)
    if t < 0:
        return
    words, aid = W[t + _TWORDS], W[t + _TAID]
    W[t + _TSEQ] = -W[t + _TSEQ]  # freed: the row stays, to name the tile if its handle is used again
    W[_RES] -= words
    W[_row(aid) + _ARES] -= words
    W[S0 + ((W[_HEAD] + W[_TOP]) & (MAX_TILES - 1))] = h & (MAX_TILES - 1)
    W[_TOP] += 1
    if W[_TCAP] > 0:
        _event(W, FREE, aid, W[t + _TR0], W[t + _TNR], W[t + _TC0], W[t + _TNC], words, h)


@jitable
def init_slow(W, aid, words):
    """Initialise ``words`` of a slow-memory array (e.g. zero O in HBM): counted as writes and as init writes."""
    a = _row(aid)
    W[a + _WRITES] += words
    W[a + _INIT] += words
    if W[_TCAP] > 0:
        _event(W, INIT, aid, 0, W[a + _ROWS], 0, W[a + _COLS], words, -1)


# LLVM's optimisation level for the numeric drivers when they compile. A numeric driver spends its time in the
# arithmetic of its tiles (NumPy's dot, exp) and runs within a few per cent as fast at -O1 as at Numba's default
# -O3, while -O1 compiles about a fifth faster: the first ``iosim compare`` on an empty cache is mostly that
# compilation. The count-only variants, whose cost is the ops themselves, keep -O3. Measured with
# experiments/bench/cpu.py (see its docstring). A user's NUMBA_OPT is left alone.
NUMERIC_OPT_LEVEL = 1


@contextlib.contextmanager
def _numeric_opt_level():
    if "NUMBA_OPT" in os.environ:
        yield
        return
    saved = numba.config.OPT
    numba.config.OPT = type(saved)(NUMERIC_OPT_LEVEL)
    try:
        yield
    finally:
        numba.config.OPT = saved


@njit(cache=True)
def _replay(W, events):
    """Apply a trace's events to a fresh memory (count-only): the handles it issues are the trace's own."""
    for k in range(events.shape[0]):
        op, aid = events[k, 0], events[k, 1]
        r0, nr, c0, nc, h = events[k, 2], events[k, 3], events[k, 4], events[k, 5], events[k, _EV_HANDLE]
        h2 = h
        if op == LOAD:
            h2 = load(W, aid, None, r0, nr, c0, nc, None)
        elif op == ALLOC:
            h2 = alloc(W, aid, r0, nr, c0, nc)
        elif op == STORE:
            store_to(W, h, None, aid, None, r0, c0)
        elif op == FREE:
            free(W, h)
        else:
            init_slow(W, aid, events[k, 6])
        if h2 != h or W[_ECODE] != 0:
            return k
    return -1


# ---------------------------------------------------------------------------------------------------------------
# The Python side: the memory object, its statistics and its trace.
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArrayCounts:
    """Words moved for one named slow-memory array."""

    reads: int = 0
    writes: int = 0
    init_writes: int = 0


class Tally:
    """Totals derived from a per-array tally; shared by measured :class:`Stats` and predicted counts."""

    per_array: dict[str, ArrayCounts]

    @property
    def reads(self) -> int:
        return sum(c.reads for c in self.per_array.values())

    @property
    def writes(self) -> int:
        return sum(c.writes for c in self.per_array.values())

    @property
    def total(self) -> int:
        return self.reads + self.writes

    @property
    def init_writes(self) -> int:
        return sum(c.init_writes for c in self.per_array.values())


@dataclass(frozen=True)
class Stats(Tally):
    """The counters of one run: the per-array tally (reads, writes, total derive from it), peak fast memory and
    what fast memory held at the peak (words per array)."""

    M: int
    peak: int
    overflowed: bool
    per_array: dict[str, ArrayCounts] = field(default_factory=dict)
    at_peak: dict[str, int] = field(default_factory=dict, compare=False)

    def __add__(self, other: Stats) -> Stats:
        names = list(dict.fromkeys([*self.per_array, *other.per_array]))
        zero = ArrayCounts()
        per = {
            n: ArrayCounts(
                self.per_array.get(n, zero).reads + other.per_array.get(n, zero).reads,
                self.per_array.get(n, zero).writes + other.per_array.get(n, zero).writes,
                self.per_array.get(n, zero).init_writes + other.per_array.get(n, zero).init_writes,
            )
            for n in names
        }
        return Stats(
            M=self.M,
            peak=max(self.peak, other.peak),
            overflowed=self.overflowed or other.overflowed,
            per_array=per,
            at_peak=self.at_peak if self.peak >= other.peak else other.at_peak,
        )


@dataclass(frozen=True)
class Tile:
    """A resident tile as the model records it: the array and the region ``[r0, r0+nr) x [c0, c0+nc)``."""

    handle: int
    array: str
    r0: int
    nr: int
    c0: int
    nc: int

    @property
    def words(self) -> int:
        return self.nr * self.nc


TRACE_COLUMNS = ("op", "array", "r0", "nr", "c0", "nc", "words", "resident", "handle")


class Trace:
    """The events of one run, in order: op (load, store, alloc, free, init), array, region, words, the resident
    words after the event, and the tile handle. ``events`` is an int64 array with one row per event."""

    def __init__(self, events: np.ndarray, names: list[str], shapes: dict[str, tuple[int, int]], M: int) -> None:
        self.events, self.names, self.shapes, self.M = events, list(names), dict(shapes), int(M)

    def __len__(self) -> int:
        return int(self.events.shape[0])

    def records(self):
        """The events as dicts (op and array by name)."""
        for row in self.events:
            yield {
                "op": OPS[int(row[0])],
                "array": self.names[int(row[1])],
                **{k: int(v) for k, v in zip(TRACE_COLUMNS[2:], row[2:9], strict=True)},
            }

    def replay(self, M: int | None = None, strict: bool = False) -> Stats:
        """Run the events through a fresh memory of M words (the trace's own M by default): its Stats."""
        mem = TwoLevelMemory(self.M if M is None else M, strict=strict)
        for name in self.names:
            mem.array_id(name, self.shapes[name])
        k = _replay(mem.W, np.ascontiguousarray(self.events))
        if k >= 0:
            raise ScheduleError(f"replay diverged at event {k}: the trace is not from a run of this model")
        mem.check()
        return mem.stats()


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def _cgroup_available() -> int | None:
    """What the process's cgroup still allows (cgroup v2 memory.max - memory.current; v1 limit - usage), or None."""
    try:
        with open("/proc/self/cgroup") as f:
            paths = [line.strip().split(":", 2)[2] for line in f if line.strip()]
    except (OSError, IndexError):
        return None
    candidates = [(f"/sys/fs/cgroup{q}/memory.max", f"/sys/fs/cgroup{q}/memory.current") for q in paths]
    candidates.append(("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))
    for limit_file, usage_file in candidates:
        try:
            with open(limit_file) as f:
                limit = f.read().strip()
            with open(usage_file) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:  # "max" (v2) or a huge number (v1): no limit
            return max(int(limit) - usage, 0)
    return None


def _address_space_available() -> int | None:
    """What ``ulimit -v`` (RLIMIT_AS) still allows this process to map, or None without a limit."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY:
            return None
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        return max(soft - mapped, 0)
    except (ImportError, OSError, ValueError, AttributeError):
        return None


def available_bytes() -> int:
    """The memory a new allocation can still take now: the least of the physical memory available (Linux:
    MemAvailable), what the process's cgroup memory limit leaves, and what ``ulimit -v`` leaves of its address
    space; all physical memory where none is known. What the up-front memory refusals (a trace's buffer here; a
    mask's table, a check's arrays: iosim.runner.estimate) compare with."""
    known = [x for x in (_meminfo_available(), _cgroup_available(), _address_space_available()) if x is not None]
    if known:
        return min(known)
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


class TraceTooLargeError(MemoryError):
    """A trace whose event buffer (and the Trace's copy of it) would take over half the memory available: raised
    before the buffer is allocated (``iosim.run`` reports it as an InputError on ``trace``)."""

    def __init__(self, events: int, need: int, have: int) -> None:
        self.events, self.need, self.have = events, need, have
        super().__init__(
            f"needs about {need / 2**30:.1f} GiB for its {events:,} events ({have / 2**30:.1f} GiB available now): "
            "trace a smaller problem or larger tiles, or count without a trace"
        )


def _check_trace_memory(events: int) -> None:
    need, have = 2 * events * EVENT_WIDTH * 8, available_bytes()
    if need > have // 2:
        raise TraceTooLargeError(events, need, have)


class TwoLevelMemory:
    """Fast memory of ``M`` words in front of an unbounded slow memory; counts every transfer and knows which
    tiles are resident.

    >>> import numpy as np
    >>> mem = TwoLevelMemory(100)
    >>> q = mem.array_id("Q", (4, 4))
    >>> src, dst = np.ones((4, 4)), np.zeros((2, 4))
    >>> h = load(mem.W, q, src, 0, 2, 0, 4, dst)
    >>> [t.array for t in mem.resident_tiles()], mem.resident
    (['Q'], 8)
    >>> free(mem.W, h)
    >>> mem.stats().reads, mem.stats().peak
    (8, 8)
    """

    def __init__(  # noqa: N803
        self, M: int, strict: bool = True, trace: bool = False, fast: bool = False, trace_capacity: int = 1 << 16
    ) -> None:
        # ValueError (iosim.InputError is one): the memory model imports nothing of iosim
        if isinstance(M, bool) or not isinstance(M, (int, np.integer)) or not 0 < M <= MAX_M:
            raise ValueError(f"M (fast-memory capacity in words) must be an integer from 1 to {MAX_M:,}, got {M!r}")
        for name, flag in (("strict", strict), ("trace", trace), ("fast", fast)):
            if not isinstance(flag, (bool, np.bool_)):
                raise ValueError(f"{name} must be True or False, got {flag!r}")
        self.M = int(M)
        self.strict = bool(strict)
        self.tracing = bool(trace)
        self.fast = bool(fast) and not self.tracing  # a trace needs the tile table
        self.names: list[str] = []
        self.shapes: dict[str, tuple[int, int]] = {}
        self._reset(trace_capacity if trace else 0)

    def _reset(self, trace_capacity: int) -> None:
        self.W = W = np.zeros(E0 + trace_capacity * EVENT_WIDTH, dtype=np.int64)
        self._arrays = W[A0:T0].reshape(MAX_ARRAYS, _STRIDE)  # views of the flat state, for reading it here
        self._tiles = W[T0:E0].reshape(MAX_TILES, _STRIDE)
        W[_M] = self.M
        W[_STRICT] = int(self.strict)
        W[_TCAP] = trace_capacity
        W[_TOP] = MAX_TILES
        W[_FAST] = int(self.fast)
        W[S0 : S0 + MAX_TILES] = np.arange(MAX_TILES)  # the ring of free slots, slot 0 first
        for i, name in enumerate(self.names):
            self._arrays[i, _ROWS], self._arrays[i, _COLS] = self.shapes[name]

    def array_id(self, name: str, shape: tuple[int, ...]) -> int:
        """Register slow array ``name`` of ``shape`` ((rows, cols), or (n,) for a vector); its integer id."""
        if len(shape) == 1:
            shape = (shape[0], 1)
        if len(shape) != 2 or any(int(s) < 0 for s in shape):
            raise ValueError(f"array {name}: shape must be (rows, cols) or (n,), got {shape!r}")
        shape = (int(shape[0]), int(shape[1]))
        if name in self.shapes and self.shapes[name] != shape:
            raise ValueError(f"array {name} is registered with shape {self.shapes[name]}, not {shape}")
        if name not in self.names:
            if len(self.names) >= MAX_ARRAYS:
                raise ValueError(f"at most {MAX_ARRAYS} named arrays per memory")
            self.names.append(name)
            self.shapes[name] = shape
        i = self.names.index(name)
        self._arrays[i, _ROWS], self._arrays[i, _COLS] = shape
        return i

    def ids(self, **shapes: tuple[int, ...]) -> tuple[int, ...]:
        """Register several arrays by keyword (``Q=(N, d), l=(N,)``); their ids in that order."""
        return tuple(self.array_id(n, s) for n, s in shapes.items())

    def call(self, driver, *args):
        """Run an @njit driver on this memory, then raise the first schedule error or leaked tile, and in strict
        mode the first overflow (:class:`CapacityError`). With tracing, a trace that outgrew its buffer is rerun
        once with a buffer of the exact size (the driver is deterministic).

        A count-only call (no data array among ``args``: integer arrays are descriptors, such as a mask's
        parameters and table, not data) runs the driver's count-only variant (:func:`count_only_variant`): the
        same loop nest without Numba's runtime, checked or, on a fast memory, counters only and inlined."""
        numeric = any(isinstance(a, np.ndarray) and a.dtype.kind not in "iub" for a in args)
        if not numeric:
            driver = count_only_variant(driver, self.fast)
        with _numeric_opt_level() if numeric else contextlib.nullcontext():
            out = driver(self.W, *args)
        if self.tracing and self.W[_NEV] > self.W[_TCAP]:
            _check_trace_memory(int(self.W[_NEV]))
            self._reset(int(self.W[_NEV]))
            out = driver(self.W, *args)
        self.check()
        return out

    def check(self) -> None:
        """Raise what the schedule did wrong: a schedule error, tiles left resident, or (strict) an overflow."""
        err = self.schedule_error()
        if err is not None:
            raise err
        if self.fast and self.W[_RES] != 0:
            raise ScheduleError(f"{self.W[_RES]} words left resident when the schedule ended; free every tile")
        if self.W[_TOP] != MAX_TILES:
            live = self.resident_tiles()
            shown = ", ".join(f"{t.array}[{t.r0}:{t.r0 + t.nr}, {t.c0}:{t.c0 + t.nc}]" for t in live[:4])
            raise ScheduleError(
                f"{len(live)} tile(s) left resident when the schedule ended ({shown}{', ...' if len(live) > 4 else ''})"
                "; free every tile",
                live[0].array,
                (live[0].r0, live[0].nr, live[0].c0, live[0].nc),
            )
        if self.strict and self.overflowed:
            raise self.overflow_error()

    def schedule_error(self) -> ScheduleError | None:
        """The first schedule error recorded by the helpers (None if there was none)."""
        code = int(self.W[_ECODE])
        if code == 0:
            return None
        aid, r0, nr, c0, nc, h = (int(x) for x in self.W[_EAID : _EHANDLE + 1])
        reason = _ERROR_TEXT[code]
        if aid < 0:
            return ScheduleError(f"{reason}: handle {h}")
        name = self.names[aid]
        if code == E_REGION or code == E_SHAPE:
            reason += f" (array {name} has shape {self.shapes[name][0]} x {self.shapes[name][1]})"
        return ScheduleError(reason, name, (r0, nr, c0, nc))

    def overflow_error(self) -> CapacityError | None:
        """The CapacityError describing the first overflow (None if the schedule always fitted)."""
        if not self.overflowed:
            return None
        aid, need, free_ = (int(x) for x in self.W[_OV_AID : _OV_FREE + 1])
        return CapacityError(self.names[aid], need, free_, self.M)

    @property
    def resident(self) -> int:
        return int(self.W[_RES])

    @property
    def peak(self) -> int:
        return int(self.W[_PEAK])

    @property
    def overflowed(self) -> bool:
        return bool(self.W[_OVER])

    def resident_tiles(self) -> list[Tile]:
        """The tiles in fast memory now, oldest first."""
        T = self._tiles
        slots = sorted((s for s in range(MAX_TILES) if T[s, _TSEQ] > 0), key=lambda s: T[s, _TSEQ])
        return [
            Tile(
                (int(T[s, _TSEQ]) << _SHIFT) | s,
                self.names[int(T[s, _TAID])],
                *(int(x) for x in T[s, _TR0 : _TNC + 1]),
            )
            for s in slots
        ]

    def resident_by_array(self) -> dict[str, int]:
        """Resident words per array now."""
        tally = self._arrays[:, _ARES] + (self._arrays[:, _READS] if self.fast else 0)  # see _acquire
        return {n: int(tally[i]) for i, n in enumerate(self.names) if tally[i]}

    def trace(self) -> Trace | None:
        """The events recorded so far (None unless the memory was made with ``trace=True``)."""
        if not self.tracing:
            return None
        n = min(int(self.W[_NEV]), int(self.W[_TCAP]))
        events = self.W[E0 : E0 + n * EVENT_WIDTH].reshape(n, EVENT_WIDTH).copy()
        return Trace(events, self.names, self.shapes, self.M)

    def stats(self) -> Stats:
        per = {
            n: ArrayCounts(*(int(x) for x in self._arrays[i, :3]))
            for i, n in enumerate(self.names)
            if self._arrays[i, :3].any()
        }
        at_peak = {n: int(self._arrays[i, _APEAK]) for i, n in enumerate(self.names) if self._arrays[i, _APEAK]}
        return Stats(M=self.M, peak=self.peak, overflowed=self.overflowed, per_array=per, at_peak=at_peak)


# ---------------------------------------------------------------------------------------------------------------
# Count-only variants: the same driver source, compiled without Numba's runtime.
# ---------------------------------------------------------------------------------------------------------------
# A count-only run moves no data, so its specialisation allocates nothing and needs no reference counting: it is
# compiled with ``_nrt=False``. On a fast memory (counters only: the built-in algorithms' count-only runs) the
# counters-only ops are also inlined (``inline="always"``), so LLVM keeps the counters in registers and a transfer
# costs a few nanoseconds instead of a call. The checked variant (a traced or user-written count-only run, and the
# tests that compare the two) calls the checked ops: inlining their tile-table logic at every call site of a
# backward driver cost minutes of compile time (square tiling's backward alone took 96 s) for a 2.5x faster
# checked run that nothing needs at scale.
# The variant is built from the driver's own code object with its globals pointing at the chosen ops (and at
# variants of any helper driver it calls), so it is the same schedule, not a second copy of it.

_OPS = ("load", "load_vec", "alloc", "alloc_vec", "store", "store_to", "free", "init_slow")  # store_vec is store
_INLINED: dict = {}
_COLD = {"_new_peak"}  # rare: a call, not a copy of its loop at every op


def _inlined(fn):
    """An ``inline="always"`` @njit copy of one of this module's jitable functions whose calls to the others go to
    their inlined copies too (the same source: only the globals differ)."""
    import types as pytypes

    if fn in _INLINED:
        return _INLINED[fn]
    g = dict(fn.__globals__)
    for name in fn.__code__.co_names:
        if name in _JITABLE and _JITABLE[name] is not fn and name not in _COLD:
            g[name] = _inlined(_JITABLE[name])
    copy_fn = pytypes.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)
    copy_fn.__qualname__ = fn.__qualname__ + "__inlined"
    copy_fn.__module__ = fn.__module__
    _INLINED[fn] = copy = njit(cache=True, inline="always", _nrt=False)(copy_fn)
    return copy


# The counters-only ops of a fast memory (TwoLevelMemory(fast=True)): what a checked op counts, without the tile
# table. A fast handle packs the array and the words, so a free releases exactly the words of its tile. A load
# counts its words once, as reads: a fast memory's per-array resident tally holds resident minus read words
# (:func:`_acquire`), which :meth:`TwoLevelMemory.resident_by_array` and the peak's composition add back.
def _fast_load(W, aid, src, r0, nr, c0, nc, dst):
    h = _open_fast(W, aid, nr * nc, False)
    W[_row(aid) + _READS] += nr * nc
    return h


def _fast_load_vec(W, aid, src, r0, n, dst):
    h = _open_fast(W, aid, n, False)
    W[_row(aid) + _READS] += n
    return h


def _fast_alloc(W, aid, r0, nr, c0, nc):
    return _open_fast(W, aid, nr * nc, True)


def _fast_alloc_vec(W, aid, r0, n):
    return _open_fast(W, aid, n, True)


def _fast_store(W, h, src, dst):
    W[_row(h >> 40) + _WRITES] += h & 0xFFFFFFFFFF


def _fast_store_to(W, h, src, aid, dst, r0, c0):
    W[_row(aid) + _WRITES] += h & 0xFFFFFFFFFF


def _fast_free(W, h):
    words = h & 0xFFFFFFFFFF
    W[_RES] -= words
    W[_row(h >> 40) + _ARES] -= words


_FAST_OPS = {
    "load": _fast_load,
    "load_vec": _fast_load_vec,
    "alloc": _fast_alloc,
    "alloc_vec": _fast_alloc_vec,
    "store": _fast_store,
    "store_to": _fast_store_to,
    "free": _fast_free,
    "init_slow": init_slow,
}
_FAST_OPS = {k: _inlined(jitable(f)) for k, f in _FAST_OPS.items()}
_VARIANTS: dict = {}


def count_only_variant(driver, fast: bool = False):
    """The count-only variant of an @njit driver or jitable helper (see above), with the checked ops or, ``fast``,
    the counters-only ops of a fast memory; cached per driver."""
    import types as pytypes

    key = (driver, fast)
    if key in _VARIANTS:
        return _VARIANTS[key]
    py = getattr(driver, "py_func", driver)
    g = dict(py.__globals__)
    for name in py.__code__.co_names:
        value = g.get(name)
        op = next((op for op in _OPS if value is _JITABLE[op]), None)
        if op is not None:
            if fast:  # the checked variant keeps the model's own ops
                g[name] = _FAST_OPS[op]
        elif value is not driver and _is_driver(value) and _calls_ops(value):
            g[name] = count_only_variant(value, fast)
    fn = pytypes.FunctionType(py.__code__, g, py.__name__, py.__defaults__, py.__closure__)
    fn.__qualname__ = py.__qualname__ + ("__fast" if fast else "__count_only")
    fn.__module__ = py.__module__
    inline = getattr(driver, "targetoptions", {}).get("inline", "never")  # a helper inlined into its drivers stays so
    variant = njit(cache=True, _nrt=False, inline=inline)(fn)
    _VARIANTS[key] = variant
    return variant


def _is_driver(value) -> bool:
    from numba.core.registry import CPUDispatcher

    return isinstance(value, CPUDispatcher) or (value in _JITABLE_FUNCS and value.__module__ != __name__)


def _calls_ops(fn, seen=None) -> bool:
    seen = set() if seen is None else seen
    py = getattr(fn, "py_func", fn)
    if py in seen:
        return False
    seen.add(py)
    g = py.__globals__
    for name in py.__code__.co_names:
        value = g.get(name)
        if any(value is _JITABLE[op] for op in _OPS):
            return True
        if _is_driver(value) and _calls_ops(value, seen):
            return True
    return False

"""The two-level memory: state, counters, capacity.

Conventions (every exact count in iosim follows them; iosim.io_model derives its closed forms from them)
------------------------------------------------------------------------------------------------------
* **Word.** One word is one matrix entry, whatever its dtype. *Reads* are words moved slow -> fast, *writes* are
  words moved fast -> slow. There is no line or block size: every word is one I/O.
* **Fast memory holds at most M words.** Everything resident counts toward M: input tiles (Q_i, K_j, V_j, ...),
  output accumulators (O_i, dK_j, ...), the score tile S_ij / P_ij and loaded row statistics (m_i, l_i, L_i, D_i).
  Loop indices and per-row scalars that live only inside one row's arithmetic do not count.
* A **load** copies a tile slow -> fast: it counts its words as reads of that array and makes them resident.
  A **store** copies resident words fast -> slow: it counts writes and leaves residency unchanged.
  **alloc** / **free** reserve and release scratch in fast memory (a free also evicts loaded tiles).
  Counting happens once per tile transfer, never per element.
* **Placing the inputs in slow memory is free.** Initialising a slow-memory array (FlashAttention 1 zeroes O, l and
  m in HBM) counts as writes, as a GPU memset writes HBM; those writes are also tallied per array in the
  ``init_writes`` column so a reader can subtract them.
* **Arithmetic on resident data is free**; recomputation is allowed.
* **Capacity.** With ``strict=True`` a transfer that would make more than M words resident raises
  :class:`CapacityError` naming the array, the words needed, the words free and M. With ``strict=False`` the
  overflow is recorded (``peak > M``, ``overflowed``) and the schedule runs on, to show a schedule that does not fit.

Implementation
--------------
All state lives in one small int64 array ``W`` owned by :class:`TwoLevelMemory` (row 0: resident, peak, M, strict;
row 1: overflowed, array, needed, free at the first overflow; rows 2.. : per-array reads, writes, init writes).
The module-level ``@njit(cache=True)`` helpers take that array, so algorithm drivers written in Numba count every
transfer at tile granularity, and Numba's on-disk cache works (no jitclass, no closures).
Count-only mode passes ``None`` for every data array: the helpers count exactly as before and copy nothing
(``if dst is not None`` is pruned at compile time, so a count-only specialisation touches no array and costs about
half a nanosecond per transfer), and the same loop nest yields the same counts without data.
The helpers never raise (an exception path inside them slows every call): the first overflow is recorded in ``W``
and :meth:`TwoLevelMemory.call` raises :class:`CapacityError` for it when the driver returns, in strict mode.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numba import njit

MAX_ARRAYS = 64
_RES, _PEAK, _M, _STRICT = 0, 1, 2, 3  # row 0
_OVER, _ERR_AID, _ERR_NEED, _ERR_FREE = 0, 1, 2, 3  # row 1
_READS, _WRITES, _INIT = 0, 1, 2  # rows 2..


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


@njit(cache=True)
def _acquire(W, aid, words):
    res = W[0, _RES] + words
    if res > W[0, _M] and W[1, _OVER] == 0:  # record the first overflow; TwoLevelMemory.call raises it
        W[1, _OVER] = 1
        W[1, _ERR_AID] = aid
        W[1, _ERR_NEED] = words
        W[1, _ERR_FREE] = W[0, _M] - W[0, _RES]
    W[0, _RES] = res
    if res > W[0, _PEAK]:
        W[0, _PEAK] = res


@njit(cache=True)
def load(W, aid, src, r0, nr, c0, nc, dst):
    """Load the nr x nc tile of slow array ``src`` at (r0, c0) into ``dst[:nr, :nc]``; count nr*nc reads."""
    words = nr * nc
    _acquire(W, aid, words)
    W[2 + aid, _READS] += words
    if dst is not None:
        dst[:nr, :nc] = src[r0 : r0 + nr, c0 : c0 + nc]


@njit(cache=True)
def load_vec(W, aid, src, r0, n, dst):
    """Load ``src[r0:r0+n]`` into ``dst[:n]``; count n reads."""
    _acquire(W, aid, n)
    W[2 + aid, _READS] += n
    if dst is not None:
        dst[:n] = src[r0 : r0 + n]


@njit(cache=True)
def store(W, aid, src, dst, r0, nr, c0, nc):
    """Store resident ``src[:nr, :nc]`` to slow array ``dst`` at (r0, c0); count nr*nc writes."""
    W[2 + aid, _WRITES] += nr * nc
    if dst is not None:
        dst[r0 : r0 + nr, c0 : c0 + nc] = src[:nr, :nc]


@njit(cache=True)
def store_vec(W, aid, src, dst, r0, n):
    """Store resident ``src[:n]`` to ``dst[r0:r0+n]``; count n writes."""
    W[2 + aid, _WRITES] += n
    if dst is not None:
        dst[r0 : r0 + n] = src[:n]


@njit(cache=True)
def alloc(W, aid, words):
    """Reserve ``words`` of scratch in fast memory for array ``aid`` (no I/O)."""
    _acquire(W, aid, words)


@njit(cache=True)
def free(W, words):
    """Release ``words`` of fast memory (scratch or loaded tiles)."""
    W[0, _RES] -= words


@njit(cache=True)
def init_slow(W, aid, words):
    """Initialise ``words`` of a slow-memory array (e.g. zero O in HBM): counted as writes and as init writes."""
    W[2 + aid, _WRITES] += words
    W[2 + aid, _INIT] += words


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
    """The counters of one run: the per-array tally (reads, writes, total derive from it) and peak fast memory."""

    M: int
    peak: int
    overflowed: bool
    per_array: dict[str, ArrayCounts] = field(default_factory=dict)

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
        )


class TwoLevelMemory:
    """Fast memory of ``M`` words in front of an unbounded slow memory; counts every transfer.

    >>> mem = TwoLevelMemory(100)
    >>> q = mem.array_id("Q")
    >>> import numpy as np
    >>> src, dst = np.ones((4, 4)), np.zeros((2, 4))
    >>> load(mem.W, q, src, 0, 2, 0, 4, dst); free(mem.W, 8)
    >>> mem.stats().reads, mem.stats().peak
    (8, 8)
    """

    def __init__(self, M: int, strict: bool = True) -> None:  # noqa: N803
        if isinstance(M, bool) or not isinstance(M, (int, np.integer)) or M <= 0:
            raise ValueError(f"M (fast-memory capacity in words) must be a positive integer, got {M!r}")
        self.M = int(M)
        self.strict = bool(strict)
        self.W = np.zeros((2 + MAX_ARRAYS, 4), dtype=np.int64)
        self.W[0, _M] = self.M
        self.W[0, _STRICT] = int(self.strict)
        self.names: list[str] = []

    def array_id(self, name: str) -> int:
        """The integer id of a named array (registered on first use), for the @njit helpers."""
        if name not in self.names:
            if len(self.names) >= MAX_ARRAYS:
                raise ValueError(f"at most {MAX_ARRAYS} named arrays per memory")
            self.names.append(name)
        return self.names.index(name)

    def ids(self, *names: str) -> tuple[int, ...]:
        return tuple(self.array_id(n) for n in names)

    def call(self, driver, *args):
        """Run an @njit driver on this memory; in strict mode, raise CapacityError for its first overflow."""
        out = driver(self.W, *args)
        if self.strict and self.overflowed:
            raise self.overflow_error()
        return out

    def overflow_error(self) -> CapacityError | None:
        """The CapacityError describing the first overflow (None if the schedule always fitted)."""
        if not self.overflowed:
            return None
        aid, need, free_ = (int(x) for x in self.W[1, 1:4])
        return CapacityError(self.names[aid], need, free_, self.M)

    @property
    def resident(self) -> int:
        return int(self.W[0, _RES])

    @property
    def peak(self) -> int:
        return int(self.W[0, _PEAK])

    @property
    def overflowed(self) -> bool:
        return bool(self.W[1, _OVER])

    def stats(self) -> Stats:
        per = {
            n: ArrayCounts(*(int(x) for x in self.W[2 + i, :3]))
            for i, n in enumerate(self.names)
            if self.W[2 + i, :3].any()
        }
        return Stats(
            M=self.M,
            peak=self.peak,
            overflowed=self.overflowed,
            per_array=per,
        )

"""Write a schedule in plain Python: the two-level memory model without Numba bookkeeping.

A :class:`Memory` wraps a :class:`~iosim.memory_model.core.TwoLevelMemory` and calls the *same* ``@njit`` operations
on its state array ``W`` that the Numba-compiled drivers call, so counts, capacity, tile handles, residency and the
event trace are identical to the word; only the copying of tile data is done here, with NumPy. Every operation is
checked as it happens: a schedule error or (strict mode) a capacity overflow raises at once, naming the array and
the region, and :meth:`Memory.finish` (or leaving a ``with`` block) raises if tiles are still resident.

Regions are half-open ranges, ``rows=(r0, r1)`` and ``cols=(c0, c1)``; a missing range means the whole dimension.
Vectors (1-D arrays: row statistics l, m, L) take ``rows`` only.

>>> import numpy as np
>>> mem = Memory(M=64)
>>> A = mem.slow("A", np.arange(12.0).reshape(3, 4))
>>> C = mem.slow("C", shape=(3, 4))  # an output: filled with NaN so an unwritten entry shows
>>> A_0 = mem.load(A, rows=(0, 2))  # a 2 x 4 tile: 8 reads
>>> C_0 = mem.alloc(C, rows=(0, 2))  # zeroed scratch for the same region of C: no I/O
>>> C_0.data[:] = 2 * A_0.data
>>> mem.store(C_0)  # 8 writes
>>> mem.resident_by_array()
{'A': 8, 'C': 8}
>>> mem.free(A_0, C_0)
>>> s = mem.finish()  # raises if a tile was left resident
>>> s.reads, s.writes, s.peak, float(C.data[1, 3])
(8, 8, 16, 14.0)

A schedule that runs as an iosim algorithm receives a ``TwoLevelMemory`` and wraps it:
``mem = Memory.wrap(mem, count_only=Q is None, dtype=dtype)``; in count-only mode every slow array and tile has
``data`` None and the schedule skips its arithmetic (the same loop nest, counted exactly). See docs/tutorial.md.
"""

from __future__ import annotations

import numbers

import numpy as np
from iosim.memory_model import core
from iosim.memory_model.core import InputError, ScheduleError, Stats, Tile, Trace, TwoLevelMemory

__all__ = ["FastTile", "Memory", "SlowArray"]


class SlowArray:
    """An array in slow memory: its ``name``, ``shape`` ((rows, cols), or (n,) for a vector) and ``data`` (the
    NumPy array itself, or None in count-only mode). Made by :meth:`Memory.slow`."""

    def __init__(self, memory: Memory, name: str, aid: int, shape: tuple[int, ...], data: np.ndarray | None):
        self.memory, self.name, self.id, self.shape, self.data = memory, name, aid, shape, data

    @property
    def is_vector(self) -> bool:
        return len(self.shape) == 1

    def __repr__(self) -> str:
        return f"SlowArray({self.name!r}, shape={self.shape})"


class FastTile:
    """A tile resident in fast memory: the region ``rows`` x ``cols`` of slow array ``array``, its model ``handle``
    and ``data``, the fast copy (a NumPy array of the region's shape, 1-D for a vector; None in count-only mode).

    Compute on ``data`` in place (``S_ij.data[:] = Q_i.data @ K_j.data.T``); assigning ``tile.data = x`` also writes
    into the fast copy, so its shape never changes. A freed tile is dead: using it again is a schedule error."""

    def __init__(self, memory: Memory, array: SlowArray, handle: int, rows, cols, data: np.ndarray | None):
        self.memory, self.array, self.handle, self.rows, self.cols = memory, array, handle, rows, cols
        self._data = data
        self.live = True

    @property
    def data(self) -> np.ndarray | None:
        return self._data

    @data.setter
    def data(self, value) -> None:
        if self._data is None:
            raise ValueError(f"tile {self}: a count-only run has no data to write")
        if value is not self._data:
            shape = np.shape(value)
            if shape not in ((), self._data.shape):
                raise InputError(
                    f"{self.array.name} tile data",
                    f"must have the tile's shape {self._data.shape} (or be a number)",
                    f"shape {shape}",
                )
            self._data[...] = value

    @property
    def region(self) -> tuple[int, int, int, int]:
        """``(r0, nr, c0, nc)``, as :class:`ScheduleError` and the trace give a region."""
        return self.rows[0], self.rows[1] - self.rows[0], self.cols[0], self.cols[1] - self.cols[0]

    @property
    def shape(self) -> tuple[int, ...]:
        nr, nc = self.rows[1] - self.rows[0], self.cols[1] - self.cols[0]
        return (nr,) if self.array.is_vector else (nr, nc)

    @property
    def words(self) -> int:
        return (self.rows[1] - self.rows[0]) * (self.cols[1] - self.cols[0])

    def __repr__(self) -> str:
        state = "" if self.live else ", freed"
        return f"FastTile({_label(self.array, self.rows, self.cols)}{state})"


def _label(array: SlowArray, rows, cols) -> str:
    if array.is_vector:
        return f"{array.name}[{rows[0]}:{rows[1]}]"
    return f"{array.name}[{rows[0]}:{rows[1]}, {cols[0]}:{cols[1]}]"


def _range(what: str, value, size: int) -> tuple[int, int]:
    """A half-open range (start, stop) of integers; None is the whole dimension ``(0, size)``."""
    if value is None:
        return 0, size
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"{what} must be a pair (start, stop) of integers, got {value!r}")
    if not all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in value):
        raise ValueError(f"{what} must be a pair (start, stop) of integers, got {value!r}")
    return int(value[0]), int(value[1])


class Memory:
    """A two-level memory for schedules written in plain Python: fast memory of ``M`` words, slow memory unbounded.

    ``strict``: raise :class:`CapacityError` when more than M words would be resident (else record it: ``peak > M``).
    ``trace``: record every event (:meth:`trace`). ``fast``: counters only, no tile table (see TwoLevelMemory).
    ``count_only``: no data anywhere (outputs and tiles have ``data`` None): the same schedule, counted.
    ``dtype``: the dtype of slow arrays and tiles (inputs are converted to it).

    An error is raised by the operation that caused it and stays recorded in the model (a later operation or
    :meth:`finish` raises it again): after an error, start a new Memory.
    """

    def __init__(
        self,
        M: int,
        *,
        strict: bool = True,
        trace: bool = False,
        fast: bool = False,
        count_only: bool = False,
        dtype=np.float64,
    ) -> None:
        self._init(TwoLevelMemory(M, strict=strict, trace=trace, fast=fast), count_only, dtype)

    @classmethod
    def wrap(cls, model: TwoLevelMemory, *, count_only: bool = False, dtype=np.float64) -> Memory:
        """A Memory over an existing :class:`TwoLevelMemory` (the ``mem`` an iosim algorithm's forward receives):
        its counters, capacity, strictness and trace are the ones used."""
        if not isinstance(model, TwoLevelMemory):
            raise ValueError(f"Memory.wrap needs a TwoLevelMemory, got {type(model).__name__}")
        self = cls.__new__(cls)
        self._init(model, count_only, dtype)
        return self

    def _init(self, model: TwoLevelMemory, count_only: bool, dtype) -> None:
        if not isinstance(count_only, (bool, np.bool_)):
            raise ValueError(f"count_only must be True or False, got {count_only!r}")
        self.model = model
        self.count_only = bool(count_only)
        self.dtype = np.dtype(dtype)
        self.arrays: dict[str, SlowArray] = {}

    @property
    def M(self) -> int:
        return self.model.M

    # -- slow memory -------------------------------------------------------------------------------------------
    def slow(self, name: str, data=None, *, shape: tuple[int, ...] | None = None) -> SlowArray:
        """Place an array in slow memory (free of I/O) and return it.

        ``data``: an input (used as is, converted to the memory's dtype if needed; None in count-only mode, then
        ``shape`` says its shape). Without ``data``: an output of ``shape``, filled with NaN so an unwritten entry
        shows (no data in count-only mode)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a slow array needs a non-empty name, got {name!r}")
        if name in self.arrays:
            raise ValueError(f"slow array {name} is already placed in this memory")
        if data is not None and not self.count_only:
            data = np.ascontiguousarray(data, dtype=self.dtype)
            if shape is not None and tuple(shape) != data.shape:
                raise ValueError(f"slow array {name}: data has shape {data.shape}, not {tuple(shape)}")
            shape = data.shape
        elif shape is None:
            if data is None:
                raise ValueError(f"slow array {name}: give its data or its shape")
            shape = np.shape(data)
        if isinstance(shape, numbers.Integral):
            shape = (shape,)
        if (
            not isinstance(shape, (tuple, list))
            or len(shape) not in (1, 2)
            or not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) and s >= 0 for s in shape)
        ):
            raise ValueError(f"slow array {name}: shape must be (rows, cols) or (n,) of integers >= 0, got {shape!r}")
        shape = tuple(int(s) for s in shape)
        if self.count_only:
            data = None
        elif data is None:
            data = np.full(shape, np.nan, dtype=self.dtype)
        aid = self.model.array_id(name, shape)
        self.arrays[name] = array = SlowArray(self, name, aid, shape, data)
        return array

    def init(self, array: SlowArray, value: float) -> None:
        """Initialise all of ``array`` in slow memory to ``value`` (a memset: counted as writes and init writes)."""
        self._own_array(array)
        self._before_op()
        core.init_slow(self.model.W, array.id, int(np.prod(array.shape)))
        self._after_op()
        if array.data is not None:
            array.data[...] = value

    # -- fast memory -------------------------------------------------------------------------------------------
    def load(self, array: SlowArray, rows=None, cols=None) -> FastTile:
        """Copy the region ``rows`` x ``cols`` of ``array`` into fast memory (its words are reads); the tile."""
        rows, cols = self._region(array, rows, cols)
        r0, nr, c0, nc = rows[0], rows[1] - rows[0], cols[0], cols[1] - cols[0]
        self._before_op()
        if array.is_vector:
            h = core.load_vec(self.model.W, array.id, None, r0, nr, None)
        else:
            h = core.load(self.model.W, array.id, None, r0, nr, c0, nc, None)
        self._after_op()
        data = None
        if array.data is not None:
            data = array.data[r0 : r0 + nr].copy() if array.is_vector else array.data[r0 : r0 + nr, c0 : c0 + nc].copy()
        return FastTile(self, array, int(h), rows, cols, data)

    def alloc(self, array: SlowArray, rows=None, cols=None, fill: float = 0.0) -> FastTile:
        """Reserve fast memory for the region ``rows`` x ``cols`` of ``array`` (scratch: an accumulator O_i, a score
        tile S_ij, row statistics m_i, l_i), filled with ``fill``; no I/O. The tile."""
        if isinstance(fill, bool) or not isinstance(fill, numbers.Real):
            raise InputError("fill", "must be a real number (the value the new tile starts with)", fill)
        rows, cols = self._region(array, rows, cols)
        r0, nr, c0, nc = rows[0], rows[1] - rows[0], cols[0], cols[1] - cols[0]
        self._before_op()
        if array.is_vector:
            h = core.alloc_vec(self.model.W, array.id, r0, nr)
        else:
            h = core.alloc(self.model.W, array.id, r0, nr, c0, nc)
        self._after_op()
        data = None if self.count_only else np.full((nr,) if array.is_vector else (nr, nc), fill, dtype=self.dtype)
        return FastTile(self, array, int(h), rows, cols, data)

    def store(self, tile: FastTile, to: SlowArray | None = None, rows=None, cols=None) -> None:
        """Copy ``tile`` to slow memory (its words are writes): to its own region, or to the region ``rows`` x
        ``cols`` of ``to`` (same shape; by default the tile's own rows and columns), e.g. P_ij computed in place of
        S_ij and written to P. The tile stays resident."""
        self._live(tile, "store")
        if to is None and rows is None and cols is None:
            target, t_rows, t_cols = tile.array, tile.rows, tile.cols
            self._before_op()
            store = core.store_vec if tile.array.is_vector else core.store
            store(self.model.W, tile.handle, None, None)
        else:
            target = tile.array if to is None else to
            self._own_array(target)
            t_rows = tile.rows if rows is None else _range("rows", rows, 0)
            t_cols = (tile.cols if cols is None else _range("cols", cols, 0)) if not target.is_vector else (0, 1)
            if (t_rows[1] - t_rows[0], t_cols[1] - t_cols[0]) != (tile.region[1], tile.region[3]):
                raise ScheduleError(
                    f"a store of {tile} ({tile.region[1]} x {tile.region[3]}) to a region of another shape",
                    target.name,
                    (t_rows[0], t_rows[1] - t_rows[0], t_cols[0], t_cols[1] - t_cols[0]),
                )
            self._before_op()
            core.store_to(self.model.W, tile.handle, None, target.id, None, t_rows[0], t_cols[0])
        self._after_op()
        if target.data is not None and tile.data is not None:
            if target.is_vector:
                target.data[t_rows[0] : t_rows[1]] = tile.data.reshape(-1)
            else:
                target.data[t_rows[0] : t_rows[1], t_cols[0] : t_cols[1]] = tile.data.reshape(tile.region[1], -1)

    def free(self, *tiles: FastTile) -> None:
        """Release exactly these tiles from fast memory (loaded or scratch); each may be freed once."""
        for tile in tiles:
            self._live(tile, "free")
            self._before_op()
            core.free(self.model.W, tile.handle)
            self._after_op()
            tile.live = False

    # -- what the model knows ------------------------------------------------------------------------------------
    @property
    def resident(self) -> int:
        """Words in fast memory now."""
        return self.model.resident

    @property
    def peak(self) -> int:
        return self.model.peak

    def resident_tiles(self) -> list[Tile]:
        """The tiles in fast memory now, oldest first (as the model records them)."""
        return self.model.resident_tiles()

    def resident_by_array(self) -> dict[str, int]:
        """Resident words per array now."""
        return self.model.resident_by_array()

    def stats(self) -> Stats:
        """The counters so far: per-array reads, writes and init writes, the peak and fast memory at the peak."""
        return self.model.stats()

    def trace(self) -> Trace | None:
        """The events so far (None unless made with ``trace=True``)."""
        return self.model.trace()

    def finish(self) -> Stats:
        """End the schedule: raise :class:`ScheduleError` if tiles are left resident (or an error was recorded,
        or in strict mode an overflow); else the final :class:`Stats`."""
        self.model.check()
        return self.stats()

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finish()

    def __repr__(self) -> str:
        return f"Memory(M={self.M}, resident={self.resident}, peak={self.peak})"

    # -- checks --------------------------------------------------------------------------------------------------
    def _own_array(self, array) -> None:
        if not isinstance(array, SlowArray):
            raise ValueError(f"expected a SlowArray (from Memory.slow), got {type(array).__name__}")
        if array.memory.model is not self.model:
            raise ScheduleError("a slow array of another Memory", array.name)

    def _region(self, array: SlowArray, rows, cols) -> tuple[tuple[int, int], tuple[int, int]]:
        self._own_array(array)
        rows = _range("rows", rows, array.shape[0])
        if array.is_vector:
            if cols is not None and tuple(cols) != (0, 1):
                raise ValueError(f"{array.name} is a vector: give rows only, not cols={cols!r}")
            return rows, (0, 1)
        return rows, _range("cols", cols, array.shape[1])

    def _live(self, tile, op: str) -> None:
        if not isinstance(tile, FastTile):
            raise ValueError(f"{op} needs a FastTile (from Memory.load or Memory.alloc), got {type(tile).__name__}")
        if tile.memory.model is not self.model:
            raise ScheduleError(f"{op} of a tile of another Memory", tile.array.name, tile.region)
        if not tile.live:
            raise ScheduleError(
                f"{op} of a stale tile handle (the tile was already freed)", tile.array.name, tile.region
            )

    def _before_op(self) -> None:
        """Make room for one more trace event: a Python schedule cannot be rerun, so the buffer grows instead."""
        W = self.model.W
        if W[core._TCAP] > 0 and W[core._NEV] >= W[core._TCAP]:
            self._grow_trace(2 * int(W[core._TCAP]))

    def _grow_trace(self, capacity: int) -> None:
        model, old = self.model, self.model.W
        W = np.zeros(core.E0 + capacity * core.EVENT_WIDTH, dtype=np.int64)
        W[: old.size] = old
        W[core._TCAP] = capacity
        model.W = W
        model._arrays = W[core.A0 : core.T0].reshape(core.MAX_ARRAYS, core._STRIDE)
        model._tiles = W[core.T0 : core.E0].reshape(core.MAX_TILES, core._STRIDE)

    def _after_op(self) -> None:
        """Raise what the op just recorded: a schedule error, or in strict mode a capacity overflow."""
        err = self.model.schedule_error()
        if err is not None:
            raise err
        if self.model.strict and self.model.overflowed:
            raise self.model.overflow_error()

"""The honesty witness: proves, independently of the memory model's counters, that the drivers move data only
through the model and compute only on live tiles.

Run as a script (``python tests/witness.py``; tests/test_witness.py does, in one subprocess) it sets
``NUMBA_DISABLE_JIT=1`` so every @njit driver and helper is plain Python, then runs every algorithm's forward and
backward pass, causal and not, at tiny odd sizes through a :class:`WitnessMemory` (a ``TwoLevelMemory`` whose
``call`` substitutes witnessed arrays), and prints one JSON document. What it checks, element by element:

(a) **Slow memory is touched only by the model's ops.** Each slow array (Q, K, V, O, L, S, P, dO, ...) reaches the
    driver as a :class:`SlowArray`: memory filled with a NaN poison pattern whose every ``__getitem__``,
    ``__setitem__``, ufunc, NumPy function and derived view is a violation. The real data lives in a *shadow*
    that only the witnessed load / store / init ops copy from and to. An access that slips past the hooks (say
    ``np.asarray(K)``) still reads poison, which the numeric check against the float64 reference catches, and a
    write that slips past them changes the poison, which is checked bit for bit after the run. ``init_slow``
    grants the whole-array write that follows it (FlashAttention 1 zeroing O, l, m in HBM), up to its words.
(b) **No fast word is read after its tile was freed, or before it was loaded or computed.** Every fast buffer
    (``buffer`` in each algorithm module) is a :class:`FastBuffer` with a per-element owner (the tile handle) and
    validity bit. A load makes the words of ``dst[:nr, :nc]`` valid and owned by the new handle, arithmetic makes
    the words it writes valid, a free makes its tile's words invalid. Element indices of any view within its root
    buffer come from the array interface's data pointer and strides.
(c) **Every fast word that is computed on lies inside a live tile.** An alloc returns a handle but names no
    buffer, so its words are bound lazily: the first write to words that no live tile holds binds them to a live
    alloc'd tile of matching size (:meth:`Witness._bind`). A write that no live tile can take (an S tile used
    without its alloc) and a read of a word that no live tile holds are violations; so are a load over a live
    tile, a load into or a store from an array that is not a fast buffer, and a store of words its tile does not
    hold.

The witness also counts reads, writes, init writes and the resident peak itself and compares them with the
model's ``Stats``, and checks the outputs against ``iosim.algorithms.reference``. Not tracked, by the model's
documented convention: Python scalars of one row's arithmetic and the temporaries NumPy/BLAS return (``np.dot``
without ``out``). Limits: when two pending alloc'd tiles have the same size, a buffer may be attributed to the
other one (the drivers free such tiles together); ndarray methods that bypass NumPy's override protocols on a fast
buffer (``.copy()`` and ``.fill()`` aside, which are hooked) are not seen. The broken copies (:data:`BROKEN`) are
text mutations of ``flash._flash2_forward`` exec'd in the module's namespace; each must be caught.

Numba note: under NUMBA_DISABLE_JIT numba's decorators return the plain function, which has no ``py_func``;
:func:`_shim_disable_jit` gives it one so code written for dispatchers (``f.py_func``) still imports.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np
from numpy.lib.stride_tricks import as_strided

ALGORITHMS = ("standard", "flash1", "flash2", "square-tiling")
OPS = ("load", "load_vec", "alloc", "alloc_vec", "store", "store_to", "store_vec", "free", "init_slow")
POISON_BITS = 0x7FF4DEADBEEF0001  # a signalling NaN with a payload: arithmetic never produces it
POISON = np.array([POISON_BITS], dtype=np.uint64).view(np.float64)[0]
TOLERANCE = 1e-9  # float64 drivers match the reference to about 1e-12

# Kinds of violation.
SLOW = "slow-access"  # (a) a slow array touched outside load/store/init
AFTER_FREE = "read-after-free"  # (b)
BEFORE_WRITE = "read-before-write"  # (b)
OUTSIDE = "outside-tile"  # (c)
MODEL = "model"  # the witness's own counts disagree with the model's, or a run raised


def _where() -> str:
    """The driver line that caused the current access (the first frame outside this file and NumPy)."""
    f = sys._getframe(1)
    while f is not None and (f.f_code.co_filename == __file__ or f"{os.sep}numpy{os.sep}" in f.f_code.co_filename):
        f = f.f_back
    if f is None:
        return "?"
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno} in {f.f_code.co_name}"


class Report:
    """Violations, aggregated by (kind, place, message): the first example and how often it happened."""

    def __init__(self) -> None:
        self.items: dict[tuple, dict] = {}

    def add(self, kind: str, message: str, key: str = "") -> None:
        where = _where()
        k = (kind, where, key or message)
        if k in self.items:
            self.items[k]["count"] += 1
        else:
            self.items[k] = {"kind": kind, "where": where, "message": message, "count": 1}

    def as_list(self) -> list[dict]:
        return list(self.items.values())


_ACTIVE: list[Witness] = []  # the witness of the mem.call in progress (at most one)


def _active() -> Witness | None:
    return _ACTIVE[-1] if _ACTIVE else None


def _plain(x):
    """The plain ndarray view of a witnessed array (anything else unchanged)."""
    if isinstance(x, (FastBuffer, SlowArray)):
        return x.view(np.ndarray)
    if isinstance(x, tuple):
        return tuple(_plain(y) for y in x)
    if isinstance(x, list):
        return [_plain(y) for y in x]
    return x


def _arrays_in(x):
    """The witnessed arrays among x (one level of tuples and lists, as NumPy's functions take them)."""
    if isinstance(x, (FastBuffer, SlowArray)):
        yield x
    elif isinstance(x, (tuple, list)):
        for y in x:
            if isinstance(y, (FastBuffer, SlowArray)):
                yield y


# ---------------------------------------------------------------------------------------------------------------
# Slow memory
# ---------------------------------------------------------------------------------------------------------------


class SlowArray(np.ndarray):
    """A slow-memory array as a driver sees it: poison whose every element access is a violation."""

    _name = "?"
    _aid = -1

    def __array_finalize__(self, obj):
        if isinstance(obj, SlowArray):  # a view derived from a slow array (K.T, K.reshape(...), ...)
            self._name, self._aid = obj._name, obj._aid
            w = _active()
            if w is not None:
                w.report.add(SLOW, f"a view of slow array {obj._name} taken outside the model's load/store")

    def __getitem__(self, key):
        w = _active()
        if w is not None:
            w.report.add(SLOW, f"direct read of slow array {self._name}[{_key_text(key)}] outside load", "read")
        return self.view(np.ndarray)[key]

    def __setitem__(self, key, value):
        w = _active()
        if w is not None and w.init_write(self, key, value):
            return
        if w is not None:
            w.report.add(SLOW, f"direct write to slow array {self._name}[{_key_text(key)}] outside store", "write")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return _dispatch(
            f"np.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}"), ufunc, method, inputs, kwargs
        )

    def __array_function__(self, func, types, args, kwargs):
        return _dispatch(f"np.{func.__name__}", func, None, args, kwargs)

    def copy(self, *args, **kwargs):
        w = _active()
        if w is not None:
            w.report.add(SLOW, f"copy of slow array {self._name} outside load")
        return self.view(np.ndarray).copy(*args, **kwargs)

    def __iter__(self):
        w = _active()
        if w is not None:
            w.report.add(SLOW, f"iteration over slow array {self._name} outside load")
        return iter(self.view(np.ndarray))


def _key_text(key) -> str:
    keys = key if isinstance(key, tuple) else (key,)
    out = []
    for k in keys:
        if isinstance(k, slice):
            out.append(f"{'' if k.start is None else k.start}:{'' if k.stop is None else k.stop}")
        else:
            out.append(str(k))
    return ", ".join(out)


# ---------------------------------------------------------------------------------------------------------------
# Fast memory
# ---------------------------------------------------------------------------------------------------------------


class FastBuffer(np.ndarray):
    """A fast-memory buffer or a view of one; the root holds each element's owner tile and validity."""

    _root = None

    def __array_finalize__(self, obj):
        self._root = getattr(obj, "_root", None)

    def _ix(self):
        """The root-buffer index of each element of this view (same shape), or None if it is not a view."""
        ix = self.__dict__.get("_ixc")
        if ix is None:
            root = self._root
            if root is None:
                return None
            isz = self.itemsize
            off = self.view(np.ndarray).__array_interface__["data"][0] - root._ptr
            if self.size == 0:
                ix = np.zeros(self.shape, np.int64)
            elif off < 0 or off >= root.nbytes or off % isz:
                return None  # a copy made by an ndarray method, not a view of the buffer
            else:
                strides = tuple(s // isz * 8 for s in self.strides)
                ix = as_strided(root._index[off // isz :], shape=self.shape, strides=strides, writeable=False)
            self._ixc = ix
        return ix

    def __getitem__(self, key):
        res = np.ndarray.__getitem__(self, key)
        w = _active()
        if w is None or self._root is None:
            return res
        if isinstance(res, FastBuffer) and res._ix() is not None:
            return res  # a view: nothing is read until it is used
        ix = self._ix()
        if ix is not None:
            w.read(self, ix[key], "indexing")
        return res.view(np.ndarray) if isinstance(res, np.ndarray) else res

    def __setitem__(self, key, value):
        w = _active()
        if w is not None and self._root is not None:
            for a in _arrays_in(value):
                w.read_array(a, "assignment")
        np.ndarray.__setitem__(self.view(np.ndarray), key, _plain(value))
        if w is not None and self._root is not None:
            ix = self._ix()
            if ix is not None:
                w.write(self, ix[key], "assignment")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return _dispatch(
            f"np.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}"), ufunc, method, inputs, kwargs
        )

    def __array_function__(self, func, types, args, kwargs):
        return _dispatch(f"np.{func.__name__}", func, None, args, kwargs)

    def copy(self, *args, **kwargs):
        w = _active()
        if w is not None:
            w.read_array(self, "copy")
        return self.view(np.ndarray).copy(*args, **kwargs)

    def fill(self, value):
        self[...] = value


def _dispatch(op, func, method, args, kwargs):
    """Run a ufunc or NumPy function on plain views, recording reads of its inputs and writes to its outputs."""
    w = _active()
    args = list(args)
    out = kwargs.get("out")
    outs = list(out) if isinstance(out, tuple) else [out]
    write_only = None  # np.dot's ``out`` and np.copyto's destination are written, not read
    if method is None and func is np.dot and len(args) == 3:
        write_only = 2
    elif method is None and func is np.copyto:
        write_only = 0
    elif method == "at":  # ufunc.at(a, indices, b) updates a in place
        outs.append(args[0])
    if write_only is not None:
        outs.append(args[write_only])
    if w is not None:
        for i, a in enumerate(args):
            if i != write_only:
                for x in _arrays_in(a):
                    w.touch(x, op, read=True)
        for k, v in kwargs.items():
            if k != "out":
                for x in _arrays_in(v):
                    w.touch(x, op, read=True)
    pargs = [_plain(a) for a in args]
    pkw = {k: _plain(v) for k, v in kwargs.items()}
    result = func(*pargs, **pkw) if method in (None, "__call__") else getattr(func, method)(*pargs, **pkw)
    if w is not None:
        for o in outs:
            for x in _arrays_in(o):
                w.touch(x, op, read=False)
    if out is not None:
        return out[0] if isinstance(out, tuple) and len(out) == 1 else out
    if write_only == 2:
        return args[2]
    return result


# ---------------------------------------------------------------------------------------------------------------
# The witness of one mem.call
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class _Tile:
    handle: int
    kind: str  # "load" or "alloc"
    array: str
    region: tuple  # r0, nr, c0, nc
    words: int
    bound: int = 0  # words of fast buffers it holds (all of them for a load)
    parts: list = field(default_factory=list)  # (root buffer, root indices)

    def text(self) -> str:
        r0, nr, c0, nc = self.region
        kind = "loaded" if self.kind == "load" else "allocated"
        return f"{kind} tile {self.array}[{r0}:{r0 + nr}, {c0}:{c0 + nc}]"


class Witness:
    """Tracks the slow arrays, fast buffers and tiles of one driver call."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.report = Report()
        self.slow: dict[int, SlowArray] = {}  # aid -> the array the driver sees
        self.shadow: dict[int, np.ndarray] = {}  # aid -> the real data
        self.tiles: dict[int, _Tile] = {}  # live tiles by handle
        self.freed: dict[int, str] = {}  # handle -> description, for messages
        self.pending: list[_Tile] = []  # live alloc'd tiles with unbound words, oldest first
        self.grants: dict[int, int] = {}  # aid -> words an init_slow allows to be written directly
        self.buffers: list[FastBuffer] = []
        self.counts: dict[str, list[int]] = {}  # array -> [reads, writes, init writes]
        self.resident = self.peak = 0
        self.checked = [0, 0]
        self.tiles_opened = 0  # fast-memory words whose reads / writes the witness checked

    # -- bookkeeping --------------------------------------------------------------------------------------------
    def _count(self, aid: int, col: int, words: int) -> None:
        self.counts.setdefault(self.names[aid], [0, 0, 0])[col] += words

    def _open(self, tile: _Tile) -> None:
        self.tiles_opened += 1
        self.tiles[tile.handle] = tile
        self.resident += tile.words
        self.peak = max(self.peak, self.resident)

    def new_buffer(self, n: int, dtype) -> FastBuffer:
        root = np.empty(n, dtype=dtype).view(FastBuffer)
        root.view(np.ndarray).view(np.uint64 if root.itemsize == 8 else np.uint32)[:] = (
            POISON_BITS if root.itemsize == 8 else 0x7FA0DEAD
        )
        root._root = root
        root._ptr = root.view(np.ndarray).__array_interface__["data"][0]
        root._index = np.arange(n, dtype=np.int64)
        root._owner = np.full(n, -1, dtype=np.int64)
        root._valid = np.zeros(n, dtype=bool)
        root._freed = np.full(n, -1, dtype=np.int64)
        root._learned = None  # the array whose alloc'd tiles this buffer held last
        root._name = f"buffer#{len(self.buffers)} ({n} words, {_where()})"
        self.buffers.append(root)
        return root

    # -- fast-memory accesses -------------------------------------------------------------------------------------
    def touch(self, x, op: str, read: bool) -> None:
        if isinstance(x, SlowArray):
            kind = "read" if read else "write"
            self.report.add(SLOW, f"{op} {'reads' if read else 'writes'} slow array {x._name} outside load/store", kind)
        elif read:
            self.read_array(x, op)
        else:
            ix = x._ix() if x._root is not None else None
            if ix is not None:
                self.write(x, ix, op)

    def read_array(self, x, op: str) -> None:
        if isinstance(x, SlowArray):
            self.touch(x, op, True)
            return
        ix = x._ix() if x._root is not None else None
        if ix is not None:
            self.read(x, ix, op)

    def read(self, view: FastBuffer, ix, op: str) -> None:
        root = view._root
        ix = np.asarray(ix).ravel()
        self.checked[0] += ix.size
        own, val = root._owner[ix], root._valid[ix]
        bad = (own < 0) | ~val
        if not bad.any():
            return
        e = int(ix[np.argmax(bad)])
        where = f"{root._name} word {e}"
        if root._owner[e] < 0 and root._valid[e]:
            msg = f"{op} reads {where}, which lies outside every live tile (computed without a load or alloc)"
            self.report.add(OUTSIDE, msg, f"{op}:read-outside")
        elif root._owner[e] < 0 and root._freed[e] >= 0:
            msg = f"{op} reads {where} after its {self.freed[int(root._freed[e])]} was freed"
            self.report.add(AFTER_FREE, msg, f"{op}:after-free")
        elif root._owner[e] < 0:
            self.report.add(
                BEFORE_WRITE, f"{op} reads {where}, which no load or computation has written", f"{op}:unwritten"
            )
        else:
            t = self.tiles[int(root._owner[e])]
            msg = f"{op} reads {where} of live {t.text()} before it was loaded or computed"
            self.report.add(BEFORE_WRITE, msg, f"{op}:unwritten")

    def write(self, view: FastBuffer, ix, op: str) -> None:
        root = view._root
        ix = np.asarray(ix).ravel()
        self.checked[1] += ix.size
        free_words = np.unique(ix[root._owner[ix] < 0])
        if free_words.size and not self._bind(view, free_words):
            self.report.add(
                OUTSIDE,
                f"{op} writes {root._name} word {int(free_words[0])} ({free_words.size} word(s)), which no live tile "
                "holds: fast memory used without a load or alloc",
                f"{op}:write-outside",
            )
        root._valid[ix] = True

    def _bind(self, view: FastBuffer, words) -> bool:
        """Bind unowned fast words being written to a live alloc'd tile: one this buffer already partly holds and
        with room for them; else a fresh tile exactly the size of the written view's unowned words (bound whole),
        else exactly the size of the words written; ties go to the array this buffer held last, then the oldest
        tile. Nothing else: a write that fits no tile this way is a violation, blamed on the buffer written."""
        root, n = view._root, words.size
        cands = [t for t in self.pending if t.words - t.bound >= n]
        if not cands:
            return False
        chosen = next((t for t in reversed(cands) if t.bound and any(p[0] is root for p in t.parts)), None)
        if chosen is None:
            vix = view._ix().ravel()
            whole = np.unique(vix[root._owner[vix] < 0])
            fresh = [t for t in cands if t.bound == 0]
            for size, take in ((whole.size, whole), (n, words)):
                same = [t for t in fresh if t.words == size]
                if same:
                    chosen = next((t for t in same if t.array == root._learned), same[0])
                    words = take
                    break
        if chosen is None:
            return False
        root._owner[words] = chosen.handle
        root._freed[words] = -1
        root._learned = chosen.array
        chosen.bound += words.size
        chosen.parts.append((root, words))
        if chosen.bound == chosen.words:
            self.pending.remove(chosen)
        return True

    # -- the model's ops ----------------------------------------------------------------------------------------
    def _tile_words(self, dst, nr: int, nc: int, op: str):
        """The root indices of dst[:nr, :nc] (dst[:nr] for a 1-D buffer), or None after reporting why not."""
        if not isinstance(dst, FastBuffer) or dst._ix() is None:
            self.report.add(OUTSIDE, f"{op} into an array that is not a fast-memory buffer ({type(dst).__name__})")
            return None
        if dst.shape[0] < nr or (dst.ndim == 2 and dst.shape[1] < nc) or (dst.ndim == 1 and nc != 1):
            self.report.add(OUTSIDE, f"{op} of a {nr} x {nc} tile into a fast buffer of shape {dst.shape}")
            return None
        return dst._ix()[:nr, :nc] if dst.ndim == 2 else dst._ix()[:nr]

    def _slow_data(self, aid: int, arr, op: str):
        """The shadow (real data) a load reads or a store writes: that of the array the driver passed (a wrong one is
        reported and used, so the numbers show what the driver did), as a 2-D view."""
        sh = self.shadow.get(aid)
        if arr is not self.slow.get(aid):
            given = getattr(arr, "_name", type(arr).__name__)
            self.report.add(SLOW, f"{op} of array {self.names[aid]} passed {given} as its slow-memory data")
            other = self.shadow.get(getattr(arr, "_aid", -1))
            if other is not None and sh is not None and other.shape == sh.shape:
                sh = other
        return None if sh is None else (sh.reshape(sh.shape[0], 1) if sh.ndim == 1 else sh)

    def load(self, h: int, aid: int, src, r0: int, nr: int, c0: int, nc: int, dst, op: str) -> None:
        self.grants.clear()
        if h < 0:
            return  # the model recorded a schedule error; mem.call raises it
        self._count(aid, 0, nr * nc)
        tile = _Tile(h, "load", self.names[aid], (r0, nr, c0, nc), nr * nc, nr * nc)
        self._open(tile)
        data = self._slow_data(aid, src, op)
        ix = self._tile_words(dst, nr, nc, op)
        if ix is None or data is None:
            return
        root = dst._root
        ix = ix.ravel()
        busy = root._owner[ix] >= 0
        if busy.any():
            other = self.tiles[int(root._owner[ix[np.argmax(busy)]])]
            self.report.add(OUTSIDE, f"{op} of {tile.text()} overwrites the words of live {other.text()}")
        region = data[r0 : r0 + nr, c0 : c0 + nc]
        plain = dst.view(np.ndarray)
        if dst.ndim == 2:
            plain[:nr, :nc] = region
        else:
            plain[:nr] = region[:, 0]
        root._owner[ix] = h
        root._valid[ix] = True
        root._freed[ix] = -1
        tile.parts.append((root, ix))

    def alloc(self, h: int, aid: int, r0: int, nr: int, c0: int, nc: int) -> None:
        self.grants.clear()
        if h < 0:
            return
        tile = _Tile(h, "alloc", self.names[aid], (r0, nr, c0, nc), nr * nc)
        self._open(tile)
        if tile.words:
            self.pending.append(tile)

    def store(self, h: int, src, aid: int | None, dst, r0: int | None, c0: int | None, op: str) -> None:
        self.grants.clear()
        tile = self.tiles.get(h)
        if tile is None:
            self.report.add(MODEL, f"{op} of handle {h}, which is not a live tile")
            return
        t0, nr, tc0, nc = tile.region
        aid = self.names.index(tile.array) if aid is None else aid
        r0, c0 = (t0, tc0) if r0 is None else (r0, c0)
        self._count(aid, 1, nr * nc)
        data = self._slow_data(aid, dst, op)
        ix = self._tile_words(src, nr, nc, op)
        if ix is None or data is None:
            return
        root = src._root
        self.read(src, ix, op)
        flat = ix.ravel()
        foreign = root._owner[flat] != h
        if foreign.any():
            o = int(root._owner[flat[np.argmax(foreign)]])
            holder = self.tiles[o].text() if o in self.tiles else "no live tile"
            self.report.add(OUTSIDE, f"{op} of {tile.text()} copies fast words held by {holder}")
        plain = src.view(np.ndarray)
        data[r0 : r0 + nr, c0 : c0 + nc] = plain[:nr, :nc] if src.ndim == 2 else plain[:nr, None]

    def free(self, h: int) -> None:
        self.grants.clear()
        tile = self.tiles.pop(h, None)
        if tile is None:
            return  # the model reports a stale handle
        self.resident -= tile.words
        if tile in self.pending:
            self.pending.remove(tile)
        self.freed[h] = tile.text()
        for root, ix in tile.parts:
            mine = ix[root._owner[ix] == h]
            root._owner[mine] = -1
            root._valid[mine] = False
            root._freed[mine] = h

    def init_slow(self, aid: int, words: int) -> None:
        self._count(aid, 1, words)
        self._count(aid, 2, words)
        self.grants[aid] = self.grants.get(aid, 0) + words

    def init_write(self, arr: SlowArray, key, value) -> bool:
        """A direct write allowed by a preceding init_slow of the same array (up to its words)."""
        words = self.grants.get(arr._aid, 0)
        sh = self.shadow.get(arr._aid)
        if words <= 0 or sh is None:
            return False
        target = sh[key]
        n = target.size if isinstance(target, np.ndarray) else 1
        if n > words:
            return False
        for a in _arrays_in(value):
            self.touch(a, "initialisation", read=True)
        sh[key] = _plain(value)
        self.grants[arr._aid] = words - n
        return True


# ---------------------------------------------------------------------------------------------------------------
# Installation: witnessed ops in every algorithm module, a memory whose call substitutes the arrays
# ---------------------------------------------------------------------------------------------------------------


def _shim_disable_jit() -> None:
    """Under NUMBA_DISABLE_JIT numba's decorators return the plain function; give it ``py_func`` (itself) so that
    code written for dispatchers (``f.py_func``) imports."""
    import numba.core.decorators as dec

    if getattr(dec._jit, "_witness_shim", False):
        return
    original = dec._jit

    def _jit(*args, **kwargs):
        decorate = original(*args, **kwargs)

        def wrap(func):
            out = decorate(func)
            if out is func and not hasattr(func, "py_func"):
                func.py_func = func
            return out

        return wrap

    _jit._witness_shim = True
    dec._jit = _jit


def install():
    """Patch the model's ops and ``buffer`` in every loaded iosim.algorithms module; return WitnessMemory."""
    from numba import config

    if not config.DISABLE_JIT:
        raise RuntimeError("the witness needs NUMBA_DISABLE_JIT=1 set before numba is imported")
    import iosim.algorithms._tiles as tiles
    import iosim.algorithms.flash  # noqa: F401 - load every driver module before patching
    import iosim.algorithms.square_tiling  # noqa: F401
    import iosim.algorithms.standard  # noqa: F401
    from iosim.memory_model import core

    real = {name: getattr(core, name) for name in OPS}
    real_buffer = tiles.buffer

    def w_load(W, aid, src, r0, nr, c0, nc, dst):
        h = real["load"](W, aid, None, r0, nr, c0, nc, None)
        _ACTIVE[-1].load(h, aid, src, r0, nr, c0, nc, dst, "load")
        return h

    def w_load_vec(W, aid, src, r0, n, dst):
        h = real["load_vec"](W, aid, None, r0, n, None)
        _ACTIVE[-1].load(h, aid, src, r0, n, 0, 1, dst, "load_vec")
        return h

    def w_alloc(W, aid, r0, nr, c0, nc):
        h = real["alloc"](W, aid, r0, nr, c0, nc)
        _ACTIVE[-1].alloc(h, aid, r0, nr, c0, nc)
        return h

    def w_alloc_vec(W, aid, r0, n):
        h = real["alloc_vec"](W, aid, r0, n)
        _ACTIVE[-1].alloc(h, aid, r0, n, 0, 1)
        return h

    def w_store(W, h, src, dst):
        _ACTIVE[-1].store(h, src, None, dst, None, None, "store")
        real["store"](W, h, None, None)

    def w_store_to(W, h, src, aid, dst, r0, c0):
        _ACTIVE[-1].store(h, src, aid, dst, r0, c0, "store_to")
        real["store_to"](W, h, None, aid, None, r0, c0)

    def w_store_vec(W, h, src, dst):
        _ACTIVE[-1].store(h, src, None, dst, None, None, "store_vec")
        real["store_vec"](W, h, None, None)

    def w_free(W, h):
        _ACTIVE[-1].free(h)
        real["free"](W, h)

    def w_init_slow(W, aid, words):
        _ACTIVE[-1].init_slow(aid, words)
        real["init_slow"](W, aid, words)

    def w_buffer(n, like):
        return None if like is None else _ACTIVE[-1].new_buffer(n, like.dtype)

    ops = dict(
        zip(
            OPS,
            (w_load, w_load_vec, w_alloc, w_alloc_vec, w_store, w_store_to, w_store_vec, w_free, w_init_slow),
            strict=True,
        )
    )
    patched = []
    for modname, mod in list(sys.modules.items()):
        if not modname.startswith("iosim.algorithms.") or modname.startswith("iosim.algorithms.cuda"):
            continue
        for name, op in ops.items():
            if getattr(mod, name, None) is real[name]:
                setattr(mod, name, op)
                patched.append(f"{modname}.{name}")
        if getattr(mod, "buffer", None) is real_buffer:
            mod.buffer = w_buffer
            patched.append(f"{modname}.buffer")
    return _witness_memory_class(core.TwoLevelMemory), patched


def _witness_memory_class(base):
    class WitnessMemory(base):
        """A TwoLevelMemory whose ``call`` runs the driver on witnessed arrays (numeric mode only)."""

        reports: list

        def call(self, driver, *args, **kwargs):
            if not hasattr(self, "reports"):
                self.reports = []
            ids = args[0]
            w = Witness(self.names)
            originals, new_args, k = {}, list(args), 0
            for i, a in enumerate(args):
                # slow-memory data are float arrays; a mask's int64 descriptor (params, table) is schedule metadata
                if not isinstance(a, np.ndarray) or a.dtype.kind != "f":
                    continue
                aid = int(ids[k])
                k += 1
                if aid < 0:  # an argument this run does not use (split-KV's partials without splits, ...)
                    continue
                name = self.names[aid]
                shape = a.shape if a.ndim == 2 else (a.shape[0], 1)
                if self.shapes[name] != shape:
                    w.report.add(MODEL, f"argument {i} of shape {a.shape} bound to array {name} {self.shapes[name]}")
                guarded = np.empty_like(a)
                guarded.view(np.uint64)[...] = POISON_BITS
                guarded = guarded.view(SlowArray)
                guarded._name, guarded._aid = name, aid
                w.slow[aid], w.shadow[aid], originals[aid] = guarded, a.copy(), a
                new_args[i] = guarded
            if k == 0:
                raise RuntimeError("the witness needs a numeric call (data arrays among the arguments)")
            _ACTIVE.append(w)
            try:
                out = base.call(self, driver, *new_args, **kwargs)
            finally:
                _ACTIVE.pop()
            for aid, g in w.slow.items():
                changed = g.view(np.ndarray).view(np.uint64) != np.uint64(POISON_BITS)
                if changed.any():
                    e = tuple(int(i) for i in np.unravel_index(int(np.argmax(changed)), g.shape))
                    w.report.items[("escape", aid)] = {
                        "kind": SLOW,
                        "where": "after the run",
                        "message": f"slow array {g._name} was written at {e} (and {int(changed.sum()) - 1} more) "
                        "by a path that bypassed the model and the witness's hooks",
                        "count": int(changed.sum()),
                    }
                originals[aid][...] = w.shadow[aid]
            stats = self.stats()
            for name in set(w.counts) | set(stats.per_array):
                mine = w.counts.get(name, [0, 0, 0])
                c = stats.per_array.get(name)
                theirs = [0, 0, 0] if c is None else [c.reads, c.writes, c.init_writes]
                if mine != theirs:
                    w.report.items[("count", name)] = {
                        "kind": MODEL,
                        "where": "after the run",
                        "message": f"array {name}: the witness saw reads/writes/init {mine}, "
                        f"the model counted {theirs}",
                        "count": 1,
                    }
            if w.peak != self.peak or w.tiles:
                w.report.items[("peak",)] = {
                    "kind": MODEL,
                    "where": "after the run",
                    "message": f"resident peak: witness {w.peak}, model {self.peak}; {len(w.tiles)} tile(s) left live",
                    "count": 1,
                }
            self.reports.append(
                {
                    "driver": getattr(driver, "__name__", str(driver)),
                    "violations": w.report.as_list(),
                    "checked_reads": w.checked[0],
                    "checked_writes": w.checked[1],
                    "tiles": int(w.tiles_opened),
                    "slow_words": int(sum(sum(c[:2]) for c in w.counts.values())),
                }
            )
            return out

    return WitnessMemory


# ---------------------------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------------------------


def case_list() -> list[dict]:
    """Every algorithm x pass at tiny odd sizes, causal and not, at capacities that give several (ragged) tiles.

    M per algorithm: standard 12 (B = 2; for N = 13 the softmax sweeps each row twice in chunks) and 30 (B = 3,
    rows fit); flash 2.5x and 4x the smallest M of the backward (forward blocks > 1, backward blocks 1-3);
    square tiling 20 (B = 2) and 36 (B = 3)."""
    cases = []
    for alg in ALGORITHMS:
        for N in (5, 13):
            for d in (3, 4):
                for M in _capacities(alg, d):
                    for causal in (False, True):
                        cases.append({"algorithm": alg, "N": N, "d": d, "M": M, "causal": causal})
        for mask in MASKS:  # masks (iosim.masking.masks): empty tiles skipped, partial ones masked, skip policy
            cases.append(
                {"algorithm": alg, "N": 13, "d": 4, "M": _capacities(alg, 4)[0], "causal": False, "mask": mask}
            )
    return cases


MASKS = ("window:3", "random-blocks:0.3:2x3:1", "prefix:4", "blockdiag:4,1,8")


def _capacities(alg: str, d: int) -> tuple[int, ...]:
    if alg == "standard":
        return (12, 30)
    if alg == "square-tiling":
        return (20, 36)
    base = {"flash1": {3: 29, 4: 37}, "flash2": {3: 25, 4: 32}}[alg][d]  # min_M(N, d, backward=True)
    return (5 * base // 2, 4 * base)


def _max_err(got, want) -> float:
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    finite = np.isfinite(want)
    if not np.array_equal(np.isfinite(got), finite):
        return math.inf
    return float(
        np.max(np.abs(got[finite] - want[finite]), initial=0.0) / max(1.0, np.max(np.abs(want[finite]), initial=0.0))
    )


def run_case(
    WitnessMemory,
    algorithm: str,
    N: int,
    d: int,
    M: int,
    causal: bool,
    seed: int = 7,
    backward: bool = True,
    mask: str | None = None,
) -> dict:
    """Run one algorithm's forward and backward under the witness; violations and errors of each pass. ``mask``
    (a --mask string) runs with that mask and the skip policy instead of ``causal``."""
    from iosim.algorithms import reference

    from iosim.masking.masks import compile_mask
    from iosim.runner import registry

    alg = registry.get(algorithm)
    rng = np.random.default_rng(seed)
    Q, K, V, dO = (rng.standard_normal((N, d)) for _ in range(4))
    scale = 1.0 / math.sqrt(d)
    out = {"algorithm": algorithm, "N": N, "d": d, "M": M, "causal": causal, "passes": {}}
    allowed = None
    if mask is not None:
        out["mask"] = mask
        causal = compile_mask(mask, N, policy="skip")
        allowed = causal.dense()
    O_ref, L_ref = reference.attention_forward(Q, K, V, scale, causal is True, mask=allowed)
    grads_ref = reference.attention_backward(Q, K, V, dO, scale, causal is True, mask=allowed)
    fwd = None
    for pass_ in ("forward", "backward"):
        mem = WitnessMemory(M)
        res = {"violations": [], "error": None, "max_rel_err": None}
        try:
            if pass_ == "forward":
                t = alg.choose_tiling(N, d, M, "fit")
                fwd = alg.forward(mem, Q, K, V, N, d, t, scale, causal, np.float64)
                errs = [_max_err(fwd["O"], O_ref)]
                if fwd.get("L") is not None:
                    errs.append(_max_err(fwd["L"], L_ref))
            else:
                t = alg.backward_tiling(N, d, M, "fit")
                g = alg.backward(mem, Q, K, V, dO, fwd, N, d, t, scale, causal, np.float64)
                errs = [_max_err(g[k], r) for k, r in zip(("dQ", "dK", "dV"), grads_ref, strict=True)]
            res["tiling"] = str(t)
            res["max_rel_err"] = max(errs)
        except Exception as exc:  # a schedule or capacity error raised by the model: report it
            res["error"] = f"{type(exc).__name__}: {exc}"
        for r in getattr(mem, "reports", []):
            res["violations"].extend(r["violations"])
            for k in ("checked_reads", "checked_writes", "tiles", "slow_words"):
                res[k] = res.get(k, 0) + r[k]
        out["passes"][pass_] = res
        if fwd is None or not backward:
            break
    return out


# The broken copies of flash2's forward: name -> (the kind the witness must report, a phrase its message must hold,
# the text edits [(old, new), ...] that break the driver; "{i}" in new is old's indentation).
_LOAD_KV = "hK, hV = load_piece(W, pids, K, V, table, tb, Kj, Vj, at, p0, n, dqk, dv, shared)\n"
BROKEN = {
    "direct-read-of-K": (
        SLOW,
        "direct read of slow array K[0, 0]",
        [(_LOAD_KV, _LOAD_KV + "{i}x = K[0, 0]\n")],
    ),
    "K-freed-early": (
        AFTER_FREE,
        "after its loaded tile K[",
        [
            (" " * 32 + "free(W, hK)\n", ""),
            ("hS = alloc(W, iS, r0, br, p0, n)\n", "hS = alloc(W, iS, r0, br, p0, n)\n{i}free(W, hK)\n"),
        ],
    ),
    "uncounted-S-tile": (
        OUTSIDE,
        "which no live tile holds",
        [("hS = alloc(W, iS, r0, br, p0, n)\n", "\n"), (" " * 32 + "free(W, hS)\n", "")],
    ),
    "O-never-initialised": (BEFORE_WRITE, "which no load or computation has written", [("Oi[:, :] = 0.0\n", "\n")]),
    "store-bypassing-the-model": (
        SLOW,
        "direct write to slow array O[",
        [("store(W, hO, Oi, Out)\n", "Out[qbase + r0 : qbase + r0 + br] = Oi\n")],
    ),
    "V-loaded-as-K": (SLOW, "load of array K passed V", [("load_piece(W, pids, K, V,", "load_piece(W, pids, V, V,")]),
    "write-escaping-the-hooks": (
        SLOW,
        "bypassed the model",
        [("store(W, hO, Oi, Out)\n", "store(W, hO, Oi, Out)\n{i}np.asarray(Out)[qbase + r0, 0] = 1.0\n")],
    ),
}
BROKEN_CASE = {"algorithm": "flash2", "N": 13, "d": 4, "M": 64, "causal": False}  # Br = Bc = 3: 13 = 4 * 3 + 1


def _mutated_source(func, edits) -> str:
    import inspect
    import textwrap

    src = textwrap.dedent(inspect.getsource(func))
    lines = src.splitlines(keepends=True)
    while lines[0].lstrip().startswith("@"):
        lines.pop(0)
    src = "".join(lines)
    for old, new in edits:
        if src.count(old) != 1:
            raise AssertionError(f"mutation anchor {old!r} occurs {src.count(old)} times in the driver source")
        at = src.index(old)
        indent = src[src.rfind("\n", 0, at) + 1 : at]
        indent = indent[: len(indent) - len(indent.lstrip())]
        src = src.replace(old, new.replace("{i}", indent))
    return src


def run_broken(WitnessMemory) -> list[dict]:
    """Each broken copy of flash2's forward, exec'd in flash's namespace, run under the witness."""
    import iosim.algorithms.flash as flash

    original = flash._flash2_forward
    results = []
    with np.errstate(all="ignore"):  # the broken copies compute on NaN poison
        _run_broken(WitnessMemory, flash, original, results)
    return results


def _run_broken(WitnessMemory, flash, original, results) -> None:
    try:
        for name, (expected, phrase, edits) in BROKEN.items():
            src = _mutated_source(original, edits)
            exec(compile(src, f"<broken flash2 forward: {name}>", "exec"), flash.__dict__)
            try:
                r = run_case(WitnessMemory, **BROKEN_CASE, backward=False)
            finally:
                flash._flash2_forward = original
            fwd = r["passes"]["forward"]
            results.append({"name": name, "expected": expected, "phrase": phrase, **fwd})
    finally:
        flash._flash2_forward = original


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    os.environ["NUMBA_DISABLE_JIT"] = "1"
    if "numba" in sys.modules and not sys.modules["numba"].config.DISABLE_JIT:
        raise RuntimeError("numba was imported before the witness could disable the JIT")
    _shim_disable_jit()
    WitnessMemory, patched = install()
    t0 = time.perf_counter()
    cases = [run_case(WitnessMemory, **c) for c in case_list()] if "--broken-only" not in argv else []
    broken = run_broken(WitnessMemory)
    doc = {"patched": patched, "cases": cases, "broken": broken, "seconds": time.perf_counter() - t0}
    json.dump(doc, sys.stdout, indent=None if "--compact" in argv else 1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

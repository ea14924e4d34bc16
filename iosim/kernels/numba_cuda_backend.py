"""numba-cuda backend: count a numba.cuda kernel's global-memory accesses under the CUDA simulator.

Under ``NUMBA_ENABLE_CUDASIM=1`` (set before numba is first imported) a kernel's arguments reach it as wrapped
arrays (``FakeWithinKernelCUDAArray``) while shared and local arrays are plain NumPy: every element a thread reads or
writes through an argument is a global access, counted here at the address it touches. Each argument is wrapped
on its own, so an access is attributed to the argument whose wrapper it went through (a sub-array taken in the
kernel keeps its argument), even where arguments share storage (K and V as views of one device array; the
simulator copies a strided host array, so only device arrays share storage). Atomics (``cuda.atomic.*``) count one
read and one write per call. Thread blocks run one after another (``BlockManager.run``): each is a program. Names
come from the kernel's parameters (or the launcher's dict, for device arrays). Slow (every CUDA thread is a Python
thread): keep sizes tiny.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import threading
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from iosim.base.errors import InputError, install_hint

SUPPORTED = "numba-cuda 0.30 (the simulator's FakeCUDAKernel, BlockManager and FakeWithinKernelCUDAArray)"
_ATOMICS = ("add", "sub", "and_", "or_", "xor", "inc", "dec", "exch", "max", "min", "nanmax", "nanmin", "cas")


def _sim():
    from numba.cuda.simulator import kernel, kernelapi
    from numba.cuda.simulator.cudadrv import devicearray

    return kernel, kernelapi, devicearray


def require() -> None:
    try:
        import numba  # noqa: F401
    except ImportError as e:
        raise InputError("backend numba-cuda", f"needs the extra: {install_hint('cuda')}", str(e)) from None
    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        raise InputError("backend numba-cuda", "needs NUMBA_ENABLE_CUDASIM=1 set before numba is imported")
    try:
        kernel, kernelapi, devicearray = _sim()
    except ImportError as e:
        raise InputError("backend numba-cuda", f"supports {SUPPORTED}", str(e)) from None
    from iosim.gpu import simulator

    simulator.install()  # the simulator's threads swap the cuda global safely
    ok = (
        hasattr(kernel, "FakeCUDAKernel")
        and hasattr(getattr(kernel, "BlockManager", None), "run")
        and hasattr(devicearray, "FakeWithinKernelCUDAArray")
        and all(hasattr(kernelapi.FakeCUDAAtomic, a) for a in ("add", "cas"))
    )
    if not ok:
        import numba

        raise InputError("backend numba-cuda", f"supports {SUPPORTED}", getattr(numba, "__version__", "?"))


def _ndarray(x):
    """The NumPy array behind a simulator array (device array, in-kernel wrapper) or x itself."""
    for _ in range(3):
        if isinstance(x, np.ndarray):
            return x
        inner = x.__dict__.get("_item") if hasattr(x, "__dict__") else None
        x = inner if inner is not None else getattr(x, "_ary", None)
        if x is None:
            return None
    return x if isinstance(x, np.ndarray) else None


def array_range(x) -> tuple[int, int] | None:
    a = _ndarray(x)
    if a is None or a.ndim == 0:
        return None
    return _span(a)


def to_numpy(x):
    a = _ndarray(x)
    return None if a is None else np.asarray(a, dtype=np.float64)


ORIGIN = "_iosim_origin"  # the range id of the argument an in-kernel array wrapper stands for


def _span(a: np.ndarray) -> tuple[int, int]:
    """(first byte, bytes) of the memory an array's elements occupy (a strided view: from its lowest to its highest
    element, not ``nbytes``, which would cut an interleaved view short)."""
    if a.size == 0:
        return int(a.ctypes.data), 0
    lo = sum((n - 1) * st for n, st in zip(a.shape, a.strides, strict=True) if st < 0)
    hi = sum((n - 1) * st for n, st in zip(a.shape, a.strides, strict=True) if st > 0)
    return int(a.ctypes.data) + lo, hi - lo + a.itemsize


def _addresses(a: np.ndarray, idx) -> np.ndarray | int | None:
    """The byte address of element ``a[idx]`` (an int), or of every element ``a[idx]`` selects (an array)."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    if len(idx) == a.ndim and all(isinstance(i, (int, np.integer)) for i in idx):
        off = 0
        for i, n, s in zip(idx, a.shape, a.strides, strict=True):
            off += (int(i) + n if i < 0 else int(i)) * s
        return a.ctypes.data + off
    v = a[idx]
    if not isinstance(v, np.ndarray):
        return None
    if v.size == 0:
        return np.zeros(0, dtype=np.uint64)
    off = sum(np.indices(v.shape).reshape(v.ndim, -1) * np.array(v.strides)[:, None]) if v.ndim else np.zeros(1)
    return (v.ctypes.data + np.asarray(off, dtype=np.int64)).astype(np.uint64)


def _method(hook):
    """A plain function that calls ``hook`` (a bound method of a :class:`_Session`) with the instance first: set on
    one of the simulator's classes, it receives that class's instance as ``self``."""

    def method(obj, *args, **kwargs):
        return hook(obj, *args, **kwargs)

    return method


@dataclass(eq=False)
class _Session:
    """The state the hooks share while installed: the recorder, the simulator's functions they wrap (``saved``,
    ``saved_atomics``), the element accesses of the running block (``buf``: (kind, itemsize, site, origin) -> byte
    addresses, and ``rank``: the lane order of each, flushed to the recorder after every block), the launch's
    parameter names (``params``, None outside a launch) and per-thread state (``quiet``: a flag that silences
    element accesses inside an atomic; the thread's count of element accesses so far).

    Lane order: the simulator runs a block's threads as Python threads, which reach their accesses in whatever
    order the scheduler picks; a block's accesses are flushed in thread order instead (the linear thread index,
    x fastest, as CUDA numbers a block's threads; a thread's own accesses in the order it made them), so which
    lanes an access's description lists first, and which argument a site met first, never depend on it."""

    recorder: object
    kernel: object  # numba.cuda.simulator.kernel
    W: type  # the in-kernel array wrapper, FakeWithinKernelCUDAArray
    skip: tuple  # numba's, numba.cuda's and the standard library's directories: no part of a site
    saved: dict = field(default_factory=dict)
    saved_atomics: dict = field(default_factory=dict)
    buf: dict = field(default_factory=lambda: defaultdict(list))
    rank: dict = field(default_factory=lambda: defaultdict(list))
    quiet: threading.local = field(default_factory=threading.local)
    params: list | None = None
    hosts: list = field(default_factory=list)  # this launch: per argument, the host array the simulator copies
    copies: dict = field(default_factory=dict)  # a host array's (first byte, bytes, itemsize) -> its copies' range
    registered: bool = False  # this launch's arguments are registered (its first block did)

    def targets(self, BM, A) -> dict:
        """What the hooks replace while counting: label -> (owner, attribute, hook)."""
        W, K = self.W, self.kernel.FakeCUDAKernel
        out = {
            "get": (W, "__getitem__", _method(self.get)),
            "set": (W, "__setitem__", _method(self.set_)),
            "call": (K, "__call__", _method(self.call)),
            "run": (BM, "run", _method(self.run)),
        }
        for a in _ATOMICS:
            if hasattr(A, a):
                out[f"atomic.{a}"] = (A, a, _method(functools.partial(self.atomic, a)))
        return out

    def install(self, BM, A) -> None:
        """Keep each original (by the label of its hook) and set its hook in its place."""
        targets = self.targets(BM, A)
        self.saved = {label: getattr(owner, name) for label, (owner, name, _) in targets.items()}
        for owner, name, hook in targets.values():
            setattr(owner, name, hook)

    def restore(self, BM, A) -> None:
        """Put every original back."""
        for label, (owner, name, _) in self.targets(BM, A).items():
            setattr(owner, name, self.saved[label])

    def site(self) -> tuple | None:
        """The access's site: the kernel's (and its device functions') source lines and instructions on the stack
        of its simulator thread, kernel first, down to the element access (numba's, the standard library's and this
        module's frames skipped); the simulator runs them as plain Python."""
        frames, f = [], sys._getframe(2)
        while f is not None:
            name = f.f_code.co_filename
            if not name.startswith(self.skip) and name != __file__:
                frames.append((name, f.f_lineno, f.f_lasti))
            f = f.f_back
        return tuple(reversed(frames)) or None

    def note(self, a, idx, kind, origin=None):
        """Buffer the byte addresses of the elements ``a[idx]`` touches, by kind, site and argument (``origin``)."""
        if getattr(self.quiet, "on", False):
            return
        addr = _addresses(a, idx)
        if addr is None:
            return
        key = (kind, a.itemsize, self.site(), origin)
        rank = self.lane_rank()
        if isinstance(addr, np.ndarray):
            self.buf[key].extend(addr.tolist())
            self.rank[key].extend([rank] * addr.size)
        else:
            self.buf[key].append(addr)
            self.rank[key].append(rank)

    def lane_rank(self) -> int:
        """The running thread's place in the block's lane order: its linear thread index (the simulator's
        ``BlockThread.thread_id``; 0 outside one), then its own count of element accesses."""
        n = getattr(self.quiet, "n", 0)
        self.quiet.n = n + 1
        return (getattr(threading.current_thread(), "thread_id", 0) << 32) + n

    def flush(self):
        """Hand the block's buffered accesses to the recorder in lane order (each access's lanes, and the accesses
        by their first lane): one access per (kind, site) and argument."""
        rec = self.recorder
        ranks = {key: np.asarray(r, dtype=np.int64) for key, r in self.rank.items()}
        for key in sorted(self.buf, key=lambda k: int(ranks[k].min()) if ranks[k].size else 0):
            (kind, size, where, origin), addrs = key, self.buf[key]
            if not addrs:
                continue
            addr = np.asarray(addrs, dtype=np.uint64)[np.argsort(ranks[key], kind="stable")]
            if origin is not None:  # through an argument's wrapper: that argument's
                rec.access(addr, kind, size, site=where, origin=origin)
            else:  # a block's element accesses mix arguments: one access per argument they fall in
                rids = rec.range_ids(addr)
                for rid in np.unique(rids):
                    rec.access(addr[rids == rid], kind, size, site=where)
        self.buf.clear()
        self.rank.clear()

    def get(self, wrapper, idx):
        """``arg[idx]`` in a kernel: a read of the elements selected, for the argument the wrapper stands for (a
        sub-array is not read yet: it keeps the argument and is counted when its elements are touched)."""
        out = self.saved["get"](wrapper, idx)
        origin = wrapper.__dict__.get(ORIGIN)
        if isinstance(out, self.W):  # a sub-array: counted when its elements are touched, for this argument
            out.__dict__[ORIGIN] = origin
        else:
            self.note(wrapper.__dict__["_item"]._ary, idx, "r", origin)
        return out

    def set_(self, wrapper, idx, val):
        """``arg[idx] = val`` in a kernel: a write of the elements selected, for the wrapper's argument."""
        self.note(wrapper.__dict__["_item"]._ary, idx, "w", wrapper.__dict__.get(ORIGIN))
        return self.saved["set"](wrapper, idx, val)

    def atomic(self, name, api, array, index, *rest):
        """``cuda.atomic.<name>(array, index, ...)``: one atomic access of the element for a kernel argument (shared
        and local arrays are plain NumPy: not global memory); the reads and writes the simulator makes to perform
        it are not counted again."""
        if isinstance(array, self.W):
            self.note(_ndarray(array), index, "a", array.__dict__.get(ORIGIN))
        self.quiet.on = True
        try:
            return self.saved[f"atomic.{name}"](api, array, index, *rest)
        finally:
            self.quiet.on = False

    def call(self, kern, *args):
        """``kernel[grid, block](...)``: begin a launch named after the kernel and keep its parameter names (a
        device function, or a call inside a kernel, runs unrecorded)."""
        if getattr(kern, "_device", False) or getattr(self.kernel, "_kernel_context", None) is not None:
            return self.saved["call"](kern, *args)
        self.recorder.begin_launch(getattr(kern.fn, "__name__", "kernel"))
        self.params = list(inspect.signature(kern.fn).parameters)
        self.hosts = [(*_span(a), a.itemsize) if isinstance(a, np.ndarray) and a.ndim > 0 else None for a in args]
        self.registered = False
        try:
            return self.saved["call"](kern, *args)
        finally:
            self.params = None

    def run(self, manager, grid_point, *args):
        """One thread block (``BlockManager.run``): name the arguments, begin a program, run the block, then flush
        its accesses to the recorder."""
        if self.params is not None and not self.registered:  # one launch's blocks share its arguments' wrappers
            self.register_arguments(args)
            self.registered = True
        self.recorder.begin_program(tuple(int(x) for x in grid_point) if isinstance(grid_point, (tuple, list)) else ())
        try:
            return self.saved["run"](manager, grid_point, *args)
        finally:
            self.flush()

    def register_arguments(self, args) -> None:
        """Register each array argument's memory as a range named after its parameter and mark its in-kernel
        wrapper with the range id; refuse an argument that is neither an array nor a number.

        A host array reaches the kernel as a copy the simulator makes for this launch (and frees after it): its
        range is the one of the host array's earlier copies (:meth:`Recorder.register_copy`), never whatever
        range a finished launch's copy of another array left at the same address. A device array is its own
        memory, the same in every launch: registered by address."""
        rec = self.recorder
        for k, (name, arg) in enumerate(zip(self.params, args, strict=False)):
            a = _ndarray(arg)
            if a is not None and a.ndim > 0:
                span = _span(a)
                host = self.hosts[k] if k < len(self.hosts) and isinstance(arg, self.W) else None
                if host is None:
                    rid = rec.register_argument(name, span[0], span[1], a.itemsize)
                else:
                    rid = rec.register_copy(name, span[0], span[1], a.itemsize, self.copies.get(host))
                    if rid is not None:
                        self.copies.setdefault(host, rid)
                if isinstance(arg, self.W) and rid is not None:
                    arg.__dict__[ORIGIN] = rid
            elif not isinstance(arg, (int, float, bool, complex, np.number, np.bool_)) and a is None:
                raise InputError(f"argument {name}", "must be an array or a number", type(arg).__name__)


@contextlib.contextmanager
def hooks(recorder):
    """Count the global accesses of the numba.cuda kernels launched in the block (under the CUDA simulator)."""
    require()
    kernel, kernelapi, devicearray = _sim()
    import numba
    import numba.cuda

    # numba's frames, numba.cuda's (the numba-cuda package installs it apart from numba) and the standard library's
    skip = tuple(os.path.dirname(m.__file__) + os.sep for m in (numba, numba.cuda, threading))
    session = _Session(recorder, kernel, devicearray.FakeWithinKernelCUDAArray, skip)
    BM, A = kernel.BlockManager, kernelapi.FakeCUDAAtomic
    session.install(BM, A)
    try:
        yield
    finally:
        session.restore(BM, A)
        recorder.end_program()

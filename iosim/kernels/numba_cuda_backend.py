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
import inspect
import os
import sys
import threading
from collections import defaultdict

import numpy as np

from iosim.errors import InputError, install_hint

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


@contextlib.contextmanager
def hooks(recorder):
    require()
    kernel, kernelapi, devicearray = _sim()
    W, K, BM, A = (
        devicearray.FakeWithinKernelCUDAArray,
        kernel.FakeCUDAKernel,
        kernel.BlockManager,
        kernelapi.FakeCUDAAtomic,
    )
    saved = {"get": W.__getitem__, "set": W.__setitem__, "call": K.__call__, "run": BM.run}
    saved_atomics = {a: getattr(A, a) for a in _ATOMICS if hasattr(A, a)}
    buf: dict = defaultdict(list)  # (kind, itemsize) -> byte addresses, flushed after every block
    quiet = threading.local()
    launch = {"params": None}

    import numba
    import numba.cuda

    # numba's frames, numba.cuda's (the numba-cuda package installs it apart from numba) and the standard library's
    skip = tuple(os.path.dirname(m.__file__) + os.sep for m in (numba, numba.cuda, threading))

    def site() -> tuple | None:
        """The access's site: the kernel's (and its device functions') source lines and instructions on the stack
        of its simulator thread, kernel first, down to the element access (numba's, the standard library's and this
        module's frames skipped); the simulator runs them as plain Python."""
        frames, f = [], sys._getframe(2)
        while f is not None:
            name = f.f_code.co_filename
            if not name.startswith(skip) and name != __file__:
                frames.append((name, f.f_lineno, f.f_lasti))
            f = f.f_back
        return tuple(reversed(frames)) or None

    def note(a, idx, kind, origin=None):
        if getattr(quiet, "on", False):
            return
        addr = _addresses(a, idx)
        if addr is None:
            return
        key = (kind, a.itemsize, site(), origin)
        if isinstance(addr, np.ndarray):
            buf[key].extend(addr.tolist())
        else:
            buf[key].append(addr)

    def flush():
        for (kind, size, where, origin), addrs in list(buf.items()):
            if addrs and origin is not None:  # through an argument's wrapper: that argument's
                recorder.access(np.asarray(addrs, dtype=np.uint64), kind, size, site=where, origin=origin)
            elif addrs:  # a block's element accesses mix arguments: one access per argument they fall in
                addr = np.asarray(addrs, dtype=np.uint64)
                rids = recorder.range_ids(addr)
                for rid in np.unique(rids):
                    recorder.access(addr[rids == rid], kind, size, site=where)
        buf.clear()

    def get(self, idx):
        out = saved["get"](self, idx)
        origin = self.__dict__.get(ORIGIN)
        if isinstance(out, W):  # a sub-array: counted when its elements are touched, for this argument
            out.__dict__[ORIGIN] = origin
        else:
            note(self.__dict__["_item"]._ary, idx, "r", origin)
        return out

    def set_(self, idx, val):
        note(self.__dict__["_item"]._ary, idx, "w", self.__dict__.get(ORIGIN))
        return saved["set"](self, idx, val)

    def atomic(name):
        orig = saved_atomics[name]

        def wrapped(self, array, index, *rest):
            if isinstance(array, W):  # a kernel argument: global memory (shared and local arrays are plain NumPy)
                note(_ndarray(array), index, "a", array.__dict__.get(ORIGIN))
            quiet.on = True
            try:
                return orig(self, array, index, *rest)
            finally:
                quiet.on = False

        return wrapped

    def call(self, *args):
        if getattr(self, "_device", False) or getattr(kernel, "_kernel_context", None) is not None:
            return saved["call"](self, *args)
        recorder.begin_launch(getattr(self.fn, "__name__", "kernel"))
        launch["params"] = list(inspect.signature(self.fn).parameters)
        try:
            return saved["call"](self, *args)
        finally:
            launch["params"] = None

    def run(self, grid_point, *args):
        if launch["params"] is not None:
            for name, arg in zip(launch["params"], args, strict=False):
                a = _ndarray(arg)
                if a is not None and a.ndim > 0:
                    span = _span(a)
                    rid = recorder.register_argument(name, span[0], span[1], a.itemsize)
                    if isinstance(arg, W) and rid is not None:
                        arg.__dict__[ORIGIN] = rid
                elif not isinstance(arg, (int, float, bool, complex, np.number, np.bool_)) and a is None:
                    raise InputError(f"argument {name}", "must be an array or a number", type(arg).__name__)
        recorder.begin_program(tuple(int(x) for x in grid_point) if isinstance(grid_point, (tuple, list)) else ())
        try:
            return saved["run"](self, grid_point, *args)
        finally:
            flush()

    W.__getitem__, W.__setitem__, K.__call__, BM.run = get, set_, call, run
    for name in saved_atomics:
        setattr(A, name, atomic(name))
    try:
        yield
    finally:
        W.__getitem__, W.__setitem__, K.__call__, BM.run = saved["get"], saved["set"], saved["call"], saved["run"]
        for name, fn in saved_atomics.items():
            setattr(A, name, fn)
        recorder.end_program()

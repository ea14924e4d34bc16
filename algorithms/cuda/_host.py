"""Host side of the kernels: array conversion, output allocation, counters and launches with M words of shared memory.

Arrays: every launcher takes Q, K, V (and dO, ...) shaped (B, H, N, d), or (N, d) for one head, as NumPy arrays
(copied to the device and the outputs copied back) or as device arrays: anything exposing
``__cuda_array_interface__`` (Numba device arrays, CuPy, PyTorch CUDA tensors), used without a copy when it is
C-contiguous float32; the outputs then stay on the device (Numba device arrays of the same leading shape).
Objects that only speak DLPack (a CPU PyTorch tensor, JAX on the host) are read through ``np.from_dlpack``.
"""

from __future__ import annotations

import math
import sys
import warnings
from dataclasses import dataclass, field

import numpy as np
from iosim.memory_model import ArrayCounts, CapacityError
from numba import cuda
from numba.core import config

SIMULATOR = bool(config.ENABLE_CUDASIM)
MAX_DEFAULT_SHARED_BYTES = 48 * 1024
WORD_BYTES = 4  # float32


def default_threads() -> int:
    """Threads per block: 128 on a GPU; 8 under the CUDA simulator, where every thread is a Python thread."""
    return 8 if SIMULATOR else 128


def max_shared_words() -> int | None:
    """The most float32 words of dynamic shared memory one block may use on this GPU (None on the simulator)."""
    if SIMULATOR:
        return None
    return cuda.get_current_device().MAX_SHARED_MEMORY_PER_BLOCK_OPTIN // WORD_BYTES


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class Batch:
    """Device views (B * H, rows, cols) of a launcher's inputs, and how to hand the outputs back."""

    arrays: dict
    B: int
    H: int
    N: int
    d: int
    lead: tuple  # the caller's leading shape: (B, H) or () for 2-D inputs
    host: bool  # inputs were host arrays: copy outputs back to NumPy

    @property
    def BH(self) -> int:
        return self.B * self.H


def _as_array(x, name: str):
    """(array, on_device): a NumPy array, or a Numba device view of a __cuda_array_interface__ object."""
    if isinstance(x, np.ndarray):
        return x, False
    if hasattr(x, "detach") and callable(x.detach):  # PyTorch: drop the autograd wrapper (no copy)
        x = x.detach()
    if hasattr(x, "__cuda_array_interface__"):
        return cuda.as_cuda_array(x), True
    if SIMULATOR and hasattr(x, "copy_to_host") and hasattr(x, "is_c_contiguous"):  # the simulator's device array
        return x, True
    if hasattr(x, "__dlpack__"):
        return np.from_dlpack(x), False
    return np.asarray(x), False


def prepare(**named) -> Batch:
    """Check shapes and dtypes of (B, H, N, d) or (N, d) inputs and move them to the device as (B * H, N, d)."""
    arrays, shapes, on_device = {}, {}, []
    for name, x in named.items():
        a, dev = _as_array(x, name)
        if a.ndim not in (2, 4):
            raise ValueError(f"{name} must have shape (B, H, N, d) or (N, d), got shape {tuple(a.shape)}")
        shapes[name] = tuple(a.shape)
        on_device.append(dev)
        arrays[name] = a
    first = next(iter(shapes.values()))
    for name, s in shapes.items():
        if s != first:
            raise ValueError(f"{name} must have the shape of the first input {first}, got {s}")
    lead = first[:-2]
    B, H = (first[0], first[1]) if len(first) == 4 else (1, 1)
    N, d = first[-2:]
    if N == 0 or d == 0 or B == 0 or H == 0:
        raise ValueError(f"inputs must be non-empty, got shape {first}")
    dev = {}
    for name, a in arrays.items():
        if isinstance(a, np.ndarray):
            dev[name] = cuda.to_device(np.ascontiguousarray(a, dtype=np.float32).reshape(B * H, N, d))
        else:
            if a.dtype != np.float32:
                raise ValueError(f"{name}: device arrays must be float32, got {a.dtype}")
            if not a.is_c_contiguous():
                raise ValueError(f"{name}: device arrays must be C-contiguous")
            dev[name] = a.reshape(B * H, N, d)
    return Batch(dev, B, H, N, d, lead, host=not all(on_device))


def device_array(shape, poison: bool = True, out: dict | None = None, name: str = ""):
    """A float32 device array; poisoned with NaN so an element the kernel never writes shows.

    ``out[name]``, when given, is used instead (a device array of that (B * H, ...) shape, e.g. preallocated once by
    a benchmark; it is not poisoned)."""
    if out is not None and name in out:
        a = out[name]
        if tuple(a.shape) != tuple(shape) or a.dtype != np.float32:
            raise ValueError(f"out[{name!r}] must be a float32 device array of shape {shape}, got {a.shape} {a.dtype}")
        return a
    if poison:
        return cuda.to_device(np.full(shape, np.nan, dtype=np.float32))
    return cuda.device_array(shape, dtype=np.float32)


def counters(names, count: bool):
    """int64 counters, one row per array name (reads, writes, init writes); 0 rows when not counting."""
    return cuda.to_device(np.zeros((len(names) if count else 0, 3), dtype=np.int64))


def read_counters(cnt, names, BH: int = 1) -> dict[str, ArrayCounts] | None:
    """The counters as the simulator's per-array tally (arrays with no traffic left out)."""
    if cnt.shape[0] == 0:
        return None
    c = cnt.copy_to_host()
    return {n: ArrayCounts(*(int(x) for x in c[i])) for i, n in enumerate(names) if c[i].any()}


def check_capacity(words: int, M: int | None, what: str) -> None:
    """Refuse a shared-memory layout larger than the fast memory M (the simulator's CapacityError)."""
    if M is not None and words > M:
        raise CapacityError(what, words, M, M)


_opted_in: dict = {}


def _opt_in(kernel, args, nbytes: int) -> None:
    """Allow ``nbytes`` of dynamic shared memory (the driver's default ceiling is 48 KiB per block)."""
    from cuda.bindings import driver as binding
    from numba.cuda.cudadrv.driver import driver

    argtypes = tuple(kernel.typeof_pyval(a) for a in args)
    key = (id(kernel), argtypes)
    if _opted_in.get(key, 0) >= nbytes:
        return
    compiled = kernel.compile(argtypes)
    cufunc = compiled._codelibrary.get_cufunc()
    # The driver takes at most the opt-in ceiling *minus the function's static shared memory* as its dynamic limit
    # (CUDA Runtime API, cudaFuncAttributeMaxDynamicSharedMemorySize); asking for more fails inside the driver.
    # The kernels declare no static shared memory, but sm_90 cubins carry 1 KiB of system-reserved shared memory
    # in the kernel's shared section (.nv.reservedSmem; see iosim.gpu.resources), so check it here.
    static = cufunc.attrs.shared
    limit = cuda.get_current_device().MAX_SHARED_MEMORY_PER_BLOCK_OPTIN - static
    if nbytes > limit:
        raise CapacityError(
            "shared memory of one thread block", nbytes // WORD_BYTES, limit // WORD_BYTES, limit // WORD_BYTES
        )
    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    driver.cuKernelSetAttribute(attr, nbytes, cufunc.handle, cufunc.device.id)
    _opted_in[key] = nbytes


def launch(kernel, grid, threads: int, words: int, *args) -> None:
    """Launch ``kernel`` on ``grid`` with ``words`` float32 words of dynamic shared memory per block."""
    nbytes = max(words, 1) * WORD_BYTES
    if not SIMULATOR and nbytes > MAX_DEFAULT_SHARED_BYTES:
        _opt_in(kernel, args, nbytes)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Grid size .* will likely result in GPU under-utilization")
        if not SIMULATOR:
            kernel[grid, threads, 0, nbytes](*args)
            return
        # The simulator runs every CUDA thread as a Python thread and a manager thread polls them at each
        # syncthreads; with the default 5 ms GIL switch interval that polling dominates (4-7x slower).
        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-5)
        try:
            kernel[grid, threads, 0, nbytes](*args)
        finally:
            sys.setswitchinterval(interval)


def result(batch: Batch, arr, tail: tuple):
    """Hand an output (B * H, *tail) back in the caller's leading shape: NumPy for host inputs, else on device."""
    shape = (*batch.lead, *tail)
    if batch.host:
        return arr.copy_to_host().reshape(shape)
    return arr.reshape(shape)


def f32_scale(scale: float | None, d: int) -> np.float32:
    return np.float32(1.0 / math.sqrt(d) if scale is None else scale)


@dataclass
class KernelRun:
    """What a launcher returns: named outputs, the counters (None unless counting) and the shared words used."""

    outputs: dict
    counts: dict[str, ArrayCounts] | None
    shared_words: int
    tiles: dict = field(default_factory=dict)


class Launcher:
    """One launcher call: its inputs on the device, outputs, counters and launches, then the KernelRun.

    ``Launcher(names, count, threads, poison, out, Q=Q, ...)`` prepares the inputs (:func:`prepare`) and makes
    the counters for the array ``names``; :meth:`output` allocates an output (B * H, *tail) (returned in the
    order allocated); :meth:`launch` runs a kernel with that many shared words; :meth:`run` hands back the
    outputs in the caller's shape, the counters and the most shared words any launch used.
    """

    def __init__(self, names, count: bool, threads: int | None, poison: bool, out: dict | None, **inputs):
        self.batch = prepare(**inputs)
        self.arrays = self.batch.arrays
        self.names = names
        self.threads = threads or default_threads()
        self.poison = poison
        self.out = out
        self.words = 0
        self._outputs: dict = {}
        self.cnt = counters(names, count)

    def output(self, name: str, tail: tuple):
        arr = device_array((self.batch.BH, *tail), self.poison, self.out, name)
        self._outputs[name] = (arr, tail)
        return arr

    def launch(self, kernel, grid, words: int, *args) -> None:
        self.words = max(self.words, words)
        launch(kernel, grid, self.threads, words, *args)

    def run(self, tiles: dict) -> KernelRun:
        outputs = {name: result(self.batch, arr, tail) for name, (arr, tail) in self._outputs.items()}
        return KernelRun(outputs, read_counters(self.cnt, self.names), self.words, tiles)

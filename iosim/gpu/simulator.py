"""numba.cuda's simulator made safe for iosim's kernels: its swap of a device function's ``cuda`` global, counted.

The simulator runs each thread of a block as a Python thread. On entering a device function it swaps the ``cuda``
global of that function's module for its fake module, and swaps it back on leaving. Two threads in device functions
of one module race: the second finds no ``cuda`` to swap, the first restores the real module while the second still
runs, and the kernel fails with ``module 'numba.cuda' has no attribute 'threadIdx'`` (or ``blockDim``, ``atomic``),
more often the more loaded the machine (numba-cuda 0.30; fixed upstream in NVIDIA/numba-cuda pull request 690).
:func:`install` replaces the swap with one counted per module under a lock: the first thread in swaps, the last one
out restores. It is installed when iosim selects the simulator (:func:`iosim.gpu.launch.select_target`) and when it
counts a numba.cuda kernel on it (:mod:`iosim.kernels.numba_cuda_backend`).
"""

from __future__ import annotations

import contextlib
import threading

_lock = threading.Lock()
_inside: dict[int, int] = {}
_saved: dict[int, dict] = {}


@contextlib.contextmanager
def counted_swap(fn, fake_cuda_module):
    """The simulator's ``swapped_cuda_module(fn, fake_cuda_module)``, counted per module (thread-safe)."""
    from numba import cuda

    globs = fn.__globals__
    key = id(globs)
    with _lock:
        if not _inside.get(key):
            _saved[key] = {k: v for k, v in globs.items() if v is cuda}
            globs.update(dict.fromkeys(_saved[key], fake_cuda_module))
        _inside[key] = _inside.get(key, 0) + 1
    try:
        yield
    finally:
        with _lock:
            _inside[key] -= 1
            if not _inside[key]:
                globs.update(_saved.pop(key))


def install() -> None:
    """Replace the simulator's swap with :func:`counted_swap` (idempotent; only where the simulator is loaded)."""
    from numba.cuda.simulator import kernel

    if hasattr(kernel, "swapped_cuda_module"):
        kernel.swapped_cuda_module = counted_swap

"""Anyone's attention kernel against iosim: its numerics against the float64 reference (:mod:`~iosim.kernels.check`,
``iosim.check``), and its I/O counted without a GPU beside iosim's closed forms and bounds.

>>> from iosim.kernels import count_file, compare   # doctest: +SKIP
>>> counts, numbers, arrays = count_file("iosim/kernels/examples/triton_flash2.py", params=dict(N=256, d=64))
>>> print(compare(counts, like="flash2", N=256, d=64, Br=64, Bc=32).table())

The counting (``count``, ``count_file``) is in :mod:`iosim.kernels.counting`, the model beside it (``compare``) in
:mod:`iosim.kernels.comparison`, one module per backend (``triton_backend``, ``pallas_backend``,
``numba_cuda_backend``). They load on first use: importing iosim imports none of them.
"""

_LAZY = {
    "BACKENDS": "counting", "ArrayTraffic": "counting", "KernelCounts": "counting", "count": "counting",
    "count_file": "counting", "count_batch": "counting", "paused": "counting", "LIKE": "comparison",
    "Comparison": "comparison", "compare": "comparison", "count_configs": "counting", "Whole": "comparison",
    "block_sizes": "comparison", "AccessError": "counting",
}  # fmt: skip
__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"iosim.kernels.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'iosim.kernels' has no attribute {name!r}")

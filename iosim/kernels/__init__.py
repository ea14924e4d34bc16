"""Count the I/O of real kernels (Triton, Pallas, numba.cuda) without a GPU, beside iosim's closed forms and bounds.

>>> from iosim.kernels import count_file, compare   # doctest: +SKIP
>>> counts, numbers, arrays = count_file("iosim/kernels/examples/triton_flash2.py", params=dict(N=256, d=64))
>>> print(compare(counts, like="flash2", N=256, d=64, Br=64, Bc=32).table())
"""

from iosim.kernels.count import BACKENDS, ArrayTraffic, KernelCounts, count, count_file

__all__ = ["BACKENDS", "ArrayTraffic", "KernelCounts", "compare", "count", "count_file", "kernel"]


def __getattr__(name):  # the model-beside-it comparison imports the theory modules: load it on first use
    if name in ("compare", "Comparison"):
        from iosim.kernels import compare as _c

        return getattr(_c, name) if name == "Comparison" else _c.compare
    raise AttributeError(name)

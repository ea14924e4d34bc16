"""Count the I/O of real kernels (Triton, Pallas, numba.cuda) without a GPU, beside iosim's closed forms and bounds.

>>> from iosim.kernels import count_file, compare   # doctest: +SKIP
>>> counts, numbers, arrays = count_file("iosim/kernels/examples/triton_flash2.py", params=dict(N=256, d=64))
>>> print(compare(counts, like="flash2", N=256, d=64, Br=64, Bc=32).table())

The counting (``count``, ``count_file``) is in :mod:`iosim.kernels.count`, the model beside it (``compare``) in
:mod:`iosim.kernels.comparison`, one module per backend (``triton_backend``, ``pallas_backend``,
``numba_cuda_backend``).
"""

from iosim.kernels.comparison import LIKE, Comparison, compare
from iosim.kernels.count import BACKENDS, ArrayTraffic, KernelCounts, count, count_file

__all__ = ["BACKENDS", "LIKE", "ArrayTraffic", "Comparison", "KernelCounts", "compare", "count", "count_file"]

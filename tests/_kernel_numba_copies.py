"""numba.cuda launchers for tests/test_kernels_stray.py: several launches in one count. The CUDA simulator copies
every host array a launch is handed and frees the copy after it, so a later launch's copy of another array often
lies at the very bytes of an earlier one's (the allocator hands the freed block back): an array's identity there is
the host array copied, not the address."""

import numpy as np
from numba import cuda


@cuda.jit
def copy_rows(X, Out):
    i, t = cuda.blockIdx.x, cuda.threadIdx.x
    Out[i * 8 + t] = X[i * 8 + t]


def launch_two_arrays(N=4, d=4):
    """copy_rows on X, then on Z (another array of X's size): two arrays behind the parameter X."""
    X, Z, Out = np.arange(16.0), np.arange(16.0, 32.0), np.zeros(16)
    copy_rows[2, 8](X, Out)
    copy_rows[2, 8](Z, Out)
    return {"Out": Out}


def launch_one_array_twice(N=4, d=4):
    """copy_rows on X twice, a scratch array of X's size allocated between: one array X."""
    X, Out = np.arange(16.0), np.zeros(16)
    copy_rows[2, 8](X, Out)
    scratch = np.zeros(16)  # may take the bytes the first launch's copy of X held
    copy_rows[2, 8](X, Out)
    return {"Out": Out, "scratch": float(scratch.sum())}

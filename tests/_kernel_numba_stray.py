"""numba.cuda kernels for tests/test_kernels_stray.py (the CUDA simulator: NUMBA_ENABLE_CUDASIM=1 set first by the
counting subprocess). The simulator bounds-checks every array index (an overrun is an IndexError, one line, exit
2), so a stray access there is a site that reads one argument in one block and another in the next: a kernel that
picks its array at run time, flagged until its launcher declares it."""

import numpy as np
from numba import cuda


@cuda.jit
def pick(A, B, Out):
    # block 0 copies A, block 1 copies B: one read site whose array is chosen at run time
    i, t = cuda.blockIdx.x, cuda.threadIdx.x
    src = A if i == 0 else B
    Out[i * 8 + t] = src[t]


@cuda.jit
def copy_rows(X, Out):
    i, t = cuda.blockIdx.x, cuda.threadIdx.x
    Out[i * 8 + t] = X[i * 8 + t]


def launch_pick(N=4, d=4, declare=None):
    A, B, Out = np.arange(8.0), np.arange(8.0, 16.0), np.zeros(16)
    pick[2, 8](A, B, Out)
    return {"A": A, "B": B, "Out": Out, **({"selects_pointers": declare} if declare else {})}


def launch_pick_declared(N=4, d=4):
    return launch_pick(N, d, ["pick"])


def launch_copy(N=4, d=4):
    X, Out = np.arange(16.0), np.zeros(16)
    copy_rows[2, 8](X, Out)
    return {"X": X, "Out": Out}


@cuda.jit(device=True)
def _copy(src, Out, i, t):
    Out[i * 8 + t] = src[t]


@cuda.jit
def two_calls(A, B, Out):
    # one device function called from two lines with two arrays: two sites, nothing stray
    i, t = cuda.blockIdx.x, cuda.threadIdx.x
    if i == 0:
        _copy(A, Out, i, t)
    else:
        _copy(B, Out, i, t)


def launch_two_calls(N=4, d=4):
    A, B, Out = np.arange(8.0), np.arange(8.0, 16.0), np.zeros(16)
    two_calls[2, 8](A, B, Out)
    return {"A": A, "B": B, "Out": Out}

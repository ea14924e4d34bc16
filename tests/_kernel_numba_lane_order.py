"""A numba.cuda kernel for tests/test_kernels_stray.py whose threads reach their accesses in reverse thread order
(under the CUDA simulator only, where a kernel is plain Python run one Python thread per CUDA thread: each thread
waits for its turn on a condition before it reads). On a GPU a block's threads have no order; under the simulator
they run in whatever order Python's scheduler picks, which once listed a stray access's lanes out of order."""

import threading

import numpy as np
from numba import cuda

THREADS = 8
_turn = threading.Condition()
_gone = [0]  # threads of the running block that have read (the simulator runs blocks one after another)


def _wait_turn(t):
    """Block thread t until every thread above it has read (bounded: a missed turn only unorders the lanes)."""
    with _turn:
        _turn.wait_for(lambda: _gone[0] == THREADS - 1 - t, timeout=10.0)


def _done():
    with _turn:
        _gone[0] = (_gone[0] + 1) % THREADS
        _turn.notify_all()


@cuda.jit
def pick_reversed(A, B, Out):
    # block 0 copies A, block 1 copies B (one read site whose array is chosen at run time), thread 7 first
    i, t = cuda.blockIdx.x, cuda.threadIdx.x
    _wait_turn(t)
    src = A if i == 0 else B
    Out[i * THREADS + t] = src[t]
    _done()


def launch_pick_reversed(N=4, d=4):
    A, B, Out = np.arange(8.0), np.arange(8.0, 16.0), np.zeros(16)
    pick_reversed[2, THREADS](A, B, Out)
    return {"A": A, "B": B, "Out": Out}

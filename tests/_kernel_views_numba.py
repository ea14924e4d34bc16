"""numba.cuda launchers for tests/test_kernels_views.py: K and V as separate arrays and as views of one cache array
(interleaved halves of its rows; V nested in K as its first columns). Written for iosim's tests."""

import numpy as np
from numba import cuda


@cuda.jit
def row_sums(K, V, out):
    # thread i: out[i] = sum of K's row i + sum of V's row i (reads every element of both once)
    i = cuda.threadIdx.x
    if i < out.shape[0]:
        acc = 0.0
        for c in range(K.shape[1]):
            acc += K[i, c]
        row = V[i]  # a sub-array of V: its elements are still V's
        for c in range(V.shape[1]):
            acc += row[c]
        out[i] = acc


def _run(k, v):
    out = np.zeros(k.shape[0])
    row_sums[1, k.shape[0]](k, v, out)
    return {"K": k, "V": v, "out": out}


def launch_separate(N=4, d=4, dv=2):
    rng = np.random.default_rng(0)
    return _run(rng.standard_normal((N, d)), rng.standard_normal((N, dv)))


def launch_nested(N=4, d=4, dv=2):
    k = cuda.to_device(np.random.default_rng(0).standard_normal((N, d)))  # device views (the simulator copies a
    return _run(k, k[:, :dv])  # strided host array, as numba.cuda does: only device arrays can share storage)


def launch_interleaved(N=4, d=4, dv=4):
    kv = cuda.to_device(np.random.default_rng(0).standard_normal((N, 2 * d)))
    return _run(kv[:, :d], kv[:, d:])

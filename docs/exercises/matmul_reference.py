"""Exercise 2, tiled matrix product (reference): T x T tiles of A and B staged in shared memory, each word of a
tile used T times; A is read ceil(n/T) times and B ceil(m/T) times in all."""

import numpy as np
from numba import cuda

T = 8


@cuda.jit
def matmul(A, B, C):
    sA = cuda.shared.array((T, T), np.float32)
    sB = cuda.shared.array((T, T), np.float32)
    ti, tj = cuda.threadIdx.x, cuda.threadIdx.y
    i, j = cuda.blockIdx.x * T + ti, cuda.blockIdx.y * T + tj
    acc = 0.0
    for p0 in range(0, A.shape[1], T):
        if i < A.shape[0] and p0 + tj < A.shape[1]:
            sA[ti, tj] = A[i, p0 + tj]
        if p0 + ti < B.shape[0] and j < B.shape[1]:
            sB[ti, tj] = B[p0 + ti, j]
        cuda.syncthreads()
        for q in range(min(T, A.shape[1] - p0)):
            acc += sA[ti, q] * sB[q, tj]
        cuda.syncthreads()
    if i < C.shape[0] and j < C.shape[1]:
        C[i, j] = acc


def launch(m: int = 16, k: int = 16, n: int = 16, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    A = cuda.to_device(rng.standard_normal((m, k)).astype(np.float32))
    B = cuda.to_device(rng.standard_normal((k, n)).astype(np.float32))
    C = cuda.device_array((m, n), np.float32)
    matmul[((m + T - 1) // T, (n + T - 1) // T), (T, T)](A, B, C)
    return {"A": A, "B": B, "C": C, "T": T}

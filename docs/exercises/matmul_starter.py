"""Exercise 2, tiled matrix product (starter): C = A B with A m x k and B k x n, one thread per entry of C.

This starter is correct but each thread reads its whole row of A and column of B from global memory: 2mnk words.
Tile it: a block of T x T threads loads T x T tiles of A and B into shared memory (2 T^2 words) and each word of
a tile is used T times. Check it with ``iosim.views.exercises.check("matmul", "THIS_FILE.py", "matmul.html")``.
"""

import numpy as np
from numba import cuda

T = 8  # the tile side: blocks of T x T threads (shared memory 2 T^2 words in the tiled version)


@cuda.jit
def matmul(A, B, C):
    i, j = cuda.grid(2)
    if i < C.shape[0] and j < C.shape[1]:
        acc = 0.0
        for p in range(A.shape[1]):
            acc += A[i, p] * B[p, j]
        C[i, j] = acc


def launch(m: int = 16, k: int = 16, n: int = 16, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    A = cuda.to_device(rng.standard_normal((m, k)).astype(np.float32))
    B = cuda.to_device(rng.standard_normal((k, n)).astype(np.float32))
    C = cuda.device_array((m, n), np.float32)
    matmul[((m + T - 1) // T, (n + T - 1) // T), (T, T)](A, B, C)
    return {"A": A, "B": B, "C": C, "T": T}

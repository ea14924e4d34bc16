"""iosim's own numba.cuda FlashAttention-2 forward (``iosim.algorithms.cuda.flash``), counted automatically under
the CUDA simulator (``--backend numba-cuda``). The kernel also keeps hand-written counters (``count=True``): the
automatic count of every array must equal them (tests/test_kernels_numba_cuda.py), a cross-check of both. The
kernel's own parameters name the arrays (Q, K, V, O, L); ``blocks`` (the tile mask) and ``cnt`` (the counters)
are counted under their own names. Slow: keep N and d tiny.
"""

from __future__ import annotations

import numpy as np


def launch(N: int, d: int, Br: int = 16, Bc: int = 16, causal: bool = False, seed: int = 0) -> dict:
    from numba import cuda

    from iosim.algorithms.cuda import flash

    rng = np.random.default_rng(seed)
    Q, K, V = (cuda.to_device(rng.standard_normal((1, 1, N, d)).astype(np.float32)) for _ in range(3))
    run = flash.flash2_forward(Q, K, V, Br=Br, Bc=Bc, causal=causal, count=True)
    return {"Q": Q, "K": K, "V": V, "O": run.outputs["O"], "L": run.outputs["L"], "scale": d**-0.5,
            "Br": Br, "Bc": Bc, "causal": causal, "dtype": "float32"}  # fmt: skip

"""The same FlashAttention-2 forward with the wasteful causal mode: every column block is loaded and the upper
triangle masked out of S_ij instead of skipped (as an older version of a popular tutorial did). Its K and V reads
are those of the non-causal kernel, about twice the causal closed form for Tr >> 1: what ``iosim kernel`` is for.
"""

from __future__ import annotations

from iosim.kernels.examples._common import default_scale, inputs
from iosim.kernels.examples.triton_flash2 import run


def launch(N: int, d: int, Br: int = 64, Bc: int = 32, causal: bool = True, H: int = 1, dtype: str = "float16",
           seed: int = 0) -> dict:  # fmt: skip
    Q, K, V = inputs("QKV", (H, N, d), dtype, seed)
    O, L = run(Q, K, V, Br, Bc, causal, skip=False)
    return {"Q": Q, "K": K, "V": V, "O": O, "L": L, "scale": default_scale(d),
            "Br": Br, "Bc": Bc, "causal": causal, "H": H}  # fmt: skip

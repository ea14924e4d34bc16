"""jax's Pallas GPU attention op (``jax.experimental.pallas.ops.gpu.attention.mha``, lowered to Triton on a GPU),
counted in place under the generic Pallas interpreter (``--backend pallas``). Nothing of it is copied here: the
launcher only builds inputs and calls it with ``interpret=True``.

Its forward is FlashAttention-2's schedule: one program per (query block, batch, head) loads its Q_i once, loops
over the key blocks (all of them, or up to the diagonal when causal), and stores O_i once; it writes no logsumexp
unless residuals are asked for. So its traffic is ``flash2_forward(N, d, Br=block_q, Bc=block_k)``'s without L.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.gpu import attention


def launch(N: int, d: int, Br: int = 64, Bc: int = 32, causal: bool = False, H: int = 1, dtype: str = "float32",
           seed: int = 0) -> dict:  # fmt: skip
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    q, k, v = (jax.random.normal(key, (1, N, H, d), jnp.float32).astype(dtype) for key in keys)
    sizes = attention.BlockSizes(block_q=Br, block_k=Bc)
    o = attention.mha(q, k, v, segment_ids=None, sm_scale=d**-0.5, causal=causal, block_sizes=sizes, interpret=True)
    o.block_until_ready()
    # (B, N, H, d) -> (B, H, N, d), the layout the numerics check reads
    q, k, v, o = (jnp.swapaxes(x, 1, 2) for x in (q, k, v, o))
    return {"Q": q, "K": k, "V": v, "O": o, "names": {"q": "Q", "k": "K", "v": "V", "o": "O"}, "scale": d**-0.5,
            "Br": Br, "Bc": Bc, "causal": causal, "H": H, "dtype": dtype}  # fmt: skip

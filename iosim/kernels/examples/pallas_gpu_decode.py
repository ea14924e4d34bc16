"""jax's Pallas GPU decoding op (``jax.experimental.pallas.ops.gpu.decode_attention.mqa``, lowered to Triton on a
GPU), counted in place under the generic Pallas interpreter (``--backend pallas``). Nothing of it is copied here.

The op is split-KV decoding (flash-decoding): a pallas_call with grid (head blocks, ``k_splits``) whose program
(i, s) loads its block of ``block_h`` query heads (masked to the heads that exist), the length (``kv_seq_len``, a
scalar per batch row, read once per program; metadata, counted as ``lengths``), the keys and values of chunk s in
blocks of ``block_k``, and stores its partial output ``o`` and its running max ``m`` and sum ``l`` per head. The
second pass (rescale the partials by exp(m - max m), sum, divide by the summed l) is plain jax after the
pallas_call: on a GPU XLA fuses it, and it is not a Pallas kernel, so nothing of it is counted here.

Against ``decode-splitkv`` (per head, H = 1): Q, K, V, ``lengths`` and the partial outputs' writes equal its pass 1
to the word; the op writes two words per program (m and l, counted as ``L_part`` and ``M_part``) where the closed
form writes one (the logsumexp); the closed form's pass 2 (reads of ``O_part``, ``L_part``, the write of ``O``) is
not counted. With H query heads in one head block (MQA), K and V are read once for all of them, not once per head.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.gpu import decode_attention


def launch(N: int, d: int, Bc: int = 32, splits: int = 4, H: int = 1, dtype: str = "float32", seed: int = 0) -> dict:
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    q = jax.random.normal(keys[0], (1, H, d), jnp.float32).astype(dtype)  # one query row per head, batch 1
    k, v = (jax.random.normal(key, (1, N, d), jnp.float32).astype(dtype) for key in keys[1:])
    lengths = jnp.full((1,), N, dtype=jnp.int32)
    o = decode_attention.mqa(q, k, v, kv_seq_len=lengths, sm_scale=d**-0.5, block_k=Bc, k_splits=splits,
                             interpret=True)  # fmt: skip
    o.block_until_ready()
    names = {
        "q": "Q",
        "k": "K",
        "v": "V",
        "kv_seq_len": "lengths",
        "o": "O_part",
        "residual_refs_0": "L_part",
        "residual_refs_1": "M_part",
    }  # l, m: the residual refs (unnamed *args of the kernel)
    return {"Q": q[:, :, None, :], "K": k[:, None], "V": v[:, None], "O": o[:, :, None, :], "names": names,
            "scale": d**-0.5, "Bc": Bc, "splits": splits, "H": H, "dtype": dtype}  # fmt: skip

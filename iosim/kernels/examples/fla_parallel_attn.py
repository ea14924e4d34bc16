"""flash-linear-attention's softmax attention (``fla.ops.attn.parallel``, PyPI ``fla-core``), counted in place from
the installed package under Triton's interpreter: nothing of it is copied here. The launcher builds (B, N, H, d)
inputs and calls the library's own host function ``parallel_attn_fwd`` (a kernel reached through a host
function). fla imports on a CPU as it is (it warns and falls back). It picks its block sizes from the shared memory
of the tensors' device; a CPU tensor has no device index, so it takes its smallest branch: BT = 128 query rows,
BS = min(32, max(16, next_pow2(N))) keys per step, num_warps = 2 (on an H100, BS = 64 and num_warps = 8). iosim
reads the block sizes off what ran.

The kernel (``parallel_attn_fwd_kernel``) is FlashAttention-2's causal forward: one program per (query block of BT
rows, batch x query head) loads its Q block once, steps over the key blocks below the diagonal and then the
diagonal ones (masked), and stores O and the logsumexp once. Its logsumexp is in the log2 domain ((B, N, H) in
layout), and a KV head serves g query heads, each loading it (per-head GQA). Counts: docs/kernels-library.md.
"""

from __future__ import annotations

import torch
from fla.ops.attn.parallel import parallel_attn_fwd


def launch(N: int, d: int, B: int = 1, H: int = 2, kv_heads: int | None = None, dtype: str = "float32",
           seed: int = 0) -> dict:  # fmt: skip
    H_kv = H if kv_heads is None else kv_heads
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, dtype)
    q = torch.randn(B, N, H, d, generator=g).to(dt)
    k, v = (torch.randn(B, N, H_kv, d, generator=g).to(dt) for _ in range(2))
    o, lse = parallel_attn_fwd(q, k, v, g_cumsum=None, sink_bias=None, scale=d**-0.5)
    return {"Q": q, "K": k, "V": v, "O": o, "L": lse, "scale": d**-0.5, "causal": True, "B": B, "H": H,
            "kv_heads": H_kv, "layout": {"Q": "BNHD", "K": "BNHD", "V": "BNHD", "O": "BNHD", "L": "BNH"},
            "logsumexp": "log2"}  # fmt: skip

"""sglang's Triton split-KV decoding (``sglang.kernels.ops.attention.decode_attention``, PyPI ``sglang`` 0.5.23),
counted in place from the installed package: nothing of it is copied here. sglang's top-level package imports its
server stack, so the launcher imports the kernel module with that package skipped
(:func:`iosim.kernels.standin.bare_package`; the module then needs msgspec, orjson, pybase64, starlette, pydantic
and pyzmq, which ``pip install sglang --no-deps`` leaves out).

The launcher calls the library's host function ``decode_attention_fwd_normal`` (multi-head: one KV head per query
head) on a token-indexed cache: ``kv_indptr`` (B + 1 words) delimits each sequence's tokens in ``kv_indices``, the
cache rows of K and V; ``num_kv_splits`` (B words) is the number of splits per sequence. Stage 1, one program per
(sequence, head, split) of ``max_kv_splits``: reads ``kv_indptr`` twice and ``num_kv_splits`` once, and, when its
split is not empty, q, the split's ``kv_indices`` and its keys and values in blocks of 64, then stores its partial
output and logsumexp (an empty split stores nothing). A split's length is rounded up to ``_MIN_BLOCK_KV`` = 32
keys. Stage 2, one program per (sequence, head): reads ``kv_indptr`` twice and ``num_kv_splits`` once, the live
splits' partials, and stores O. Counts: docs/kernels-library.md.
"""

from __future__ import annotations

import torch

from iosim.kernels.standin import bare_package

bare_package("sglang")  # its __init__ starts the server stack; the kernel module needs none of it

from sglang.kernels.ops.attention import decode_attention as da  # noqa: E402


def launch(N: int, d: int, splits: int = 4, B: int = 2, H: int = 2, dtype: str = "float32", seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, dtype)
    q = torch.randn(B, H, d, generator=g).to(dt)
    k, v = (torch.randn(B * N, H, d, generator=g).to(dt) for _ in range(2))  # the cache: one row per token
    kv_indptr = torch.arange(0, (B + 1) * N, N, dtype=torch.int32)
    kv_indices = torch.arange(B * N, dtype=torch.int32)
    num_kv_splits = torch.full((B,), splits, dtype=torch.int32)
    logits = torch.full((B, H, splits, d), float("nan"), dtype=torch.float32)
    lse = torch.full((B, H, splits), float("nan"), dtype=torch.float32)
    o = torch.empty(B, H, d, dtype=dt)
    da.decode_attention_fwd_normal(q, k, v, o, kv_indptr, kv_indices, logits, lse, num_kv_splits, splits, d**-0.5,
                                   1.0)  # fmt: skip
    return {"Q": q, "K": k.view(B, N, H, d), "V": v.view(B, N, H, d), "O": o, "O_part": logits, "L_part": lse,
            "indptr": kv_indptr, "kv_indices": kv_indices, "num_kv_splits": num_kv_splits, "scale": d**-0.5,
            "B": B, "H": H, "splits": splits, "empty_splits": "skipped", "chunk_multiple": da._MIN_BLOCK_KV,
            "metadata": {"indptr": [2, 2], "num_kv_splits": [1, 1]},
            "layout": {"Q": "BHD", "O": "BHD", "K": "BNHD", "V": "BNHD"}}  # fmt: skip

"""flash-linear-attention's native sparse attention, the selected-attention forward (``fla.ops.nsa.parallel``, PyPI
``fla-core``), counted in place from the installed package under Triton's interpreter: nothing of it is copied here.
The launcher builds a top-k block selection (:func:`selection`) and calls the library's own host function
``parallel_nsa_fwd``, the one its ``parallel_nsa`` reaches through ``ParallelNSAFunction`` when the caller gives
``block_indices`` (``parallel_nsa`` itself would first launch its mean-pooling kernel for the compressed branch,
which the selected branch does not read). Counts and the hand derivation: docs/sparse-indices.md.

NSA's layout: q (B, T_q, H_q, d), k (B, T_k, H_kv, d), v (B, T_k, H_kv, d_v), ``block_indices`` (B, T_q, H_kv, S):
one selection of S key blocks of ``block`` keys per (query token, key/value head), shared by the g = H_q / H_kv
query heads of the group (``parallel_nsa`` asserts g a power of 2 and at least 16). The queries are the last T_q
tokens of the sequence (the kernel's ``Q_OFFSET = T_k - T_q``); the kernel skips a selected block that starts after
the query's position and masks, inside a block, the keys after it (a score mask: the block's keys are all loaded).
:func:`selection` therefore draws, for each query token and KV head, S distinct blocks among those starting at or
before the token's position: every block it lists is loaded, so the selection is iosim's (``iosim.masking.topk_sparse``,
policy ``gqa``), with the same array.

The kernel (``parallel_nsa_fwd_kernel``): grid (T_q, NV, B H_kv), NV = ceil(d_v / BV) with BV = min(128,
next_pow2(d_v)) for a CPU tensor (256 on Hopper); program (t, i_v, b H_kv + h) loads its g query rows once, then for
each of its S selections the index (one word) and, for a block starting at or before the query's position, that
block's keys below T_k of K and of V (BS = ``block`` rows), and stores g rows of O and g logsumexps (natural log,
float32). One program per (batch item, KV head, query token) holding the group's heads, loading its selection once:
iosim's ``gqa`` policy.
"""

from __future__ import annotations

import numpy as np

BLOCK = 16  # NSA's selection block (block_size; 64 in the paper, 16 keeps the sizes small)
TOPK = 4  # S, the blocks selected per query token (16 in the paper)


def selection(problem=None, *, N_q: int | None = None, N: int | None = None, B: int = 1, kv_heads: int = 1,
              block: int = BLOCK, topk: int = TOPK, seed: int = 0) -> np.ndarray:  # fmt: skip
    """int32 (B, H_kv, T_q, S): for query token t (absolute position T_k - T_q + t) of each batch item and KV head,
    ``topk`` distinct blocks among 0 .. (T_k - T_q + t) // block, ascending, drawn from ``seed``. Called with an
    :class:`iosim.Problem` (``iosim run topk-sparse --indices mod:THIS_FILE:selection``) it reads N_q, N_k, B and
    H_kv from it. iosim's index layout; the kernel's is this array moved to (B, T_q, H_kv, S)."""
    if problem is not None:
        N_q, N, B, kv_heads = problem.N_q, problem.N_k, problem.B, problem.H_kv
    first = (N - N_q) // block + 1  # blocks visible to the first query token
    if first < topk:
        raise ValueError(f"the first query token (position {N - N_q}) sees {first} block(s) of {block} keys; {topk} "
                         "are selected: make N - N_q at least (topk - 1) * block")  # fmt: skip
    rng = np.random.default_rng(seed)
    out = np.empty((B, kv_heads, N_q, topk), dtype=np.int32)
    for b in range(B):
        for h in range(kv_heads):
            for t in range(N_q):
                visible = (N - N_q + t) // block + 1
                out[b, h, t] = np.sort(rng.choice(visible, size=topk, replace=False))
    return out


def launch(N: int, d: int, N_q: int | None = None, B: int = 1, H: int = 16, kv_heads: int = 1, dv: int | None = None,
           dtype: str = "float32", seed: int = 0, indices: list | None = None) -> dict:  # fmt: skip
    """Q, K, V and the selection for T_k = N keys and T_q = N_q queries (default N / 2), launched through
    ``parallel_nsa_fwd`` with ``block_counts = S`` (every query token uses all S of its blocks). ``indices``: a
    selection of one's own in iosim's layout (B, H_kv, T_q, S) as nested lists (``count_file(params=...)``), used
    as given: a block that starts after its query's position is skipped by the kernel (see the module docstring)."""
    import torch
    from fla.ops.nsa.parallel import parallel_nsa_fwd

    N_q = N // 2 if N_q is None else N_q
    d_v = d if dv is None else dv
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, dtype)
    q = torch.randn(B, N_q, H, d, generator=g).to(dt)
    k = torch.randn(B, N, kv_heads, d, generator=g).to(dt)
    v = torch.randn(B, N, kv_heads, d_v, generator=g).to(dt)
    if indices is None:
        sel = selection(N_q=N_q, N=N, B=B, kv_heads=kv_heads, seed=seed)
    else:
        sel = np.asarray(indices, dtype=np.int32).reshape(B, kv_heads, N_q, -1)
    block_indices = torch.from_numpy(np.ascontiguousarray(sel.transpose(0, 2, 1, 3)))  # (B, T_q, H_kv, S)
    S = block_indices.shape[-1]
    o, lse = parallel_nsa_fwd(q, k, v, block_indices, block_counts=S, block_size=BLOCK, scale=d**-0.5)
    return {"Q": q, "K": k, "V": v, "O": o, "L": lse, "indices": block_indices, "scale": d**-0.5, "B": B, "H": H,
            "kv_heads": kv_heads, "block": BLOCK, "topk": S,
            "layout": {"Q": "BNHD", "K": "BNHD", "V": "BNHD", "O": "BNHD", "L": "BNH"}}  # fmt: skip

"""DeepSeek sparse attention's lightning indexer, its decode scan as two Triton kernels written for iosim (not a
library's): what a DSA decode step reads to choose its top-k keys, before the sparse attention reads them.

The indexer (DeepSeek-V3.2-Exp, ``inference/model.py`` and ``inference/kernel.py``'s ``fp8_index``): the current
token has H_I indexer heads of width d_I (``q_I``) and a weight per head (``w``); every earlier token s has one
indexer key (``K_I``, d_I values) and its dequantization scale (``k_scale``, one per token: DeepSeek stores the key
in fp8 with a float32 scale per 128 values). The score of key s is ``sum_h w[h] relu(q_I[h] . K_I[s]) k_scale[s]``
and the selection is the k highest. As vLLM's DSA path runs it, the scores are written to global memory
(``logits``) and a top-k kernel reads them back; the two kernels here do the same:

* ``index_scores``: grid (B, ceil(N / BLOCK_N)); program (b, j) loads the sequence's q_I (H_I d_I) and w (H_I),
  the block's keys (c_j d_I, c_j = min(BLOCK_N, N - j BLOCK_N)) and scales (c_j), and stores c_j scores. Every
  program of a sequence loads q_I and w again: ceil(N / BLOCK_N) times per sequence.
* ``top_k``: grid (B,); program b loads the N scores of its sequence and stores the k indices of the highest
  (``tl.topk``-free: k rounds of argmax).

Words per decode step: q_I B T H_I d_I, w B T H_I (T = ceil(N / BLOCK_N)), K_I B N d_I, k_scale B N, logits B N
written and B N read, indices B k written (tests/test_kernels_dsa_indexer.py: a hand count, a float64 reference,
and iosim's own scan, ``iosim run topk-sparse --indexer H:d:BLOCK_N`` at N_q = 1, equal array by array;
docs/sparse-indices.md, "The indexer's own scan").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def index_scores(Q, W, K, KS, S, N, H: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr):
    b, j = tl.program_id(0), tl.program_id(1)
    heads, dims = tl.arange(0, H), tl.arange(0, D)
    q = tl.load(Q + b * H * D + heads[:, None] * D + dims[None, :])  # q_I: H x D
    w = tl.load(W + b * H + heads)  # one weight per indexer head
    keys = j * BLOCK_N + tl.arange(0, BLOCK_N)
    live = keys < N
    k = tl.load(K + b * N * D + keys[:, None] * D + dims[None, :], mask=live[:, None], other=0.0)  # BLOCK_N x D
    ks = tl.load(KS + b * N + keys, mask=live, other=0.0)  # the keys' scales
    s = tl.sum(tl.maximum(tl.dot(k, tl.trans(q)), 0.0) * w[None, :], 1) * ks  # sum_h w_h relu(q_h . k)
    tl.store(S + b * N + keys, s, mask=live)


@triton.jit
def top_k(S, IDX, N, TOPK: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    s = tl.load(S + b * N + cols, mask=cols < N, other=float("-inf"))  # the sequence's scores, once
    for i in tl.static_range(TOPK):
        best = tl.argmax(s, 0)
        tl.store(IDX + b * TOPK + i, best)
        s = tl.where(cols == best, float("-inf"), s)


def launch(N: int, d: int = 32, H: int = 16, B: int = 2, topk: int = 8, Bc: int = 32, seed: int = 0) -> dict:
    """One decode step of B sequences of N cached tokens: ``d`` = d_I, ``H`` = H_I (powers of two from 16, as
    ``tl.dot`` needs), ``Bc`` = BLOCK_N keys per scoring program, ``topk`` keys selected (at most N)."""
    if topk > N:
        raise ValueError(f"topk must be at most N = {N}, got {topk}")
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, d, generator=g)
    w = torch.rand(B, H, generator=g)
    k = torch.randn(B, N, d, generator=g)
    k_scale = torch.rand(B, N, generator=g) + 0.5
    logits = torch.full((B, N), float("nan"))
    idx = torch.full((B, topk), -1, dtype=torch.int32)
    index_scores[(B, triton.cdiv(N, Bc))](q, w, k, k_scale, logits, N, H=H, D=d, BLOCK_N=Bc)
    top_k[(B,)](logits, idx, N, TOPK=topk, BLOCK=triton.next_power_of_2(N))
    return {"q_I": q, "w": w, "K_I": k, "k_scale": k_scale, "logits": logits, "indices": idx, "B": B, "H": H,
            "topk": topk, "Bc": Bc}  # fmt: skip

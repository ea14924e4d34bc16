"""A Triton block-sparse attention forward that consumes a real FlexAttention ``BlockMask`` (built on the CPU with
``create_block_mask``): per row block it loads the block counts, then for each partial block its index, K_j, the
document ids ``mask_mod`` reads (at the rows and at the columns), the bias ``score_mod`` reads and V_j, and for each
full block the same without the document ids. Written for iosim from the structure of FlexAttention's forward
kernel (FlexAttention's own, torch's template, is torch_flex_template.py beside this one); counted
under the Triton interpreter it moves, array by array, what ``iosim.masking.block_sparse`` counts for the same BlockMask
(tests/test_flex_kernel.py).

mask_mod: causal within documents, ``doc[q] == doc[kv] and q >= kv``; score_mod: ``score + bias[q, kv]``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from iosim.kernels.examples._common import default_scale, inputs


@triton.jit
def _flex_forward(Q, K, V, O, L, KV_NUM, KV_IDX, FULL_NUM, FULL_IDX, DOC, BIAS, N, stride_idx, stride_full, scale,
                  D: tl.constexpr, BQ: tl.constexpr, BKV: tl.constexpr, HAS_BIAS: tl.constexpr):  # fmt: skip
    i = tl.program_id(0)
    head = tl.program_id(1)
    rows = i * BQ + tl.arange(0, BQ)
    live_r = rows < N
    dims = tl.arange(0, D)
    base = head * N * D
    q = tl.load(Q + base + rows[:, None] * D + dims[None, :], mask=live_r[:, None], other=0.0)
    m_i = tl.full((BQ,), float("-inf"), tl.float32)
    l_i = tl.zeros((BQ,), tl.float32)
    acc = tl.zeros((BQ, D), tl.float32)
    n_partial = tl.load(KV_NUM + i)
    n_full = tl.load(FULL_NUM + i)
    for kind in tl.static_range(2):  # partial blocks (mask_mod applied), then full blocks
        n = n_partial if kind == 0 else n_full
        for t in range(n):
            if kind == 0:
                j = tl.load(KV_IDX + i * stride_idx + t)
            else:
                j = tl.load(FULL_IDX + i * stride_full + t)
            cols = j * BKV + tl.arange(0, BKV)
            live_c = cols < N
            k = tl.load(K + base + cols[:, None] * D + dims[None, :], mask=live_c[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k)) * scale
            if HAS_BIAS:
                s += tl.load(
                    BIAS + rows[:, None] * N + cols[None, :], mask=live_r[:, None] & live_c[None, :], other=0.0
                )
            allowed = live_r[:, None] & live_c[None, :]
            if kind == 0:  # mask_mod: its captured document ids, at the rows and at the columns
                doc_q = tl.load(DOC + rows, mask=live_r, other=-1)
                doc_k = tl.load(DOC + cols, mask=live_c, other=-2)
                allowed = allowed & (doc_q[:, None] == doc_k[None, :]) & (rows[:, None] >= cols[None, :])
            s = tl.where(allowed, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V + base + cols[:, None] * D + dims[None, :], mask=live_c[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    tl.store(O + base + rows[:, None] * D + dims[None, :], (acc / l_safe[:, None]).to(O.dtype.element_ty),
             mask=live_r[:, None])  # fmt: skip
    tl.store(L + head * N + rows, tl.where(l_i == 0.0, float("-inf"), m_i + tl.log(l_safe)), mask=live_r)


def documents(N: int):  # noqa: N803
    """Document ids of N tokens: three documents of N/4, N/2 and the rest."""
    import torch

    return torch.repeat_interleave(torch.arange(3), torch.tensor([N // 4, N // 2, N - N // 4 - N // 2]))


def launch(N: int, d: int, Br: int = 32, Bc: int = 32, causal: bool = True, H: int = 1, dtype: str = "float32",
           seed: int = 0, bias: bool = True) -> dict:  # fmt: skip
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    doc = documents(N)

    def causal_document(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    bm = create_block_mask(causal_document, None, None, N, N, device="cpu", BLOCK_SIZE=(Br, Bc))
    Q, K, V = inputs("QKV", (H, N, d), dtype, seed)
    B = inputs("B", (N, N), dtype, seed + 1)[0] if bias else torch.zeros(1, dtype=Q.dtype)
    O = torch.empty_like(Q)
    L = torch.empty((H, N), dtype=torch.float32)
    kv_num, kv_idx = bm.kv_num_blocks.contiguous(), bm.kv_indices.contiguous()
    full_num, full_idx = bm.full_kv_num_blocks.contiguous(), bm.full_kv_indices.contiguous()
    doc32 = doc.to(torch.int32).contiguous()
    _flex_forward[(triton.cdiv(N, Br), H)](Q, K, V, O, L, kv_num, kv_idx, full_num, full_idx, doc32, B, N,
                                           kv_idx.shape[-1], full_idx.shape[-1], default_scale(d), D=d, BQ=Br,
                                           BKV=Bc, HAS_BIAS=bias)  # fmt: skip
    out = {"Q": Q, "K": K, "V": V, "O": O, "L": L, "kv_num_blocks": kv_num, "kv_indices": kv_idx,
           "full_kv_num_blocks": full_num, "full_kv_indices": full_idx, "doc": doc32, "scale": default_scale(d),
           "Br": Br, "Bc": Bc, "H": H,
           "buffers": {"doc": ("q+kv", "mask", "int32"), **({"bias": ("qkv", "score")} if bias else {})}}  # fmt: skip
    if bias:
        out["bias"] = B
    return out

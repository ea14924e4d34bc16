"""FlashAttention-2 forward in Triton, written for iosim: one program per (row block i, head), K_j and V_j
streamed, causal blocks above the diagonal skipped (the loop stops at the row block's last column block).

Its traffic is iosim's ``flash2_forward(N, d, Br=BLOCK_M, Bc=BLOCK_N, causal)`` closed form: Q_i loaded once per
program, K_j and V_j once per (i, j) step, O_i and L_i stored once; ragged N and d < BLOCK_D are masked.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from iosim.kernels.examples._common import default_scale, inputs, next_pow2


@triton.jit
def flash2_forward_kernel(
    Q, K, V, O, L, N, d, scale, stride_h, stride_n,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, SKIP: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0)
    h = tl.program_id(1)
    rows = i * BLOCK_M + tl.arange(0, BLOCK_M)
    dd = tl.arange(0, BLOCK_D)
    base = h * stride_h
    q_mask = (rows[:, None] < N) & (dd[None, :] < d)
    Qi = tl.load(Q + base + rows[:, None] * stride_n + dd[None, :], mask=q_mask, other=0.0)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    hi = N
    if CAUSAL and SKIP:  # FlashAttention-2's causal skip: no column block right of the row block's last row
        hi = tl.minimum((i + 1) * BLOCK_M, N)
    for start in range(0, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        kv_mask = (cols[:, None] < N) & (dd[None, :] < d)
        Kj = tl.load(K + base + cols[:, None] * stride_n + dd[None, :], mask=kv_mask, other=0.0)
        Vj = tl.load(V + base + cols[:, None] * stride_n + dd[None, :], mask=kv_mask, other=0.0)
        Sij = tl.dot(Qi, tl.trans(Kj)).to(tl.float32) * scale
        keep = cols[None, :] < N
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None])
        Sij = tl.where(keep, Sij, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(Sij, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
        Pij = tl.exp(Sij - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(Pij, 1)
        acc = acc * alpha[:, None] + tl.dot(Pij.to(Vj.dtype), Vj).to(tl.float32)
        m_i = m_new
    Oi = acc / l_i[:, None]
    tl.store(O + base + rows[:, None] * stride_n + dd[None, :], Oi.to(O.dtype.element_ty), mask=q_mask)
    tl.store(L + h * N + rows, m_i + tl.log(l_i), mask=rows < N)


def run(Q, K, V, Br: int, Bc: int, causal: bool, skip: bool = True, scale: float | None = None):
    """O, L of Q, K, V shaped (H, N, d) (torch, contiguous)."""
    H, N, d = Q.shape
    O = torch.full_like(Q, float("nan"))
    L = torch.full((H, N), float("nan"), dtype=torch.float32, device=Q.device)
    sc = default_scale(d) if scale is None else scale
    grid = (triton.cdiv(N, Br), H)
    flash2_forward_kernel[grid](
        Q, K, V, O, L, N, d, sc, Q.stride(0), Q.stride(1),
        BLOCK_M=Br, BLOCK_N=Bc, BLOCK_D=next_pow2(d), CAUSAL=causal, SKIP=skip,
    )  # fmt: skip
    return O, L


def launch(N: int, d: int, Br: int = 64, Bc: int = 32, causal: bool = False, H: int = 1, dtype: str = "float16",
           seed: int = 0) -> dict:  # fmt: skip
    Q, K, V = inputs("QKV", (H, N, d), dtype, seed)
    O, L = run(Q, K, V, Br, Bc, causal)
    return {"Q": Q, "K": K, "V": V, "O": O, "L": L, "scale": default_scale(d),
            "Br": Br, "Bc": Bc, "causal": causal, "H": H}  # fmt: skip

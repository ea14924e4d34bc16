"""FlashAttention-2 backward in Triton, written for iosim: a D pass, then one program per (column block j, head).

Pass 1 (one program per row block): D_i = rowsum(dO_i o O_i) and dQ_i = 0 (the initialisation the model counts as
writes: a memset writes HBM). Pass 2: K_j, V_j loaded once; for every row block i not skipped by the causal mask,
Q_i, dO_i, L_i, D_i loaded, P_ij = exp(S_ij - L_i) recomputed, dV_j and dK_j accumulated on chip, and
dQ_i += dS_ij K_j added in global memory with atomics (a read and a write per element); dK_j, dV_j stored once.
Its traffic is iosim's ``flash2_backward(N, d, Br=BLOCK_M, Bc=BLOCK_N, causal)`` closed form.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from iosim.kernels.examples._common import default_scale, inputs, next_pow2
from iosim.kernels.examples.triton_flash2 import run as forward


@triton.jit
def flash2_backward_prep_kernel(O, dO, D, dQ, N, d, stride_h, stride_n, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    i = tl.program_id(0)
    h = tl.program_id(1)
    rows = i * BLOCK_M + tl.arange(0, BLOCK_M)
    dd = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < N) & (dd[None, :] < d)
    offs = h * stride_h + rows[:, None] * stride_n + dd[None, :]
    Oi = tl.load(O + offs, mask=mask, other=0.0).to(tl.float32)
    dOi = tl.load(dO + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(D + h * N + rows, tl.sum(Oi * dOi, 1), mask=rows < N)
    tl.store(dQ + offs, tl.zeros((BLOCK_M, BLOCK_D), tl.float32), mask=mask)


@triton.jit
def flash2_backward_kernel(
    Q, K, V, dO, L, D, dQ, dK, dV, N, d, scale, stride_h, stride_n,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    j = tl.program_id(0)
    h = tl.program_id(1)
    cols = j * BLOCK_N + tl.arange(0, BLOCK_N)
    dd = tl.arange(0, BLOCK_D)
    base = h * stride_h
    kv_mask = (cols[:, None] < N) & (dd[None, :] < d)
    kv_offs = base + cols[:, None] * stride_n + dd[None, :]
    Kj = tl.load(K + kv_offs, mask=kv_mask, other=0.0)
    Vj = tl.load(V + kv_offs, mask=kv_mask, other=0.0)
    dKj = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    dVj = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    lo = 0
    if CAUSAL:  # the first row block that sees column j * BLOCK_N
        lo = (j * BLOCK_N) // BLOCK_M * BLOCK_M
    for start in range(lo, N, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        q_mask = (rows[:, None] < N) & (dd[None, :] < d)
        q_offs = base + rows[:, None] * stride_n + dd[None, :]
        Qi = tl.load(Q + q_offs, mask=q_mask, other=0.0)
        dOi = tl.load(dO + q_offs, mask=q_mask, other=0.0)
        Li = tl.load(L + h * N + rows, mask=rows < N, other=0.0)
        Di = tl.load(D + h * N + rows, mask=rows < N, other=0.0)
        Sij = tl.dot(Qi, tl.trans(Kj)).to(tl.float32) * scale
        keep = (rows[:, None] < N) & (cols[None, :] < N)
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None])
        Pij = tl.where(keep, tl.exp(Sij - Li[:, None]), 0.0)
        dVj += tl.dot(tl.trans(Pij).to(dOi.dtype), dOi).to(tl.float32)
        dPij = tl.dot(dOi, tl.trans(Vj)).to(tl.float32)
        dSij = Pij * (dPij - Di[:, None])
        dKj += tl.dot(tl.trans(dSij).to(Qi.dtype), Qi).to(tl.float32) * scale
        dQi = tl.dot(dSij.to(Kj.dtype), Kj).to(tl.float32) * scale
        tl.atomic_add(dQ + q_offs, dQi, mask=q_mask)
    tl.store(dK + kv_offs, dKj.to(dK.dtype.element_ty), mask=kv_mask)
    tl.store(dV + kv_offs, dVj.to(dV.dtype.element_ty), mask=kv_mask)


def run_backward(Q, K, V, O, L, dO, Br: int, Bc: int, causal: bool, scale: float | None = None):
    """dQ (float32, accumulated with atomics), dK, dV of (H, N, d) torch tensors."""
    H, N, d = Q.shape
    sc = default_scale(d) if scale is None else scale
    D = torch.full((H, N), float("nan"), dtype=torch.float32)
    dQ = torch.full(Q.shape, float("nan"), dtype=torch.float32)
    dK, dV = torch.full_like(K, float("nan")), torch.full_like(V, float("nan"))
    BD = next_pow2(d)
    flash2_backward_prep_kernel[(triton.cdiv(N, Br), H)](O, dO, D, dQ, N, d, Q.stride(0), Q.stride(1), Br, BD)
    flash2_backward_kernel[(triton.cdiv(N, Bc), H)](
        Q, K, V, dO, L, D, dQ, dK, dV, N, d, sc, Q.stride(0), Q.stride(1),
        BLOCK_M=Br, BLOCK_N=Bc, BLOCK_D=BD, CAUSAL=causal,
    )  # fmt: skip
    return dQ, dK, dV, D


def launch(N: int, d: int, Br: int = 32, Bc: int = 32, causal: bool = False, H: int = 1, dtype: str = "float32",
           seed: int = 0) -> dict:  # fmt: skip
    """The forward (not counted: ``forward=True`` counts it too) computes O and L; then the counted backward."""
    Q, K, V, dO = inputs(["Q", "K", "V", "dO"], (H, N, d), dtype, seed)
    return {**_backward(Q, K, V, dO, Br, Bc, causal), "Br": Br, "Bc": Bc, "causal": causal, "H": H}


def _backward(Q, K, V, dO, Br, Bc, causal):
    from iosim.kernels.counting import paused

    with paused():  # the forward's traffic is not the backward's
        O, L = forward(Q, K, V, Br, Bc, causal)
    dQ, dK, dV, D = run_backward(Q, K, V, O, L, dO, Br, Bc, causal)
    return {"Q": Q, "K": K, "V": V, "O": O, "L": L, "dO": dO, "D": D, "dQ": dQ, "dK": dK, "dV": dV,
            "scale": default_scale(Q.shape[-1])}  # fmt: skip

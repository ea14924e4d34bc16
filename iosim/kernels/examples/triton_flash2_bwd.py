"""FlashAttention-2 backward in Triton, written for iosim: a D pass, then one program per (column block j, head).

Pass 1 (one program per row block): D_i = rowsum(dO_i o O_i) and dQ_i = 0 (the initialisation the model counts as
writes: a memset writes HBM). Pass 2: K_j, V_j loaded once; for every row block i not skipped by the causal mask,
Q_i, dO_i, L_i, D_i loaded, P_ij = exp(S_ij - L_i) recomputed, dV_j and dK_j accumulated on chip, and
dQ_i += dS_ij K_j added in global memory with atomics (a read and a write per element); dK_j, dV_j stored once.
Its traffic is iosim's ``flash2_backward(N, d, Br=BLOCK_M, Bc=BLOCK_N, causal)`` closed form per head.

Over a whole problem (B batch items, H query heads, ``kv_heads`` key/value heads, arrays (B, heads, N, d)):
``gqa="per-head"`` runs one pass-2 program per (column block, query head), each loading its KV head's K_j, V_j,
and writes dK_j, dV_j to the expanded dKpart, dVpart (B, H, N, d); a third kernel sums each group of g = H /
kv_heads partials into dK, dV (flash-attn's GQA backward). ``gqa="packed"`` runs one program per (column block, KV
head) that streams the g query heads' rows of its group past K_j, V_j and writes dK_j, dV_j once. Its traffic is
``io_model.flash2_backward_problem`` (``iosim kernel --like flash2-backward --B --H --kv-heads``).
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
    Q, K, V, dO, L, D, dQ, dK, dV, N, d, scale, stride_h, stride_n, H, H_kv,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, PACKED: tl.constexpr,
):  # fmt: skip
    # program (j, u): column block j of unit u, a query head (B x H of them; dK, dV: its expanded partials) or, PACKED,
    # a key/value head (B x H_kv) streaming its group's g query heads (dK, dV: the KV head's own)
    j = tl.program_id(0)
    u = tl.program_id(1)
    g = H // H_kv
    if PACKED:
        kvh = u
        heads = g
    else:
        kvh = (u // H) * H_kv + (u % H) // g
        heads = 1
    cols = j * BLOCK_N + tl.arange(0, BLOCK_N)
    dd = tl.arange(0, BLOCK_D)
    kv_mask = (cols[:, None] < N) & (dd[None, :] < d)
    kv_offs = kvh * stride_h + cols[:, None] * stride_n + dd[None, :]
    Kj = tl.load(K + kv_offs, mask=kv_mask, other=0.0)
    Vj = tl.load(V + kv_offs, mask=kv_mask, other=0.0)
    dKj = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    dVj = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    lo = 0
    if CAUSAL:  # the first row block that sees column j * BLOCK_N
        lo = (j * BLOCK_N) // BLOCK_M * BLOCK_M
    for t in range(0, heads):
        if PACKED:
            h = (u // H_kv) * H + (u % H_kv) * g + t
        else:
            h = u
        base = h * stride_h
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
    out_offs = u * stride_h + cols[:, None] * stride_n + dd[None, :]
    tl.store(dK + out_offs, dKj.to(dK.dtype.element_ty), mask=kv_mask)
    tl.store(dV + out_offs, dVj.to(dV.dtype.element_ty), mask=kv_mask)


@triton.jit
def group_sum_kernel(dKpart, dVpart, dK, dV, N, d, stride_h, stride_n, g,
                     BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    # program (j, kvh): keys of column block j of KV head kvh: its g query heads' partials read one after another
    # into an accumulator, the sum written once
    j = tl.program_id(0)
    kvh = tl.program_id(1)
    cols = j * BLOCK_N + tl.arange(0, BLOCK_N)
    dd = tl.arange(0, BLOCK_D)
    mask = (cols[:, None] < N) & (dd[None, :] < d)
    offs = cols[:, None] * stride_n + dd[None, :]
    sk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    sv = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    for t in range(0, g):
        sk += tl.load(dKpart + (kvh * g + t) * stride_h + offs, mask=mask, other=0.0).to(tl.float32)
        sv += tl.load(dVpart + (kvh * g + t) * stride_h + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(dK + kvh * stride_h + offs, sk.to(dK.dtype.element_ty), mask=mask)
    tl.store(dV + kvh * stride_h + offs, sv.to(dV.dtype.element_ty), mask=mask)


def run_backward(Q, K, V, O, L, dO, Br: int, Bc: int, causal: bool, scale: float | None = None,
                 gqa: str = "per-head"):  # fmt: skip
    """dQ (float32, accumulated with atomics), dK, dV, D of (heads, N, d) torch tensors: Q, O, dO with H heads, K, V
    with H_kv heads (H a multiple of H_kv; the B x heads of a batch flattened), L (H, N). With H > H_kv, ``gqa``
    per-head (expanded partials dKpart, dVpart and a group sum, returned too) or packed."""
    H, N, d = Q.shape
    H_kv = K.shape[0]
    sc = default_scale(d) if scale is None else scale
    D = torch.full((H, N), float("nan"), dtype=torch.float32)
    dQ = torch.full(Q.shape, float("nan"), dtype=torch.float32)
    dK, dV = torch.full_like(K, float("nan")), torch.full_like(V, float("nan"))
    packed = gqa == "packed" or H == H_kv
    dKo, dVo = (dK, dV) if packed else (torch.full_like(Q, float("nan")), torch.full_like(Q, float("nan")))
    BD = next_pow2(d)
    flash2_backward_prep_kernel[(triton.cdiv(N, Br), H)](O, dO, D, dQ, N, d, Q.stride(0), Q.stride(1), Br, BD)
    flash2_backward_kernel[(triton.cdiv(N, Bc), H_kv if packed else H)](
        Q, K, V, dO, L, D, dQ, dKo, dVo, N, d, sc, Q.stride(0), Q.stride(1), H, H_kv,
        BLOCK_M=Br, BLOCK_N=Bc, BLOCK_D=BD, CAUSAL=causal, PACKED=packed,
    )  # fmt: skip
    if not packed:
        group_sum_kernel[(triton.cdiv(N, Bc), H_kv)](dKo, dVo, dK, dV, N, d, Q.stride(0), Q.stride(1), H // H_kv,
                                                     BLOCK_N=Bc, BLOCK_D=BD)  # fmt: skip
        return dQ, dK, dV, D, dKo, dVo
    return dQ, dK, dV, D


def launch(N: int, d: int, Br: int = 32, Bc: int = 32, causal: bool = False, H: int = 1, dtype: str = "float32",
           seed: int = 0, B: int = 1, kv_heads: int | None = None, gqa: str = "per-head") -> dict:  # fmt: skip
    """The forward (not counted) computes O and L; then the counted backward over B batch items of H query heads
    and ``kv_heads`` key/value heads (default H), arrays (B, heads, N, d); ``gqa`` per-head or packed."""
    H_kv = H if kv_heads is None else kv_heads
    if H_kv < 1 or H % H_kv:
        raise ValueError(f"kv_heads must divide H = {H}, got {kv_heads}")
    if gqa not in ("per-head", "packed"):
        raise ValueError(f"gqa must be per-head or packed, got {gqa!r}")
    if H_kv == H:
        Q, K, V, dO = inputs(["Q", "K", "V", "dO"], (B, H, N, d), dtype, seed)
    else:
        Q, dO = inputs(["Q", "dO"], (B, H, N, d), dtype, seed)
        K, V = inputs(["K", "V"], (B, H_kv, N, d), dtype, seed + 1)
    out = _backward(Q, K, V, dO, Br, Bc, causal, gqa)
    return {**out, "Br": Br, "Bc": Bc, "causal": causal, "H": H, "B": B, "kv_heads": H_kv}


def _backward(Q, K, V, dO, Br, Bc, causal, gqa="per-head"):
    from iosim.kernels.counting import paused

    B, H, N, d = Q.shape
    H_kv = K.shape[1]
    flat = [x.reshape(-1, N, d) for x in (Q, K, V, dO)]
    with paused():  # the forward's traffic is not the backward's
        Kx, Vx = (x.repeat_interleave(H // H_kv, dim=1).reshape(-1, N, d) for x in (K, V))
        O, L = forward(flat[0], Kx, Vx, Br, Bc, causal)
    dQ, dK, dV, D, *parts = run_backward(flat[0], flat[1], flat[2], O, L, flat[3], Br, Bc, causal, gqa=gqa)
    shape_q, shape_kv = (B, H, N, d), (B, H_kv, N, d)
    out = {"Q": Q, "K": K, "V": V, "O": O.reshape(shape_q), "L": L.reshape(B, H, N), "dO": dO, "D": D,
           "dQ": dQ.reshape(shape_q), "dK": dK.reshape(shape_kv), "dV": dV.reshape(shape_kv),
           "scale": default_scale(d)}  # fmt: skip
    if parts:
        out.update(dKpart=parts[0], dVpart=parts[1])
    return out


def launch_packed(N: int, d: int, Br: int = 32, Bc: int = 32, causal: bool = False, H: int = 1, dtype: str = "float32",
                  seed: int = 0, B: int = 1, kv_heads: int | None = None) -> dict:  # fmt: skip
    """:func:`launch` with GQA packed: one pass-2 program per (column block, KV head)."""
    return launch(N, d, Br, Bc, causal, H, dtype, seed, B, kv_heads, "packed")

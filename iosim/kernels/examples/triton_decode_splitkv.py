"""Split-KV decoding in Triton, written for iosim: one query row per head against N cached keys, the keys cut into
``splits`` chunks processed by separate programs (flash-decoding), then a second kernel combining the partials.

Pass 1, program (s, h): reads the head's length from ``lengths`` (metadata, counted under its own name), q, the
keys and values of chunk s in blocks of BLOCK_N (of KV head h // g with ``kv_heads`` < H: GQA, each query head
loading its KV head's keys, g times per KV head), and writes its partial output O_part[h, s] and logsumexp
L_part[h, s]. Chunks are whole column blocks, so the last splits may be empty: such a program still writes its
partials (O = 0, L = -inf), or with ``skip_empty`` returns after reading its length and the combine reads only the
live splits. Pass 2, program h: reads the splits' partials and writes O[h]. Its traffic is
``iosim.kernels.comparison.decode_splitkv(N, d, splits, Bc, H_q=H, H_kv=kv_heads, empty=...)``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from iosim.kernels.examples._common import default_scale, inputs, next_pow2


@triton.jit
def decode_split_kernel(
    Q, K, V, lengths, O_part, L_part, chunk, d, scale, stride_kh, stride_kn, splits, group,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SKIP_EMPTY: tl.constexpr,
):  # fmt: skip
    s = tl.program_id(0)
    h = tl.program_id(1)
    n = tl.load(lengths + h)
    if SKIP_EMPTY and s * chunk >= n:
        return
    dd = tl.arange(0, BLOCK_D)
    q = tl.load(Q + h * d + dd, mask=dd < d, other=0.0).to(tl.float32)
    m_i = float("-inf")
    l_i = 0.0
    acc = tl.zeros((BLOCK_D,), tl.float32)
    lo = s * chunk
    hi = tl.minimum(lo + chunk, n)
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (cols[:, None] < hi) & (dd[None, :] < d)
        offs = (h // group) * stride_kh + cols[:, None] * stride_kn + dd[None, :]
        Kj = tl.load(K + offs, mask=mask, other=0.0).to(tl.float32)
        Vj = tl.load(V + offs, mask=mask, other=0.0).to(tl.float32)
        sj = tl.where(cols < hi, tl.sum(Kj * q[None, :], 1) * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sj, 0))
        p = tl.exp(sj - m_new)
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 0)
        acc = acc * alpha + tl.sum(p[:, None] * Vj, 0)
        m_i = m_new
    empty = l_i == 0.0
    tl.store(O_part + (h * splits + s) * d + dd, tl.where(empty, 0.0, acc / l_i), mask=dd < d)
    tl.store(L_part + h * splits + s, tl.where(empty, float("-inf"), m_i + tl.log(l_i)))


@triton.jit
def decode_combine_kernel(O_part, L_part, O, d, splits, live, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    h = tl.program_id(0)
    ss = tl.arange(0, BLOCK_S)
    dd = tl.arange(0, BLOCK_D)
    Ls = tl.load(L_part + h * splits + ss, mask=ss < live, other=float("-inf"))
    Os = tl.load(O_part + (h * splits + ss[:, None]) * d + dd[None, :], mask=(ss[:, None] < live) & (dd[None, :] < d),
                 other=0.0)  # fmt: skip
    m = tl.max(Ls, 0)
    w = tl.exp(Ls - m)
    out = tl.sum(w[:, None] * Os, 0) / tl.sum(w, 0)
    tl.store(O + h * d + dd, out.to(O.dtype.element_ty), mask=dd < d)


def launch(N: int, d: int, Bc: int = 32, splits: int = 4, H: int = 1, kv_heads: int | None = None,
           skip_empty: bool = False, dtype: str = "float32", seed: int = 0) -> dict:  # fmt: skip
    H_kv = H if kv_heads is None else kv_heads
    Q = inputs("Q", (H, 1, d), dtype, seed)[0]  # one query row per head
    K, V = inputs("KV", (H_kv, N, d), dtype, seed + 1)
    lengths = torch.full((H,), N, dtype=torch.int32)
    chunk = triton.cdiv(triton.cdiv(N, splits), Bc) * Bc
    live = min(splits, triton.cdiv(N, chunk)) if skip_empty else splits
    O_part = torch.full((H, splits, d), float("nan"), dtype=torch.float32)
    L_part = torch.full((H, splits), float("nan"), dtype=torch.float32)
    O = torch.full((H, 1, d), float("nan"), dtype=Q.dtype)
    BD = next_pow2(d)
    sc = default_scale(d)
    decode_split_kernel[(splits, H)](Q, K, V, lengths, O_part, L_part, chunk, d, sc, K.stride(0), K.stride(1), splits,
                                     H // H_kv, BLOCK_N=Bc, BLOCK_D=BD, SKIP_EMPTY=skip_empty)  # fmt: skip
    decode_combine_kernel[(H,)](O_part, L_part, O, d, splits, live, BLOCK_S=next_pow2(splits, 1), BLOCK_D=BD)
    return {
        "Q": Q,
        "K": K,
        "V": V,
        "lengths": lengths,
        "O_part": O_part,
        "L_part": L_part,
        "O": O,
        "scale": sc,
        "Bc": Bc,
        "splits": splits,
        "H": H,
        "kv_heads": H_kv,
        "empty_splits": "skipped" if skip_empty else "written",
    }

"""A first kernel to count (docs/kernel-first.md): attention's forward in Triton, one program per block of Br query
rows, K and V streamed in blocks of Bc rows with the online softmax (FlashAttention-2's loop, no causal mask, one
head). The launcher builds the inputs, launches the kernel and returns its arrays by the names iosim's model uses.

    iosim kernel iosim/kernels/examples/first_kernel.py --N 256 --d 64 --like flash2
"""

import torch
import triton
import triton.language as tl


@triton.jit
def attention_forward(Q, K, V, O, L, N, scale, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # this program's query rows
    dims = tl.arange(0, D)
    q = tl.load(Q + rows[:, None] * D + dims[None, :], mask=rows[:, None] < N, other=0.0)  # Q_i, loaded once
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)  # running row maximum
    s_sum = tl.zeros((BLOCK_M,), tl.float32)  # running row sum of exp(S - m)
    acc = tl.zeros((BLOCK_M, D), tl.float32)  # O_i before the division by the row sum
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        k = tl.load(K + cols[:, None] * D + dims[None, :], mask=cols[:, None] < N, other=0.0)  # K_j
        v = tl.load(V + cols[:, None] * D + dims[None, :], mask=cols[:, None] < N, other=0.0)  # V_j
        s = tl.where(cols[None, :] < N, tl.dot(q, tl.trans(k)) * scale, float("-inf"))  # S_ij, Br x Bc
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)  # rescales what was summed under the old maximum
        s_sum = s_sum * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    tl.store(O + rows[:, None] * D + dims[None, :], (acc / s_sum[:, None]).to(tl.float16), mask=rows[:, None] < N)
    tl.store(L + rows, m + tl.log(s_sum), mask=rows < N)  # the row's logsumexp, for a backward pass


def launch(N: int, d: int, Br: int = 64, Bc: int = 32, seed: int = 0) -> dict:
    """Q, K, V of shape (N, d) in float16; d a power of two from 16 (tl.dot's smallest block) to 256."""
    if d not in (16, 32, 64, 128, 256):
        raise ValueError(f"--d must be a power of two from 16 to 256 for this kernel, got {d}")
    torch.manual_seed(seed)
    Q, K, V = (torch.randn(N, d, dtype=torch.float16) for _ in range(3))
    O = torch.empty_like(Q)
    L = torch.empty(N, dtype=torch.float32)
    scale = d**-0.5
    attention_forward[(triton.cdiv(N, Br),)](Q, K, V, O, L, N, scale, D=d, BLOCK_M=Br, BLOCK_N=Bc)
    return {"Q": Q, "K": K, "V": V, "O": O, "L": L, "scale": scale, "Br": Br, "Bc": Bc}

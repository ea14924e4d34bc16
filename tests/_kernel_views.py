"""Launchers for tests/test_kernels_views.py and docs/kv-cache.md: small kernels written for iosim's tests (no other
project's code), launched with K and V as separate buffers and as views of one cache tensor the way serving engines
store it (interleaved: ``kv.split(d, -1)``; nested: V = ``K[..., :d_v]``, an MLA latent's first columns).
Imported only by the counting subprocess (TRITON_INTERPRET=1 set first).
"""

import torch
import triton
import triton.language as tl


@triton.jit
def decode(Q, K, V, O, N, s_k, s_v, s_hk, s_hv, D: tl.constexpr, DV: tl.constexpr, BLOCK_N: tl.constexpr):
    """One query row per program (head h = program 0): o = softmax(q K^T) V over N keys in blocks of BLOCK_N;
    K's rows have stride s_k and its heads s_hk, V's s_v and s_hv."""
    h = tl.program_id(0)
    dd, dv = tl.arange(0, D), tl.arange(0, DV)
    q = tl.load(Q + h * D + dd)
    m = tl.full((1,), float("-inf"), tl.float32)
    den = tl.zeros((1,), tl.float32)
    acc = tl.zeros((DV,), tl.float32)
    for s in range(0, N, BLOCK_N):
        rows = s + tl.arange(0, BLOCK_N)
        live = rows < N
        k = tl.load(K + h * s_hk + rows[:, None] * s_k + dd[None, :], mask=live[:, None], other=0.0)
        v = tl.load(V + h * s_hv + rows[:, None] * s_v + dv[None, :], mask=live[:, None], other=0.0)
        sc = tl.where(live, tl.sum(k * q[None, :], 1), float("-inf"))
        mn = tl.maximum(m, tl.max(sc, 0))
        p = tl.exp(sc - mn)
        a = tl.exp(m - mn)
        den = den * a + tl.sum(p, 0)
        acc = acc * a + tl.sum(p[:, None] * v, 0)
        m = mn
    tl.store(O + h * DV + dv, acc / den)


def _run(q, k, v, N, D, DV, H, block_n):
    o = torch.empty(H, DV)
    decode[(H,)](q, k, v, o, N, k.stride(1), v.stride(1), k.stride(0), v.stride(0), D=D, DV=DV, BLOCK_N=block_n)
    return o


def _qkv(H, N, D, DV, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(H, D, generator=g), torch.randn(H, N, D, generator=g), torch.randn(H, N, DV, generator=g))


def launch_separate(N=64, d=16, dv=8, H=1, block_n=16):
    """K (H, N, d) and V (H, N, dv) in buffers of their own."""
    q, k, v = _qkv(H, N, d, dv)
    return {"Q": q, "K": k, "V": v, "O": _run(q, k, v, N, d, dv, H, block_n)}


def launch_nested(N=64, d=16, dv=8, H=1, block_n=16):
    """V = K[..., :dv]: the first dv columns of K, the same addresses (an MLA latent cache)."""
    q, k, _ = _qkv(H, N, d, dv)
    v = k[..., :dv]
    return {"Q": q, "K": k, "V": v, "O": _run(q, k, v, N, d, dv, H, block_n)}


def launch_interleaved(N=64, d=16, dv=16, H=1, block_n=16):
    """One cache tensor (H, N, 2d) split into K and V: ``kv.split(d, -1)`` (row stride 2d for both)."""
    g = torch.Generator().manual_seed(0)
    q, kv = torch.randn(H, d, generator=g), torch.randn(H, N, 2 * d, generator=g)
    k, v = kv.split(d, -1)
    return {"Q": q, "K": k, "V": v, "O": _run(q, k, v, N, d, d, H, block_n)}


@triton.jit
def scale_into(Src, Dst, N, s_src, s_dst, DV: tl.constexpr, BLOCK_N: tl.constexpr):
    """Dst[r, :DV] = 2 Src[r, :DV], one block of BLOCK_N rows per program."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, DV)
    live = rows[:, None] < N
    x = tl.load(Src + rows[:, None] * s_src + cols[None, :], mask=live, other=0.0)
    tl.store(Dst + rows[:, None] * s_dst + cols[None, :], 2 * x, mask=live)


def launch_write_overlap(N=32, d=16, dv=8, block_n=16):
    """Dst = Src[:, :dv]: the kernel stores through one view the words it loads through the other."""
    src = torch.randn(N, d, generator=torch.Generator().manual_seed(1))
    dst = src[:, :dv]
    scale_into[(triton.cdiv(N, block_n),)](src, dst, N, src.stride(0), dst.stride(0), DV=dv, BLOCK_N=block_n)
    return {"Src": src, "Dst": dst}


@triton.jit
def mla_fwd(Q, K, V, O, L, N, R, scale, DV: tl.constexpr, DR: tl.constexpr, NAIVE: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """An MLA-style forward over one latent cache K (N, DV + DR): its first DV columns are c_KV (V, the same
    addresses), the last DR the rotary part. Q is (R, DV + DR): the g query heads' rows packed (all share the one
    latent head); program i takes row block i. Each key block of K is loaded as its two parts, and V is the c_KV
    part already loaded (NAIVE: loaded again through V)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rm = rows[:, None] < R
    cv, cr = tl.arange(0, DV), tl.arange(0, DR)
    q_c = tl.load(Q + rows[:, None] * (DV + DR) + cv[None, :], mask=rm, other=0.0)
    q_r = tl.load(Q + rows[:, None] * (DV + DR) + DV + cr[None, :], mask=rm, other=0.0)
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    den = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, DV), tl.float32)
    for s in range(0, N, BLOCK_N):
        cols = s + tl.arange(0, BLOCK_N)
        cm = cols[:, None] < N
        c = tl.load(K + cols[:, None] * (DV + DR) + cv[None, :], mask=cm, other=0.0)
        r = tl.load(K + cols[:, None] * (DV + DR) + DV + cr[None, :], mask=cm, other=0.0)
        sc = tl.sum(q_c[:, None, :] * c[None, :, :], 2) + tl.sum(q_r[:, None, :] * r[None, :, :], 2)
        sc = tl.where((cols < N)[None, :], sc * scale, float("-inf"))
        if NAIVE:
            v = tl.load(V + cols[:, None] * (DV + DR) + cv[None, :], mask=cm, other=0.0)
        else:
            v = c
        mn = tl.maximum(m, tl.max(sc, 1))
        p = tl.exp(sc - mn[:, None])
        a = tl.exp(m - mn)
        den = den * a + tl.sum(p, 1)
        acc = acc * a[:, None] + tl.sum(p[:, :, None] * v[None, :, :], 1)
        m = mn
    tl.store(O + rows[:, None] * DV + cv[None, :], acc / den[:, None], mask=rm)
    tl.store(L + rows, m + tl.log(den), mask=rows < R)


def launch_mla(N=40, d=32, dv=16, H=4, N_q=5, Br=8, Bc=16, mla="shared"):
    """One batch item, H query heads over one latent head (K (1, 1, N, d), V = K[..., :dv]), N_q query rows each,
    packed: R = H N_q rows of Q in blocks of Br."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, H, N_q, d, generator=g)
    k = torch.randn(1, 1, N, d, generator=g)
    v = k[..., :dv]
    o, lse = torch.empty(1, H, N_q, dv), torch.empty(1, H, N_q)
    R = H * N_q
    mla_fwd[(triton.cdiv(R, Br),)](q, k, v, o, lse, N, R, d**-0.5, DV=dv, DR=d - dv, NAIVE=mla == "naive",
                                   BLOCK_M=Br, BLOCK_N=Bc)  # fmt: skip
    return {"Q": q, "K": k, "V": v, "O": o, "L": lse, "scale": d**-0.5}


@triton.jit
def window_fwd(Q, K, V, O, L, N, W, scale, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A causal sliding window of width W (row r sees r - W < c <= r), FlashAttention-2 style, one head (N, D):
    program i walks only the key blocks its rows can see, from the block holding r0 - W + 1 to the one holding its
    last row; it reads no block mask (the range is computed here)."""
    i = tl.program_id(0)
    r0 = i * BLOCK_M
    rows = r0 + tl.arange(0, BLOCK_M)
    dd = tl.arange(0, D)
    rm = rows[:, None] < N
    q = tl.load(Q + rows[:, None] * D + dd[None, :], mask=rm, other=0.0)
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    den = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    lo = (tl.maximum(r0 - W + 1, 0) // BLOCK_N) * BLOCK_N
    hi = tl.minimum(r0 + BLOCK_M, N)
    for s in range(lo, hi, BLOCK_N):
        cols = s + tl.arange(0, BLOCK_N)
        cm = cols[:, None] < N
        k = tl.load(K + cols[:, None] * D + dd[None, :], mask=cm, other=0.0)
        v = tl.load(V + cols[:, None] * D + dd[None, :], mask=cm, other=0.0)
        seen = (cols[None, :] <= rows[:, None]) & (cols[None, :] > rows[:, None] - W) & (cols[None, :] < N)
        sc = tl.where(seen, tl.sum(q[:, None, :] * k[None, :, :], 2) * scale, float("-inf"))
        mn = tl.maximum(m, tl.max(sc, 1))
        p = tl.exp(sc - mn[:, None])
        a = tl.exp(m - mn)
        den = den * a + tl.sum(p, 1)
        acc = acc * a[:, None] + tl.sum(p[:, :, None] * v[None, :, :], 1)
        m = mn
    tl.store(O + rows[:, None] * D + dd[None, :], acc / den[:, None], mask=rm)
    tl.store(L + rows, m + tl.log(den), mask=rows < N)


def launch_window(N=40, d=16, W=12, Br=16, Bc=8):
    """One head, (N, d) contiguous, a causal window of W keys."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(N, d, generator=g) for _ in range(3))
    o, lse = torch.empty(N, d), torch.empty(N)
    window_fwd[(triton.cdiv(N, Br),)](q, k, v, o, lse, N, W, d**-0.5, D=d, BLOCK_M=Br, BLOCK_N=Bc)
    return {"Q": q, "K": k, "V": v, "O": o, "L": lse}


@triton.jit
def scores_kernel(Q, K, S, Mask, N, D: tl.constexpr, BLOCK: tl.constexpr):
    """Writes the masked scores S = (Q K^T) * Mask of one row block to memory, reading an N x N mask: arrays the
    flash2 model does not have (its Q, K reads are flash2's, with no V, O, L)."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, BLOCK)
    dd = tl.arange(0, D)
    q = tl.load(Q + rows[:, None] * D + dd[None, :])
    for s in range(0, N, BLOCK):
        k = tl.load(K + (s + cols)[:, None] * D + dd[None, :])
        mk = tl.load(Mask + rows[:, None] * N + (s + cols)[None, :])
        tl.store(S + rows[:, None] * N + (s + cols)[None, :], tl.sum(q[:, None, :] * k[None, :, :], 2) * mk)


def launch_scores(N=32, d=16, Br=16, Bc=16):
    """A kernel moving most of its words in arrays the model does not have (an N x N mask read, S written)."""
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(N, d, generator=g), torch.randn(N, d, generator=g)
    s, mask = torch.empty(N, N), (torch.rand(N, N, generator=g) > 0.5).float()
    scores_kernel[(N // 16,)](q, k, s, mask, N, D=d, BLOCK=16)
    return {"Q": q, "K": k, "S": s, "mask": mask}


def launch_prints(N=16, d=4):
    """A launcher that says what it launches (its output is shown before the counts)."""
    x, y = torch.arange(float(N * d)), torch.empty(N * d)
    print(f"launching scale_into on {N} rows")
    scale_into[(1,)](x, y, N, d, d, DV=d, BLOCK_N=N)
    return {"X": x, "Y": y}


def launch_returns_none(N=16, d=4):
    """A launcher that forgets to return its arrays."""
    x, y = torch.arange(float(N * d)), torch.empty(N * d)
    scale_into[(1,)](x, y, N, d, d, DV=d, BLOCK_N=N)

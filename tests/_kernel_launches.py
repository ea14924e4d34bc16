"""Launchers for tests/test_kernels_launch.py: one small FlashAttention-2 forward launched the ways kernel authors
launch kernels (launch options, @triton.autotune pinned or several, @triton.heuristics, tensor descriptors, a
library-style host function), a tutorial-style variant storing its logsumexp past the end of its array at a ragged N,
launchers whose block sizes disagree with the kernel's, a kernel whose store depends on a score (refused by --fast).
Written for iosim's tests; imported only by the counting subprocess (TRITON_INTERPRET=1 set first).
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _step(q, k, v, cols, N, qk_scale, m, l, acc, LOG2: tl.constexpr):
    """One key block of the online softmax (k is BLOCK_N x d): the new (m, l, acc). LOG2: exp2, the scale times
    log2(e) (the Triton tutorial family)."""
    sc = tl.where(cols[None, :] < N, tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
    mn = tl.maximum(m, tl.max(sc, 1))
    if LOG2:
        p = tl.exp2(sc - mn[:, None])
        a = tl.exp2(m - mn)
    else:
        p = tl.exp(sc - mn[:, None])
        a = tl.exp(m - mn)
    return mn, l * a + tl.sum(p, 1), acc * a[:, None] + tl.dot(p, v)


@triton.jit
def _rows(Q, K, V, O, L, N, d, base, l_base, s_n, qk_scale, i, LOG2: tl.constexpr, MASK_L: tl.constexpr,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    """Row block i of one head at ``base`` (row stride s_n): load Q_i, stream K_j, V_j, store O_i and L_i (L_i
    without its row mask unless MASK_L: the tutorial's unmasked store, which runs past L at a ragged N)."""
    rows = i * BLOCK_M + tl.arange(0, BLOCK_M)
    dd = tl.arange(0, BLOCK_D)
    qm = (rows[:, None] < N) & (dd[None, :] < d)
    q = tl.load(Q + base + rows[:, None] * s_n + dd[None, :], mask=qm, other=0.0)
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for s in range(0, N, BLOCK_N):
        cols = s + tl.arange(0, BLOCK_N)
        km = (cols[:, None] < N) & (dd[None, :] < d)
        k = tl.load(K + base + cols[:, None] * s_n + dd[None, :], mask=km, other=0.0)
        v = tl.load(V + base + cols[:, None] * s_n + dd[None, :], mask=km, other=0.0)
        m, l, acc = _step(q, k, v, cols, N, qk_scale, m, l, acc, LOG2)
    tl.store(O + base + rows[:, None] * s_n + dd[None, :], acc / l[:, None], mask=qm)
    lse = m + tl.log2(l) if LOG2 else m + tl.log(l)
    if MASK_L:
        tl.store(L + l_base + rows, lse, mask=rows < N)
    else:
        tl.store(L + l_base + rows, lse)


@triton.jit
def fwd(Q, K, V, O, L, N, d, scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    # one head, (N, d) contiguous: FlashAttention-2's forward, one program per row block
    _rows(Q, K, V, O, L, N, d, 0, 0, d, scale, tl.program_id(0), False, True, BLOCK_M, BLOCK_N, BLOCK_D)


tuned = triton.autotune(
    configs=[
        triton.Config({"BLOCK_M": 32, "BLOCK_N": 16}, num_warps=4, num_stages=2),
        triton.Config({"BLOCK_M": 16, "BLOCK_N": 32}, num_warps=8, num_stages=3),
    ],
    key=["N"],
)(fwd)
pinned = triton.autotune(configs=[triton.Config({"BLOCK_M": 32, "BLOCK_N": 16}, num_warps=4)], key=["N"])(fwd)
heur = triton.heuristics({"BLOCK_D": lambda a: triton.next_power_of_2(a["d"])})(fwd)


def _inputs(N, d):
    g = torch.Generator().manual_seed(0)
    Q, K, V = (torch.randn(N, d, generator=g) for _ in range(3))
    return Q, K, V, torch.empty_like(Q), torch.empty(N)


def launch(N, d):
    Q, K, V, O, L = _inputs(N, d)
    fwd[(triton.cdiv(N, 32),)](
        Q,
        K,
        V,
        O,
        L,
        N,
        d,
        d**-0.5,
        BLOCK_M=32,
        BLOCK_N=16,
        BLOCK_D=triton.next_power_of_2(d),
        num_warps=4,
        num_stages=3,
    )
    return {"Q": Q, "K": K, "V": V, "O": O, "L": L}


def launch_tuned(N, d):
    Q, K, V, O, L = _inputs(N, d)
    tuned[lambda meta: (triton.cdiv(N, meta["BLOCK_M"]),)](
        Q, K, V, O, L, N, d, d**-0.5, BLOCK_D=triton.next_power_of_2(d)
    )
    return {"Q": Q, "K": K, "V": V, "O": O, "L": L}


def launch_pinned(N, d):
    Q, K, V, O, L = _inputs(N, d)
    pinned[lambda meta: (triton.cdiv(N, meta["BLOCK_M"]),)](
        Q, K, V, O, L, N, d, d**-0.5, BLOCK_D=triton.next_power_of_2(d)
    )
    return {"Q": Q, "K": K, "V": V, "O": O, "L": L}


def launch_heur(N, d):
    Q, K, V, O, L = _inputs(N, d)
    heur[(triton.cdiv(N, 32),)](Q, K, V, O, L, N, d, d**-0.5, BLOCK_M=32, BLOCK_N=16, num_warps=2)
    return {"Q": Q, "K": K, "V": V, "O": O, "L": L}


def launch_ragged(N, d, H=2):
    """The tutorial's unmasked logsumexp store: at a ragged N, head H - 1's last row block stores past L's end."""
    return _strided(N, d, 1, H, "BHND", False, mask_l=False)


def launch_swallows(N, d, Br=64, Bc=64):
    """Takes block sizes and ignores them: runs 32 x 16."""
    return launch(N, d)


def launch_says(N, d):
    """Returns block sizes that are not the ones it ran."""
    return {**launch(N, d), "Br": 64, "Bc": 16}


def attention(q, k, v, block_m=32, block_n=16):
    """A library-style host function: allocates its outputs, launches, returns (o, lse)."""
    N, d = q.shape
    o, lse = torch.empty_like(q), torch.empty(N)
    fwd[(triton.cdiv(N, block_m),)](
        q,
        k,
        v,
        o,
        lse,
        N,
        d,
        d**-0.5,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=triton.next_power_of_2(d),
        num_warps=4,
        num_stages=2,
    )
    return o, lse


def launch_host(N, d):
    Q, K, V, _, _ = _inputs(N, d)
    O, L = attention(Q, K, V)
    return {"Q": Q, "K": K, "V": V, "O": O, "L": L}


def launch_unnamed(N, d):
    """Names nothing: the kernel's parameters are not the model's names."""
    Q, K, V, O, L = _inputs(N, d)
    fwd[(triton.cdiv(N, 32),)](Q, K, V, O, L, N, d, d**-0.5, BLOCK_M=32, BLOCK_N=16, BLOCK_D=16)
    return {"names": {"Q": "q_ptr", "K": "k_ptr", "V": "v_ptr", "O": "o_ptr", "L": "lse_ptr"}}


@triton.jit
def desc_fwd(
    q_desc, k_desc, v_desc, o_desc, L, N, scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr
):
    i = tl.program_id(0)
    q = q_desc.load([i * BLOCK_M, 0])
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for s in range(0, N, BLOCK_N):
        cols = s + tl.arange(0, BLOCK_N)
        m, l, acc = _step(q, k_desc.load([s, 0]), v_desc.load([s, 0]), cols, N, scale, m, l, acc, False)
    o_desc.store([i * BLOCK_M, 0], acc / l[:, None])
    rows = i * BLOCK_M + tl.arange(0, BLOCK_M)
    tl.store(L + rows, m + tl.log(l), mask=rows < N)


def launch_desc(N, d):
    from triton.tools.tensor_descriptor import TensorDescriptor

    Q, K, V, O, L = _inputs(N, d)
    dq = [TensorDescriptor.from_tensor(x, [32, d]) for x in (Q, O)]
    dk = [TensorDescriptor.from_tensor(x, [16, d]) for x in (K, V)]
    desc_fwd[(triton.cdiv(N, 32),)](
        dq[0], dk[0], dk[1], dq[1], L, N, d**-0.5, BLOCK_M=32, BLOCK_N=16, BLOCK_D=d, num_warps=4
    )
    return {"Q": Q, "K": K, "V": V, "O": O, "L": L}


# --- conventions: the logsumexp a kernel stores, the layouts of its arrays ----------------------------------------
@triton.jit
def strided_fwd(Q, K, V, O, L, N, d, H, scale, s_b, s_h, s_n, LOG2: tl.constexpr, MASK_L: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    # one program per (row block, batch x head) over arrays with strides (s_b, s_h, s_n, 1); L is (B, H, N)
    bh = tl.program_id(1)
    qk_scale = scale * 1.4426950408889634 if LOG2 else scale
    _rows(Q, K, V, O, L, N, d, (bh // H) * s_b + (bh % H) * s_h, bh * N, s_n, qk_scale, tl.program_id(0), LOG2,
          MASK_L, BLOCK_M, BLOCK_N, BLOCK_D)  # fmt: skip


def _strided(N, d, B, H, layout, log2, mask_l=True):
    g = torch.Generator().manual_seed(1)
    shape = (B, N, H, d) if layout == "BNHD" else (B, H, N, d)
    Q, K, V = (torch.randn(shape, generator=g) for _ in range(3))
    O, L = torch.empty_like(Q), torch.empty(B, H, N)
    s_b, s_h, s_n = (Q.stride(0), Q.stride(2), Q.stride(1)) if layout == "BNHD" else Q.stride()[:3]
    strided_fwd[(triton.cdiv(N, 32), B * H)](Q, K, V, O, L, N, d, H, d**-0.5, s_b, s_h, s_n, LOG2=log2,
                                             MASK_L=mask_l, BLOCK_M=32, BLOCK_N=16,
                                             BLOCK_D=triton.next_power_of_2(d))  # fmt: skip
    return {"Q": Q, "K": K, "V": V, "O": O, "L": L, "H": B * H}


def launch_log2(N, d):
    """Stores a log2-domain logsumexp and says so."""
    return {**_strided(N, d, 1, 2, "BHND", True), "logsumexp": "log2"}


def launch_log2_unsaid(N, d):
    """Stores a log2-domain logsumexp and does not say so."""
    return _strided(N, d, 1, 2, "BHND", True)


def launch_bnhd(N, d):
    """(B, N, H, d) arrays, declared."""
    return {**_strided(N, d, 2, 3, "BNHD", False), "layout": "BNHD"}


def launch_bnhd_undeclared(N, d):
    return _strided(N, d, 2, 3, "BNHD", False)


def launch_layout_unknown(N, d):
    return {**_strided(N, d, 2, 3, "BNHD", False), "layout": "NHD"}


def launch_decode_bhd(N, d, H=2):
    """Split-KV decoding with queries (batch, H, d): declared BHD (the cache K, V is (batch, H, N, d))."""
    from iosim.kernels.examples.triton_decode_splitkv import launch as decode

    out = decode(N=N, d=d, Bc=16, splits=2, H=H)
    q, o = out["Q"].reshape(1, H, d), out["O"].reshape(1, H, d)
    return {**out, "Q": q, "O": o, "K": out["K"][None], "V": out["V"][None], "layout": "BHD"}


def launch_decode_bhd_undeclared(N, d, H=2):
    return {k: v for k, v in launch_decode_bhd(N, d, H).items() if k != "layout"}


# --- stray accesses: a site that moves one argument, then another -------------------------------------------------
def launch_stray(N, d, B=2):
    """L allocated for one batch item of two, and O carved from the same allocation right after it: batch item 1's
    logsumexp stores run past L's end and land wholly inside O (no lane outside every argument)."""
    g = torch.Generator().manual_seed(2)
    Q, K, V = (torch.randn(B, 1, N, d, generator=g) for _ in range(3))
    buf = torch.zeros(N + B * N * d)
    L, O = buf[:N].view(1, 1, N), buf[N:].view(B, 1, N, d)
    strided_fwd[(triton.cdiv(N, 32), B)](Q, K, V, O, L, N, d, 1, d**-0.5, *Q.stride()[:3], LOG2=False, MASK_L=True,
                                         BLOCK_M=32, BLOCK_N=16, BLOCK_D=triton.next_power_of_2(d))  # fmt: skip
    return {"Q": Q, "K": K, "V": V, "O": O, "L": L, "B": B}


@triton.jit
def pick(A, B, Out, BLOCK: tl.constexpr):
    # program 0 copies A, program 1 copies B: one load site whose pointer is chosen at run time
    pid = tl.program_id(0)
    src = A
    if pid == 1:
        src = B
    x = tl.load(src + tl.arange(0, BLOCK))  # the site that selects its pointer
    tl.store(Out + pid * BLOCK + tl.arange(0, BLOCK), x)


def launch_pick(N, d, declare=None):
    A, B = torch.arange(16.0), torch.arange(16.0, 32.0)
    Out = torch.empty(32)
    pick[(2,)](A, B, Out, BLOCK=16)
    return {"A": A, "B": B, "Out": Out, **({"selects_pointers": declare} if declare is not None else {})}


def launch_pick_kernel(N, d):
    """The same kernel, declared by name."""
    return launch_pick(N, d, ["pick"])


def launch_pick_site(N, d):
    """The same kernel, declared by its load's FILE.py:LINE."""
    import inspect

    lines, first = inspect.getsourcelines(pick.fn)
    line = first + next(i for i, t in enumerate(lines) if "x = tl.load(src" in t)
    return launch_pick(N, d, [f"_kernel_launches.py:{line}"])


def launch_pick_wrong(N, d):
    return launch_pick(N, d, ["_kernel_launches.py:1"])


@triton.jit
def _copy_block(src, Out, pid, BLOCK: tl.constexpr):
    tl.store(Out + pid * BLOCK + tl.arange(0, BLOCK), tl.load(src + tl.arange(0, BLOCK)))


@triton.jit
def two_calls(A, B, Out, BLOCK: tl.constexpr):
    # one jitted helper called from two lines with two pointers: two sites, nothing stray
    pid = tl.program_id(0)
    if pid == 0:
        _copy_block(A, Out, pid, BLOCK)
    else:
        _copy_block(B, Out, pid, BLOCK)


def launch_two_calls(N, d):
    A, B = torch.arange(16.0), torch.arange(16.0, 32.0)
    Out = torch.empty(32)
    two_calls[(2,)](A, B, Out, BLOCK=16)
    return {"A": A, "B": B, "Out": Out}


@triton.jit
def score_branch(Q, K, Out, BLOCK: tl.constexpr):
    # whether a row is stored depends on the value of a score (iosim kernel --fast must compute it: refused)
    r = tl.arange(0, BLOCK)
    q = tl.load(Q + r[:, None] * BLOCK + r[None, :])
    k = tl.load(K + r[:, None] * BLOCK + r[None, :])
    total = tl.sum(tl.sum(tl.dot(q, tl.trans(k)), 1), 0)
    if total > 0:
        tl.store(Out + r, tl.load(Q + r))


def launch_score_branch(N, d):
    g = torch.Generator().manual_seed(0)
    Q, K = torch.randn(16, 16, generator=g), torch.randn(16, 16, generator=g)
    Out = torch.zeros(16)
    score_branch[(1,)](Q, K, Out, BLOCK=16)
    return {"Q": Q, "K": K, "Out": Out}

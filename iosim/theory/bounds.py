"""The papers' I/O bounds, each with its citation and regime.

Lower bounds with explicit constants are used to judge measured counts (measured / bound); upper bounds are the
papers' Theta(.) expressions evaluated with constant 1, shown for orientation only. Constants not stated by the
authors are marked provisional, as in docs/theory-provisional.md.

Regimes: M >= d^2 is the large-cache regime (FlashAttention is optimal, Saha & Ye Theorem 3.1); M < d^2 is the
small-cache regime (square tiling wins, Theta(N^2 d / sqrt(M))).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Bound:
    name: str
    kind: str  # "lower" or "upper (asymptotic, constant 1)"
    value: float
    formula: str
    citation: str
    regime: str
    applies: bool  # whether (N, d, M) lie in the regime where the bound is stated

    @property
    def is_lower(self) -> bool:
        return self.kind == "lower"


def regime(d: int, M: int) -> str:
    return "large cache (M >= d^2)" if M >= d * d else "small cache (M < d^2)"


def is_large_cache(d: int, M: int) -> bool:
    return M >= d * d


def theory_winner(d: int, M: int) -> tuple[str, str]:
    """The algorithm the asymptotic theory says moves the fewest words at (d, M), and why: (name, reason).

    Small cache (M < d^2): square tiling, Theta(N^2 d / sqrt(M)), beats FlashAttention's Theta(N^2 d^2 / M) by the
    factor d / sqrt(M) > 1 (Saha & Ye Theorems 3.5, 3.7; backward: Li et al. Theorems 4.3, 4.4). Large cache
    (M >= d^2): FlashAttention is optimal (Saha & Ye Theorem 3.1; flash2 has the smaller constant). Near M = d^2
    the constants decide (docs/theory-bounds.md#regime: F1 and S1 cross at about 1.67 d^2); ``iosim compare`` shows the
    measured order.
    """
    if is_large_cache(d, M):
        return "flash2", (
            "FlashAttention's N^2 d^2 / M <= N^2 d / sqrt(M) when M >= d^2 (Saha & Ye Thm 3.1; backward: Li et al. "
            "Thm 4.1, 4.2)"
        )
    return "square-tiling", (
        "its N^2 d / sqrt(M) < FlashAttention's N^2 d^2 / M when M < d^2 (Saha & Ye Thm 3.5, 3.7; backward: Li et al. "
        "Thm 4.3, 4.4)"
    )


def forward_bounds(N: int, d: int, M: int, scores: int | None = None) -> list[Bound]:
    """The forward's bounds. ``scores``: the scores the problem computes (default N^2; causal N(N+1)/2). The
    lower bounds count computed scores (level-1 summation trees, products of the QK^T matmul, entries of QK^T), and
    each argument holds for any subset of them, so N^2 becomes ``scores``
    (docs/theory-bounds.md#how-the-lower-bound-is-chosen); the upper bounds are the dense Theta expressions."""
    large = is_large_cache(d, M)
    Z = N * N if scores is None else scores
    return [
        Bound(
            "trivial",
            "lower",
            4 * N * d,
            "4Nd",
            "read Q, K, V and write O once",
            "any M",
            True,
        ),
        Bound(
            "Saha-Ye large-cache",
            "lower",
            max(0.0, Z * d * d / (4 * (M + d * d)) - M),
            "N^2 d^2 / (4(M + d^2)) - M",
            "Saha & Ye, ICML 2024, Lemma 3.3-3.4 + Hong-Kung "
            "(constant derived in docs/theory-bounds.md#forward-bounds, provisional)",
            "M >= d^2, standard matmul",
            large,
        ),
        Bound(
            "Saha-Ye small-cache",
            "lower",
            max(0.0, 2 * Z * d / math.sqrt(M) - 2 * M),
            "2 N^2 d / sqrt(M) - 2M",
            "Saha & Ye, ICML 2024, Theorem 3.7 via the tight matmul bound (Smith, van de Geijn et al.)",
            "M < d^2, standard matmul",
            not large,
        ),
        Bound(
            "Saha-Ye any-matmul",
            "lower",
            max(0.0, min(Z * d * d / (8 * M), Z / 8) - M),
            "min(N^2 d^2 / (8M), N^2 / 8) - M",
            "Saha & Ye, ICML 2024, Theorem 4.8 "
            "(fields with q > N; constant derived in docs/theory-bounds.md#forward-bounds, provisional)",
            "any M, any matmul algorithm",
            True,
        ),
        Bound(
            "FlashAttention Thm 2",
            "upper (asymptotic, constant 1)",
            N * N * d * d / M,
            "N^2 d^2 / M",
            "Dao et al., NeurIPS 2022, Theorem 2 (FlashAttention)",
            "d <= M <= Nd",
            d <= M <= N * d,
        ),
        Bound(
            "standard Thm 2",
            "upper (asymptotic, constant 1)",
            N * d + N * N,
            "Nd + N^2",
            "Dao et al., NeurIPS 2022, Theorem 2 (standard attention; needs M >~ d^2, "
            "docs/theory-bounds.md#forward-bounds)",
            "M >= d^2",
            large,
        ),
        Bound(
            "Saha-Ye square tiling",
            "upper (asymptotic, constant 1)",
            N * N * d / math.sqrt(M),
            "N^2 d / sqrt(M)",
            "Saha & Ye, ICML 2024, Theorem 3.5 (Algorithm 1)",
            "M < d^2",
            not large,
        ),
    ]


def backward_bounds(N: int, d: int, M: int, scores: int | None = None) -> list[Bound]:
    """The backward's bounds; ``scores`` as in :func:`forward_bounds`."""
    large = is_large_cache(d, M)
    Z = N * N if scores is None else scores
    return [
        Bound(
            "trivial",
            "lower",
            7 * N * d,
            "7Nd",
            "read Q, K, V, dO and write dQ, dK, dV once (docs/theory-bounds.md#backward-bounds, L0)",
            "any M",
            True,
        ),
        Bound(
            "fine-grained large-cache",
            "lower",
            max(0.0, Z * d * d / (4 * (M + d * d)) - M),
            "N^2 d^2 / (4(M + d^2)) - M",
            "Li, Liang, Shi, Song, Zhou, arXiv 2410.09397, Thm 4.2 (via Saha-Ye Lemma 3.4; constant provisional)",
            "M >= d^2, standard matmul",
            large,
        ),
        Bound(
            "fine-grained small-cache",
            "lower",
            max(0.0, 2 * Z * d / math.sqrt(M) - 2 * M),
            "2 N^2 d / sqrt(M) - 2M",
            "Li et al., arXiv 2410.09397, Thm 4.4 (Hong-Kung matmul bound on the QK^T product)",
            "M < d^2, standard matmul",
            not large,
        ),
        Bound(
            "fine-grained Thm 1.1",
            "upper (asymptotic, constant 1)",
            min((N * N * d * d + N * d**3) / M, (N * N * d + N * d * d) / math.sqrt(M)),
            "min{(N^2 d^2 + N d^3)/M, (N^2 d + N d^2)/sqrt(M)}",
            "Li et al., arXiv 2410.09397, Theorem 1.1 (tight; Theta)",
            "any M",
            True,
        ),
    ]


def lower_bound(N: int, d: int, M: int, backward: bool = False, mask=None, causal: bool = False) -> tuple[float, str]:
    """The largest lower bound that applies at (N, d, M): its value and name. With a mask (a TileMask other than
    none or causal) the dense bounds do not apply: the sparse nnz bound (L6, provisional, constant 1) is used. A
    causal problem computes N(N+1)/2 scores, not N^2: its bounds count those (a bound proven for all N^2 scores
    would not be proven for a schedule that forms about half of them)."""
    if mask is not None and getattr(mask, "label", "") == "none":
        mask = None  # the dense mask compiled: the dense bounds apply
    if mask is not None:
        sparse = sparse_lower_bound(N, d, M, mask.nnz())[0]
        floor = masked_compulsory(N, d, mask, backward)
        if floor >= sparse:
            return float(floor), "trivial, masked rows and keys"
        return sparse, "sparse nnz (L6, provisional)"
    scores = N * (N + 1) // 2 if causal else None
    bounds = backward_bounds(N, d, M, scores) if backward else forward_bounds(N, d, M, scores)
    best = max((b for b in bounds if b.is_lower and b.applies), key=lambda b: b.value)
    return best.value, best.name + (", causal scores" if causal and best.name != "trivial" else "")


def masked_compulsory(N: int, d: int, mask, backward: bool = False) -> int:
    """The trivial bound under a mask (one head, N x N): read each query row that sees a key, each key (and its
    value) that some row sees, write O whole (a row that sees nothing still has its output); the backward reads Q,
    O, dO and L of those rows and writes dQ, dK, dV whole. Any mask kind, a mask_mod's included, so the bound a
    ``mod:`` mask reports is never below the one its built-in twin reports."""
    from iosim.algorithms.tile_masks import seen_counts

    kind, params, table, _ = mask.args
    rows, keys = (int(x) for x in seen_counts(kind, params, table, N, 0, N))
    if backward:
        return 3 * rows * d + rows + 2 * keys * d + 3 * N * d
    return rows * d + 2 * keys * d + N * d


# ---------------------------------------------------------------------------------------------------------------
# Sparse attention (masks, iosim.masking.masks)
# ---------------------------------------------------------------------------------------------------------------
SPARSE_NOTE = (
    "provisional: the fine-grained paper's sparse theorem could not be read; this is the nnz form L6 of "
    "docs/theory-bounds.md#sparse-bounds "
    "(Pagh-Stoeckel's semiring sparse-matmul bound with block size 1 applied to Q K^T), constant 1"
)


def sparse_lower_bound(N: int, d: int, M: int, nnz: int) -> tuple[float, float]:
    """L6 (docs/theory-bounds.md#sparse-bounds), provisional: min{Z_in^2 / M, Z_in sqrt(Z_QK / M)}, switching at
    M* = Z_in^2 / Z_QK.

    Derivation (docs/theory-bounds.md): Pagh & Stoeckel bound semiring sparse matrix products by
    (N'/B) min(sqrt(Z'/M), N'/M) with N' the nonzeros of the operands and Z' those of the product; with B = 1,
    operands Q, K (Z_in = Nd, as in the paper's dense check) and the product restricted to the mask's Z_QK allowed
    scores this reads min{Z_in^2 / M, Z_in sqrt(Z_QK) / sqrt(M)}. Dense (Z_QK = N^2): min{N^2 d^2 / M, N^2 d /
    sqrt(M)}, Saha & Ye's two regimes, and the switch Z_in^2 / Z_QK = d^2. The first term is the smaller one exactly
    when M >= M* (the sparse "large cache"). Returns (value, M*).
    """
    Z_in, Z_QK = N * d, max(int(nnz), 1)
    return min(Z_in * Z_in / M, Z_in * math.sqrt(Z_QK / M)), Z_in * Z_in / Z_QK


def block_density(N: int, Br: int, Bc: int, mask) -> float:
    """s of Proposition 4: the fraction of the Br x Bc blocks the mask leaves nonzero."""
    from iosim.theory.io_model import tile_sums

    return tile_sums(N, Br, Bc, mask).tiles / (-(-N // Br) * -(-N // Bc))


def sparse_bounds(N: int, d: int, M: int, mask, tilings: dict | None = None) -> list[Bound]:
    """Proposition 4 with s measured on each algorithm's own tiling (``tilings``: name -> Tiling; by default the
    ``fit`` tilings of flash1 and flash2 at these sizes) and the provisional nnz lower bound L6."""
    from iosim.runner import registry

    nnz = mask.nnz()
    value, switch = sparse_lower_bound(N, d, M, nnz)
    out = [
        Bound(
            "sparse nnz lower bound (L6)",
            "lower (asymptotic, constant 1, provisional)",
            value,
            "min{Z_in^2 / M, Z_in sqrt(Z_QK / M)}, Z_in = Nd, Z_QK = nnz",
            "Li et al., arXiv 2410.09397, sparse theorem in the form L6 of "
            "docs/theory-bounds.md#sparse-bounds (provisional)",
            f"Z_QK = {nnz:,} of N^2 = {N * N:,} (density {nnz / (N * N):.3g}); "
            f"{'large' if M >= switch else 'small'} sparse cache: M {'>=' if M >= switch else '<'} "
            f"Z_in^2 / Z_QK = {switch:,.0f}",
            True,
        )
    ]
    if tilings is None:
        tilings = {}
        for name in ("flash1", "flash2"):
            try:
                tilings[name] = registry.get(name).choose_tiling(N, d, M, "fit")
            except Exception:  # noqa: BLE001 - an M too small for this algorithm: no Prop. 4 line for it
                continue
    for name, t in tilings.items():
        s = block_density(N, t.Br, t.Bc, mask)
        out.append(
            Bound(
                f"Proposition 4 ({name})",
                "upper (asymptotic, constant 1)",
                N * d + N * N * d * d * s / M,
                "Nd + N^2 d^2 s / M",
                "Dao et al., NeurIPS 2022, Proposition 4 (block-sparse FlashAttention)",
                f"s = {s:.4g}: nonzero blocks of {t.Br} x {t.Bc} ({name}'s tiling)",
                d <= M <= N * d,
            )
        )
    return out


PROBLEM_NOTE = (
    "the papers' bounds (Dao et al. Theorem 2, Saha & Ye, Li et al.) are stated for one head with N_q = N_k = N "
    "and d_qk = d_v = d; for any other problem only the compulsory traffic is a bound here"
)


def problem_bounds(problem, M: int, seen: tuple[int, int] | None = None) -> list[Bound]:
    """The bounds that apply to a problem (an :class:`iosim.spec.problem.Problem`): the compulsory traffic always (read
    Q, the KV cache once per key/value head, write O: the floor decoding kernels aim for; MLA's latent is one
    cache), and the papers' forward bounds only for one head with N_q = N_k and d_qk = d_v (:data:`PROBLEM_NOTE`)."""
    p = problem
    floor = Bound(
        "compulsory",
        "lower",
        float(sum(p.compulsory(seen).values())),
        ("B H_q N_q (d_qk + d_v) + B H_kv N_k (d_qk + d_v)" if not p.latent else "B H_q N_q (d_qk + d_v) + B N_k d_qk")
        if seen is None
        else "B H_q (N_q' d_qk + N_q d_v) + B H_kv N_k' (d_qk + d_v), N_q' rows see a key, N_k' keys are seen",
        "every input word read once and every output word written once "
        "(docs/theory-problems.md#problems-batch-heads-decoding)",
        "any M",
        True,
    )
    if p.B == 1 and p.H_q == 1 and p.N_q == p.N_k and p.d_qk == p.d_v and not p.latent and seen is None:
        return [floor] + [b for b in forward_bounds(p.N_q, p.d_qk, M) if b.applies and b.name != "trivial"]
    return [floor]


def topk_compulsory(indices, dims: tuple, block: int, q_block: int, latent: bool, causal: bool = False) -> dict:
    """The compulsory traffic of sparse attention by top-k indices, in words: read Q, write O, and read once per
    key/value head the union of the keys that its query heads' rows attend to (every other key need not move): the
    keys of their selected blocks (a -1 entry selects none) and, under ``causal`` (query row r at position
    r + N_k - N_q), only those at or before the row's position. MLA's latent (``latent``) is one cache, V inside K.
    ``indices`` (B', H', T_q, k) select blocks of ``block`` keys; dims = (B, H_q, H_kv, N_q, N_k, d_qk, d_v). The
    index array itself is not counted here (it is the selection's input)."""
    import numpy as np

    from iosim.theory.io_model import topk_index_rows

    B, H_q, H_kv, N_q, N_k, d_qk, d_v = dims
    k = indices.shape[3]
    nblk = -(-N_k // block)
    irow = topk_index_rows(indices.shape, dims, q_block)
    head = np.broadcast_to((np.arange(B)[:, None, None] * H_kv + np.arange(H_q)[None, :, None] // (H_q // H_kv)),
                           irow.shape).ravel()  # fmt: skip
    n_irows = int(irow.max()) + 1
    pair = head * n_irows + irow.ravel()  # each query row's (key/value head, index row)
    pairs, inv = np.unique(pair, return_inverse=True)
    last = np.full(pairs.size, N_k, dtype=np.int64)  # the last position among a pair's rows (N_k: every key)
    if causal:
        last[:] = -(1 << 62)
        np.maximum.at(last, inv.ravel(), np.broadcast_to(np.arange(N_q) + N_k - N_q, irow.shape).ravel())
    sel = indices.reshape(-1, k)[pairs % n_irows]
    seen = np.minimum(np.minimum(block, N_k - sel * block), last[:, None] + 1 - sel * block)  # keys of j seen
    seen = np.where(sel >= 0, np.maximum(seen, 0), 0)
    per_block = np.zeros(B * H_kv * nblk, dtype=np.int64)  # keys of block j seen by some row of the head
    np.maximum.at(per_block, ((pairs // n_irows)[:, None] * nblk + np.maximum(sel, 0)).ravel(), seen.ravel())
    keys = int(per_block.sum())
    out = {"Q": B * H_q * N_q * d_qk, "K": keys * d_qk, "O": B * H_q * N_q * d_v}
    if not latent:
        out["V"] = keys * d_v
    return out

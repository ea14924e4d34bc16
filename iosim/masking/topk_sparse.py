"""Sparse attention by top-k indices: the selection, the load policies kernels use, exact counts beside their closed
form and the compulsory floor.

The selection is an integer array ``indices`` of shape (B', H', T_q, k) (or (T_q, k), one for every head): row
(b, h, t) lists the k key blocks that query rows t q_block .. (t + 1) q_block - 1 of head h of batch item b attend
to, each block ``block`` keys wide (block 1: token level, DeepSeek's DSA; block b: NSA's and MoBA's key blocks; the
last block of a ragged N_k is N_k mod b keys). B' is 1 or B; H' is 1, H_kv (one selection per key/value head, as
FlashMLA's ``indices[s_q, h_kv, topk]``) or H_q; T_q = ceil(N_q / q_block) (MoBA: one selection per block of
queries). What is refused, in one line naming ``indices``: a non-integer dtype, another shape, an index below 0 or
at or beyond ceil(N_k / block), k = 0 (an empty selection) and a block listed twice in one row (a kernel that loads
a duplicated index loads its keys twice and counts their scores twice in the softmax: refused rather than counted).

``invalid=-1`` accepts -1 entries as "no block" (fla-core's NSA top-k writes -1 where a token has fewer than k
blocks to choose from, and its selected-attention kernel reads such an index word and skips it; other negatives are
still refused, and -1 may repeat within a row). A causal problem (``Problem(causal=True)``, bottom-right aligned:
query row r is at position r + N_k - N_q) leaves out of a program's block set every selected block that starts
after the position of all its rows (j block > r + N_k - N_q: a block is loaded if any row of the program sees it;
under ``per-query`` and ``gqa`` all rows of a program share one position), and masks, inside a loaded block, the
scores of the keys after each row's position (a score mask: the block is loaded whole, as fla's kernel does). The
index words are counted in full either way: k per index row a program reads.

A row that sees no key (every entry -1, or under causal every selected key after its position) gets O = 0 and
L = -inf, in the schedule and in the float64 :func:`reference` alike: the convention of FlashAttention >= 2.1 and
FlexAttention for a row that sees no key, and iosim's for causal rows (:mod:`iosim.spec.problem`). Its program
still reads its index words and writes its O and L; it loads no K or V. fla-core's NSA kernel divides 0 by 0 there
(O = NaN, L = -inf; docs/sparse-indices.md): the error measure counts a NaN as an infinite error, so such a row is
never reported equal.

It comes as an array, ``file:PATH.npy`` (numpy.load), ``mod:FILE.py:NAME`` (the function NAME of FILE.py called
with the problem, returning the array) or a Python callable taking the problem, as masks do
(:mod:`iosim.masking.masks`).

Load policies (what one program, a thread block, holds and loads; :mod:`iosim.algorithms.topk_sparse`):

* ``per-query``: one query row of one head; it loads the k blocks its row selected.
* ``group:g``: g consecutive query rows of one head (speculative / multi-token decoding, chunked prefill); it loads
  the union of their selections once (vLLM PR #52963's question: 4 decode tokens, 22 distinct blocks, 64 loaded).
* ``gqa``: the g = H_q / H_kv query heads of one key/value head at one position (NSA's group-centric loading); the
  union of their selections, once.
* ``gather``: FlashMLA's packed path: a gather kernel copies each gqa program's selected K/V rows into a workspace
  (read the cache, write the workspace), then attention reads the workspace densely in tiles of Bc rows. Needs one
  selection per program (H' at most H_kv).

The indexer's own scan (``indexer=(H_I, d_I)`` or ``(H_I, d_I, B_n)``, default off): DeepSeek-V3.2's lightning
indexer, which writes the selection, counted first on the same memory (:func:`iosim.algorithms.topk_sparse.
indexer_scan`, closed form :func:`indexer_closed_form`): arrays q_I, w, K_I, k_scale, logits and the writes of
``indices``. It selects tokens for all heads at once, so it needs block 1, q_block 1, no -1 entries and indices of
shape (B, 1, N_q, k) (or (N_q, k) when B = 1). Bytes at DeepSeek-V3.2-Exp's dtypes (:data:`INDEXER_BYTES`).

>>> from iosim import Problem
>>> import numpy as np
>>> idx = np.array([[0, 2], [2, 3], [1, 3], [0, 1]])  # 4 query rows, 2 blocks of 16 keys each
>>> p = Problem(N_q=4, N_k=60, d=8)
>>> [topk_sparse(p, idx, block=16, policy=pol).words["K"] for pol in ("per-query", "group:4")]
[960, 480]
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import numpy as np

from iosim.base.errors import InputError
from iosim.masking.counted_run import CountedRun
from iosim.memory_model.core import ArrayCounts, Stats, TwoLevelMemory
from iosim.spec.problem import Problem
from iosim.theory import bounds, io_model

__all__ = [
    "POLICIES",
    "TopkResult",
    "indexer_closed_form",
    "load_indices",
    "parse_indexer",
    "parse_policy",
    "topk_sparse",
]

POLICIES = ("per-query", "group:G", "gqa", "gather")
INDEX_BYTES = 4  # int32, as FlashMLA's and vLLM's index tensors
# The indexer's arrays at DeepSeek-V3.2-Exp's dtypes (inference/model.py, Indexer): q_I and the key cache in fp8
# (float8_e4m3fn, 1 byte), one float32 scale per 128-value key (d_I = 128: one per token), float32 head weights
# and scores (fp8_index's output).
INDEXER_BYTES = {"q_I": 1, "w": 4, "K_I": 1, "k_scale": 4, "logits": 4}
INDEXER_ARRAYS = ("q_I", "w", "K_I", "k_scale", "logits")
MAX_BLOCK = 1 << 20


def parse_policy(policy) -> tuple[str, int]:
    """("per-query", 1), ("group", g), ("gqa", 0) or ("gather", 0) from a policy's name; one line otherwise."""
    if isinstance(policy, str):
        if policy in ("per-query", "gqa", "gather"):
            return policy, 1 if policy == "per-query" else 0
        if policy.startswith("group:") and policy[6:].isdigit() and 1 <= int(policy[6:]) <= 1 << 26:
            return "group", int(policy[6:])
    raise InputError("policy", "must be per-query, group:G (G from 1 to 67,108,864 consecutive query rows), gqa or "
                     "gather", policy)  # fmt: skip


def parse_indexer(indexer) -> tuple[int, int, int] | None:
    """None (no indexer) or (H_I, d_I, B_n) from (H_I, d_I), (H_I, d_I, B_n) or "H_I:d_I[:B_n]" (B_n, keys per
    scoring program, default 64); one line naming ``indexer`` otherwise."""
    if indexer is None:
        return None
    parts = indexer.split(":") if isinstance(indexer, str) else indexer
    if isinstance(parts, (list, tuple)) and all(isinstance(x, str) for x in parts):
        parts = [int(x) if x.isdigit() else x for x in parts]
    ok = isinstance(parts, (list, tuple)) and len(parts) in (2, 3)
    ok = ok and all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in parts)
    hi = (1 << 12, 1 << 16, 1 << 20)
    if not ok or not all(1 <= x <= h for x, h in zip(parts, hi[: len(parts)], strict=True)):
        raise InputError("indexer", "must be H_I:d_I or H_I:d_I:B_n (indexer heads 1 to 4,096, their width 1 to "
                         "65,536, keys per scoring program 1 to 1,048,576, default 64)", indexer)  # fmt: skip
    return int(parts[0]), int(parts[1]), int(parts[2]) if len(parts) == 3 else 64


def _indexer_fits(p: Problem, idx: np.ndarray, block: int, q_block: int, invalid) -> None:
    """One line naming ``indexer`` if the selection is not what DSA's indexer writes: k tokens per query token for
    every head (block 1, q_block 1, shape (B, 1, N_q, k), no -1 entries)."""
    if block != 1 or q_block != 1 or invalid is not None:
        raise InputError("indexer", "selects tokens for each query token: needs block 1, q_block 1 and no -1 "
                         "entries (invalid None)", f"block {block}, q_block {q_block}, invalid {invalid}")  # fmt: skip
    if idx.shape[:2] != (p.B, 1):
        raise InputError("indexer", f"writes one selection per query token for all heads: indices of shape ({p.B}, "
                         f"1, {p.N_q}, k) (or ({p.N_q}, k) when B = 1)", f"shape {idx.shape}")  # fmt: skip


def indexer_closed_form(dims: tuple, indexer: tuple, k: int) -> tuple[dict, int]:
    """The exact words of the indexer's scan, (reads, writes) per array, and its peak. dims = (B, N_q, N_k),
    indexer = (H_I, d_I, B_n), T = ceil(N_k / B_n) scoring programs per query token:

    * q_I: B N_q T H_I d_I reads (every scoring program loads its token's q_I); w: B N_q T H_I reads;
    * K_I: B N_q N_k d_I reads; k_scale: B N_q N_k reads (each token scans every key, causal or not);
    * logits: B N_q N_k written, and read once by top-k; indices: B N_q k written;
    * peak: max(H_I (d_I + 1) + c (d_I + 2), N_k + k), c = min(B_n, N_k) (a scoring program; a top-k program)."""
    B, N_q, N_k = dims
    H, d, Bn = indexer
    T, rows = -(-N_k // Bn), B * N_q
    words = {"q_I": (rows * T * H * d, 0), "w": (rows * T * H, 0), "K_I": (rows * N_k * d, 0),
             "k_scale": (rows * N_k, 0), "logits": (rows * N_k, rows * N_k), "indices": (0, rows * k)}  # fmt: skip
    return words, max(H * (d + 1) + min(Bn, N_k) * (d + 2), N_k + k)


def _with_indexer(predicted, dims: tuple, indexer: tuple, k: int):
    """The attention's closed form plus the indexer's: arrays added (indices: the writes), peak the larger."""
    words, peak = indexer_closed_form(dims, indexer, k)
    per = dict(predicted.per_array)
    for name, (r, w) in words.items():
        old = per.get(name, ArrayCounts())
        per[name] = ArrayCounts(old.reads + r, old.writes + w, old.init_writes)
    return io_model.Prediction(per, max(predicted.peak, peak))


def indexer_reference(q, w, K, ks, p: Problem, H: int, d: int):
    """float64 logits (B N_q, N_k): sum_h w[h] relu(q_I[h] . K_I[s]) k_scale[s], -inf after a row's position."""
    q3 = q.reshape(p.B, p.N_q, H, d)
    K3 = K.reshape(p.B, p.N_k, d)
    s = np.einsum("brh,brsh->brs", w.reshape(p.B, p.N_q, H), np.maximum(np.einsum("brhe,bse->brsh", q3, K3), 0))
    s = s * ks.reshape(p.B, 1, p.N_k)
    pos = np.array([position(p, r) for r in range(p.N_q)])
    s[:, np.arange(p.N_k)[None, :] > pos[:, None]] = -np.inf
    return s.reshape(p.B * p.N_q, p.N_k)


def _positive(name: str, value, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 1 <= value <= hi:
        raise InputError(name, f"must be an integer from 1 to {hi:,}", value)
    return int(value)


def _from_spec(spec, p: Problem):
    """The array an index source names (see the module docstring)."""
    label = spec if isinstance(spec, str) else type(spec).__name__
    if isinstance(spec, str) and spec.startswith("file:"):
        path = spec[5:]
        try:
            return np.load(path, allow_pickle=False), label
        except (OSError, ValueError, EOFError) as e:
            raise InputError("indices", "must be a .npy file of integers that numpy.load can read",
                             f"{path} ({type(e).__name__})") from None  # fmt: skip
    if isinstance(spec, str) and spec.startswith("mod:") and spec.count(":") == 2:
        import runpy

        _, path, name = spec.split(":")
        try:
            scope = runpy.run_path(path)
        except OSError as e:
            raise InputError("indices", "must name a readable Python file (mod:FILE.py:NAME)",
                             f"{path} ({e.strerror})") from None  # fmt: skip
        except Exception as e:  # noqa: BLE001 (the user's module: any failure is one line)
            raise InputError("indices", "must name a Python file that runs without raising",
                             f"{path}: {type(e).__name__}: {e}") from None  # fmt: skip
        if not callable(scope.get(name)):
            raise InputError("indices", f"must name a function defined in {path} (mod:FILE.py:NAME)", name)
        spec = scope[name]
    if callable(spec):
        try:
            return spec(p), label
        except Exception as e:  # noqa: BLE001
            raise InputError("indices", "function must return the index array without raising",
                             f"{label}: {type(e).__name__}: {e}") from None  # fmt: skip
    if isinstance(spec, str):
        raise InputError("indices", "must be an integer array, file:PATH.npy, mod:FILE.py:NAME or a function", spec)
    return spec, "array"


def _invalid(invalid):
    """None (every entry a block) or -1 (entries -1 mean "no block"); one line otherwise."""
    integer = isinstance(invalid, numbers.Integral) and not isinstance(invalid, bool)
    if invalid is not None and not (integer and invalid == -1):
        raise InputError("invalid", "must be None (every index is a block) or -1 (-1 entries select no block)", invalid)
    return invalid


def load_indices(spec, p: Problem, block: int = 1, q_block: int = 1, invalid: int | None = None) -> np.ndarray:
    """The selection as an int64 array (B', H', T_q, k), checked (module docstring: what is refused); ``invalid``
    -1: -1 entries are kept as "no block"."""
    invalid = _invalid(invalid)
    block = _positive("block", block, MAX_BLOCK)
    q_block = _positive("q_block", q_block, p.N_q)
    a, label = _from_spec(spec, p)
    if not isinstance(a, np.ndarray):
        a = np.asarray(a) if isinstance(a, (list, tuple)) else a
    if not isinstance(a, np.ndarray) or a.dtype.kind not in "iu":
        kind = a.dtype if isinstance(a, np.ndarray) else type(a).__name__
        raise InputError("indices", "must be an integer array (int32 or int64)", f"{label}: {kind}")
    Tq, nblk = -(-p.N_q // q_block), -(-p.N_k // block)
    if a.ndim == 2:
        a = a[None, None]
    heads = sorted({1, p.H_kv, p.H_q})
    ok = a.ndim == 4 and a.shape[0] in (1, p.B) and a.shape[1] in heads and a.shape[2] == Tq
    if not ok:
        raise InputError(
            "indices",
            f"must have shape (B', H', {Tq}, k) or ({Tq}, k) with B' in (1, {p.B}), H' in "
            f"{tuple(heads)} ({Tq} = ceil(N_q / q_block) selections)",
            f"{label}: shape {a.shape}",
        )
    if a.shape[3] == 0:
        raise InputError("indices", "must select at least one key block per row (k >= 1): an empty selection",
                         f"{label}: shape {a.shape}")  # fmt: skip
    lo, hi = int(a.min()), int(a.max())
    low = a[a != -1].min(initial=0) if invalid == -1 else lo
    if low < 0 or hi >= nblk:
        pad = "; -1 for no block" if invalid == -1 else "; -1 as no block needs invalid=-1"
        raise InputError("indices", f"must be key blocks from 0 to {nblk - 1:,} (ceil(N_k / block) = {nblk:,}{pad})",
                         f"{label}: min {lo:,}, max {hi:,}")  # fmt: skip
    a = a.astype(np.int64)
    s = np.sort(a, axis=3)
    dup = np.argwhere(((s[..., 1:] == s[..., :-1]) & (s[..., 1:] >= 0)).any(axis=3))
    if dup.size:
        where = tuple(int(x) for x in dup[0])
        raise InputError("indices", "must list each key block at most once per row (a duplicate would be loaded and "
                         "weighted twice)", f"{label}: row (b', h', t) = {where}")  # fmt: skip
    return a


@dataclass(frozen=True)
class Plan:
    """The programs of a policy as flat arrays (see :func:`iosim.algorithms.topk_sparse.topk_forward`)."""

    rows: np.ndarray
    rptr: np.ndarray
    irows: np.ndarray
    iptr: np.ndarray
    rsel: np.ndarray
    ublk: np.ndarray
    uptr: np.ndarray
    kvb: np.ndarray
    rpos: np.ndarray

    def arrays(self) -> tuple:
        return (self.rows, self.rptr, self.irows, self.iptr, self.rsel, self.ublk, self.uptr, self.kvb, self.rpos)

    @property
    def programs(self) -> int:
        return self.uptr.size - 1


def _program_rows(p: Problem, kind: str, g: int):
    """Each program's query rows as (b, h, r) lists, in launch order."""
    G = p.g
    if kind == "per-query":
        return [[(b, h, r)] for b in range(p.B) for h in range(p.H_q) for r in range(p.N_q)]
    if kind == "group":
        return [[(b, h, r) for r in range(r0, min(r0 + g, p.N_q))]
                for b in range(p.B) for h in range(p.H_q) for r0 in range(0, p.N_q, g)]  # fmt: skip
    return [[(b, hk * G + t, r) for t in range(G)] for b in range(p.B) for hk in range(p.H_kv) for r in range(p.N_q)]


def position(p: Problem, r: int) -> int:
    """The position of query row r: r + N_k - N_q under causal (bottom-right), else N_k (after every key)."""
    return r + p.offset if p.causal else p.N_k


def plan(p: Problem, idx: np.ndarray, kind: str, g: int, q_block: int, block: int) -> Plan:
    """The programs of policy (kind, g) over the selection ``idx`` (B', H', T_q, k): each loads the blocks its rows
    selected that start at or before the last position among them (:func:`position`; -1 entries: none)."""
    Bm, Hm, Tq, _ = idx.shape
    flat = idx.reshape(Bm * Hm * Tq, -1)
    rows, rptr, irows, iptr, rsel, ublk, uptr, kvb, rpos = [], [0], [], [0], [], [], [0], [], []
    for prog in _program_rows(p, kind, g):
        mine: list[int] = []
        last = max(position(p, r) for _, _, r in prog)
        for b, h, r in prog:
            hh = h if Hm == p.H_q else (h // p.g if Hm == p.H_kv else 0)
            ir = ((b if Bm == p.B else 0) * Hm + hh) * Tq + r // q_block
            if ir not in mine:
                mine.append(ir)
            rows.append((b * p.H_q + h) * p.N_q + r)
            rpos.append(position(p, r))
            rsel.append(mine.index(ir))
        union = sorted({int(j) for ir in mine for j in flat[ir] if 0 <= j * block <= last})
        irows += mine
        ublk += union
        rptr.append(len(rows))
        iptr.append(len(irows))
        uptr.append(len(ublk))
        b, h = prog[0][0], prog[0][1]
        kvb.append((b * p.H_kv + h // p.g) * p.N_k)
    return Plan(*(np.array(x, dtype=np.int64) for x in (rows, rptr, irows, iptr, rsel, ublk, uptr, kvb, rpos)))


@dataclass
class TopkResult(CountedRun):
    """A counted run beside its closed form (``stats``, ``predicted``: per array and peak), the compulsory floor
    (``floor``, words per array), bytes per array at the problem's dtypes (indices int32; the indexer's arrays at
    :data:`INDEXER_BYTES`), the indexer (H_I, d_I, B_n) if its scan was counted, the programs and, for a
    numeric run, the max abs error of O and L against the float64 reference restricted to the selected keys."""

    problem: Problem
    policy: str
    block: int
    q_block: int
    stats: Stats
    predicted: io_model.Prediction
    floor: dict
    programs: int
    errors: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict, repr=False)  # a numeric run's O (B H_q N_q, d_v) and L
    invalid: int | None = None  # -1: -1 entries selected no block
    indexer: tuple | None = None  # (H_I, d_I, B_n): the indexer's scan counted first

    def bytes_of(self, array: str, words: int) -> int:
        if array == "indices":
            return words * INDEX_BYTES
        if array in INDEXER_BYTES:
            return words * INDEXER_BYTES[array]
        return self.problem.bytes_of({"Kws": "K", "Vws": "V"}.get(array, array), words)

    @property
    def bytes(self) -> dict[str, int]:
        return {k: self.bytes_of(k, w) for k, w in self.words.items()}

    @property
    def floor_words(self) -> int:
        return sum(self.floor.values())

    @property
    def kv_words(self) -> int:
        """Words of the KV cache read (K and V): what the policies differ in."""
        return self.words.get("K", 0) + self.words.get("V", 0)


def reference(Q, K, V, p: Problem, idx: np.ndarray, block: int, q_block: int, scale: float):
    """float64 attention restricted to each row's selected keys (no -1 entry; under causal, none after the row's
    position): O (B H_q N_q, d_v) and L (B H_q N_q); a row with no such key: O = 0, L = -inf."""
    irow = io_model.topk_index_rows(idx.shape, (p.B, p.H_q, p.H_kv, p.N_q), q_block).ravel()
    flat = idx.reshape(-1, idx.shape[3])
    O = np.zeros((p.B * p.H_q * p.N_q, p.d_v))
    L = np.full(p.B * p.H_q * p.N_q, -np.inf)
    for row in range(O.shape[0]):
        b, h = row // (p.H_q * p.N_q), row // p.N_q % p.H_q
        keys = [c for j in flat[irow[row]] if j >= 0 for c in range(j * block, min((j + 1) * block, p.N_k))]
        keys = np.array([c for c in keys if c <= position(p, row % p.N_q)], dtype=np.int64)
        if keys.size == 0:
            continue
        base = (b * p.H_kv + h // p.g) * p.N_k
        s = scale * (K[base + keys] @ Q[row])
        m = s.max()
        w = np.exp(s - m)
        vals = K[base + keys, : p.d_v] if p.latent else V[base + keys]
        O[row] = w @ vals / w.sum()
        L[row] = m + np.log(w.sum())
    return O, L


def _max_error(x: np.ndarray, ref: np.ndarray) -> float:
    """max |x - ref|, a row with L = -inf in both counting 0 (one in only one: inf), and a NaN in either inf: a
    kernel that divides 0 by 0 for a row with no selected key (O = NaN) never equals the convention O = 0
    (as :func:`iosim.kernels.check` counts a NaN)."""
    diff = np.zeros(np.shape(x))
    with np.errstate(invalid="ignore"):
        np.subtract(x, ref, out=diff, where=~(np.isneginf(x) & np.isneginf(ref)))
    diff = np.abs(diff)
    return float(np.where(np.isnan(diff), np.inf, diff).max(initial=0.0))


def topk_sparse(problem: Problem, indices, *, policy: str = "per-query", block: int = 1, q_block: int = 1,
                Bc: int = 64, M: int | None = None, count_only: bool = True, seed: int = 0,
                scale: float | None = None, invalid: int | None = None, indexer=None) -> TopkResult:  # noqa: N803  # fmt: skip
    """Count the top-k sparse schedule of ``policy`` over ``problem`` for the selection ``indices`` (module
    docstring) on a fast memory of M words (default: the schedule's peak, so it fits exactly); ``Bc``: the
    workspace tile of ``gather``; ``invalid=-1``: -1 entries select no block; ``problem.causal``: blocks after every
    row of a program are not loaded, keys after a row's position are masked (module docstring).
    ``count_only=False`` also computes O and L from standard-normal inputs drawn from ``seed`` (Q, then K, then V
    unless MLA's latent, as (B H_q N_q, d_qk), (B H_kv N_k, d_qk), (B H_kv N_k, d_v) rows in (b, h, row) order) and
    compares them with the float64 reference restricted to the selected keys (and, causal, the visible ones).
    ``indexer=(H_I, d_I[, B_n])``: DSA's indexer scan counted first (module docstring); numeric, its logits from
    inputs drawn from ``[seed, 1]`` (q_I, w, K_I, k_scale) against :func:`indexer_reference` (``errors["logits"]``)
    and its own top-k in ``outputs["selection"]`` (the attention reads the ``indices`` given)."""
    p = problem
    if not isinstance(p, Problem):
        raise InputError("problem", "must be an iosim.Problem", type(p).__name__)
    if p.page_size is not None:
        raise InputError("problem", "must have no page_size field here: the indices are the selection", p)
    kind, g = parse_policy(policy)
    Bc = _positive("Bc", Bc, 1 << 20)
    idx = load_indices(indices, p, block, q_block, invalid)
    indexer = parse_indexer(indexer)
    if indexer is not None:
        _indexer_fits(p, idx, block, q_block, invalid)
    if kind == "gather" and idx.shape[1] > p.H_kv:
        raise InputError("indices", f"must hold one selection per key/value head (H' <= H_kv = {p.H_kv}) for the "
                         "gather policy: its workspace serves every query head of the group", idx.shape)  # fmt: skip
    if not isinstance(count_only, bool):
        raise InputError("count_only", "must be True or False", count_only)
    dims = (p.B, p.H_q, p.H_kv, p.N_q, p.N_k, p.d_qk, p.d_v)
    shared = p.latent
    predicted = io_model.topk_sparse(kind, g, idx, dims, block, q_block, shared, Bc, causal=p.causal)
    if indexer is not None:
        predicted = _with_indexer(predicted, (p.B, p.N_q, p.N_k), indexer, idx.shape[3])
    if M is not None and (isinstance(M, bool) or not isinstance(M, numbers.Integral) or not predicted.peak <= M):
        raise InputError("M", f"must be an integer of at least the schedule's working set, {predicted.peak:,} words", M)
    pl = plan(p, idx, kind, g, q_block, block)
    mem = TwoLevelMemory(predicted.peak if M is None else int(M), strict=True)
    numeric = not count_only
    scale = 1 / np.sqrt(p.d_qk) if scale is None else float(scale)
    out = _run(mem, p, idx, pl, kind, block, Bc, shared, scale, numeric, seed, indexer)
    stats = mem.stats()
    floor = bounds.topk_compulsory(idx, dims, block, q_block, p.latent, causal=p.causal)
    errors, outputs = {}, {}
    if numeric:
        (Q, K, V), (O, L), scan = out
        O_ref, L_ref = reference(Q, K, V, p, idx, block, q_block, scale)
        errors = {"O": _max_error(O, O_ref), "L": _max_error(L, L_ref)}
        outputs = {"O": O, "L": L}
        if indexer is not None:
            q, w, KI, ks, logits, sel = scan
            errors["logits"] = _max_error(logits, indexer_reference(q, w, KI, ks, p, *indexer[:2]))
            outputs.update(logits=logits, selection=sel)
    return TopkResult(p, policy, block, q_block, stats, predicted, floor, pl.programs, errors, outputs, invalid,
                      indexer)  # fmt: skip


def _run_indexer(mem, p: Problem, indexer: tuple, k: int, numeric: bool, seed: int, got: dict):
    """The indexer's scan on ``mem`` (:func:`iosim.algorithms.topk_sparse.indexer_scan`), before the attention;
    numeric: its (q_I, w, K_I, k_scale, logits, selection), else None."""
    from iosim.algorithms import topk_sparse as alg

    H, d, Bn = indexer
    rows, keys = p.B * p.N_q, p.B * p.N_k
    shapes = dict(q_I=(rows, H * d), w=(rows, H), K_I=(keys, d), k_scale=(keys,), logits=(rows, p.N_k))
    ids = np.array([*mem.ids(**shapes), got["indices"]], dtype=np.int64)
    data = (None,) * 6
    if numeric:
        rng = np.random.default_rng([seed, 1])
        q, w, KI = rng.standard_normal((rows, H * d)), rng.random((rows, H)), rng.standard_normal((keys, d))
        data = (q, w, KI, rng.random(keys) + 0.5, np.full((rows, p.N_k), np.nan), np.full((rows, k), -1))
    pos = np.array([position(p, r) for r in range(p.N_q)], dtype=np.int64)
    dims = np.array([p.B, p.N_q, p.N_k, H, d, Bn, k], dtype=np.int64)
    mem.call(alg.indexer_scan, ids, *data, dims, pos)
    return data if numeric else None


def _run(mem, p: Problem, idx, pl: Plan, kind: str, block: int, Bc: int, shared: bool, scale: float, numeric: bool,
         seed: int, indexer: tuple | None = None):  # fmt: skip
    """The kernels on ``mem`` (the indexer's scan first, if any); numeric: ((Q, K, V), (O, L), the indexer's
    arrays or None) else None."""
    from iosim.algorithms import topk_sparse as alg

    rows_q, rows_kv = p.B * p.H_q * p.N_q, p.B * p.H_kv * p.N_k
    k = idx.shape[3]
    flat = np.ascontiguousarray(idx.reshape(-1, k))
    Rmax = int(np.diff(pl.rptr).max())
    width = np.minimum(block, p.N_k - pl.ublk * block)
    wptr = np.concatenate([[0], np.cumsum(width)]).astype(np.int64)[pl.uptr]  # a program may load no block
    starts = np.concatenate([[0], np.cumsum(width)[:-1]]).astype(np.int64)
    wkey = np.repeat(pl.ublk * block - starts, width) + np.arange(width.sum(), dtype=np.int64)  # workspace row's key
    Q = K = V = O = L = Kws = Vws = Idx = None
    if numeric:
        rng = np.random.default_rng(seed)
        Q, K = rng.standard_normal((rows_q, p.d_qk)), rng.standard_normal((rows_kv, p.d_qk))
        V = K if shared else rng.standard_normal((rows_kv, p.d_v))  # the latent: V_j is read from K_j's tile
        O, L = np.full((rows_q, p.d_v), np.nan), np.full(rows_q, np.nan)
        Idx = flat
        if kind == "gather":
            Kws = np.full((int(wptr[-1]), p.d_qk), np.nan)
            Vws = Kws if shared else np.full((int(wptr[-1]), p.d_v), np.nan)
    shapes = dict(Q=(rows_q, p.d_qk), K=(rows_kv, p.d_qk), V=(rows_kv, p.d_v), O=(rows_q, p.d_v), L=(rows_q,),
                  indices=flat.shape, m=(Rmax,), S=(Rmax, max(block, Bc)))  # fmt: skip
    if kind == "gather":
        shapes.update(Kws=(int(wptr[-1]), p.d_qk), Vws=(int(wptr[-1]), p.d_v))
    got = dict(zip(shapes, mem.ids(**shapes), strict=True))
    ids = np.array([got.get(n, -1) for n in ("Q", "K", "V", "O", "L", "indices", "m", "S")], dtype=np.int64)
    dims = np.array([p.d_qk, p.d_v, k, block, p.N_k, Rmax], dtype=np.int64)
    hs = [np.full(Rmax, -1, dtype=np.int64) for _ in range(4)]
    scan = None if indexer is None else _run_indexer(mem, p, indexer, k, numeric, seed, got)
    if kind == "gather":
        gids = np.array([got[n] for n in ("K", "V", "Kws", "Vws", "indices")], dtype=np.int64)
        mem.call(alg.topk_gather, gids, K, V, Kws, Vws, Idx, pl.arrays(), wptr, dims, shared, hs[3])
        ids[1], ids[2] = got["Kws"], got["Vws"]
        mem.call(alg.workspace_attend, ids, Q, Kws, Vws, O, L, pl.arrays(), wptr, wkey, dims, Bc, scale, shared, *hs)
    else:
        mem.call(alg.topk_forward, ids, Q, K, V, O, L, Idx, pl.arrays(), dims, scale, shared, *hs)
    return ((Q, K, V), (O, L), scan) if numeric else None

"""One attention problem: batch, heads, sequence lengths, head dimensions, mask and the dtype of every array.

:class:`Problem` is what :func:`iosim.run` counts when it is given ``problem=`` (today's ``N=, d=`` is its one-head
special case, :meth:`Problem.single`). It is a frozen description, never a schedule: which loops are outer (GQA
``per-head`` or ``packed``), split-KV, MLA's shared latent read and the tiles are the schedule's choices
(:data:`GQA_POLICIES`, :data:`MLA_POLICIES`), passed to :func:`iosim.run` beside it.

Fields (the symbols of docs/theory-problems.md#problems-batch-heads-decoding):

* ``B`` batch, ``H_q`` query heads, ``H_kv`` key/value heads; ``H_q`` is a multiple of ``H_kv`` and g = H_q / H_kv
  is the group size (MQA: H_kv = 1). Query head h uses key/value head h // g.
* ``N_q`` query rows and ``N_k`` keys per head. N_q = N_k is prefill; N_q = 1 (or a few) against a long N_k is
  decoding with a KV cache; N_q < N_k is chunked prefill. ``causal`` aligns the diagonal bottom-right, as
  FlashAttention >= 2.1 does: query row r sees key c when c <= r + N_k - N_q (rows r < N_q - N_k see no key when
  N_q > N_k: O = 0, L = -inf).
* ``d_qk`` the width of Q and K, ``d_v`` the width of V and O.
* ``latent`` (MLA, DeepSeek-V2/V3): the cache holds one latent row per token, K = [c_KV, k_rope] of width d_qk and
  V = c_KV, the first d_v columns of K (d_v <= d_qk; H_kv defaults to 1, the absorbed form's one shared cache).
* ``page_size`` P: the KV cache is paged in blocks of P tokens located through a page table (vLLM); None: contiguous.
* ``dtype_q``, ``dtype_kv``, ``dtype_o``: the storage dtype of Q, of the KV cache (K, V) and of O (:data:`BYTES`);
  the statistics (L, the split partials) are fp32 and the page table int32, as the kernels keep them. The backward
  moves dO at dtype_o, dK and dV at dtype_kv, and dQ as FlashAttention's kernels accumulate it: in fp32 (its
  read-modify-writes are fp32 words; fp64 in a problem at fp64). Word counts do not depend on dtypes.

Counts are in words (one word per entry, the memory model's unit) and, through the dtypes, in bytes
(:meth:`Problem.bytes_of`).
"""

from __future__ import annotations

import numbers
from dataclasses import InitVar, asdict, dataclass
from typing import NamedTuple

from iosim.base.errors import InputError

# Bytes per entry of each storage dtype a problem may name (fp8: e4m3 / e5m2 alike).
BYTES = {"fp64": 8, "fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
ALIASES = {"float64": "fp64", "float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}
GQA_POLICIES = ("per-head", "packed")
MLA_POLICIES = ("shared", "naive")
# How flash1 (K/V outer) reads a paged cache: each page piece of a column block an outer step of its own ("pieces"),
# or the block's keys gathered from their pages into one tile first ("gather"); flash2 reads pieces in its inner loop.
PAGE_READS = ("pieces", "gather")
# Arrays whose dtype is fixed by what the kernels keep (fp32 statistics and split partials, int32 page table).
FIXED_DTYPES = {"L": "fp32", "l": "fp32", "m": "fp32", "Opart": "fp32", "Lpart": "fp32", "page_table": "int32"}
INT_BYTES = {"int32": 4}
MAX_TOKENS = 1 << 26  # N_q and N_k, as iosim.runner.api.MAX_N
MAX_DIM = 1 << 16
MAX_HEADS = 1 << 12
MAX_BATCH = 1 << 16


def dtype_name(value, parameter: str) -> str:
    """The canonical name of a storage dtype ("bf16", ...); one line naming ``parameter`` if it is unknown."""
    name = ALIASES.get(value, value) if isinstance(value, str) else None
    if name not in BYTES:
        raise InputError(parameter, f"must be one of {', '.join(BYTES)}", value)
    return name


def _int(name: str, value, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not lo <= value <= hi:
        raise InputError(name, f"must be an integer from {lo:,} to {hi:,}", value)
    return int(value)


class SeenTotals(NamedTuple):
    """What a mask that differs per (b, h) lets the compulsory traffic skip, over the whole problem (the ``seen``
    of :meth:`Problem.compulsory` is per head otherwise): query rows that see a key, summed over every head, and
    keys read, summed over the key/value heads, each the keys that some query head of its group sees."""

    rows_q: int
    rows_k: int


@dataclass(frozen=True)
class Problem:
    """An attention problem (module docstring). ``Problem(N=1024, d=64)`` is one head with N_q = N_k = 1024 and
    d_qk = d_v = 64; every other field has a default that keeps that case."""

    B: int = 1
    H_q: int = 1
    H_kv: int | None = None  # default: H_q (multi-head attention); 1 with the MLA latent (its absorbed form)
    N_q: int | None = None
    N_k: int | None = None
    d_qk: int | None = None
    d_v: int | None = None  # default: d_qk
    causal: bool = False
    latent: bool = False
    page_size: int | None = None
    dtype_q: str = "fp64"
    dtype_kv: str | None = None  # default: dtype_q
    dtype_o: str | None = None  # default: dtype_q
    N: InitVar[int | None] = None
    d: InitVar[int | None] = None

    def __post_init__(self, N, d) -> None:  # noqa: N803
        def put(name, value):
            object.__setattr__(self, name, value)

        if N is not None:
            if self.N_q is not None or self.N_k is not None:
                raise InputError("N", "is N_q = N_k: give N, or N_q and N_k, not both", N)
            put("N_q", N)
            put("N_k", N)
        if d is not None:
            if self.d_qk is not None:
                raise InputError("d", "is d_qk (= d_v unless given): give d or d_qk, not both", d)
            put("d_qk", d)
        if self.N_q is None or self.N_k is None or self.d_qk is None:
            raise InputError("problem", "needs N (or N_q and N_k) and d (or d_qk)")
        put("B", _int("B (batch)", self.B, 1, MAX_BATCH))
        put("H_q", _int("H_q (query heads)", self.H_q, 1, MAX_HEADS))
        default_kv = 1 if self.latent is True else self.H_q  # MLA: one latent cache shared by every query head
        put("H_kv", _int("H_kv (key/value heads)", default_kv if self.H_kv is None else self.H_kv, 1, self.H_q))
        if self.H_q % self.H_kv:
            raise InputError(
                "H_kv (key/value heads)",
                f"must divide H_q = {self.H_q} (a divisor from 1 to {self.H_q}: g = H_q / H_kv query heads share one)",
                self.H_kv,
            )
        put("N_q", _int("N_q (query rows)", self.N_q, 1, MAX_TOKENS))
        put("N_k", _int("N_k (keys)", self.N_k, 1, MAX_TOKENS))
        put("d_qk", _int("d_qk (query/key width)", self.d_qk, 1, MAX_DIM))
        put("d_v", _int("d_v (value width)", self.d_qk if self.d_v is None else self.d_v, 1, MAX_DIM))
        for name in ("causal", "latent"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(name, "must be True or False", getattr(self, name))
        if self.latent and self.d_v > self.d_qk:
            raise InputError(
                "d_v",
                f"must be at most d_qk = {self.d_qk} with the MLA latent (V is the first d_v columns of K)",
                self.d_v,
            )
        if self.page_size is not None:
            put("page_size", _int("page_size", self.page_size, 1, self.N_k))
        put("dtype_q", dtype_name(self.dtype_q, "dtype_q"))
        put("dtype_kv", dtype_name(self.dtype_q if self.dtype_kv is None else self.dtype_kv, "dtype_kv"))
        put("dtype_o", dtype_name(self.dtype_q if self.dtype_o is None else self.dtype_o, "dtype_o"))

    @classmethod
    def single(cls, N: int, d: int, causal: bool = False) -> Problem:  # noqa: N803
        """Today's problem: one head, N_q = N_k = N, d_qk = d_v = d."""
        return cls(N=N, d=d, causal=causal)

    @property
    def g(self) -> int:
        """Query heads per key/value head."""
        return self.H_q // self.H_kv

    @property
    def is_single(self) -> bool:
        """One head, N_q = N_k, d_qk = d_v, contiguous, not latent: the seed papers' problem."""
        return (
            self.B == 1
            and self.H_q == 1
            and self.N_q == self.N_k
            and self.d_qk == self.d_v
            and not self.latent
            and self.page_size is None
        )

    @property
    def offset(self) -> int:
        """The bottom-right causal offset: row r sees key c when c <= r + offset."""
        return self.N_k - self.N_q

    @property
    def pages(self) -> int:
        """Pages per sequence (0 when the cache is contiguous)."""
        return 0 if self.page_size is None else -(-self.N_k // self.page_size)

    def dtype_of(self, array: str) -> str:
        """The storage dtype of a slow-memory array by its iosim name."""
        if array in FIXED_DTYPES:
            return FIXED_DTYPES[array]
        if array in ("dKpart", "dVpart"):  # GQA's per-query-head partials: FlashAttention-2 allocates them with
            return self.dtype_q  # q.options() (flash_api.cpp, mha_bwd: dk_expanded), as iosim.hierarchy prices them
        if array in ("K", "V", "dK", "dV"):  # the kernels write dK, dV at K's and V's dtype
            return self.dtype_kv
        if array == "dQ":  # accumulated in fp32 (flash-attn's dq_accum; fp64 where the problem computes in fp64)
            return "fp64" if self.dtype_o == "fp64" else "fp32"
        if array in ("O", "dO"):
            return self.dtype_o
        if array == "Q":
            return self.dtype_q
        return "fp32"  # scratch of the standard algorithms (S, P, dS, ...) and statistics

    def storage(self, array: str) -> tuple[str, str]:
        """Where ``array``'s words live, the one address map of a problem's arrays: (the array whose addresses they
        are, what one copy serves). V of an MLA latent is the latent's first d_v columns, K's addresses (a naive
        read of V touches the lines the K tile touched); K and V are one copy per key/value head; the page table is
        one per batch item (a batch item's key/value heads share its pages, as vLLM's cache); every other array
        (Q, O, the statistics, the gradients, scratch) one per query head (or per packed group of them)."""
        if array == "V" and self.latent:
            return "K", "kv head"
        if array in ("K", "V"):
            return array, "kv head"
        if array == "page_table":
            return array, "batch item"
        return array, "head"

    def bytes_of(self, array: str, words: int) -> int:
        """Bytes of ``words`` entries of ``array`` (a non-negative integer: InputError otherwise)."""
        if isinstance(words, bool) or not isinstance(words, numbers.Integral) or words < 0:
            raise InputError("words", "must be a non-negative integer (a count of entries)", words)
        dt = self.dtype_of(array)
        return int(words) * (INT_BYTES[dt] if dt in INT_BYTES else BYTES[dt])

    def groups(self, gqa: str) -> tuple[int, int, int]:
        """How a schedule groups the rows: (G, groups, R). ``per-head`` runs each query head alone (G = g query heads
        per key/value head, R = N_q rows per group); ``packed`` packs a key/value head's g query heads into one
        group (G = 1, R = g N_q). groups = B H_kv G."""
        G = self.g if gqa == "per-head" else 1
        return G, self.B * self.H_kv * G, self.N_q * (self.g // G)

    def compulsory(self, seen: tuple[int, int] | None = None) -> dict[str, int]:
        """The compulsory traffic in words: read Q, the KV cache once per key/value head, write O (and nothing
        else). MLA's latent is one cache: V is inside K, so only K counts. ``seen`` = (query rows that see a key,
        keys that some query row sees), per head, under a mask (default: N_q, N_k): a row that sees no key need not
        be read (its O = 0 is still written), a key no row sees need not be read."""
        rows_q, rows_k = self._seen(seen)
        out = {"Q": rows_q * self.d_qk, "K": rows_k * self.d_qk, "O": self.B * self.H_q * self.N_q * self.d_v}
        if not self.latent:
            out["V"] = rows_k * self.d_v
        return out

    def compulsory_backward(self, seen: tuple[int, int] | None = None) -> dict[str, int]:
        """The backward's compulsory traffic in words: read Q, O, dO and the logsumexp L, the KV cache once per
        key/value head, and write dQ, dK, dV once (dK, dV once per key/value head); ``seen`` as in
        :meth:`compulsory` (dQ, dK, dV are written whole)."""
        rows_q, rows_k = self._seen(seen)
        all_q, all_k = self.B * self.H_q * self.N_q, self.B * self.H_kv * self.N_k
        return {"Q": rows_q * self.d_qk, "O": rows_q * self.d_v, "dO": rows_q * self.d_v, "L": rows_q,
                "K": rows_k * self.d_qk, "V": rows_k * self.d_v, "dQ": all_q * self.d_qk,
                "dK": all_k * self.d_qk, "dV": all_k * self.d_v}  # fmt: skip

    def _seen(self, seen) -> tuple[int, int]:
        if isinstance(seen, SeenTotals):
            return seen.rows_q, seen.rows_k
        q, k = (self.N_q, self.N_k) if seen is None else seen
        return self.B * self.H_q * q, self.B * self.H_kv * k

    def compulsory_bytes(self, seen: tuple[int, int] | None = None) -> int:
        return sum(self.bytes_of(a, w) for a, w in self.compulsory(seen).items())

    def as_dict(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if not k.startswith("_")}
        out["g"] = self.g
        return out

    def __str__(self) -> str:
        parts = [f"B={self.B}", f"H_q={self.H_q}", f"H_kv={self.H_kv}", f"N_q={self.N_q}", f"N_k={self.N_k}"]
        parts += [f"d_qk={self.d_qk}", f"d_v={self.d_v}"]
        if self.causal:
            parts.append("causal (bottom-right)")
        if self.latent:
            parts.append("MLA latent")
        if self.page_size:
            parts.append(f"pages of {self.page_size}")
        if len({self.dtype_q, self.dtype_kv, self.dtype_o}) > 1 or self.dtype_q != "fp64":
            parts.append(f"dtypes q={self.dtype_q} kv={self.dtype_kv} o={self.dtype_o}")
        return ", ".join(parts)

"""What a block-sparse attention kernel loads for a mask: FlexAttention's schedule, counted and in closed form.

:func:`block_sparse` runs the schedule of :mod:`iosim.algorithms.block_sparse` (per row block: the BlockMask's
metadata words, then K/V of the partial and full blocks only, mask_mod's captured buffers in partial blocks only and
score_mod's in every visited block) on the two-level memory and puts the closed form of
:mod:`iosim.theory.block_sparse` beside it, per array, in words and in bytes. ``dense=True`` counts the kernel that
loads every column block and masks afterwards.

The mask is a torch ``BlockMask`` (built on the CPU), its four index tensors
(:func:`iosim.masking.mask_mod.block_index`),
a ``mask_mod`` function (classified as ``create_block_mask`` does: a block is full only when every one of its
BQ x BKV positions is allowed; per (b, h) when it reads b or h, or as ``mask_B``, ``mask_H`` say), or any iosim
mask (``"causal"``, ``"window:256"``, ...). Every one of them is over the sequence: the queries are the last N_q of
N_k positions, so a mask_mod is evaluated at q_idx = N_k - N_q + i, the same whether it comes raw, wrapped in
``iosim.masking.masks.from_mask_mod`` or as ``mod:FILE:NAME`` (torch's ``create_block_mask`` with Q_LEN = N_q < N_k
passes
q_idx = i: give it the mask_mod shifted by N_k - N_q for the same mask).

>>> from iosim import Problem
>>> r = block_sparse(Problem(N=1024, d=64, dtype_q="bf16"), "causal", block=128)
>>> r.exact, r.words["K"], r.words["kv_indices"], r.words["full_kv_indices"], r.bytes_total, r.naive_bytes
(True, 294912, 8, 28, 1446096, 524288)
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import numpy as np

from iosim.algorithms import block_sparse as _bs
from iosim.base.errors import InputError
from iosim.masking.counted_run import CountedRun
from iosim.memory_model.core import Stats, TwoLevelMemory
from iosim.spec.problem import BYTES, Problem
from iosim.theory.block_sparse import block_sparse_counts

__all__ = ["BlockSparseResult", "Buffer", "block_sparse", "blocks_of"]

SCOPES = ("mask", "score")
INDEX_READS = ("once", "template")  # each listed index read once; as torch's FlexAttention Triton template reads them
# (with ``template`` the captured buffers are also read at a ragged block's padded positions, as the template does)
INT_BYTES = {"int32": 4, "int64": 8, "bool": 1}
ARRAY_BYTES_FIXED = {"L": 4, "kv_num_blocks": 4, "kv_indices": 4, "full_kv_num_blocks": 4, "full_kv_indices": 4}


@dataclass(frozen=True)
class Buffer:
    """A tensor captured by mask_mod (``scope="mask"``: read in partial blocks) or score_mod (``"score"``: read in
    every visited block), read per block as its ``index`` names (:data:`iosim.algorithms.block_sparse.INDEX`):
    ``q`` a per-query-position vector, ``kv`` a per-key-position vector, ``q+kv`` one vector read at both (document
    ids), ``qkv`` a (q, kv) bias shared by every head, ``bhqkv`` a full (b, h, q, kv) bias, ``h`` a per-head
    scalar; ``dtype`` its storage (bytes per word)."""

    name: str
    index: str
    scope: str = "score"
    dtype: str = "fp32"
    shape: tuple | None = None  # the captured tensor's shape, when given: checked against the index on the problem

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise InputError("buffer name", "must be an identifier", self.name)
        if self.index not in _bs.INDEX:
            raise InputError("buffer index", f"must be one of {', '.join(_bs.INDEX)}", self.index)
        if self.scope not in SCOPES:
            raise InputError(
                "buffer scope", "must be mask (mask_mod's, partial blocks) or score (every block)", self.scope
            )
        if self.dtype not in BYTES and self.dtype not in INT_BYTES:
            raise InputError("buffer dtype", f"must be one of {', '.join([*BYTES, *INT_BYTES])}", self.dtype)

    @property
    def bytes(self) -> int:
        return BYTES.get(self.dtype) or INT_BYTES[self.dtype]

    def check_shape(self, p: Problem) -> None:
        """One line unless the captured tensor's shape (leading 1s dropped) is what its index reads on ``p``."""
        if self.shape is None:
            return
        want = {"q": (p.N_q,), "kv": (p.N_k,), "q+kv": (max(p.N_q, p.N_k),), "qkv": (p.N_q, p.N_k),
                "bhqkv": (p.B, p.H_q, p.N_q, p.N_k), "h": (p.H_q,)}[self.index]  # fmt: skip
        try:
            got = tuple(int(x) for x in self.shape)
        except (TypeError, ValueError):
            raise InputError(f"buffer {self.name} shape", "must be a tuple of integers", self.shape) from None
        while len(got) > len(want) and got[0] == 1:
            got = got[1:]
        if got != want:
            raise InputError(f"buffer {self.name} shape", f"must be {want} for index {self.index!r} on this problem "
                             "(leading 1s allowed)", self.shape)  # fmt: skip

    def slow_shape(self, p: Problem) -> tuple[int, int]:
        return {
            "q": (p.N_q, 1),
            "kv": (p.N_k, 1),
            "q+kv": (max(p.N_q, p.N_k), 1),
            "qkv": (p.N_q, p.N_k),
            "bhqkv": (p.B * p.H_q * p.N_q, p.N_k),
            "h": (p.H_q, 1),
        }[self.index]


@dataclass(frozen=True)
class BlockSparseResult(CountedRun):
    """A counted run beside its closed form: ``stats`` (simulated) and ``predicted``, ``words`` and ``bytes`` per
    array (reads + writes), the naive estimate |Q| + |K| + |V| + |O| in bytes, the block classes' census."""

    problem: Problem
    block: tuple[int, int]
    dense: bool
    stats: Stats
    predicted: Stats
    bytes_per_word: dict = field(repr=False)
    census: dict = field(default_factory=dict)

    @property
    def bytes(self) -> dict[str, int]:
        return {k: w * self.bytes_per_word[k] for k, w in self.words.items()}

    @property
    def bytes_total(self) -> int:
        return sum(self.bytes.values())

    @property
    def naive_bytes(self) -> int:
        p = self.problem
        q = p.bytes_of("Q", p.B * p.H_q * p.N_q * p.d_qk)
        kv = p.bytes_of("K", p.B * p.H_kv * p.N_k * (p.d_qk + p.d_v))
        return q + kv + p.bytes_of("O", p.B * p.H_q * p.N_q * p.d_v)


def _block(value) -> tuple[int, int]:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = (value, value)
    ok = isinstance(value, (tuple, list)) and len(value) == 2
    if not ok or not all(
        isinstance(x, numbers.Integral) and not isinstance(x, bool) and 0 < x <= 1 << 16 for x in value
    ):
        raise InputError("block", "must be a positive integer or (BQ, BKV), each from 1 to 65,536", value)
    return int(value[0]), int(value[1])


def _index_of(cls: np.ndarray, BQ: int, BKV: int):  # noqa: N803
    """A BlockIndex (ascending indices) from classes (B', H', T_r, T_c)."""
    from iosim.masking import mask_mod as _mm

    def lists(sel):
        num = sel.sum(axis=3)
        order = np.argsort(~sel, axis=3, kind="stable")  # the selected blocks first, ascending
        return num.astype(np.int64), order.astype(np.int64)

    kv_num, kv_idx = lists(cls == _mm.PARTIAL)
    full_num, full_idx = lists(cls == _mm.FULL)
    return _mm.BlockIndex(kv_num, kv_idx, full_num, full_idx, BQ, BKV)


def blocks_of(p: Problem, mask, block=(128, 128), mask_B: int | None = None, mask_H: int | None = None,  # noqa: N803
              allow_long: bool = False):  # fmt: skip
    """The BlockIndex a kernel receives for ``mask`` on problem ``p`` with blocks of ``block`` (see the module)."""
    from iosim.masking import mask_mod as _mm
    from iosim.masking import masks

    BQ, BKV = _block(block)
    if isinstance(mask, _mm.BlockIndex):
        bi = mask
    elif hasattr(mask, "kv_num_blocks"):
        bi = _mm.block_index(mask)
    elif callable(mask) and not isinstance(mask, masks.Mask):
        _mm.check_mask_mod(mask)
        Bm, Hm = (mask_B or 1), (mask_H or 1)
        if mask_B is None and mask_H is None and p.B * p.H_q > 1 and _mm.reads_b_or_h(mask, p.N_k):
            Bm, Hm = p.B, p.H_q  # it reads b or h: classified at every (b, h)
        if Bm not in (1, p.B) or Hm not in (1, p.H_q):
            raise InputError("mask_B", f"and mask_H must be 1 or the problem's B = {p.B}, H_q = {p.H_q}", (Bm, Hm))
        from iosim.runner import estimate

        what = f"evaluating the mask_mod on {Bm * Hm} x {p.N_q:,} x {p.N_k:,} scores"
        seconds = Bm * Hm * p.N_q * p.N_k * masks.MOD_ELEMENT
        estimate.check(seconds, what, allow_long=allow_long, parameter="mask", value=_mm.fn_label(mask))
        cls = np.zeros((Bm, Hm, -(-p.N_q // BQ), -(-p.N_k // BKV)), dtype=np.int8)
        for b in range(Bm):
            for h in range(Hm):
                cls[b, h] = _mm.classify(mask, b, h, p.N_q, p.N_k, BQ, BKV, padded=True, q_offset=p.N_k - p.N_q).cls
        bi = _index_of(cls, BQ, BKV)
    else:
        from iosim.masking import head_masks
        from iosim.runner import estimate

        one, grid = head_masks.resolve(p, mask, allow_long)  # a mask that differs per (b, h): its classes at each
        if grid is None:
            grid = [[masks.compile_mask(one, p.N_k)]]
        tests = -(-p.N_q // BQ) * -(-p.N_k // BKV) * len(grid) * len(grid[0])
        seconds = estimate.count_only_seconds(4 * tests) + grid[0][0].scan_tests * estimate.MASK_SCAN_DRAW
        estimate.check(seconds, f"classifying {tests:,} blocks of the mask", allow_long=allow_long, parameter="block",
                       value=f"{BQ}x{BKV}")  # fmt: skip
        cls = np.array([[_bs.block_classes(t.kind, t.params, t.table, p.N_q, p.N_k, BQ, BKV) for t in row]
                        for row in grid], dtype=np.int8)  # fmt: skip
        bi = _index_of(cls, BQ, BKV)
    _mm.check_shape(bi, p.N_q, p.N_k, p.B, p.H_q)
    return bi


def block_sparse(problem: Problem, mask, *, block=(128, 128), buffers=(), dense: bool = False, M: int | None = None,
                 mask_B: int | None = None, mask_H: int | None = None, allow_long: bool = False,
                 indices: str = "once") -> BlockSparseResult:  # noqa: N803  # fmt: skip
    """Count the block-sparse schedule (or with ``dense`` the load-everything-then-mask kernel) on ``problem`` for
    ``mask`` with ``buffers`` (:class:`Buffer`); M defaults to the schedule's peak (it fits exactly). ``indices``:
    ``once`` reads each listed block's index once; ``template`` as torch's FlexAttention Triton template reads
    them (each list's first index before its loop, then each block's own and the next one's but the last's) and
    reads the captured buffers at every BQ x BKV position of a ragged block, indices wrapped."""
    p = problem
    if not isinstance(p, Problem):
        raise InputError("problem", "must be an iosim.Problem", type(p).__name__)
    if p.latent or p.page_size is not None or p.causal:
        raise InputError("problem", "must be a plain problem here (no latent, page_size or causal field: give the "
                         "mask as the mask)", p)  # fmt: skip
    if not isinstance(dense, bool):
        raise InputError("dense", "must be True or False", dense)
    if indices not in INDEX_READS:
        raise InputError("indices", f"must be one of {', '.join(INDEX_READS)}", indices)
    template = indices == "template"
    buffers = tuple(buffers)
    for b in buffers:
        if not isinstance(b, Buffer):
            raise InputError("buffers", "must be iosim.masking.block_sparse.Buffer objects", type(b).__name__)
        b.check_shape(p)
    names = [b.name for b in buffers]
    reserved = {"Q", "K", "V", "O", "L", "m", "l", "S", *ARRAY_BYTES_FIXED}
    if len(set(names)) != len(names) or reserved & set(names):
        raise InputError("buffers", f"must have distinct names, none of {', '.join(sorted(reserved))}", names)
    bi = blocks_of(p, mask, block, mask_B, mask_H, allow_long)
    BQ, BKV = bi.BQ, bi.BKV
    Tr, Tc = -(-p.N_q // BQ), -(-p.N_k // BKV)
    cls = bi.classes(Tc)
    dims = (p.B, p.H_q, p.H_kv, p.N_q, p.N_k, p.d_qk, p.d_v, BQ, BKV)
    spec = tuple((b.name, b.index, b.scope) for b in buffers)
    predicted = block_sparse_counts(cls, dims, spec, dense, M, template)
    weight = (p.B // bi.kv_num.shape[0]) * (p.H_q // bi.kv_num.shape[1])
    steps = p.B * p.H_q * Tr * Tc if dense else int(bi.kv_num.sum() + bi.full_num.sum()) * weight
    from iosim.runner import estimate

    estimate.check(estimate.count_only_seconds(steps + p.B * p.H_q * Tr), "the block-sparse count",
                   allow_long=allow_long, parameter="problem", value=f"{steps:,} blocks")  # fmt: skip
    if M is not None and (
        isinstance(M, bool) or not isinstance(M, numbers.Integral) or not predicted.peak <= M <= 1 << 40
    ):
        need = f"{predicted.peak:,} words (blocks of {BQ} x {BKV})"
        raise InputError("M", f"must be an integer from the schedule's working set, {need}, to {1 << 40:,}", M)
    mem = TwoLevelMemory(predicted.peak if M is None else int(M), strict=True, fast=True)
    C, Cf = bi.kv_idx.shape[3], bi.full_idx.shape[3]
    Bm, Hm = bi.kv_num.shape[:2]
    ids = mem.ids(Q=(p.B * p.H_q * p.N_q, p.d_qk), K=(p.B * p.H_kv * p.N_k, p.d_qk), V=(p.B * p.H_kv * p.N_k, p.d_v),
                  O=(p.B * p.H_q * p.N_q, p.d_v), L=(p.B * p.H_q * p.N_q,), m=(p.B * p.H_q * p.N_q,),
                  l=(p.B * p.H_q * p.N_q,), S=(BQ, BKV), kv_num_blocks=(Bm * Hm * Tr, 1),
                  kv_indices=(Bm * Hm * Tr, C), full_kv_num_blocks=(Bm * Hm * Tr, 1),
                  full_kv_indices=(Bm * Hm * Tr, Cf))  # fmt: skip
    bufs = np.array([(mem.array_id(b.name, b.slow_shape(p)), _bs.INDEX.index(b.index), 0 if b.scope == "mask" else 1)
                     for b in buffers], dtype=np.int64).reshape(-1, 3)  # fmt: skip
    handles = np.full(_bs.handle_slots(len(buffers), p.N_q, p.N_k, BQ, BKV), -1, dtype=np.int64)
    mem.call(_bs.block_sparse_forward, np.array(ids, dtype=np.int64), np.array(dims, dtype=np.int64), bi.kv_num,
             bi.kv_idx, bi.full_num, bi.full_idx, bufs, handles, dense, template)  # fmt: skip
    stats = mem.stats()
    if M is None:
        stats = Stats(M=predicted.M, peak=stats.peak, overflowed=stats.overflowed, per_array=stats.per_array,
                      at_peak=stats.at_peak)  # fmt: skip
    bpw = {"Q": p.bytes_of("Q", 1), "K": p.bytes_of("K", 1), "V": p.bytes_of("V", 1), "O": p.bytes_of("O", 1),
           **ARRAY_BYTES_FIXED, **{b.name: b.bytes for b in buffers}}  # fmt: skip
    census = {"blocks": int(cls[0, 0].size), "partial": int((cls == 1).sum()), "full": int((cls == 2).sum()),
              "heads_per_mask": (p.B // Bm) * (p.H_q // Hm)}  # fmt: skip
    return BlockSparseResult(p, (BQ, BKV), dense, stats, predicted, bpw, census)

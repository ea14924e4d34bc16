"""The model beside the kernel: a kernel's counts against the closed form of the schedule it implements, the lower
bounds at the working set its block sizes imply, a verdict per array, and the numerics against float64.

``like`` names the schedule:

* ``flash2``: FlashAttention-2 forward, ``io_model.flash2_forward(N, d, Br, Bc, causal)``, M = its working set
  ``flash_working_set(d, Br, Bc)`` (Q_i, O_i, K_j, V_j, S_ij, m_i, l_i);
* ``flash2-backward``: ``io_model.flash2_backward`` with D precomputed (the D pass reads O and dO, writes D) and
  dQ accumulated in global memory (its zero initialisation counted as writes), M = ``flash2_backward_working_set``;
  over a whole problem (batch, GQA/MQA per-head with the expanded dKpart, dVpart and their group sum, or packed)
  ``io_model.flash2_backward_problem``, the lower bound the problem's compulsory backward traffic;
* ``decode-splitkv``: split-KV decoding (one query row per head, the keys cut into ``splits`` chunks, partial
  results combined by a second kernel), :func:`decode_splitkv` below (derived here; no io_model entry yet);
* ``block-sparse``: FlexAttention's block-sparse forward on the mask ``whole.mask`` (a ``--mask`` string:
  ``mod:FILE.py:NAME`` classified as ``create_block_mask`` classifies it),
  :func:`iosim.masking.block_sparse.block_sparse`
  with the launcher's declared ``buffers`` (mask_mod's and score_mod's captured tensors), per array in words and
  bytes, the BlockMask's four index tensors as arrays of their own; the kernel's BlockMask (when the launcher
  returns it) must be the mask's.

A square multi-head problem (B x H heads, no GQA, N_q = N) is compared with B H x the per-head closed form; any
other with the closed form of the whole problem.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from iosim.base.errors import InputError
from iosim.kernels._theory import bounds, check, io_model
from iosim.kernels.counting import KernelCounts, lsu_lines
from iosim.memory_model import ArrayCounts

LIKE = ("flash2", "flash2-backward", "decode-splitkv", "block-sparse")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


METADATA = {"lengths": (1, 0), "indptr": (2, 0)}  # words each split program, each combine program reads


def decode_splitkv(N: int, d: int, splits: int, Bc: int | None = None, B: int = 1, H_q: int = 1,
                   H_kv: int | None = None, gqa: str = "per-head", empty: str = "written",
                   page_size: int | None = None, chunk_multiple: int | None = None,
                   metadata: dict | None = None, d_v: int | None = None,
                   mla: str | None = None) -> dict[str, ArrayCounts]:  # fmt: skip
    """Split-KV decoding of one query row per head against N keys in ``splits`` chunks, over a whole problem.

    The keys are cut into chunks of ``chunk = ceil(ceil(N / splits) / c) c`` with c = ``chunk_multiple`` (default
    Bc: whole column blocks, as kernels round them; without either, ceil(N / splits)), so the last splits may be
    empty. A unit is what one program of
    pass 1 serves: a query head (``gqa="per-head"``: G = g units per KV head, each loading its KV head's keys) or a
    KV head's g query heads packed (``packed``: one unit per KV head, R = g rows); units = B H_kv G.

    Pass 1, one program per (unit, split): reads its length (metadata ``lengths``, 1 word), q (R d), the keys and
    values of its chunk (every key once per unit: N d each), writes its partial output and logsumexp (R d + R).
    An empty split (``empty="written"``) still reads q and writes its partials (O = 0, L = -inf), which pass 2
    reads; ``empty="skipped"``: it reads only its length, and pass 2 skips it. Pass 2 reads the live splits'
    partials and writes O (B H_q d), one program per query head. Metadata: ``metadata`` maps an array to the words
    each pass-1 program and each pass-2 program reads of it (default :data:`METADATA`: ``lengths`` 1 and
    ``indptr`` 2 per pass-1 program); ``kv_indices`` one word per key per unit; paged (``page_size`` P): the page
    table one word per page piece of each column block, per unit. ``d_v``: the width of V and of the outputs (d:
    the width of q and K); ``mla="shared"``: V is K's first d_v columns, read with K (no V reads), ``"naive"``: read
    again through V.
    """
    H_kv = H_q if H_kv is None else H_kv
    dv = d if d_v is None else d_v
    g = H_q // H_kv
    G = g if gqa == "per-head" else 1
    R, units = g // G, B * H_kv * G
    c = chunk_multiple or Bc
    chunk = cdiv(N, splits) if c is None else cdiv(cdiv(N, splits), c) * c
    live = splits if empty == "written" else min(splits, cdiv(N, chunk))
    meta = {k: ArrayCounts(units * splits * int(w1) + B * H_q * int(w2), 0)
            for k, (w1, w2) in (METADATA if metadata is None else metadata).items()}  # fmt: skip
    per = {
        **meta,
        "Q": ArrayCounts(units * live * R * d, 0),
        "K": ArrayCounts(units * N * d, 0),
        "V": ArrayCounts(0 if mla == "shared" else units * N * dv, 0),
        "O_part": ArrayCounts(units * live * R * dv, units * live * R * dv),
        "L_part": ArrayCounts(units * live * R, units * live * R),
        "O": ArrayCounts(0, B * H_q * dv),
        "kv_indices": ArrayCounts(units * N, 0),
    }
    if page_size:
        per["page_table"] = ArrayCounts(units * int(io_model._pieces(N, Bc or chunk, page_size)[0].sum()), 0)
    return per


OPTIONAL = ("kv_indices", "page_table", *METADATA)  # metadata rows: in the model where the kernel has them


def decode_working_set(d: int, Bc: int) -> int:
    """q, the output accumulator, K_j, V_j, the scores and m, l: 2d + 2 Bc d + Bc + 2 words."""
    return 2 * d + 2 * Bc * d + Bc + 2


@dataclass
class Row:
    array: str
    reads: int
    writes: int
    model_reads: int | None
    model_writes: int | None
    distinct_reads: int
    verdict: str


@dataclass
class Comparison:
    like: str
    N: int
    d: int
    Br: int | None
    Bc: int | None
    causal: bool
    heads: int
    M: int
    rows: list[Row]
    lower_bound: float
    bound_name: str
    counts: KernelCounts
    numerics: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    whole: Whole | None = None
    gqa: str | None = None  # with KV heads shared: the policy whose closed form the kernel's K reads equal

    @property
    def equal(self) -> bool:
        """Every array the model counts moved exactly the model's words (arrays the model does not have, such as a
        kernel's counters or metadata, are reported beside it: :attr:`extra_words`)."""
        return all(r.reads == r.model_reads and r.writes == r.model_writes for r in self.rows
                   if r.model_reads is not None)  # fmt: skip

    @property
    def extra_words(self) -> int:
        """Words the kernel moved in arrays the model does not have (metadata, counters)."""
        return sum(r.reads + r.writes for r in self.rows if r.model_reads is None)

    def summary(self) -> str:
        """One line: equal per array, or the verdicts of the arrays that differ."""
        off = [r.verdict for r in self.rows if r.model_reads is not None and (r.reads, r.writes) !=
               (r.model_reads, r.model_writes)]  # fmt: skip
        extra = (f" (+{self.extra_words:,} words in {', '.join(self.extra_arrays)}, outside the model: "
                 f"{self.kernel_total / max(self.model_total, 1):.4g}x the closed form over all arrays)"
                 if self.extra_words else "")  # fmt: skip
        return ("equal per array" if not off else "; ".join(off)) + extra

    def equal_where_moved(self) -> bool:
        """Every array the kernel moves and the model counts is equal to the word (arrays a kernel does not write,
        such as L of a forward that keeps no residuals, left out), and the kernel moves no array the model lacks."""
        return all((r.reads, r.writes) in ((r.model_reads, r.model_writes), (0, 0)) for r in self.rows
                   if r.model_reads is not None)  # fmt: skip

    @property
    def extra_arrays(self) -> list[str]:
        """The arrays the kernel moved that the model does not have."""
        return [r.array for r in self.rows if r.model_reads is None and r.reads + r.writes]

    @property
    def kernel_total(self) -> int:
        """The kernel's words over all arrays, those the model does not have included."""
        return sum(r.reads + r.writes for r in self.rows)

    def _total_row(self, mr: int, mw: int) -> list:
        """The headline: the kernel's words over all arrays against the closed form's (which has no words in arrays
        it does not have); those arrays named, and the ratio over the model's arrays alone beside it."""
        reads, writes = sum(r.reads for r in self.rows), sum(r.writes for r in self.rows)
        total, model = reads + writes, max(self.model_total, 1)
        bound = f"{total / self.lower_bound:.3g}x the lower bound"
        if not self.extra_arrays:
            verdict = f"{total / model:.4g}x the closed form, {bound}"
            return ["total (model's arrays)", reads, writes, mr, mw, "", verdict]
        alone = (total - self.extra_words) / model
        verdict = (
            f"{total / model:.4g}x the closed form over all arrays, {bound} ({self.extra_words:,} words in "
            f"{', '.join(self.extra_arrays)}: not in the model; the model's arrays alone {alone:.4g}x)"
        )
        return ["total (all arrays)", reads, writes, mr, mw, "", verdict]

    @property
    def model_total(self) -> int:
        return sum((r.model_reads or 0) + (r.model_writes or 0) for r in self.rows)

    @property
    def numerics_ok(self) -> bool | None:
        return None if not self.numerics else all(n["ok"] for n in self.numerics)

    def _whole(self) -> str:
        w = self.whole
        if w is None:
            return ""
        parts = [f"batch={w.B}"] if w.B != 1 else []
        hkv = w.H_kv or (1 if w.mla else None)
        if hkv not in (None, self.heads):
            parts.append(f"kv-heads={hkv} ({self.gqa})")
        if w.N_q not in (None, self.N):
            parts.append(f"N_q={w.N_q}")
        if w.page_size:
            parts.append(f"page size={w.page_size}")
        if self.like == "decode-splitkv":
            parts.append(f"empty splits {w.empty_splits}")
        if self.like == "flash2" and w.mask is not None:
            parts.append(f"mask={w.mask}")
        if w.d_v is not None:
            parts.append(f"d_v={w.d_v}")
        if w.mla:
            parts.append(f"mla={w.mla}")
        if any(w.dtypes):
            parts.append("dtypes " + " ".join(f"{k}={v}" for k, v in zip(("q", "kv", "o"), w.dtypes, strict=True) if v))
        return "".join(" " + x for x in parts)

    def table(self, fmt: str = "simple", lsu: bool = False) -> str:
        """The model line, the per-array table in ``fmt`` (a tabulate format, ``iosim kernel --format``), the
        numerics, with ``lsu`` the LSU level's lines (:func:`iosim.kernels.counting.lsu_lines`) and the notes."""
        from tabulate import tabulate

        head = ["array", "reads", "writes", "model reads", "model writes", "distinct reads", "verdict"]
        body = [[r.array, r.reads, r.writes, r.model_reads, r.model_writes, r.distinct_reads, r.verdict]
                for r in self.rows]  # fmt: skip
        inm = [r for r in self.rows if r.model_reads is not None]
        mr, mw = sum(r.model_reads for r in inm), sum(r.model_writes for r in inm)
        body.append(self._total_row(mr, mw))
        kernels = ", ".join(dict.fromkeys(self.counts.kernels))
        lines = [
            f"{self.counts.backend}: {self.counts.launches} launch(es) ({kernels}),"
            f" {self.counts.programs} programs, counted in {self.counts.seconds:.2f} s",
            f"model: {self.like} N={self.N} d={self.d}"
            + (f" Br={self.Br}" if self.Br else "")
            + (f" Bc={self.Bc}" if self.Bc else "")
            + f" causal={self.causal} heads={self.heads}"
            + self._whole()
            + f"; M = {self.M} words "
            f"(the working set of the block sizes); lower bound {self.lower_bound:,.0f} ({self.bound_name})",
            tabulate(body, head, tablefmt=fmt, intfmt=","),
        ]
        for n in self.numerics:
            lines.append(
                f"numerics {n['output']}: max error {n['error']:.3g}, bound {n['bound']:.3g} "
                f"({'within' if n['ok'] else 'OUTSIDE'} iosim.check's rule, {n['dtype']})"
                + (f"; {n['hint']}" if n.get("hint") else "")
            )
        lines += lsu_lines(self.counts) if lsu else []
        lines += [f"note: {x}" for x in self.notes]
        return "\n".join(lines)


@dataclass(frozen=True)
class Whole:
    """The whole problem a launch computes: batch, query and key/value heads, query rows (N_q; None: N), page size,
    and what the kernel does with an empty split (decode-splitkv)."""

    B: int = 1
    H_q: int = 1
    H_kv: int | None = None
    N_q: int | None = None
    page_size: int | None = None
    empty_splits: str = "written"
    chunk_multiple: int | None = None  # decode-splitkv: what a split's length is rounded up to (default Bc)
    metadata: dict | None = None  # decode-splitkv: array -> (words per split program, per combine program)
    mask: str | None = None  # block-sparse: the --mask the kernel's BlockMask was built for
    buffers: dict | None = (
        None  # block-sparse: captured tensor -> (index, scope[, dtype]) (iosim.masking.block_sparse.Buffer)
    )
    dtype: str | None = None  # block-sparse: the inputs' dtype (bytes per word of Q, K, V, O)
    indices: str = "once"  # block-sparse: how the kernel reads the BlockMask (iosim.masking.block_sparse.INDEX_READS)
    d_v: int | None = None  # the width of V and O (None: d, the width of Q and K)
    mla: str | None = None  # an MLA latent cache (V = K's first d_v columns), V read "shared" or "naive"
    dtypes: tuple = (None, None, None)  # storage dtypes of Q, of the KV cache and of O (bytes; words do not change)

    def one_head_family(self, N: int, d: int | None = None) -> bool:
        """Square, multi-head, contiguous, d_v = d, no latent: the per-head closed form times B H_q is the whole
        problem's."""
        same_width = self.d_v is None or self.d_v == d
        return (self.H_kv in (None, self.H_q) and self.N_q in (None, N) and not self.page_size and same_width
                and self.mla is None)  # fmt: skip

    def problem(self, N: int, d: int, causal: bool, N_q: int | None = None):
        from iosim.spec.problem import Problem

        dq, dkv, do = self.dtypes
        return Problem(B=self.B, H_q=self.H_q, H_kv=self.H_kv, N_q=N_q or self.N_q or N, N_k=N, d_qk=d, d_v=self.d_v,
                       causal=causal, latent=self.mla is not None, page_size=self.page_size, dtype_q=dq or "fp64",
                       dtype_kv=dkv, dtype_o=do)  # fmt: skip


def model(like: str, N: int, d: int, Br: int | None, Bc: int | None, causal: bool, splits: int | None,
          whole: Whole | None = None, gqa: str = "per-head"):  # fmt: skip
    """(per-array closed form of the whole problem, M, lower bound, bound name)."""
    w = whole or Whole()
    heads = w.B * w.H_q
    _refuse_widths(like, w)
    if like == "flash2" and w.mask is not None:
        return _flash2_masked(N, d, Br, Bc, causal, w, gqa)
    if like in ("flash2", "flash2-backward") and w.one_head_family(N, d):
        _need(Br=Br, Bc=Bc)
        back = like == "flash2-backward"
        pred = (io_model.flash2_backward if back else io_model.flash2_forward)(N, d, Br, Bc, causal)
        M = (io_model.flash2_backward_working_set if back else io_model.flash_working_set)(d, Br, Bc)
        lb, name = bounds.lower_bound(N, d, M, backward=back, causal=causal)
        per = {k: ArrayCounts(c.reads * heads, c.writes * heads) for k, c in pred.per_array.items()}
        return per, M, lb * heads, name
    if like == "flash2":
        _need(Br=Br, Bc=Bc)
        p = w.problem(N, d, causal)
        pred = io_model.flash2_problem(p, Br, Bc, gqa=gqa, mla=w.mla or "shared")
        per = {k: ArrayCounts(*c) if isinstance(c, tuple) else c for k, c in pred.per_array.items()}
        per = {k: c for k, c in per.items() if k != "page_table" or w.page_size}
        M = io_model.problem_working_set(d, p.d_v, Br, Bc, p.latent and w.mla == "shared")
        lb = max(b.value for b in bounds.problem_bounds(p, M) if b.is_lower)
        return per, M, lb, "the whole problem's (bounds.problem_bounds)"
    if like == "flash2-backward":
        _need(Br=Br, Bc=Bc)
        if w.page_size:
            raise InputError("--page-size", "is modelled for flash2 and decode-splitkv, not the backward", w.page_size)
        p = w.problem(N, d, causal)
        pred = io_model.flash2_backward_problem(p, Br, Bc, gqa=gqa)
        M = io_model.flash2_backward_problem_working_set(d, p.d_v, Br, Bc)
        return (dict(pred.per_array), M, float(sum(p.compulsory_backward().values())), "the whole problem's "
                "compulsory backward traffic (read Q, O, dO, L, K/V once per KV head; write dQ, dK, dV)")  # fmt: skip
    if like == "block-sparse":
        return block_sparse_model(N, d, Br, Bc, w)[:4]
    if like == "decode-splitkv":
        _need(Bc=Bc, splits=splits)
        p = w.problem(N, d, False, N_q=1)
        per = decode_splitkv(N, d, splits, Bc, w.B, w.H_q, p.H_kv, gqa, w.empty_splits, w.page_size,
                             w.chunk_multiple, w.metadata, d_v=p.d_v, mla=w.mla)  # fmt: skip
        floor = sum(p.compulsory().values()) + w.B * (1 + (cdiv(N, w.page_size) if w.page_size else 0))
        return (per, decode_working_set(d, Bc), floor, "compulsory: q, the KV cache once per KV head, O, "
                "each sequence's length (and page table) once")  # fmt: skip
    raise InputError("--like", f"must be one of {', '.join(LIKE)}", like)


def _flash2_masked(N: int, d: int, Br: int | None, Bc: int | None, causal: bool, w: Whole, gqa: str):
    """flash2 over the problem under ``w.mask`` (a --mask string), skipping the tiles the mask empties and reading no
    metadata (a kernel that computes its key range itself, as a sliding-window kernel without a BlockMask does):
    :func:`iosim.theory.io_model.flash2_problem` with the problem's TileMask; the lower bound the problem's compulsory
    traffic under the mask (rows that see a key, keys some row sees)."""
    from iosim.runner.problem_runs import problem_mask, problem_seen

    _need(Br=Br, Bc=Bc)
    p = w.problem(N, d, causal)
    tm = problem_mask(p, w.mask, None)
    pred = io_model.flash2_problem(p, Br, Bc, gqa=gqa, mla=w.mla or "shared", mask=tm)
    per = {k: ArrayCounts(*c) if isinstance(c, tuple) else c for k, c in pred.per_array.items()}
    per = {k: c for k, c in per.items() if k != "page_table" or w.page_size}
    M = io_model.problem_working_set(d, p.d_v, Br, Bc, p.latent and w.mla == "shared")
    lb = float(sum(p.compulsory(problem_seen(p, w.mask)).values()))
    return per, M, lb, "the problem's compulsory traffic under the mask"


def check_heads(H_q: int, H_kv: int | None) -> None:
    """InputError (on --kv-heads) unless the key/value heads divide the query heads (GQA/MQA: H_q / H_kv query heads
    share one), 1..H_q; None: as many as the query heads."""
    if H_kv is not None and (not 1 <= H_kv <= H_q or H_q % H_kv):
        divisors = ", ".join(str(k) for k in range(1, H_q + 1) if H_q % k == 0)
        raise InputError("--kv-heads", f"must divide --H = {H_q} (one of {divisors}: 1..{H_q})", H_kv)


def _refuse_widths(like: str, w: Whole) -> None:
    """--dv and --mla are modelled where the schedule has them: flash2 and decode-splitkv (and --dv the backward)."""
    if w.mla is not None and like not in ("flash2", "decode-splitkv"):
        raise InputError("--mla", "is modelled for --like flash2 and decode-splitkv (an MLA latent's forward)", w.mla)
    if w.d_v is not None and like == "block-sparse":
        raise InputError("--dv", "is modelled for --like flash2, flash2-backward and decode-splitkv", w.d_v)


def block_sparse_model(N: int, d: int, Br: int | None, Bc: int | None, w: Whole, arrays: dict | None = None):
    """(per-array counts, M, lower bound, its name, the :class:`iosim.masking.block_sparse.BlockSparseResult`, the
    BlockIndex of the mask) of the block-sparse schedule on ``w.mask`` with blocks Br x Bc and ``w.buffers``; the
    lower bound is the problem's compulsory traffic under the mask (rows that see a key, keys some row sees). With
    ``arrays`` (the launcher's), the kernel's BlockMask is checked against the mask's first
    (:func:`check_block_mask`)."""
    from iosim.masking import masks
    from iosim.masking.block_sparse import Buffer, block_sparse, blocks_of
    from iosim.runner.problem_runs import problem_seen
    from iosim.spec.problem import ALIASES, Problem

    _need(Br=Br, Bc=Bc)
    if w.mask is None:
        raise InputError("--mask", f"is needed by --like block-sparse: the mask the kernel's BlockMask was built for "
                         f"({masks.FORMS})")  # fmt: skip
    bufs = []
    for name, spec in (w.buffers or {}).items():
        spec = [spec] if isinstance(spec, str) else list(spec)
        if not 1 <= len(spec) <= 3:
            raise InputError(f"launcher result 'buffers' {name}", "must be index, (index, scope) or (index, scope, "
                             "dtype) as iosim.masking.block_sparse.Buffer takes them", spec)  # fmt: skip
        bufs.append(Buffer(name, *spec))
    dt = ALIASES.get(w.dtype or "float32", w.dtype or "float32")
    p = Problem(B=w.B, H_q=w.H_q, H_kv=w.H_kv, N_q=w.N_q or N, N_k=N, d_qk=d, dtype_q=dt)
    m = masks.parse(w.mask)
    fn = getattr(m, "fn", None)  # a mask_mod: its blocks classified as create_block_mask classifies them
    bi = blocks_of(p, fn if fn is not None else w.mask, (Br, Bc))
    if arrays:
        check_block_mask(arrays, bi)
    res = block_sparse(p, bi, block=(Br, Bc), buffers=bufs, indices=w.indices)
    per = {k: ArrayCounts(c.reads, c.writes) for k, c in res.stats.per_array.items()}
    lb = float(sum(p.compulsory(problem_seen(p, w.mask)).values()))
    return per, res.stats.peak, lb, "the problem's compulsory traffic under the mask", res, bi


def check_block_mask(arrays: dict, bi) -> None:
    """InputError unless the BlockMask the kernel received (its four index tensors, when the launcher returns
    them) lists, per row block, the partial and full blocks of ``bi`` (the model's, from the mask)."""
    names = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")
    if not all(k in arrays for k in names):
        return
    got = [np.asarray(arrays[k]).astype(np.int64) for k in names]
    want = (bi.kv_num, bi.kv_idx, bi.full_num, bi.full_idx)
    if got[0].shape != want[0].shape:
        raise InputError("--mask", f"must be the mask the kernel's BlockMask was built for: the kernel's has "
                         f"{got[0].shape} row blocks (B, H, Tr), the mask's {want[0].shape}")  # fmt: skip
    for at in np.ndindex(*want[0].shape):
        lists = []
        for num, idx in ((0, 1), (2, 3)):
            k, m = int(got[num][at]), int(want[num][at])
            lists.append((sorted(got[idx][at][:k].tolist()), sorted(np.asarray(want[idx][at][:m]).tolist())))
        if any(a != b for a, b in lists):
            (kp, mp), (kf, mf) = lists
            raise InputError("--mask", f"must be the mask the kernel's BlockMask was built for: at (b, h, row block) "
                             f"{tuple(int(x) for x in at)} the kernel's lists partial blocks {kp} and full {kf}, the "
                             f"mask's {mp} and {mf}")  # fmt: skip


# the block sizes each model needs, and the array whose per-program loads show each (rows of Q_i, keys of K_j)
BLOCKS = {"flash2": {"Br": "Q", "Bc": "K"}, "flash2-backward": {"Br": "Q", "Bc": "K"}, "decode-splitkv": {"Bc": "K"},
          "block-sparse": {"Br": "Q", "Bc": "K"}}  # fmt: skip


def _block_of(shape: tuple, d: int, widths: tuple = ()) -> int | None:
    """The block length of one per-program load: its shape less unit axes and one head-dimension axis (d, or d
    padded to a power of two; or one of ``widths``, such as d_v and d - d_v of an MLA latent loaded in two parts);
    None for a flat load, or when that leaves other than one axis."""
    dims = [int(x) for x in shape if int(x) != 1]
    if len(dims) < 2:  # a flat or single-row load: its length is not a block size of the model
        return None
    heads = {w for x in (d, *widths) if x and x > 0 for w in (x, 1 << max(0, (x - 1).bit_length()))}
    for k in range(len(dims) - 1, -1, -1):
        if dims[k] in heads and len(dims) > 1:
            del dims[k]
            break
    return dims[0] if len(dims) == 1 else None


def blocks_ran(counts: KernelCounts, like: str, d: int, widths: tuple = ()) -> dict[str, tuple[int | None, str]]:
    """The block sizes the kernel ran, read off the shapes of its per-program loads: for each block size ``like``
    needs, (size or None, how it was read)."""
    out = {}
    for block, array in BLOCKS.get(like, {}).items():
        shapes = sorted(
            {tuple(s) for info in counts.launch_info for s in info.get("shapes", {}).get(array, {}).get("r", [])}
        )
        sizes = {_block_of(s, d, widths) for s in shapes}
        how = f"{array}'s loads are {' and '.join('x'.join(map(str, s)) for s in shapes)}" if shapes else ""
        out[block] = (sizes.pop() if len(sizes) == 1 and None not in sizes else None, how)
    return out


def block_sizes(counts: KernelCounts, like: str, d: int, launcher: dict | None = None, given: dict | None = None,
                widths: tuple = ()) -> dict[str, int]:  # fmt: skip
    """The block sizes to compare with: what the kernel ran (its loads' shapes) is the truth; the launcher's returned
    values and the command line's (``given``) must agree with it, or InputError names which differ. With nothing
    readable off the kernel, the launcher's or the command line's (which must then agree)."""
    out = {}
    for block, (ran, how) in blocks_ran(counts, like, d, widths).items():
        said = {"the launcher returned": (launcher or {}).get(block), "the command line says": (given or {}).get(block)}
        said = {k: int(v) for k, v in said.items() if v is not None}
        if ran is not None:
            off = {k: v for k, v in said.items() if v != ran}
            if off:
                wrong = ", ".join(f"{k} {block}={v}" for k, v in off.items())
                raise InputError(f"--{block}", f"must be what the kernel ran: {block}={ran} ({how}), but {wrong}")
            out[block] = ran
        elif said:
            if len(set(said.values())) > 1:
                raise InputError(f"--{block}", "must agree: " + ", ".join(f"{k} {block}={v}" for k, v in said.items()))
            out[block] = next(iter(said.values()))
        else:
            where = f" ({how})" if how else ""
            raise InputError(f"--{block}", f"could not be read off the kernel{where}: give it")
    return out


def _need(**given) -> None:
    for k, v in given.items():
        if v is None or int(v) < 1:
            raise InputError(f"--{k}", "must be a positive integer for this model", v)


def _verdict(like: str, name: str, got: tuple[int, int], want: tuple[int, int] | None) -> str:
    if want is None:
        return "not in the model" if sum(got) else "no traffic"
    if got == want:
        return f"equal to {like}'s closed form to the word"
    if sum(got) == 0:
        return f"{name}: not moved by the kernel (the closed form moves {sum(want):,} words)"
    if sum(want) == 0:
        return f"{name}: {sum(got):,} words the closed form does not move"
    parts = []
    for label, g, w in (("reads", got[0], want[0]), ("writes", got[1], want[1])):
        if g != w:
            parts.append(f"{label} {g / w:.3g}x" if w else f"{label} +{g:,}")
    return f"{name}: {sum(got) / sum(want):.3g}x the closed form ({', '.join(parts)})"


def compare(
    counts: KernelCounts,
    like: str,
    N: int,
    d: int,
    Br: int | None = None,
    Bc: int | None = None,
    causal: bool = False,
    heads: int = 1,
    splits: int | None = None,
    arrays: dict | None = None,
    scale: float | None = None,
    dtype: str | None = None,
    layout: str | None = None,
    logsumexp: str | None = None,
    whole: Whole | None = None,
    gqa: str | None = None,
) -> Comparison:
    """Counts beside ``like``'s closed form over the whole problem (``whole``: batch, KV heads, N_q, pages, empty
    splits; ``heads`` is H_q, the query heads per batch item), the problem's lower bound, and (with ``arrays``) the
    numerics: ``layout`` and ``logsumexp`` are the launcher's declarations (:data:`LAYOUTS`, :data:`LOGSUMEXP`).
    With fewer KV heads than query heads, the closed form of the GQA policy whose K reads the kernel's equal
    (``per-head``: a KV head's K, V read g times, once per query head; ``packed``: once) is used, and said; the
    block-sparse schedule is per-head (FlexAttention's forward runs one program per query head); ``gqa`` names the
    policy instead (``iosim run``'s --gqa)."""
    import dataclasses

    w = dataclasses.replace(whole or Whole(), H_q=int(heads))
    check_heads(w.H_q, w.H_kv)
    wanted = gqa
    gqa, g = gqa or "per-head", w.H_q // (w.H_kv or (1 if w.mla else w.H_q))
    sparse = None
    if like == "block-sparse":
        w = dataclasses.replace(w, dtype=w.dtype or dtype)
        per, M, lb, bname, sparse, bi = block_sparse_model(N, d, Br, Bc, w, arrays)
    else:
        per, M, lb, bname = model(like, N, d, Br, Bc, causal, splits, w, gqa)
    if g > 1 and like != "block-sparse" and wanted is None:  # (block-sparse: per query head, no policy to choose)
        packed = model(like, N, d, Br, Bc, causal, splits, w, "packed")
        k_reads = counts.per_array["K"].reads if "K" in counts.per_array else -1
        if k_reads == packed[0]["K"].reads != per["K"].reads:
            gqa, (per, M, lb, bname) = "packed", packed
    per = {k: c for k, c in per.items() if k not in OPTIONAL or k in counts.per_array}
    rows = []
    for name, c in per.items():
        want = (c.reads, c.writes)
        t = counts.per_array.get(name)
        got = (t.reads, t.writes) if t else (0, 0)
        verdict = _verdict(like, name, got, want)
        if g > 1 and name in ("K", "V"):
            verdict += f" ({'once per KV head: packed' if gqa == 'packed' else f'g = {g} times per KV head: per-head'})"
        rows.append(Row(name, *got, *want, t.distinct_reads if t else 0, verdict))
    for name, t in counts.per_array.items():
        if name not in per:
            rows.append(Row(name, t.reads, t.writes, None, None, t.distinct_reads,
                            _verdict(like, name, (t.reads, t.writes), None)))  # fmt: skip
    cmp = Comparison(like, N, d, Br, Bc, causal, heads, M, rows, lb, bname, counts, whole=w, gqa=gqa if g > 1 else None)
    if w.mla == "shared" and like != "block-sparse":
        cmp.notes.append("mla shared: V is K's first d_v columns, read with K's tiles: the closed form moves no V")
    reload = [r.array for r in rows if r.reads > r.distinct_reads]
    if reload:
        cmp.notes.append(f"re-loaded within a program (issued > distinct): {', '.join(reload)}")
    if sparse is not None:
        cmp.notes.append(_bytes_note(counts, sparse))
        c, label = sparse.census, getattr(w.mask, "label", w.mask)
        cmp.notes.append(f"mask {label}: {c['partial']} partial and {c['full']} full blocks of {c['blocks']} per "
                         "head (numerics are not checked for block-sparse)")  # fmt: skip
    elif any(w.dtypes):
        cmp.notes.append(_problem_bytes_note(counts, per, w.problem(N, d, causal)))
    if like == "flash2" and w.mask is not None:
        cmp.notes.append(f"mask {w.mask}: flash2 skipping the tiles it empties, no metadata read (numerics are not "
                         "checked under a mask)")  # fmt: skip
    elif sparse is None and arrays:
        cmp.numerics = numerics(like, arrays, causal, scale, dtype, N, d, layout, logsumexp, w.d_v, w.N_q)
    return cmp


def _problem_bytes_note(counts: KernelCounts, per: dict, p) -> str:
    """The kernel's bytes per array against the closed form's words at the problem's dtypes (--dtype-q/kv/o; the
    statistics fp32, :meth:`iosim.spec.problem.Problem.bytes_of`)."""
    want = {k: p.bytes_of(k.replace("_", ""), c.reads) + p.bytes_of(k.replace("_", ""), c.writes)
            for k, c in per.items()}  # fmt: skip
    got = {k: a.read_bytes + a.write_bytes for k, a in counts.per_array.items()}
    off = [f"{k}: {got.get(k, 0):,} against {b:,}" for k, b in want.items() if got.get(k, 0) != b]
    if not off:
        return f"bytes at the problem's dtypes: equal per array, {sum(want.values()):,} in the model's arrays"
    return "bytes at the problem's dtypes differ: " + "; ".join(off)


def _bytes_note(counts: KernelCounts, res) -> str:
    """The kernel's bytes per array against the block-sparse schedule's (each array at its own element size)."""
    got = {k: a.read_bytes + a.write_bytes for k, a in counts.per_array.items() if a.reads or a.writes}
    off = [f"{k}: {got.get(k, 0):,} against {b:,}" for k, b in res.bytes.items() if got.get(k, 0) != b]
    if not off:
        return f"bytes: equal per array, {sum(got.values()):,} in all (the schedule's {res.bytes_total:,})"
    return "bytes differ: " + "; ".join(off)


# ---------------------------------------------------------------------------------------------------------------
# Numerics: the kernel's outputs against the float64 reference, with iosim.check's bound
# ---------------------------------------------------------------------------------------------------------------
LAYOUTS = {  # the layouts a launcher may declare ("layout" in its dict), as axes of (B, H, N, d)
    "BHND": "(batch, heads, rows, d)",
    "BNHD": "(batch, rows, heads, d)",
    "HND": "(heads, rows, d)",
    "ND": "(rows, d): one head",
    "BHD": "(batch, heads, d): decoding, one query row per head (Q, O; the caches K, V are BHND)",
}
L_LAYOUTS = {"BHN": "(batch, heads, rows)", "BNH": "(batch, rows, heads)", "HN": "(heads, rows)"}  # L, in a dict
LOGSUMEXP = {  # what a kernel stores as L ("logsumexp" in the launcher's dict), and the factor to the natural log
    "natural": 1.0,  # L = log(sum_j exp(scale q.k_j)): iosim's convention (iosim.check, the papers)
    "log2": float(np.log(2.0)),  # L = log2(sum_j exp(scale q.k_j)): the Triton tutorial family (exp2 with log2(e))
    "none": None,  # the kernel stores something else (or nothing) as L: its numerics are not checked
}


def _standard(x, layout: str) -> np.ndarray:
    """An array in the declared layout as (B, H, N, d) float64."""
    x = np.asarray(x, dtype=np.float64)
    if layout == "BNHD":
        return np.swapaxes(x, 1, 2)
    if layout == "HND":
        return x[None]
    if layout == "ND":
        return x[None, None]
    if layout == "BHD":
        return x[:, :, None, :]
    return x


def read_layout(arrays: dict, like: str, N: int, d: int, layout: str | None, dv: int | None = None,
                N_q: int | None = None) -> dict[str, np.ndarray]:  # fmt: skip
    """Q, K, V, O (dO, dQ, dK, dV) as (B, H, N, d), read in the launcher's declared ``layout`` (or, undeclared,
    (B, H, N, d) for 4-d arrays, (H, N, d) for 3-d ones, (N, d) for 2-d ones). InputError (one line) for a layout
    iosim does not accept, an array whose rank is not the layout's, or shapes that do not read as --N, --d and the
    model."""
    given = layout if isinstance(layout, dict) else {}
    for k, lay in given.items() if isinstance(layout, dict) else [("", layout)]:
        if k == "L" and lay in L_LAYOUTS:
            continue
        if lay is not None and lay not in LAYOUTS:
            accepted = "; ".join(f"{k} {v}" for k, v in LAYOUTS.items())
            raise InputError("launcher result 'layout'", f"must be one of {accepted} (or a dict array -> one)", lay)
    out, raw = {}, {}
    for k in ("Q", "K", "V", "O", "dO", "dQ", "dK", "dV"):
        if k not in arrays:
            continue
        x = np.asarray(arrays[k])
        lay = given.get(k) if isinstance(layout, dict) else layout
        lay = "BHND" if lay == "BHD" and k in ("K", "V", "dK", "dV") else lay
        lay = lay or {4: "BHND", 3: "HND", 2: "ND"}.get(x.ndim)
        if lay is None or len(lay) != x.ndim:
            raise InputError(f"launcher array {k}", f"must be {LAYOUTS.get(lay, 'of rank 2, 3 or 4')} as declared "
                             f"(the launcher's 'layout': one of {', '.join(LAYOUTS)})", x.shape)  # fmt: skip
        out[k] = _standard(x, lay)
        raw[k] = tuple(x.shape)
    if not all(k in out for k in "QKV"):
        return out
    Q, K = out["Q"], out["K"]
    read = f"read as {layout or 'BHND/HND/ND (undeclared)'}"
    n_q = 1 if like == "decode-splitkv" else N_q or N
    for k, x in out.items():
        width, opt = (d, "--d") if dv is None or k in ("Q", "K", "dQ", "dK") else (dv, "--dv")
        if x.shape[-1] != width:
            raise InputError(f"launcher array {k}", f"{read} has d = {x.shape[-1]}, not {opt} {width}: declare its "
                             "layout", raw[k])  # fmt: skip
        want_n = n_q if k in ("Q", "O", "dO", "dQ") else N
        if x.shape[2] != want_n or x.shape[0] != Q.shape[0]:
            raise InputError(f"launcher array {k}", f"{read} has B = {x.shape[0]}, N = {x.shape[2]}; the model "
                             f"wants B = {Q.shape[0]}, N = {want_n}: declare its layout ('layout': "
                             f"{', '.join(LAYOUTS)})", raw[k])  # fmt: skip
    if Q.shape[1] % K.shape[1]:
        raise InputError("launcher array Q", f"{read} has {Q.shape[1]} heads, not a multiple of K's {K.shape[1]}",
                         raw["Q"])  # fmt: skip
    return out


def numerics(like: str, arrays: dict, causal: bool, scale: float | None, dtype: str | None, N: int | None = None,
             d: int | None = None, layout: str | None = None, logsumexp: str | None = None,
             dv: int | None = None, N_q: int | None = None) -> list[dict]:  # fmt: skip
    """Per output: the largest error against the golden and whether every element is within check's bound. Arrays
    are read in the launcher's ``layout`` (:data:`LAYOUTS`); L is converted from the kernel's ``logsumexp``
    convention (:data:`LOGSUMEXP`) to the natural log of scale QK^T before the comparison."""
    need = {"flash2": ("Q", "K", "V", "O"), "decode-splitkv": ("Q", "K", "V", "O"),
            "flash2-backward": ("Q", "K", "V", "O", "dO", "dQ", "dK", "dV")}[like]  # fmt: skip
    if any(k not in arrays for k in need):
        return []
    if logsumexp is not None and logsumexp not in LOGSUMEXP:
        raise InputError("launcher result 'logsumexp'", f"must be one of {', '.join(LOGSUMEXP)}", logsumexp)
    first = np.asarray(arrays["K"])
    std = read_layout(arrays, like, first.shape[-2] if N is None else N, first.shape[-1] if d is None else d, layout,
                      dv, N_q)  # fmt: skip
    Q, K, V = std["Q"], std["K"], std["V"]
    d, N_q, N_k = Q.shape[-1], Q.shape[-2], K.shape[-2]
    sc = float(scale) if scale is not None else 1.0 / np.sqrt(d)
    name, np_dtype, u = check._dtype(dtype or "float32")
    offset = N_k - N_q if causal else 0
    bwd = like == "flash2-backward"
    dO = std["dO"] if bwd else np.zeros_like(Q)
    H_kv = K.shape[1]
    gold = check._golden(Q, K, V, dO, sc, causal, offset, H_kv, "float64", bwd)
    with np.errstate(all="ignore"):
        naive = check._naive(Q, K, V, dO, sc, causal, offset, H_kv, np_dtype, bwd)
        v = u if np_dtype == np.float64 else check.ACCUMULATOR_U
        floors = check._floors(Q, K, V, dO, gold, sc, causal, offset, H_kv, u, v, bwd)
    factor_L = LOGSUMEXP[logsumexp or "natural"]
    got_of = {k: std[k] for k in ("O", "dQ", "dK", "dV") if k in std}
    if "L" in arrays and factor_L is not None:
        L = np.asarray(arrays["L"], dtype=np.float64) * factor_L
        if isinstance(layout, dict) and layout.get("L") == "BNH":
            L = np.swapaxes(L, 1, 2)
        got_of["L"] = L
    out = []
    outputs = ("dQ", "dK", "dV") if bwd else ("O", "L")
    for key in outputs:
        if key not in got_of:
            continue
        ref = gold[key]
        if got_of[key].size != ref.size:
            raise InputError(f"launcher array {key}", f"must hold {ref.size:,} elements {ref.shape}",
                             got_of[key].shape)  # fmt: skip
        got = got_of[key].reshape(ref.shape)
        factor = check.BACKWARD_FACTOR if bwd else check.FORWARD_FACTOR
        baseline = float(np.max(check._abs_err(naive[key], ref)))
        bound = np.maximum(factor * baseline if np.isfinite(baseline) else 0.0, floors[key])
        err = check._abs_err(got, ref)
        i = int(np.argmax(err / np.where(bound > 0, bound, 1)))
        ok = bool(np.all(err <= bound))
        row = dict(output=key, error=float(err.flat[i]), bound=float(bound.flat[i]), ok=ok, dtype=name)
        for conv, f in LOGSUMEXP.items():  # an L outside the rule that another convention explains: say which
            if (
                key == "L"
                and not ok
                and f
                and f != factor_L
                and np.all(check._abs_err(got * f / factor_L, ref) <= bound)
            ):
                row["hint"] = f"L is in the {conv} convention: declare it in the launcher's dict, 'logsumexp': '{conv}'"
        out.append(row)
    return out

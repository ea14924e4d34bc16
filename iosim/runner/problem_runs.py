"""A run over a whole problem (:class:`iosim.spec.problem.Problem`): batch, heads, GQA, N_q != N_k, split-KV, paged KV,
MLA. :func:`iosim.runner.api.run` comes here when the problem is more than one head of the seed papers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from iosim.base.errors import InputError
from iosim.memory_model import Stats, TwoLevelMemory
from iosim.runner import estimate
from iosim.runner.inputs import problem_arrays
from iosim.runner.references import all_finite, logsumexp_error, problem_reference, problem_reference_backward
from iosim.runner.results import PassResult, Result
from iosim.runner.validate import MAX_D, MAX_N, dtype_arg, estimated_steps, flag, positive_int, scale_arg, seed_arg
from iosim.spec.problem import Problem
from iosim.theory.tiling import Tiling

PROBLEM_ALGORITHMS = ("flash1", "flash2")
BACKWARD_FLOOR = "compulsory (read Q, O, dO, L, K/V once per KV head; write dQ, dK, dV)"
ONE_HEAD_ALGORITHMS = ("standard", "square-tiling")  # one head, any N_q, N_k, d_qk, d_v


def problem_arg(problem, N, d, causal, Q, dtype) -> Problem:
    """The problem of a run: the one given, or the one-head problem of N and d (schedule options without one)."""
    if problem is None:
        if N is None or d is None:
            raise InputError("problem", "or N and d must be given with gqa, splits or mla")
        return Problem(N=positive_int("N", N, MAX_N), d=positive_int("d", d, MAX_D), causal=bool(causal))
    if not isinstance(problem, Problem):
        raise InputError("problem", "must be an iosim.Problem", type(problem).__name__)
    if N is not None or d is not None:
        raise InputError("N, d", "must not be given with problem= (the problem holds N_q, N_k, d_qk, d_v)", (N, d))
    if causal:
        raise InputError("causal", "is a field of the problem (Problem(causal=True)) when problem= is given", causal)
    return problem


def is_plain(p: Problem, gqa: str, splits, mla: str, pages: str = "pieces") -> bool:
    """Whether a problem and its schedule are the seed papers' case (one head, N_q = N_k, no split, no latent)."""
    return p.is_single and gqa == "per-head" and splits == 1 and mla == "shared" and pages == "pieces"


def explicit_tiling(algo, given: dict, t, t_bwd, N, d, M, causal_arg, strict: bool):
    """The rule's tiling with the given tiles in place; the forward's (and backward's) peak must fit in M."""
    fields = {k: given.get(k, getattr(t, k)) for k in ("Br", "Bc", "B") if getattr(t, k) is not None}
    t = Tiling("explicit", **fields)
    checks = [("forward", algo.predict_forward(N, d, M, t, causal_arg))]
    if t_bwd is not None:
        t_bwd = t
        checks.append(("backward", algo.predict_backward(N, d, M, t, causal_arg)))
    for what, pred in checks:
        if strict and pred is not None and pred.peak > M:
            raise InputError(
                ", ".join(given),
                f"give a {what} working set of {pred.peak:,} words above M = {M:,}: choose smaller tiles "
                "(or strict=False to record the overflow)",
                tuple(given.values()),
            )
    return t, t_bwd


def _problem_schedule(algo, p: Problem, gqa, splits, mla, B, pages="pieces") -> tuple[int, str]:
    """The schedule's options (each checked on its own by :class:`iosim.Schedule`) against the algorithm and the
    problem: (splits, mla)."""
    if algo.name in ONE_HEAD_ALGORITHMS:
        # heads one after another, each its own schedule: batch, heads, GQA per-head, any N_q, N_k, d_qk, d_v
        for name, value, given in (("gqa", gqa, gqa != "per-head"), ("splits", splits, splits != 1),
                                   ("page_size", p.page_size, p.page_size is not None),
                                   ("latent", True, p.latent)):  # fmt: skip
            if given:
                raise InputError(
                    name,
                    f"applies to {' and '.join(PROBLEM_ALGORITHMS)}; {algo.name} runs each query head as its own "
                    "problem (--gqa per-head, no splits, pages or MLA latent)",
                    value,
                )
        return 1, mla
    if algo.name not in PROBLEM_ALGORITHMS:
        raise InputError(
            "algorithm",
            f"must be one of {', '.join(PROBLEM_ALGORITHMS + ONE_HEAD_ALGORITHMS)} for a problem beyond one head "
            "with N_q = N_k",
            algo.name,
        )
    if pages == "gather" and (algo.name != "flash1" or p.page_size is None):
        raise InputError(
            "pages",
            "gather applies to flash1 over a paged cache (page_size): its K/V-outer steps gather a column block's "
            f"keys from their pages; flash2 reads page pieces in its inner loop either way ({algo.name}, page_size "
            f"{p.page_size})",
            pages,
        )
    if mla == "naive" and not p.latent:
        raise InputError("mla", "naive applies to a latent (MLA) problem: Problem(latent=True)", mla)
    splits = positive_int("splits", splits, p.N_k)  # at most one split per key
    if splits > 1 and algo.name != "flash2":
        raise InputError(
            "splits",
            f"applies to flash2 (Flash-Decoding splits FlashAttention-2's key loop); {algo.name} takes 1",
            splits,
        )
    return splits, mla


def combine_rows(p: Problem, splits: int, M: int) -> int:
    """Rows per block of the split-KV combine step: the most whose working set fits M (at most all rows)."""
    from iosim.theory.io_model import combine_working_set

    if splits == 1:
        return 1
    per_row = combine_working_set(p.d_v, splits, 1)
    rows = min(p.B * p.H_q * p.N_q, M // per_row)
    if rows < 1:
        raise InputError(
            "M", f"must be at least {per_row:,} words for the split-KV combine step (s + 2 d_v + 1 words per row)", M
        )
    return rows


def _problem_inputs(p: Problem, rng, user=None):
    """Standard-normal Q (B H_q N_q x d_qk), K and V (B H_kv N_k rows; the latent: V = K's first d_v columns) in
    logical order, or the caller's (``user``: :func:`iosim.runner.inputs.problem_arrays`), and the paged storage: (Q, K,
    V, K_stored, V_stored, table)."""
    if user is not None:
        Q, K, V = user[:3]
    else:
        Q = rng.standard_normal((p.B * p.H_q * p.N_q, p.d_qk))
        K = rng.standard_normal((p.B * p.H_kv * p.N_k, p.d_qk))
        V = np.ascontiguousarray(K[:, : p.d_v]) if p.latent else rng.standard_normal((p.B * p.H_kv * p.N_k, p.d_v))
    if p.page_size is None:
        return Q, K, V, K, V, None
    P, pages = p.page_size, p.pages
    table = rng.permutation(p.B * pages).astype(np.int64)  # logical page t of batch item b -> physical page
    Ks = np.full((p.B * pages * p.H_kv * P, p.d_qk), np.nan)  # unwritten rows stay NaN: a wrong load shows
    Vs = np.full((p.B * pages * p.H_kv * P, p.d_v), np.nan)
    for b in range(p.B):
        for t in range(pages):
            n = min(P, p.N_k - t * P)
            for hk in range(p.H_kv):
                src = (b * p.H_kv + hk) * p.N_k + t * P
                dst = (int(table[b * pages + t]) * p.H_kv + hk) * P
                Ks[dst : dst + n] = K[src : src + n]
                Vs[dst : dst + n] = V[src : src + n]
    return Q, K, V, Ks, Vs, table


def _user_arrays(p: Problem, o: dict, backward: bool):
    """The caller's (Q, K, V, dO) over ``p``, checked and flattened (:func:`iosim.runner.inputs.problem_arrays`), or
    None
    when none is given (the run draws them from its seed)."""
    Q, K, V, dO = o["arrays"]
    if Q is None and K is None and V is None:
        if dO is not None:
            raise InputError("dO", "is given with Q, K and V over a problem (or drawn from seed with them)", "an array")
        return None
    if flag("count_only", o["count_only"]):
        raise InputError("count_only", "cannot be combined with given Q, K, V (count-only runs have no data)")
    if dO is not None and not backward:
        raise InputError("dO", "is only used with backward=True", "an array")
    return problem_arrays(p, Q, K, V, dO)


def _problem_dO(rng, shape: tuple[int, int], user) -> np.ndarray:
    """The upstream gradient: the caller's (``user[3]``) or drawn from ``rng`` after Q, K, V."""
    if user is not None and user[3] is not None:
        return user[3]
    return rng.standard_normal(shape)


def _problem_backward_check(algo, p: Problem, splits: int) -> None:
    """The backward over a problem of flash1, flash2 (batch, heads, GQA, N_q != N_k, d_qk != d_v): the inference
    options (split-KV, paged KV, MLA latent) have none."""
    for name, value, given in (("splits", splits, splits != 1), ("page_size", p.page_size, p.page_size is not None),
                               ("latent", True, p.latent)):  # fmt: skip
        if given:
            raise InputError(
                name,
                "is an inference option with no backward: use splits 1, no pages, no MLA latent with backward",
                value,
            )


def _seen(p: Problem, tmask) -> tuple[int, int] | None:
    """Per head, (query rows that see a key, keys some query row sees) under ``tmask`` (a TileMask over N_k x N_k
    or None for the problem's causal field); None when every row sees every key."""
    from iosim.algorithms.tile_masks import seen_counts

    if tmask is None:
        return (p.N_k, p.N_k) if p.causal and p.N_q > p.N_k else None
    if tmask.packed_rows:  # one group's packed rows under masks of their own (iosim.masking.head_masks.packed_mask)
        from iosim.spec.problem import SeenTotals

        return SeenTotals(*(int(x) for x in seen_counts(*tmask.args[:3], tmask.packed_rows, 0, p.N_k)))
    return tuple(int(x) for x in seen_counts(*tmask.args[:3], p.N_q, p.N_k - p.N_q, p.N_k))


def problem_seen(p: Problem, mask, allow_long: bool = False) -> tuple[int, int] | None:
    """:func:`_seen` of a ``mask`` argument (a ``--mask`` string, a Mask, an array or None) over problem ``p``: what
    its compulsory traffic reads (:meth:`iosim.spec.problem.Problem.compulsory`). A random mask is tested element by
    element over the queries' N_q rows: that time is estimated first, under the long-run rule."""
    if mask is None or (isinstance(mask, str) and mask in ("none", "dense")):
        return _seen(p, None)
    from iosim.algorithms.tile_masks import DENSE
    from iosim.masking import head_masks
    from iosim.masking.masks import compile_mask

    one, g = head_masks.resolve(p, mask, allow_long)
    if g is not None:  # a mask that differs per (b, h): over the whole problem
        return head_masks.seen_totals(p, g)
    tm = compile_mask(one, p.N_k, p.causal, allow_long=allow_long)
    draws = -(-getattr(tm, "scan_tests", 0) * p.N_q // p.N_k)  # the scan of the whole N_k x N_k, for N_q rows
    if draws:
        estimate.check(
            draws * estimate.MASK_SCAN_DRAW,
            f"a count of the mask {tm.label} over {p.N_q:,} x {p.N_k:,} ({draws:,} draws)",
            allow_long=allow_long, parameter="mask", value=tm.label, remedy="use a smaller N or a structured mask",
        )  # fmt: skip
    return None if tm.kind == DENSE else _seen(p, tm)


def problem_mask(p: Problem, mask, policy, allow_long: bool = False):
    """The mask of a flash schedule over a problem: a TileMask over the whole sequence (N_k x N_k) whose last N_q
    rows are the queries' (aligned bottom-right, as the causal field is), or None for the dense mask. ``policy``
    None is skip: a problem's schedules load no operand of a block the mask empties, as FlashAttention's kernels."""
    from iosim.algorithms.tile_masks import DENSE
    from iosim.masking.masks import compile_mask

    if p.N_q > p.N_k:
        raise InputError(
            "mask",
            f"over a problem needs N_q <= N_k (the queries are the last N_q of the N_k positions the mask covers); "
            f"N_q = {p.N_q:,}, N_k = {p.N_k:,}",
            mask if isinstance(mask, str) else type(mask).__name__,
        )
    from iosim.masking.head_masks import one_mask

    mask = one_mask(p, mask, allow_long)
    tm = compile_mask(mask, p.N_k, p.causal, "skip" if policy is None else policy, allow_long=allow_long)
    return None if tm.kind == DENSE else tm


@dataclass
class ProblemRun:
    """One run over a problem, its options checked (:meth:`check`): what the steps of :func:`run_problem` share.
    ``o`` keeps the raw keywords a step reads as given (tiling rule, kv_policy, pages, combine, mask)."""

    algo: object  # the registered algorithm (iosim.runner.registry.Algorithm)
    p: Problem
    M: int
    gqa: str
    splits: int
    mla: str
    Br: int | None
    Bc: int | None
    B: int | None
    o: dict
    backward: bool
    count_only: bool = False
    strict: bool = True
    reference: bool = True
    allow_long: bool = False
    trace: bool = False
    dtype: str = "float64"
    seed: int | None = 0
    scale: float = 1.0
    tmask: object = None  # the compiled TileMask over N_k x N_k, or None (dense, or the problem's causal field)
    user: tuple | None = None  # the caller's (Q, K, V, dO), flattened, or None (drawn from seed)

    @property
    def name(self) -> str:
        return self.algo.name

    @property
    def rule(self) -> str:  # the tiling rule, "fit" or "paper"
        return self.o["tiling"]

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    @property
    def gather(self) -> bool:  # flash1 over a paged cache: a column block's keys gathered from their pages
        return self.o.get("pages") == "gather"

    @classmethod
    def check(cls, algo, p: Problem, M: int, gqa, splits, mla, Br, Bc, B, masked: bool, o: dict) -> ProblemRun:
        """The schedule's options against the algorithm and the problem, the mask compiled, the flags, the caller's
        arrays, dtype, seed, scale and explicit tiles checked, in that order (the first mistake is the one named)."""
        from iosim.masking.masks import compile_mask

        backward = flag("backward", o["backward"])
        splits, mla = _problem_schedule(algo, p, gqa, splits, mla, B, o.get("pages", "pieces"))
        tmask = problem_mask(p, o["mask"], o["kv_policy"], o["allow_long"] is True) if masked else None
        if not masked and p.causal and o["kv_policy"] == "paper":  # the causal field under the policy asked for
            tmask = compile_mask(None, p.N_k, True, "paper")
        if backward:
            _problem_backward_check(algo, p, splits)
        r = cls(algo, p, M, gqa, splits, mla, Br, Bc, B, o, backward, trace=flag("trace", o["trace"]), tmask=tmask)
        r.user = _user_arrays(p, o, backward)
        r.count_only, r.strict = flag("count_only", o["count_only"]), flag("strict", o["strict"])
        r.reference, r.allow_long = flag("reference", o["reference"]), flag("allow_long", o["allow_long"])
        r.dtype = dtype_arg(o["dtype"])
        r.seed = None if r.user is not None else seed_arg(o["seed"])
        r.scale = scale_arg(o["scale"], p.d_qk)
        r.Br = None if Br is None else positive_int("Br", Br, MAX_N)
        r.Bc = None if Bc is None else positive_int("Bc", Bc, MAX_N)
        return r

    def memory(self, trace: bool) -> TwoLevelMemory:
        """A fresh fast memory of M words for one pass (``trace``: record it); a count-only run without a trace
        runs on the counters-only memory."""
        return TwoLevelMemory(self.M, strict=self.strict, trace=trace, fast=self.count_only and not self.trace)

    def inputs(self) -> tuple:
        """(Q, K, V, K_stored, V_stored, table): the caller's or drawn from ``seed``; all None when count-only."""
        if self.count_only:
            return (None,) * 6
        return _problem_inputs(self.p, np.random.default_rng(self.seed), self.user)

    def mask_label(self) -> str:
        return self.tmask.label if self.tmask else "causal" if self.p.causal else "none"


def run_problem(algo, p: Problem, M: int, gqa, splits, mla, Br, Bc, B, one_head, **o) -> Result:
    """:func:`iosim.runner.api.run` over a whole problem (flash1, flash2: :mod:`iosim.algorithms.flash`; standard and
    square tiling head by head). ``one_head`` is :func:`iosim.runner.api.run`'s keyword form, which a backward run head
    by
    head calls for each head."""
    from iosim.masking.masks import check_policy

    check_policy(o["kv_policy"], None)  # checked with or without a mask (None: skip over a problem)
    masked = not (o["mask"] is None or (isinstance(o["mask"], str) and o["mask"] in ("none", "dense")))
    backward = flag("backward", o["backward"])
    if masked:  # a mask that differs per (b, h): each part of the problem under its own (iosim.masking.head_masks)
        from iosim.masking import head_masks

        one, grid = head_masks.resolve(p, o["mask"], o["allow_long"] is True)
        if grid is not None:
            return _run_mask_parts(algo, p, M, gqa, splits, mla, Br, Bc, B, o, one_head, grid)
        o = {**o, "mask": one}
    if algo.name not in PROBLEM_ALGORITHMS and backward:
        return run_by_heads(algo, p, M, gqa, splits, mla, Br, Bc, B, masked, o, one_head)
    r = ProblemRun.check(algo, p, M, gqa, splits, mla, Br, Bc, B, masked, o)
    if algo.name in ONE_HEAD_ALGORITHMS:
        return _run_one_head_problem(r)
    return _run_flash_problem(r)


def _run_flash_problem(r: ProblemRun) -> Result:
    """flash1 or flash2 over the problem: the tiling, the long-run and memory checks, the forward, its reference,
    then (backward) the backward on a fresh memory; the result carries the schedule and what it saw."""
    if r.B is not None:
        raise InputError("B", f"applies to standard and square-tiling; {r.name} takes Br and Bc", r.B)
    p = r.p
    G = p.g if r.gqa == "per-head" else 1
    rows = p.N_q * (p.g // G)
    t = _flash_tiling(r, rows)
    bm = combine_rows(p, r.splits, r.M)  # a fast memory too small for split-KV's combine step is refused here
    _check_flash_cost(r, t, rows, G)
    mem = r.memory(r.trace and not r.backward)
    schedule = {
        "gqa": r.gqa,
        "splits": r.splits,
        "mla": r.mla if p.latent else None,
        "combine_rows": bm if r.splits > 1 else None,
        "pages": r.o.get("pages", "pieces") if p.page_size and r.name == "flash1" else None,
    }
    Q, K, V, Ks, Vs, table = r.inputs()
    outputs, predicted = _flash_forward(r, mem, t, bm, (Q, Ks, Vs), table)
    schedule["thread_blocks"] = predicted.thread_blocks
    errors: dict[str, float] = {}
    if not r.count_only and r.reference:
        O_ref, L_ref = problem_reference(p, Q, K, V, r.scale, r.tmask)
        errors["O"] = float(np.max(np.abs(outputs["O"] - O_ref)))
        errors["L"] = logsumexp_error(outputs["L"], L_ref)
    seen = _seen(p, r.tmask)
    lb = float(sum(p.compulsory(seen).values()))
    fwd = PassResult(
        "forward", mem.stats(), predicted, lb, "compulsory (read Q, K/V once per KV head, write O)", errors, t,
        r.count_only or all_finite(outputs, ("O", "L")),
    )  # fmt: skip
    passes = {"forward": fwd}
    pass_trace = mem.trace()
    if r.backward:
        passes["backward"], pass_trace = _problem_backward_pass(r, rows, outputs, (Q, K, V), schedule, seen)
    return Result(
        r.name, p.N_q, p.d_qk, r.M, p.causal, r.count_only, r.dtype, passes["backward"].tiling if r.backward else t,
        passes, outputs, r.seed, r.scale, pass_trace, r.mask_label(),
        r.tmask.policy if r.tmask else (r.o["kv_policy"] or "skip"), p, schedule, seen,
    )  # fmt: skip


def _flash_tiling(r: ProblemRun, rows: int):
    """The forward's tiles over the problem (the rule's, or the explicit Br, Bc): :func:`problem_tiling`."""
    from iosim.theory.tiling import problem_tiling

    shared = r.p.latent and r.mla == "shared"
    return problem_tiling(r.name, r.p, r.M, r.rule, rows, shared, r.Br, r.Bc)


def _check_flash_cost(r: ProblemRun, t, rows: int, G: int) -> None:  # noqa: N803
    """The long-run rule (the run's estimated seconds: its tile steps, arithmetic and a random mask's tile tests)
    and, numeric, whether its arrays fit in memory: refused up front, before any work."""
    p = r.p
    groups = p.B * p.H_kv * G
    steps = groups * -(-rows // t.Br) * (-(-p.N_k // t.Bc) + p.pages + r.splits)
    passes_n = 3 if r.backward else 1  # a random mask's tests: the backward about twice the forward's
    steps_b = 0
    if r.backward:  # the backward's own tiles (smaller than the forward's, so more of them)
        from iosim.theory.tiling import problem_backward_tiling

        tb = problem_backward_tiling(p, r.M, r.rule, rows, r.Br, r.Bc, r.name)
        steps_b = groups * -(-rows // tb.Br) * -(-p.N_k // tb.Bc)
    # a random mask: every tile of every group is tested by the run, and once more by the closed form's summary
    tests = r.tmask.tile_tests(t.Br, t.Bc) if r.tmask else 0
    draws = (groups + 1) * -(-rows // t.Br) * -(-p.N_k // t.Bc) * tests
    # one head of N_q x N_k per group: the numeric estimate's arithmetic is per head (N_q N_k d), times the heads
    if r.count_only:
        seconds = estimate.count_only_seconds(steps + estimate.COUNT_BACKWARD * steps_b)
    else:
        flops = estimate.NUMERIC_N2D * p.B * p.H_q * p.N_q * p.N_k * (p.d_qk + p.d_v)
        seconds = (steps + steps_b) * estimate.NUMERIC_STEP + flops * (
            1 + (estimate.NUMERIC_BACKWARD if r.backward else 0)
        )
    seconds += _priced_tile_tests(r.tmask, p, draws * passes_n, r.allow_long, "larger blocks")
    estimate.check(seconds, f"a run of {r.name} over {p}", allow_long=r.allow_long, parameter="problem", value=str(p))
    if not r.count_only:
        words = (p.B * p.H_q * p.N_q * (p.d_qk + (r.splits + 1) * p.d_v)) + 3 * p.B * p.H_kv * p.N_k * (p.d_qk + p.d_v)
        if r.backward:  # dO, dQ, D and the reference's; dK, dV and the expanded partials
            words += 3 * p.B * p.H_q * (p.N_q + p.N_k) * (p.d_qk + p.d_v)
        if words * 8 > 0.8 * estimate.available_bytes():
            raise InputError(
                "count_only", f"must be True for this problem ({words * 8 / 2**30:.1f} GiB of arrays)", False
            )


def _flash_forward(r: ProblemRun, mem: TwoLevelMemory, t, bm: int, inputs: tuple, table) -> tuple[dict, object]:
    """The forward nest of flash2 (split-KV's combine in blocks of ``bm`` rows included, unless ``combine`` is
    "apart": a part of a problem whose combine runs over the whole) or flash1 on ``mem``: (outputs, the closed
    form's prediction)."""
    from iosim.algorithms import flash
    from iosim.theory import io_model

    p, s = r.p, r.splits
    data = [None if x is None else np.ascontiguousarray(x, dtype=r.np_dtype) for x in inputs]
    if r.name == "flash2":
        apart = s > 1 and r.o.get("combine") == "apart"
        O, L = flash.flash2_problem(
            mem, p, *data, table, Br=t.Br, Bc=t.Bc, gqa=r.gqa, splits=s, mla=r.mla, combine_rows=bm, scale=r.scale,
            dtype=r.np_dtype, mask=r.tmask, combine_mem=TwoLevelMemory(r.M, fast=r.count_only) if apart else None,
        )  # fmt: skip
        predicted = io_model.flash2_problem(p, t.Br, t.Bc, r.gqa, s, r.mla, None if apart else bm, r.tmask)
        return {"O": O, "L": L}, predicted
    O, l_, m = flash.flash1_problem(
        mem, p, *data, table, Br=t.Br, Bc=t.Bc, gqa=r.gqa, mla=r.mla, scale=r.scale, dtype=r.np_dtype, mask=r.tmask,
        gather=r.gather,
    )  # fmt: skip
    with np.errstate(divide="ignore"):
        L = None if m is None else m + np.log(l_)
    predicted = io_model.flash1_problem(p, t.Br, t.Bc, r.gqa, r.mla, r.tmask, gather=r.gather)
    return {"O": O, "l": l_, "m": m, "L": L}, predicted


def _priced_tile_tests(tmask, p: Problem, draws: int, allow_long: bool, larger: str) -> float:
    """The seconds of a run's ``draws`` generator draws testing the tiles of ``tmask`` over ``p`` (0 for a
    structured mask), under the long-run rule naming the mask."""
    if draws:
        estimate.check(draws * estimate.MASK_DRAW, f"the tile tests of the mask {tmask.label} over {p}",
                       allow_long=allow_long, parameter="mask", value=tmask.label,
                       remedy=f"use fewer heads, {larger} or a structured mask")  # fmt: skip
    return draws * estimate.MASK_DRAW


def run_by_heads(algo, p: Problem, M: int, gqa, splits, mla, Br, Bc, B, masked: bool, o: dict, one_head) -> Result:
    """The backward of standard attention and square tiling over a problem, under any mask (flash1 and flash2 have their
    own problem backward, :mod:`iosim.algorithms.flash`; the forward of these two over a problem is
    :func:`_run_one_head_problem`): the B H_q query heads one after another, each the one-head schedule of :func:`run`
    on its own rows against its key/value head (GQA ``per-head``), so every array's counts are the heads' sum and the
    peak one head's (:func:`iosim.theory.io_model.heads_problem`). In the backward of a group of g > 1 query heads each
    head writes its dK, dV as partials (``dKpart``, ``dVpart``, as FlashAttention-2's GQA backward writes them expanded)
    and the group sum of :mod:`iosim.algorithms.flash` adds the g partials of each key/value head into dK, dV
    (:func:`iosim.theory.io_model.group_sum`). Every head is simulated; nothing is multiplied."""
    from iosim.theory import io_model

    what = "a masked backward" if masked else "the backward pass"
    need = (("N_q = N_k", p.N_q == p.N_k), ("d_qk = d_v", p.d_qk == p.d_v), ("no page_size", p.page_size is None),
            ("no latent", not p.latent), ("splits = 1", splits == 1), ("gqa per-head", gqa == "per-head"))  # fmt: skip
    missing = [k for k, ok in need if not ok]
    if missing:
        parameter = "mask" if masked else "backward"
        raise InputError(
            parameter,
            f"over a problem runs the heads one after another and needs {', '.join(k for k, _ in need)} "
            f"(this problem or schedule has not {', '.join(missing)})",
            (o["mask"] if isinstance(o["mask"], str) else getattr(o["mask"], "label", "a mask")) if masked else True,
        )
    if flag("trace", o["trace"]):
        raise InputError("trace", f"is not recorded for {what} over a problem (one head: N and d)", True)
    backward, count_only = flag("backward", o["backward"]), flag("count_only", o["count_only"])
    allow_long = flag("allow_long", o["allow_long"])
    N, d, heads = p.N_q, p.d_qk, p.B * p.H_q
    algo_t = algo.backward_tiling(N, d, M, o["tiling"]) if backward else algo.choose_tiling(N, d, M, o["tiling"])
    steps = heads * estimated_steps(algo_t, N, d, backward) + (heads * N if backward else 0)
    if count_only:
        seconds = estimate.count_only_seconds(steps, estimate.count_step(algo.name, backward, algo_t))
    else:
        seconds = estimate.numeric_seconds(N, d, steps, backward, heads)
    estimate.check(seconds, f"{what} of {algo.name} over {p}", allow_long=allow_long, parameter="problem",
                   value=str(p))  # fmt: skip
    if backward and p.g > 1 and M < 2 * d:
        raise InputError("M", f"must be at least 2 d = {2 * d} words for the GQA backward's group sum of dK, dV", M)
    user = _user_arrays(p, o, backward)
    seed = None if user is not None else seed_arg(o["seed"])
    one = dict(M=M, causal=p.causal, mask=o["mask"], kv_policy=o["kv_policy"], backward=backward, tiling=o["tiling"],
               dtype=o["dtype"], scale=o["scale"], strict=o["strict"], reference=o["reference"], allow_long=True,
               Br=Br, Bc=Bc, B=B)  # fmt: skip
    if not count_only:
        rng = np.random.default_rng(seed)
        Q, K, V = _problem_inputs(p, rng, user)[:3]
        dO = _problem_dO(rng, (heads * N, d), user) if backward else None
    runs = []
    for b in range(p.B):
        for h in range(p.H_q):  # query head h reads key/value head h // g
            if count_only:
                runs.append(one_head(algo.name, N=N, d=d, count_only=True, **one))
                continue
            q, k = (b * p.H_q + h) * N, (b * p.H_kv + h // p.g) * N
            grad = dict(dO=dO[q : q + N]) if backward else {}
            runs.append(one_head(algo.name, Q=Q[q : q + N], K=K[k : k + N], V=V[k : k + N], **grad, **one))
    first = runs[0]
    seen = problem_seen(p, o["mask"] if masked else None, allow_long=o["allow_long"] is True)
    passes: dict[str, PassResult] = {}
    for name, ps in first.passes.items():
        stats = runs[0].passes[name].stats
        for r in runs[1:]:
            stats = stats + r.passes[name].stats
        predicted = None if ps.predicted is None else io_model.heads_problem(ps.predicted, heads)
        errors = {e: max(r.passes[name].errors.get(e, 0.0) for r in runs) for e in ps.errors}
        finite = all(r.passes[name].finite for r in runs)
        floor = p.compulsory_backward(seen) if name == "backward" else p.compulsory(seen)
        what = BACKWARD_FLOOR if name == "backward" else "compulsory (read Q, K/V once per KV head, write O)"
        passes[name] = PassResult(name, stats, predicted, float(sum(floor.values())), what, errors, ps.tiling, finite)
    outputs: dict[str, np.ndarray | None] = {}
    for key in first.outputs:
        parts = [r.outputs.get(key) for r in runs]
        outputs[key] = None if any(x is None for x in parts) else np.concatenate(parts)
    if backward and p.g > 1:
        passes["backward"], outputs = _gqa_reduction(p, M, passes["backward"], outputs, count_only)
        if not count_only and flag("reference", o["reference"]):  # the summed dK, dV against the float64 sums
            from iosim.masking.masks import compile_mask

            tm = compile_mask(o["mask"] if masked else None, N, p.causal, allow_long=o["allow_long"] is True)
            ref_mask = None if tm.is_causal or tm.label == "none" else tm
            _, dK_ref, dV_ref = problem_reference_backward(p, Q, K, V, dO, first.scale, ref_mask)
            errs = passes["backward"].errors
            errs["dK"] = float(np.max(np.abs(outputs["dK"] - dK_ref)))
            errs["dV"] = float(np.max(np.abs(outputs["dV"] - dV_ref)))
    schedule = {"gqa": "per-head", "splits": 1, "mla": None, "thread_blocks": None}
    return Result(
        algo.name, N, d, M, p.causal, count_only, first.dtype, first.tiling, passes, outputs, seed, first.scale, None,
        first.mask, first.kv_policy, p, schedule, seen,
    )  # fmt: skip


def _run_mask_parts(algo, p: Problem, M: int, gqa, splits, mla, Br, Bc, B, o: dict, one_head, grid) -> Result:
    """:func:`run_problem` under a mask that differs per (b, h) (``grid``: its tile oracle at each, not all the
    same): the problem cut into parts within which it is the same (:mod:`iosim.masking.head_masks`), each part run as
    its
    own problem under its mask on the inputs of the whole (drawn from ``seed`` as the whole problem's are, or the
    caller's), every pass's counts and closed form the parts' sums and the peak the largest part's; per-query-head
    parts of a group of g > 1 write dK, dV as the group's partials and the group sum follows
    (:func:`_gqa_reduction`); packed GQA runs a group's heads as one part under its packed rows' own mask. The
    floor reads each row that sees a key once and each key/value head's keys its group sees
    (:func:`iosim.masking.head_masks.seen_totals`)."""
    from dataclasses import replace

    from iosim.masking import head_masks
    from iosim.theory import io_model

    how = head_masks.cut(p, grid)
    head_masks.check_schedule(o["trace"])
    backward, count_only = flag("backward", o["backward"]), flag("count_only", o["count_only"])
    user = _user_arrays(p, o, backward)
    seed = None if user is not None else seed_arg(o["seed"])
    if not count_only:
        rng = np.random.default_rng(seed)
        Q, K, V = _problem_inputs(p, rng, user)[:3]
        dO = _problem_dO(rng, (p.B * p.H_q * p.N_q, p.d_v), user) if backward else None
    runs = []
    for b, h0, nh, mask in head_masks.part_masks(p, grid, how, gqa):
        nkv = max(1, nh // p.g)
        sub = replace(p, B=1, H_q=nh, H_kv=nkv)
        arrays = (None,) * 4
        if not count_only:
            q, k = (b * p.H_q + h0) * p.N_q, (b * p.H_kv + h0 // p.g) * p.N_k
            qs, ks = slice(q, q + nh * p.N_q), slice(k, k + nkv * p.N_k)
            grad = None if dO is None else dO[qs].reshape(1, nh, p.N_q, -1)
            arrays = (Q[qs].reshape(1, nh, p.N_q, -1), K[ks].reshape(1, nkv, p.N_k, -1),
                      V[ks].reshape(1, nkv, p.N_k, -1), grad)  # fmt: skip
        part = {**o, "mask": mask, "arrays": arrays, "seed": o["seed"] if count_only else None}
        if splits != 1:  # split-KV: each part's split kernel; the combine kernel runs once over the whole, below
            part["combine"] = "apart"
        r = run_problem(algo, sub, M, gqa, splits, mla, Br, Bc, B, one_head, **part)
        runs.append(r)
    seen = head_masks.seen_totals(p, grid)
    first = runs[0]
    s = first.schedule.get("splits", 1)  # validated by the parts' runs
    if s > 1:  # the combine kernel over all B H_q N_q rows, its blocks across the parts as over the whole problem
        from iosim.algorithms import flash

        Rtot, bm = p.B * p.H_q * p.N_q, combine_rows(p, s, M)
        cmem = TwoLevelMemory(M, strict=flag("strict", o["strict"]), fast=True)
        flash.split_combine(cmem, Rtot, p.d_v, s, bm)
        combine = (cmem.stats(), io_model.split_combine(Rtot, p.d_v, s, bm))
    passes: dict[str, PassResult] = {}
    for name, ps in first.passes.items():
        each = [r.passes[name] for r in runs]
        stats = each[0].stats
        for x in each[1:]:
            stats = stats + x.stats
        predicted = None
        if all(x.predicted is not None for x in each):
            predicted = io_model.sum_predictions([x.predicted for x in each])
        if s > 1 and name == "forward":
            stats = stats + combine[0]
            predicted = None if predicted is None else io_model.sum_predictions([predicted, combine[1]])
        errors = {e: max(x.errors.get(e, 0.0) for x in each) for e in ps.errors}
        floor = p.compulsory_backward(seen) if name == "backward" else p.compulsory(seen)
        passes[name] = PassResult(name, stats, predicted, float(sum(floor.values())), ps.lower_bound_name, errors,
                                  ps.tiling, all(x.finite for x in each))  # fmt: skip
    outputs: dict[str, np.ndarray | None] = {}
    for key in first.outputs:
        pieces = [r.outputs.get(key) for r in runs]
        outputs[key] = None if any(x is None for x in pieces) else np.concatenate(pieces)
    if backward and how == "head" and p.g > 1 and gqa != "packed":  # each head's dK, dV: its group's partials
        bwd = passes["backward"]
        errs = {{"dK": "dKpart", "dV": "dVpart"}.get(e, e): v for e, v in bwd.errors.items()}
        R = bwd.tiling.Bc if algo.name in PROBLEM_ALGORITHMS else None  # as the schedule over the whole sums
        passes["backward"], outputs = _gqa_reduction(p, M, replace(bwd, errors=errs), outputs, count_only, R)
    schedule = dict(first.schedule)
    for k in ("thread_blocks", "backward_thread_blocks"):
        if isinstance(schedule.get(k), int):
            schedule[k] = sum(r.schedule[k] for r in runs)
    if s > 1:
        schedule["thread_blocks"] += combine[1].thread_blocks
        schedule["combine_rows"] = combine_rows(p, s, M)
    schedule["mask_parts"] = f"{len(runs)} ({how})"
    label = f"{grid[0][0].label} per (b, h)"
    return Result(
        algo.name, p.N_q, p.d_qk, M, p.causal, count_only, first.dtype, first.tiling, passes, outputs, seed,
        first.scale, None, label, first.kv_policy, p, schedule, seen,
    )  # fmt: skip


def _gqa_reduction(p: Problem, M: int, bwd: PassResult, outputs: dict, count_only: bool, R: int | None = None):  # noqa: N803
    """The group sum after a head-by-head backward of g > 1 query heads per key/value head: the per-head passes
    wrote dK, dV (renamed ``dKpart``, ``dVpart``); :func:`iosim.algorithms.flash.sum_group` reads the g partials
    of each key/value head, R keys at a time (default :func:`iosim.theory.io_model.group_sum_rows`; flash1 and
    flash2 sum B_c at a time), and writes dK, dV."""
    from iosim.algorithms import flash
    from iosim.theory import io_model

    def renamed(per: dict) -> dict:
        return {{"dK": "dKpart", "dV": "dVpart"}.get(n, n): c for n, c in per.items()}

    R = io_model.group_sum_rows(p, M) if R is None else R
    mem = TwoLevelMemory(M, fast=count_only)
    out = dict(outputs)
    for name in ("dK", "dV"):
        d = p.d_qk if name == "dK" else p.d_v
        ids = mem.ids(**{f"{name}part": (p.B * p.H_q * p.N_k, d), name: (p.B * p.H_kv * p.N_k, d)})
        part = None if count_only else np.ascontiguousarray(outputs[name])
        total = None if count_only else np.empty((p.B * p.H_kv * p.N_k, d), dtype=part.dtype)
        bufs = (None, None) if count_only else (np.empty(R * d, part.dtype), np.empty(R * d, part.dtype))
        mem.call(flash.sum_group, ids, part, total, p.B * p.H_kv, p.g, p.N_k, d, R, *bufs)
        out[name] = total
    stats = Stats(M=bwd.stats.M, peak=bwd.stats.peak, overflowed=bwd.stats.overflowed,
                  per_array=renamed(bwd.stats.per_array), at_peak=bwd.stats.at_peak) + mem.stats()  # fmt: skip
    predicted = None
    if bwd.predicted is not None:
        arrays, peak = io_model.group_sum(p, R)
        per = renamed(bwd.predicted.per_array)
        for n, (reads, writes) in arrays.items():
            c = per.get(n, io_model.ArrayCounts())
            per[n] = io_model.ArrayCounts(c.reads + reads, c.writes + writes, c.init_writes)
        predicted = io_model.Prediction(per, max(bwd.predicted.peak, peak))
    return PassResult(bwd.name, stats, predicted, bwd.lower_bound, bwd.lower_bound_name, bwd.errors, bwd.tiling,
                      bwd.finite), out  # fmt: skip


def _problem_backward_pass(r: ProblemRun, rows: int, outputs: dict, inputs: tuple, schedule: dict, seen) -> tuple:
    """The flash2 (flash1) backward over a problem on a fresh memory of M words, reading the forward's O and L (O,
    l and m); dO is drawn from ``seed`` after Q, K, V. Fills ``outputs`` with dQ, dK, dV.
    Returns the pass and its trace (the run's trace, as for one head)."""
    from iosim.algorithms import flash
    from iosim.theory import io_model
    from iosim.theory.tiling import problem_backward_tiling

    p, name = r.p, r.name
    t = problem_backward_tiling(p, r.M, r.rule, rows, r.Br, r.Bc, name)
    predict = io_model.flash1_backward_problem if name == "flash1" else io_model.flash2_backward_problem
    predicted = predict(p, t.Br, t.Bc, r.gqa, r.tmask)
    if (r.Br is not None or r.Bc is not None) and r.strict and predicted.peak > r.M:
        raise InputError(
            "Br, Bc", f"give a backward working set of {predicted.peak:,} words above M = {r.M:,}: choose smaller "
            "tiles", (r.Br, r.Bc),
        )  # fmt: skip
    mem = r.memory(r.trace)
    if r.count_only:
        dO = None
        data = (None,) * (7 if name == "flash1" else 6)
    else:
        rng = np.random.default_rng(r.seed)
        _problem_inputs(p, rng, r.user)  # the same draws as the forward's, then dO
        dO = _problem_dO(rng, (p.B * p.H_q * p.N_q, p.d_v), r.user)
        stats = (outputs["l"], outputs["m"]) if name == "flash1" else (outputs["L"],)
        data = (*inputs, outputs["O"], dO, *stats)
    run_backward = flash.flash1_backward_problem if name == "flash1" else flash.flash2_backward_problem
    dQ, dK, dV = run_backward(mem, p, *data, Br=t.Br, Bc=t.Bc, gqa=r.gqa, scale=r.scale, dtype=r.np_dtype, mask=r.tmask)
    outputs.update(dQ=dQ, dK=dK, dV=dV)
    schedule["backward_thread_blocks"] = predicted.thread_blocks
    errors: dict[str, float] = {}
    if not r.count_only and r.reference:
        refs = problem_reference_backward(p, *inputs, dO, r.scale, r.tmask)
        for grad, x, ref in zip(("dQ", "dK", "dV"), (dQ, dK, dV), refs, strict=True):
            errors[grad] = float(np.max(np.abs(x - ref)))
    result = PassResult(
        "backward", mem.stats(), predicted, float(sum(p.compulsory_backward(seen).values())), BACKWARD_FLOOR, errors, t,
        r.count_only or all_finite(outputs, ("dQ", "dK", "dV")),
    )  # fmt: skip
    return result, mem.trace()


def _run_one_head_problem(r: ProblemRun) -> Result:
    """Standard attention (Algorithm 0) or square tiling over a problem: each of the B H_q query heads in turn, its
    own schedule of N_q rows against its key/value head's N_k keys (GQA ``per-head``), widths d_qk and d_v; causal
    bottom-right, or the TileMask ``tmask`` over the whole N_k x N_k sequence with the queries its last N_q rows
    (:func:`problem_mask`). Exact counts: :func:`iosim.theory.io_model.standard_forward` with N_k and d_v (the
    dense baseline computes every tile whatever the mask) or :func:`iosim.theory.io_model.square_tiling_problem`
    for one head, times the heads (:func:`iosim.theory.io_model.heads_problem`)."""
    p, heads = r.p, r.p.B * r.p.H_q
    t, predicted = _one_head_tiling(r)
    if r.trace and heads > 1:  # each head's schedule addresses its own rows from 0: one trace would overlay them
        raise InputError(
            "trace",
            f"is recorded for {r.name} over one head (B = H_q = 1; it runs B H_q = {heads} heads one after "
            "another): trace one head, or flash1 / flash2 over the whole problem",
            True,
        )
    if r.B is not None and r.strict and predicted.peak > r.M:
        raise InputError(
            "B", f"gives a working set of {predicted.peak:,} words above M = {r.M:,}: choose a smaller B", r.B
        )
    _check_one_head_cost(r, t)
    mem = r.memory(r.trace)
    Q, K, V, outputs = _one_head_forward(r, mem, t)
    errors: dict[str, float] = {}
    if not r.count_only and r.reference:
        O_ref, L_ref = problem_reference(p, Q, K, V, r.scale, r.tmask)
        errors["O"] = float(np.max(np.abs(outputs["O"] - O_ref)))
        if "L" in outputs:
            errors["L"] = logsumexp_error(outputs["L"], L_ref)
    seen = _seen(p, r.tmask)
    fwd = PassResult(
        "forward", mem.stats(), predicted, float(sum(p.compulsory(seen).values())),
        "compulsory (read Q, K/V once per KV head, write O)", errors, t,
        r.count_only or all_finite({"O": outputs["O"]}, ("O",)),
    )  # fmt: skip
    return Result(
        r.name, p.N_q, p.d_qk, r.M, p.causal, r.count_only, r.dtype, t, {"forward": fwd}, outputs, r.seed, r.scale,
        mem.trace(), r.mask_label(), r.tmask.policy if r.tmask else "paper", p,
        {"gqa": "per-head", "splits": 1, "mla": None, "thread_blocks": None} if heads > 1 else {"thread_blocks": None},
        seen,
    )  # fmt: skip


def _one_head_tiling(r: ProblemRun) -> tuple:
    """One head's square tiles (the rule's, or the explicit B) and the closed form over all B H_q heads."""
    from iosim.theory import io_model
    from iosim.theory.tiling import saha_ye_problem_tiling
    from iosim.theory.tiling import square_tiling as standard_tiling

    p = r.p
    if r.name == "standard":
        t = standard_tiling("standard", p.N_q, p.d_qk, r.M, r.rule, p.N_k, p.d_v)
    else:
        t = saha_ye_problem_tiling(p, r.M, r.rule)
    if r.B is not None:
        t = Tiling("explicit", B=positive_int("B", r.B, MAX_N))
    if r.name == "standard":
        one = io_model.standard_forward(p.N_q, p.d_qk, r.M, t.B, p.causal, p.N_k, p.d_v)
    else:
        one = io_model.square_tiling_problem(p, t.B, r.tmask)
    return t, io_model.heads_problem(one, p.B * p.H_q)


def _check_one_head_cost(r: ProblemRun, t) -> None:
    """The long-run rule (tile steps, arithmetic, a random mask's tile tests) and, numeric, the memory check."""
    p, heads = r.p, r.p.B * r.p.H_q
    Tq, Tk = -(-p.N_q // t.B), -(-p.N_k // t.B)
    steps = heads * (Tq * Tk * (-(-p.d_qk // t.B) + -(-p.d_v // t.B)) + p.N_q)  # the products' tile steps, rows
    if r.count_only:
        seconds = estimate.count_only_seconds(steps)
    else:
        seconds = estimate.numeric_seconds(1, 1, steps, False) + estimate.NUMERIC_N2D * heads * p.N_q * p.N_k * (
            p.d_qk + p.d_v
        )
    if r.tmask is not None and r.name == "square-tiling":  # each tile tested in both phases and by the closed form
        draws = (2 * heads + 1) * Tq * Tk * r.tmask.tile_tests(t.B, t.B)
        seconds += _priced_tile_tests(r.tmask, p, draws, r.allow_long, "a larger B")
    estimate.check(seconds, f"a run of {r.name} over {p}", allow_long=r.allow_long, parameter="problem", value=str(p))
    if not r.count_only:
        words = 3 * p.N_q * p.N_k + 3 * heads * (p.N_q + p.N_k) * (p.d_qk + p.d_v)
        if words * 8 > 0.8 * estimate.available_bytes():
            raise InputError("count_only", f"must be True for this problem ({words * 8 / 2**30:.1f} GiB)", False)


def _one_head_forward(r: ProblemRun, mem: TwoLevelMemory, t) -> tuple:
    """Every head's forward on ``mem``, one after another (query head h reads key/value head h // g): (Q, K, V,
    outputs), the inputs None in count-only mode."""
    from iosim.algorithms import square_tiling, standard

    p, heads = r.p, r.p.B * r.p.H_q
    forward = standard.standard_forward if r.name == "standard" else square_tiling.square_tiling_forward
    mask = p.causal if r.tmask is None else r.tmask
    kw = dict(N=p.N_q, d=p.d_qk, B=t.B, scale=r.scale, causal=mask, dtype=r.np_dtype, N_k=p.N_k, d_v=p.d_v)
    if r.count_only:
        for _ in range(heads):  # every head is simulated (its counts add to the same arrays' tallies)
            forward(mem, None, None, None, **kw)
        outputs = {"O": None} if r.name == "standard" else {"O": None, "L": None}
        return None, None, None, outputs
    Q, K, V = r.inputs()[:3]
    O = np.empty((heads * p.N_q, p.d_v), dtype=r.np_dtype)
    L = np.empty(heads * p.N_q, dtype=r.np_dtype) if r.name == "square-tiling" else None
    for b in range(p.B):
        for h in range(p.H_q):
            q = (b * p.H_q + h) * p.N_q
            k = (b * p.H_kv + h // p.g) * p.N_k
            out = forward(mem, Q[q : q + p.N_q], K[k : k + p.N_k], V[k : k + p.N_k], **kw)
            O[q : q + p.N_q] = out[0]
            if L is not None:
                L[q : q + p.N_q] = out[1]
    return Q, K, V, ({"O": O} if r.name == "standard" else {"O": O, "L": L})

"""A run over a whole problem (:class:`iosim.problem.Problem`): batch, heads, GQA, N_q != N_k, split-KV, paged KV,
MLA. :func:`iosim.api.run` comes here when the problem is more than one head of the seed papers."""

from __future__ import annotations

import numpy as np

from iosim import estimate
from iosim.errors import InputError
from iosim.inputs import problem_arrays
from iosim.memory_model import Stats, TwoLevelMemory
from iosim.problem import Problem
from iosim.references import all_finite, logsumexp_error, problem_reference, problem_reference_backward
from iosim.results import PassResult, Result
from iosim.theory.tiling import Tiling
from iosim.validate import MAX_D, MAX_N, dtype_arg, estimated_steps, flag, positive_int, scale_arg, seed_arg

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
    logical order, or the caller's (``user``: :func:`iosim.inputs.problem_arrays`), and the paged storage: (Q, K,
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
    """The caller's (Q, K, V, dO) over ``p``, checked and flattened (:func:`iosim.inputs.problem_arrays`), or None
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
    if tmask.packed_rows:  # one group's packed rows under masks of their own (iosim.head_masks.packed_mask)
        from iosim.problem import SeenTotals

        return SeenTotals(*(int(x) for x in seen_counts(*tmask.args[:3], tmask.packed_rows, 0, p.N_k)))
    return tuple(int(x) for x in seen_counts(*tmask.args[:3], p.N_q, p.N_k - p.N_q, p.N_k))


def problem_seen(p: Problem, mask, allow_long: bool = False) -> tuple[int, int] | None:
    """:func:`_seen` of a ``mask`` argument (a ``--mask`` string, a Mask, an array or None) over problem ``p``: what
    its compulsory traffic reads (:meth:`iosim.problem.Problem.compulsory`). A random mask is tested element by
    element over the queries' N_q rows: that time is estimated first, under the long-run rule."""
    if mask is None or (isinstance(mask, str) and mask in ("none", "dense")):
        return _seen(p, None)
    from iosim import head_masks
    from iosim.algorithms.tile_masks import DENSE
    from iosim.masks import compile_mask

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
    from iosim.masks import compile_mask

    if p.N_q > p.N_k:
        raise InputError(
            "mask",
            f"over a problem needs N_q <= N_k (the queries are the last N_q of the N_k positions the mask covers); "
            f"N_q = {p.N_q:,}, N_k = {p.N_k:,}",
            mask if isinstance(mask, str) else type(mask).__name__,
        )
    from iosim.head_masks import one_mask

    mask = one_mask(p, mask, allow_long)
    tm = compile_mask(mask, p.N_k, p.causal, "skip" if policy is None else policy, allow_long=allow_long)
    return None if tm.kind == DENSE else tm


def run_problem(algo, p: Problem, M: int, gqa, splits, mla, Br, Bc, B, one_head, **o) -> Result:
    """:func:`iosim.api.run` over a whole problem (flash1, flash2: :mod:`iosim.algorithms.flash`; standard and
    square tiling head by head). ``one_head`` is :func:`iosim.api.run` itself, which a backward run head by head
    calls for each head."""
    from iosim.algorithms import flash
    from iosim.masks import check_policy, compile_mask
    from iosim.theory import io_model
    from iosim.theory.tiling import problem_tiling

    check_policy(o["kv_policy"], None)  # checked with or without a mask (None: skip over a problem)
    masked = not (o["mask"] is None or (isinstance(o["mask"], str) and o["mask"] in ("none", "dense")))
    backward = flag("backward", o["backward"])
    if masked:  # a mask that differs per (b, h): each part of the problem under its own (iosim.head_masks)
        from iosim import head_masks

        one, grid = head_masks.resolve(p, o["mask"], o["allow_long"] is True)
        if grid is not None:
            return _run_mask_parts(algo, p, M, gqa, splits, mla, Br, Bc, B, o, one_head, grid)
        o = {**o, "mask": one}
    if algo.name not in PROBLEM_ALGORITHMS and backward:
        return run_by_heads(algo, p, M, gqa, splits, mla, Br, Bc, B, masked, o, one_head)
    splits, mla = _problem_schedule(algo, p, gqa, splits, mla, B, o.get("pages", "pieces"))
    gather = o.get("pages") == "gather"
    tmask = problem_mask(p, o["mask"], o["kv_policy"], o["allow_long"] is True) if masked else None
    if not masked and p.causal and o["kv_policy"] == "paper":  # the causal field under the policy asked for
        tmask = compile_mask(None, p.N_k, True, "paper")
    if backward:
        _problem_backward_check(algo, p, splits)
    trace = flag("trace", o["trace"])
    user = _user_arrays(p, o, backward)
    count_only, strict = flag("count_only", o["count_only"]), flag("strict", o["strict"])
    reference, allow_long = flag("reference", o["reference"]), flag("allow_long", o["allow_long"])
    dtype = dtype_arg(o["dtype"])
    seed = None if user is not None else seed_arg(o["seed"])
    scale = scale_arg(o["scale"], p.d_qk)
    Br = None if Br is None else positive_int("Br", Br, MAX_N)
    Bc = None if Bc is None else positive_int("Bc", Bc, MAX_N)
    if algo.name in ONE_HEAD_ALGORITHMS:
        return _run_one_head_problem(
            algo,
            p,
            M,
            B,
            count_only,
            strict,
            reference,
            dtype,
            seed,
            scale,
            o["tiling"],
            allow_long,
            tmask,
            trace,
            user,
        )
    if B is not None:
        raise InputError("B", f"applies to standard and square-tiling; {algo.name} takes Br and Bc", B)
    G = p.g if gqa == "per-head" else 1
    rows = p.N_q * (p.g // G)
    shared = p.latent and mla == "shared"
    t = problem_tiling(algo.name, p, M, o["tiling"], rows, shared, Br, Bc)
    bm = combine_rows(p, splits, M)
    groups = p.B * p.H_kv * G
    steps = groups * -(-rows // t.Br) * (-(-p.N_k // t.Bc) + p.pages + splits)
    passes_n = 3 if backward else 1  # a random mask's tests: the backward about twice the forward's
    steps_b = 0
    if backward:  # the backward's own tiles (smaller than the forward's, so more of them)
        from iosim.theory.tiling import problem_backward_tiling

        tb = problem_backward_tiling(p, M, o["tiling"], rows, Br, Bc, algo.name)
        steps_b = groups * -(-rows // tb.Br) * -(-p.N_k // tb.Bc)
    # a random mask: every tile of every group is tested by the run, and once more by the closed form's summary
    draws = (groups + 1) * -(-rows // t.Br) * -(-p.N_k // t.Bc) * (tmask.tile_tests(t.Br, t.Bc) if tmask else 0)
    # one head of N_q x N_k per group: the numeric estimate's arithmetic is per head (N_q N_k d), times the heads
    if count_only:
        seconds = estimate.count_only_seconds(steps + estimate.COUNT_BACKWARD * steps_b)
    else:
        flops = estimate.NUMERIC_N2D * p.B * p.H_q * p.N_q * p.N_k * (p.d_qk + p.d_v)
        seconds = (steps + steps_b) * estimate.NUMERIC_STEP + flops * (
            1 + (estimate.NUMERIC_BACKWARD if backward else 0)
        )
    seconds += _priced_tile_tests(tmask, p, draws * passes_n, allow_long, "larger blocks")
    estimate.check(seconds, f"a run of {algo.name} over {p}", allow_long=allow_long, parameter="problem", value=str(p))
    if not count_only:
        words = (p.B * p.H_q * p.N_q * (p.d_qk + (splits + 1) * p.d_v)) + 3 * p.B * p.H_kv * p.N_k * (p.d_qk + p.d_v)
        if backward:  # dO, dQ, D and the reference's; dK, dV and the expanded partials
            words += 3 * p.B * p.H_q * (p.N_q + p.N_k) * (p.d_qk + p.d_v)
        if words * 8 > 0.8 * estimate.available_bytes():
            raise InputError(
                "count_only", f"must be True for this problem ({words * 8 / 2**30:.1f} GiB of arrays)", False
            )
    np_dtype = np.dtype(dtype)
    mem = TwoLevelMemory(M, strict=strict, trace=trace and not backward, fast=count_only and not trace)
    schedule = {
        "gqa": gqa,
        "splits": splits,
        "mla": mla if p.latent else None,
        "combine_rows": bm if splits > 1 else None,
        "pages": o.get("pages", "pieces") if p.page_size and algo.name == "flash1" else None,
    }
    errors: dict[str, float] = {}
    if count_only:
        Q = K = V = Ks = Vs = table = None
    else:
        Q, K, V, Ks, Vs, table = _problem_inputs(p, np.random.default_rng(seed), user)
    data = [None if x is None else np.ascontiguousarray(x, dtype=np_dtype) for x in (Q, Ks, Vs)]
    if algo.name == "flash2":
        apart = splits > 1 and o.get("combine") == "apart"  # a part of a problem whose combine runs over the whole
        O, L = flash.flash2_problem(
            mem, p, *data, table, Br=t.Br, Bc=t.Bc, gqa=gqa, splits=splits, mla=mla, combine_rows=bm, scale=scale,
            dtype=np_dtype, mask=tmask, combine_mem=TwoLevelMemory(M, fast=count_only) if apart else None,
        )  # fmt: skip
        outputs = {"O": O, "L": L}
        predicted = io_model.flash2_problem(p, t.Br, t.Bc, gqa, splits, mla, None if apart else bm, tmask)
    else:
        O, l_, m = flash.flash1_problem(
            mem, p, *data, table, Br=t.Br, Bc=t.Bc, gqa=gqa, mla=mla, scale=scale, dtype=np_dtype, mask=tmask,
            gather=gather,
        )  # fmt: skip
        with np.errstate(divide="ignore"):
            L = None if m is None else m + np.log(l_)
        outputs = {"O": O, "l": l_, "m": m, "L": L}
        predicted = io_model.flash1_problem(p, t.Br, t.Bc, gqa, mla, tmask, gather=gather)
    schedule["thread_blocks"] = predicted.thread_blocks
    if not count_only and reference:
        O_ref, L_ref = problem_reference(p, Q, K, V, scale, tmask)
        errors["O"] = float(np.max(np.abs(outputs["O"] - O_ref)))
        errors["L"] = logsumexp_error(outputs["L"], L_ref)
    seen = _seen(p, tmask)
    lb = float(sum(p.compulsory(seen).values()))
    fwd = PassResult(
        "forward", mem.stats(), predicted, lb, "compulsory (read Q, K/V once per KV head, write O)", errors, t,
        count_only or all_finite(outputs, ("O", "L")),
    )  # fmt: skip
    passes = {"forward": fwd}
    if backward:
        passes["backward"], bwd_trace = _problem_backward_pass(
            algo.name, p, M, gqa, rows, o["tiling"], Br, Bc, strict, count_only, reference, np_dtype, seed, scale,
            outputs, (Q, K, V), schedule, trace, tmask, seen, user,
        )  # fmt: skip
    return Result(
        algo.name, p.N_q, p.d_qk, M, p.causal, count_only, dtype, passes["backward"].tiling if backward else t,
        passes, outputs, seed, scale,
        bwd_trace if backward else mem.trace(), tmask.label if tmask else "causal" if p.causal else "none",
        tmask.policy if tmask else (o["kv_policy"] or "skip"), p, schedule, seen,
    )  # fmt: skip


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
            from iosim.masks import compile_mask

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
    same): the problem cut into parts within which it is the same (:mod:`iosim.head_masks`), each part run as its
    own problem under its mask on the inputs of the whole (drawn from ``seed`` as the whole problem's are, or the
    caller's), every pass's counts and closed form the parts' sums and the peak the largest part's; per-query-head
    parts of a group of g > 1 write dK, dV as the group's partials and the group sum follows
    (:func:`_gqa_reduction`); packed GQA runs a group's heads as one part under its packed rows' own mask. The
    floor reads each row that sees a key once and each key/value head's keys its group sees
    (:func:`iosim.head_masks.seen_totals`)."""
    from dataclasses import replace

    from iosim import head_masks
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


def _problem_backward_pass(name: str, p: Problem, M, gqa, rows, rule, Br, Bc, strict, count_only, reference, np_dtype,
                           seed, scale, outputs, inputs, schedule, trace=False, mask=None,
                           seen=None, user=None) -> tuple:  # fmt: skip
    """The flash2 (flash1) backward over a problem on a fresh memory of M words, reading the forward's O and L (O,
    l and m); dO is drawn from ``seed`` after Q, K, V. Fills ``outputs`` with dQ, dK, dV.
    Returns the pass and its trace (the run's trace, as for one head)."""
    from iosim.algorithms import flash
    from iosim.theory import io_model
    from iosim.theory.tiling import problem_backward_tiling

    t = problem_backward_tiling(p, M, rule, rows, Br, Bc, name)
    predict = io_model.flash1_backward_problem if name == "flash1" else io_model.flash2_backward_problem
    predicted = predict(p, t.Br, t.Bc, gqa, mask)
    if (Br is not None or Bc is not None) and strict and predicted.peak > M:
        raise InputError(
            "Br, Bc", f"give a backward working set of {predicted.peak:,} words above M = {M:,}: choose smaller tiles",
            (Br, Bc),
        )  # fmt: skip
    mem = TwoLevelMemory(M, strict=strict, trace=trace, fast=count_only and not trace)
    Rtot = p.B * p.H_q * p.N_q
    errors: dict[str, float] = {}
    if count_only:
        dO = None
        data = (None,) * (7 if name == "flash1" else 6)
    else:
        rng = np.random.default_rng(seed)
        _problem_inputs(p, rng, user)  # the same draws as the forward's, then dO
        dO = _problem_dO(rng, (Rtot, p.d_v), user)
        stats = (outputs["l"], outputs["m"]) if name == "flash1" else (outputs["L"],)
        data = (*inputs, outputs["O"], dO, *stats)
    run_backward = flash.flash1_backward_problem if name == "flash1" else flash.flash2_backward_problem
    dQ, dK, dV = run_backward(mem, p, *data, Br=t.Br, Bc=t.Bc, gqa=gqa, scale=scale, dtype=np_dtype, mask=mask)
    outputs.update(dQ=dQ, dK=dK, dV=dV)
    schedule["backward_thread_blocks"] = predicted.thread_blocks
    if not count_only and reference:
        refs = problem_reference_backward(p, *inputs, dO, scale, mask)
        for name, x, ref in zip(("dQ", "dK", "dV"), (dQ, dK, dV), refs, strict=True):
            errors[name] = float(np.max(np.abs(x - ref)))
    result = PassResult(
        "backward", mem.stats(), predicted, float(sum(p.compulsory_backward(seen).values())), BACKWARD_FLOOR, errors, t,
        count_only or all_finite(outputs, ("dQ", "dK", "dV")),
    )  # fmt: skip
    return result, mem.trace()


def _run_one_head_problem(
    algo,
    p: Problem,
    M,
    B,
    count_only,
    strict,
    reference,
    dtype,
    seed,
    scale,
    rule,
    allow_long,
    tmask=None,
    trace=False,
    user=None,
) -> Result:
    """Standard attention (Algorithm 0) or square tiling over a problem: each of the B H_q query heads in turn, its
    own schedule of N_q rows against its key/value head's N_k keys (GQA ``per-head``), widths d_qk and d_v; causal
    bottom-right, or the TileMask ``tmask`` over the whole N_k x N_k sequence with the queries its last N_q rows
    (:func:`problem_mask`). Exact counts: :func:`iosim.theory.io_model.standard_forward` with N_k and d_v (the
    dense baseline computes every tile whatever the mask) or :func:`iosim.theory.io_model.square_tiling_problem`
    for one head, times the heads (:func:`iosim.theory.io_model.heads_problem`)."""
    from iosim.algorithms import square_tiling, standard
    from iosim.theory import io_model
    from iosim.theory.tiling import saha_ye_problem_tiling
    from iosim.theory.tiling import square_tiling as standard_tiling

    if algo.name == "standard":
        t = standard_tiling("standard", p.N_q, p.d_qk, M, rule, p.N_k, p.d_v)
    else:
        t = saha_ye_problem_tiling(p, M, rule)
    if B is not None:
        t = Tiling("explicit", B=positive_int("B", B, MAX_N))
    if algo.name == "standard":
        one = io_model.standard_forward(p.N_q, p.d_qk, M, t.B, p.causal, p.N_k, p.d_v)
    else:
        one = io_model.square_tiling_problem(p, t.B, tmask)
    heads = p.B * p.H_q
    if trace and heads > 1:  # each head's schedule addresses its own rows from 0: one trace would overlay them
        raise InputError(
            "trace",
            f"is recorded for {algo.name} over one head (B = H_q = 1; it runs B H_q = {heads} heads one after "
            "another): trace one head, or flash1 / flash2 over the whole problem",
            True,
        )
    predicted = io_model.heads_problem(one, heads)
    if B is not None and strict and predicted.peak > M:
        raise InputError("B", f"gives a working set of {predicted.peak:,} words above M = {M:,}: choose a smaller B", B)
    Tq, Tk = -(-p.N_q // t.B), -(-p.N_k // t.B)
    steps = heads * (Tq * Tk * (-(-p.d_qk // t.B) + -(-p.d_v // t.B)) + p.N_q)  # the products' tile steps, rows
    if count_only:
        seconds = estimate.count_only_seconds(steps)
    else:
        seconds = estimate.numeric_seconds(1, 1, steps, False) + estimate.NUMERIC_N2D * heads * p.N_q * p.N_k * (
            p.d_qk + p.d_v
        )
    if tmask is not None and algo.name == "square-tiling":  # each tile tested in both phases and by the closed form
        draws = (2 * heads + 1) * Tq * Tk * tmask.tile_tests(t.B, t.B)
        seconds += _priced_tile_tests(tmask, p, draws, allow_long, "a larger B")
    estimate.check(seconds, f"a run of {algo.name} over {p}", allow_long=allow_long, parameter="problem", value=str(p))
    if not count_only:
        words = 3 * p.N_q * p.N_k + 3 * heads * (p.N_q + p.N_k) * (p.d_qk + p.d_v)
        if words * 8 > 0.8 * estimate.available_bytes():
            raise InputError("count_only", f"must be True for this problem ({words * 8 / 2**30:.1f} GiB)", False)
    mem = TwoLevelMemory(M, strict=strict, trace=trace, fast=count_only and not trace)
    np_dtype = np.dtype(dtype)
    mask = p.causal if tmask is None else tmask
    kw = dict(N=p.N_q, d=p.d_qk, B=t.B, scale=scale, causal=mask, dtype=np_dtype, N_k=p.N_k, d_v=p.d_v)
    if count_only:
        Q = K = V = O = L = None
        for _ in range(heads):  # every head is simulated (its counts add to the same arrays' tallies)
            if algo.name == "standard":
                standard.standard_forward(mem, None, None, None, **kw)
            else:
                square_tiling.square_tiling_forward(mem, None, None, None, **kw)
    else:
        Q, K, V, _, _, _ = _problem_inputs(p, np.random.default_rng(seed), user)
        O = np.empty((heads * p.N_q, p.d_v), dtype=np_dtype)
        L = np.empty(heads * p.N_q, dtype=np_dtype) if algo.name == "square-tiling" else None
        for b in range(p.B):
            for h in range(p.H_q):  # query head h reads key/value head h // g (GQA per-head)
                q = (b * p.H_q + h) * p.N_q
                k = (b * p.H_kv + h // p.g) * p.N_k
                args = (Q[q : q + p.N_q], K[k : k + p.N_k], V[k : k + p.N_k])
                if algo.name == "standard":
                    O[q : q + p.N_q] = standard.standard_forward(mem, *args, **kw)[0]
                else:
                    O[q : q + p.N_q], L[q : q + p.N_q], _ = square_tiling.square_tiling_forward(mem, *args, **kw)
    outputs = {"O": O} if algo.name == "standard" else {"O": O, "L": L}
    errors: dict[str, float] = {}
    if not count_only and reference:
        O_ref, L_ref = problem_reference(p, Q, K, V, scale, tmask)
        errors["O"] = float(np.max(np.abs(O - O_ref)))
        if "L" in outputs:
            errors["L"] = logsumexp_error(outputs["L"], L_ref)
    seen = _seen(p, tmask)
    fwd = PassResult(
        "forward", mem.stats(), predicted, float(sum(p.compulsory(seen).values())),
        "compulsory (read Q, K/V once per KV head, write O)", errors, t, count_only or all_finite({"O": O}, ("O",)),
    )  # fmt: skip
    return Result(
        algo.name, p.N_q, p.d_qk, M, p.causal, count_only, dtype, t, {"forward": fwd}, outputs, seed, scale,
        mem.trace(), tmask.label if tmask else "causal" if p.causal else "none", tmask.policy if tmask else "paper", p,
        {"gqa": "per-head", "splits": 1, "mla": None, "thread_blocks": None} if heads > 1 else {"thread_blocks": None},
        seen,
    )  # fmt: skip

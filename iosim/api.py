"""The front door: :func:`run` one algorithm under the memory model and get counts, bounds and errors."""

from __future__ import annotations

import functools
import inspect
import warnings

import numpy as np

from iosim import registry
from iosim.algorithms.reference import attention_backward, attention_forward
from iosim.errors import InputError
from iosim.inputs import check_arrays, check_dO, problem_arrays
from iosim.memory_model import TraceTooLargeError, TwoLevelMemory
from iosim.problem import Problem
from iosim.problem_runs import combine_rows, explicit_tiling, is_plain, problem_arg, problem_seen, run_problem
from iosim.references import all_finite, logsumexp_error, problem_reference, problem_reference_backward
from iosim.results import PassResult, Result
from iosim.schedule import Schedule, explicit_tiles, from_objects
from iosim.theory import bounds
from iosim.theory.tiling import RULES
from iosim.validate import (
    DTYPES,
    MAX_D,
    MAX_M,
    MAX_N,
    MAX_SEED,
    OutOfMemory,
    check_memory,
    check_time,
    dtype_arg,
    flag,
    positive_int,
    scale_arg,
    seed_arg,
)

# Re-exported: the names other modules and users reach through iosim.api (sizes, the problem helpers).
__all__ = [
    "DTYPES", "MAX_D", "MAX_M", "MAX_N", "MAX_SEED", "PassResult", "Result", "algorithm_names", "combine_rows",
    "problem_reference", "problem_reference_backward", "problem_seen", "run",
]  # fmt: skip


def algorithm_names() -> list[str]:
    """The names of the registered algorithms."""
    return registry.algorithms()


def _trace_memory_is_input(fn):
    """A trace too large for the memory available (:class:`iosim.memory_model.TraceTooLargeError`, raised before its
    buffer is allocated) is the caller's choice of size: an InputError on ``trace``."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TraceTooLargeError as e:
            raise InputError("trace", str(e), True) from None

    return wrapper


def _three_objects(fn):
    """``run``'s keywords as the three objects: the :class:`Schedule` they stand for is built (and so checked) once,
    before any work, and stamped on the result with the problem and the memory (``result.spec``, the JSON's
    provenance); ``run(problem, schedule, M)`` is the same run from the objects themselves."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as e:  # a missing or unknown keyword: one line, as every other mistake
            raise InputError("run", f"takes (algorithm, *, M, ...) or (problem, schedule, M): {e}") from None
        a = bound.arguments
        algorithm = a.get("algorithm")
        if isinstance(algorithm, Problem):
            numerics = {k: v for k, v in a.items() if k not in ("algorithm", "schedule", "M")}
            return _run_objects(algorithm, a.get("schedule"), a.get("M"), numerics, fn)
        if a.get("schedule") is not None:
            raise InputError("schedule", "is given with a problem as the first argument: run(problem, schedule, M)")
        if a.get("M") is None:
            raise InputError("M", "must be given: the fast memory's size in words")
        d = {k: a.get(k, v.default) for k, v in signature.parameters.items()}
        spec = Schedule(algorithm, **{k: d[k] for k in Schedule.__dataclass_fields__ if k != "algorithm"})
        result = fn(*args, **kwargs)
        result.spec = spec
        return result

    return wrapper


def _run_objects(problem: Problem, schedule, M, numerics: dict, fn) -> Result:
    """``run(problem, schedule, M, **numerics)``: the schedule over the problem; the keywords left are the numerics
    (dtype, seed, scale, count_only, reference, trace, ...)."""
    schedule, options = from_objects(problem, schedule, numerics)
    result = fn(schedule.algorithm, M=M, **options)
    result.spec = schedule
    return result


@_three_objects
@_trace_memory_is_input
def run(
    algorithm: str | Problem,
    schedule: Schedule | str | None = None,
    M: int | None = None,
    *,
    N: int | None = None,
    d: int | None = None,
    Q=None,
    K=None,
    V=None,
    dO=None,
    backward: bool = False,
    causal: bool = False,
    count_only: bool = False,
    tiling: str = "fit",
    dtype: str = "float64",
    seed: int = 0,
    scale: float | None = None,
    strict: bool = True,
    trace: bool = False,
    reference: bool = True,
    allow_long: bool = False,
    mask=None,
    kv_policy: str | None = None,
    problem: Problem | None = None,
    gqa: str = "per-head",
    splits: int = 1,
    mla: str = "shared",
    Br: int | None = None,
    Bc: int | None = None,
    B: int | None = None,
) -> Result:
    """Run ``algorithm`` under a fast memory of ``M`` words and return counts, prediction, bounds and errors.

    Inputs are either the caller's Q, K, V (N x d each; then N and d come from them) or random standard-normal
    arrays of size N x d drawn from ``seed``. ``count_only`` runs the same schedule without arithmetic (and without
    allocating N x d data), so it scales to N = 2^20. ``strict=False`` records a capacity overflow instead of
    raising :class:`iosim.memory_model.CapacityError`.

    ``backward=True`` runs the forward (on its own memory of M words), then the backward on a fresh memory of M
    words, reading the forward's outputs (O and l, m or L, or P) as the paper's backward does. ``dO`` is the upstream
    gradient (N x d; drawn from ``seed`` after Q, K, V when not given). ``passes`` holds both passes' counts;
    ``errors`` are then those of dQ, dK, dV against :func:`iosim.algorithms.reference.attention_backward`.

    ``trace=True`` records every load, store, alloc, free and initialisation of the requested pass
    (``result.trace``; :meth:`iosim.memory_model.Trace.replay` reproduces the counts). ``reference=False`` skips the
    float64 reference (no ``errors``). A run (count-only, or numeric with its reference) estimated at over a minute
    needs ``allow_long=True``; over an hour, or a numeric run whose arrays would not fit in memory, is refused up
    front (:class:`InputError`; the rule and its costs: :mod:`iosim.estimate`).
    Outputs that are not finite (finite inputs whose scores overflow) give a warning and ``result.finite`` False.

    ``mask`` (an :mod:`iosim.masks` pattern, a ``--mask`` string such as ``"window:128"``, or an N x N boolean array)
    masks the scores; ``causal=True`` is the causal mask. Built-in algorithms skip the tiles the mask empties;
    ``kv_policy`` ("paper" or "skip") decides whether the outer-loop operands (K_j, V_j; Q_i for flash2's forward)
    of a block whose tiles are all empty are loaded (FlashAttention Algorithm 5) or not (its CUDA kernel); None is
    paper for one head and skip over a problem (flash1, flash2), whose schedules skip as the kernels do.

    ``problem`` (an :class:`iosim.problem.Problem`: batch, query and key/value heads, N_q, N_k, d_qk, d_v, causal
    bottom-right, MLA latent, page size, dtypes) replaces N and d; ``gqa`` ("per-head" or "packed"), ``splits``
    (split-KV, flash2) and ``mla`` ("shared" or "naive", a latent problem) choose the schedule over it
    (:mod:`iosim.algorithms.decoding`). A one-head problem with N_q = N_k and the default schedule runs the
    algorithms above unchanged. ``Br``, ``Bc`` (flash1, flash2) and ``B`` (standard, square-tiling) fix the tiles
    instead of the tiling rule; their working set must fit in M.
    """
    algo = registry.get(algorithm)
    M = positive_int("M", M, MAX_M)
    if problem is not None or gqa != "per-head" or splits != 1 or mla != "shared":
        problem = problem_arg(problem, N, d, causal, Q, dtype)
        if not is_plain(problem, gqa, splits, mla):
            opts = dict(backward=backward, count_only=count_only, tiling=tiling, dtype=dtype, seed=seed, scale=scale)
            opts.update(strict=strict, trace=trace, reference=reference, allow_long=allow_long, mask=mask)
            opts.update(kv_policy=kv_policy, arrays=(Q, K, V, dO))
            return run_problem(algo, problem, M, gqa, splits, mla, Br, Bc, B, run, **opts)
        N, d, causal = problem.N_q, problem.d_qk, problem.causal
        if Q is not None or K is not None or V is not None:  # one head's arrays, given as (B, H, N, d) or (N, d)
            Q, K, V, dO = problem_arrays(problem, Q, K, V, dO)
    explicit = explicit_tiles(algo, Br, Bc, B)
    backward, causal, count_only = flag("backward", backward), flag("causal", causal), flag("count_only", count_only)
    strict, trace, reference = flag("strict", strict), flag("trace", trace), flag("reference", reference)
    allow_long = flag("allow_long", allow_long)
    if not isinstance(tiling, str) or tiling not in RULES:
        raise InputError("tiling", f"must be one of {', '.join(RULES)}", tiling)
    dtype = dtype_arg(dtype)
    if backward:
        if not algo.has_backward:
            have = [name for name, a in registry.REGISTRY.items() if a.has_backward]
            raise InputError(
                "backward", f"is not implemented for {algorithm}; algorithms with one: {', '.join(have)}", backward
            )
    elif dO is not None:
        raise InputError("dO", "is only used with backward=True", "an array")
    given = Q is not None or K is not None or V is not None
    seed = None if given else seed_arg(seed)
    if given:
        if count_only:
            raise InputError("count_only", "cannot be combined with given Q, K, V (count-only runs have no data)")
        Q, K, V, N, d = check_arrays(Q, K, V, N, d)
    else:
        if N is None or d is None:
            raise InputError("N and d", "must be given when Q, K, V are not")
        N, d = positive_int("N", N, MAX_N), positive_int("d", d, MAX_D)
    scale = scale_arg(scale, d)
    from iosim.masks import compile_mask

    tmask = compile_mask(mask, N, causal, kv_policy)
    causal = tmask.is_causal
    masked = not causal and tmask.label != "none"
    if masked and not algo.builtin:
        raise InputError("mask", f"is only supported by the built-in algorithms, not by {algorithm}", tmask.label)
    # what the algorithm receives in its ``causal`` argument: the compiled mask (built-in), the flag (user's)
    causal_arg = tmask if algo.builtin else causal

    t = algo.choose_tiling(N, d, M, tiling)
    t_bwd = algo.backward_tiling(N, d, M, tiling) if backward else None  # before any work: a too-small M fails fast
    if explicit:
        t, t_bwd = explicit_tiling(algo, explicit, t, t_bwd, N, d, M, causal_arg, strict)
    np_dtype = np.dtype(dtype)
    if count_only:
        check_time(t_bwd or t, N, d, backward, allow_long, tmask if masked else None)
    else:
        check_memory(algo, N, d, backward, reference, np_dtype.itemsize)
        check_time(t_bwd or t, N, d, backward, allow_long, tmask if masked else None, count_only=False)
        rng = np.random.default_rng(seed)
        if not given:
            Q, K, V = (rng.standard_normal((N, d)) for _ in range(3))
        if dO is not None:
            dO = check_dO(dO, N, d)
        elif backward:
            dO = rng.standard_normal((N, d))
    if dO is not None and count_only:
        raise InputError("dO", "cannot be combined with count_only=True (count-only runs have no data)")

    # A count-only run of a built-in algorithm uses the counters-only memory (its loop nest is checked against the
    # tile table by the test suite); a traced run and every user-registered algorithm keep the tile table.
    fast = count_only and algo.builtin and not trace
    mem = TwoLevelMemory(M, strict=strict, trace=trace and not backward, fast=fast)
    data = (None, None, None) if count_only else (Q, K, V)
    with OutOfMemory(algorithm, N, d, "simulated forward"):
        outputs = algo.forward(mem, *data, N, d, t, scale, causal_arg, np_dtype)
    errors: dict[str, float] = {}
    allowed = tmask if masked and not count_only and reference else None  # the reference takes its rows per block
    if not count_only and reference:
        # an overflow shows as result.finite, with one warning below
        with np.errstate(all="ignore"), OutOfMemory(algorithm, N, d, "float64 reference"):
            O_ref, L_ref = attention_forward(Q, K, V, scale=scale, causal=causal, mask=allowed)
        errors["O"] = float(np.max(np.abs(outputs["O"] - O_ref)))
        if outputs.get("L") is not None:
            errors["L"] = logsumexp_error(outputs["L"], L_ref)
    lb, lb_name = bounds.lower_bound(N, d, M, mask=tmask if masked else None, causal=causal)
    fwd = PassResult(
        "forward",
        mem.stats(),
        algo.predict_forward(N, d, M, t, causal_arg),
        lb,
        lb_name,
        errors,
        t,
        count_only or all_finite(outputs, ("O", "L")),
    )
    passes = {"forward": fwd}
    pass_trace = mem.trace()
    if backward:
        # a fresh fast memory: the backward is a separate kernel
        mem_bwd = TwoLevelMemory(M, strict=strict, trace=trace, fast=fast)
        with OutOfMemory(algorithm, N, d, "simulated backward"):
            grads = algo.backward(
                mem_bwd, *data, None if count_only else dO, outputs, N, d, t_bwd, scale, causal_arg, np_dtype
            )
        errors_bwd: dict[str, float] = {}
        if not count_only and reference:
            with np.errstate(all="ignore"), OutOfMemory(algorithm, N, d, "float64 reference"):
                refs = attention_backward(Q, K, V, dO, scale=scale, causal=causal, mask=allowed)
            for name, ref in zip(("dQ", "dK", "dV"), refs, strict=True):
                errors_bwd[name] = float(np.max(np.abs(grads[name] - ref)))
        lb_bwd, lb_bwd_name = bounds.lower_bound(N, d, M, backward=True, mask=tmask if masked else None, causal=causal)
        passes["backward"] = PassResult(
            "backward",
            mem_bwd.stats(),
            algo.predict_backward(N, d, M, t_bwd, causal_arg),
            lb_bwd,
            lb_bwd_name,
            errors_bwd,
            t_bwd,
            count_only or all_finite(grads, ("dQ", "dK", "dV")),
        )
        outputs = {**outputs, **grads}
        pass_trace = mem_bwd.trace()
    result = Result(
        algorithm,
        N,
        d,
        M,
        causal,
        count_only,
        dtype,
        t_bwd or t,
        passes,
        outputs,
        seed,
        scale,
        pass_trace,
        tmask.label,
        tmask.policy,
        problem
        if problem is not None
        else Problem(N=N, d=d, causal=causal, dtype_q="fp64" if dtype == "float64" else "fp32"),
    )
    if not result.finite:
        bad = [name for name, p in passes.items() if not p.finite]
        warnings.warn(
            f"{algorithm}: the {' and '.join(bad)} outputs are not finite (NaN or inf) although the inputs are: the "
            f"scores overflow {dtype} (scale x max|Q K^T| too large); the counts are exact, the outputs are not",
            RuntimeWarning,
            stacklevel=2,
        )
    return result

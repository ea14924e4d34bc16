"""The front door: :func:`run` one algorithm under the memory model and get counts, bounds and errors."""

from __future__ import annotations

import functools
import math
import numbers
import warnings
from dataclasses import dataclass, field

import numpy as np

from iosim import estimate, registry
from iosim.algorithms.reference import attention_backward, attention_forward, default_scale
from iosim.errors import InputError
from iosim.memory_model import Stats, Trace, TraceTooLargeError, TwoLevelMemory
from iosim.problem import GQA_POLICIES, MLA_POLICIES, Problem
from iosim.theory import bounds
from iosim.theory.io_model import Prediction
from iosim.theory.tiling import RULES, Tiling

DTYPES = ("float64", "float32")
# Sizes the counters and the loop indices serve: every count is an int64, and the closed forms are evaluated in
# Python integers, so the limits keep the largest count of any algorithm (standard attention's ~6 N^2 ceil(d/B)
# words) far below 2^63.
MAX_N = 1 << 26
MAX_D = 1 << 16
MAX_M = 1 << 40
MAX_SEED = 1 << 64


@dataclass
class PassResult:
    """Counts, prediction, bound and errors of one pass (forward or backward)."""

    name: str
    stats: Stats
    predicted: Prediction | None
    lower_bound: float
    lower_bound_name: str
    errors: dict[str, float] = field(default_factory=dict)
    tiling: Tiling | None = None  # the blocks this pass ran with (the backward may choose its own)

    finite: bool = True  # every output is finite (False: overflow or NaN from finite inputs; see Result.finite)

    @property
    def exact(self) -> bool | None:
        """Whether the simulated counts equal the closed form, array by array and in peak (None: no closed form,
        as for a user's algorithm registered without one)."""
        if self.predicted is None:
            return None
        return self.stats.per_array == self.predicted.per_array and self.stats.peak == self.predicted.peak

    def as_dict(self) -> dict:
        """This pass's counts, prediction, bound, errors and the composition of fast memory at the peak."""
        p = self.predicted
        return {
            "reads": self.stats.reads,
            "writes": self.stats.writes,
            "total": self.stats.total,
            "init_writes": self.stats.init_writes,
            "peak": self.stats.peak,
            "resident_at_peak": dict(self.stats.at_peak),
            "predicted_total": None if p is None else p.total,
            "predicted_peak": None if p is None else p.peak,
            "exact": self.exact,
            "finite": self.finite,
            "lower_bound": self.lower_bound,
            "lower_bound_name": self.lower_bound_name,
            "tiling": None if self.tiling is None else self.tiling.as_dict(),
            "errors": dict(self.errors),
            "per_array": {k: vars(v) for k, v in self.stats.per_array.items()},
            "predicted_per_array": None if p is None else {k: vars(v) for k, v in p.per_array.items()},
        }


@dataclass
class Result:
    """What :func:`run` returns. ``stats``, ``predicted``, ``lower_bound`` and ``tiling`` are those of the requested
    pass: the backward when ``backward=True`` (its forward is in ``passes["forward"]``)."""

    algorithm: str
    N: int
    d: int
    M: int
    causal: bool
    count_only: bool
    dtype: str
    tiling: Tiling
    passes: dict[str, PassResult]
    outputs: dict[str, np.ndarray | None]
    seed: int | None = None  # None: the caller's arrays
    scale: float = 1.0
    trace: Trace | None = None  # the requested pass's event trace (``trace=True``)
    mask: str = "none"  # the mask's label (``causal`` for the causal flag); see iosim.masks
    kv_policy: str = "paper"  # the empty-block policy (iosim.algorithms.tile_masks.POLICIES)
    problem: Problem | None = None  # what was counted (provenance): B, heads, N_q, N_k, d_qk, d_v, dtypes
    schedule: dict = field(default_factory=dict)  # GQA policy, splits, MLA read, thread blocks (problem runs)
    seen: tuple[int, int] | None = None  # a mask over a problem: (rows that see a key, keys seen), per head

    @property
    def bytes_per_array(self) -> dict[str, int]:
        """Bytes moved per array (reads + writes), each array at its dtype (:meth:`iosim.problem.Problem.bytes_of`)."""
        p = self.problem or Problem(N=self.N, d=self.d)
        return {n: p.bytes_of(n, c.reads + c.writes) for n, c in self.stats.per_array.items()}

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_per_array.values())

    @property
    def finite(self) -> bool:
        """Whether every output of every pass is finite. False means the arithmetic overflowed (finite inputs whose
        scores exceed the dtype's range): the counts are still exact, the outputs are not a clean run."""
        return all(p.finite for p in self.passes.values())

    @property
    def main(self) -> PassResult:
        return self.passes["backward"] if "backward" in self.passes else self.passes["forward"]

    @property
    def stats(self) -> Stats:
        return self.main.stats

    @property
    def predicted(self) -> Prediction:
        return self.main.predicted

    @property
    def lower_bound(self) -> float:
        return self.main.lower_bound

    @property
    def errors(self) -> dict[str, float]:
        return self.main.errors

    @property
    def max_abs_error(self) -> float | None:
        return max(self.errors.values()) if self.errors else None

    @property
    def regime(self) -> str:
        return bounds.regime(self.d, self.M)

    def as_dict(self) -> dict:
        """A JSON-ready summary (what ``iosim run --json`` prints), with its provenance: iosim's version, the seed
        (None for the caller's arrays), scale, dtype, tiling and the predicted per-array counts."""
        from iosim.version import __version__

        main = self.main
        out = {
            "iosim_version": __version__,
            "algorithm": self.algorithm,
            "pass": main.name,
            "N": self.N,
            "d": self.d,
            "M": self.M,
            "causal": self.causal,
            "mask": self.mask,
            "kv_policy": self.kv_policy,
            "count_only": self.count_only,
            "dtype": self.dtype,
            "seed": self.seed,
            "inputs": "given" if self.seed is None else "standard normal from seed",
            "scale": self.scale,
            "regime": self.regime,
            **main.as_dict(),
            "tiling": self.tiling.as_dict(),
            "max_abs_error": self.max_abs_error,
            "finite": self.finite,
        }
        if self.problem is not None:
            out["problem"] = self.problem.as_dict()
            out["schedule"] = dict(self.schedule)
            out["bytes_per_array"] = self.bytes_per_array
            out["total_bytes"] = self.total_bytes
            out["compulsory_words"] = sum(self.problem.compulsory(self.seen).values())
            out["compulsory_bytes"] = self.problem.compulsory_bytes(self.seen)
        if len(self.passes) > 1:
            out["passes"] = {name: p.as_dict() for name, p in self.passes.items()}
            out["total_all_passes"] = sum(p.stats.total for p in self.passes.values())
        return out


def algorithm_names() -> list[str]:
    """The names of the registered algorithms."""
    return registry.algorithms()


def _positive_int(name: str, value, limit: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 < value <= limit:
        raise InputError(name, f"must be an integer from 1 to {limit:,}", value)
    return int(value)


def _flag(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise InputError(name, "must be True or False", value)
    return bool(value)


def _seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < MAX_SEED:
        raise InputError("seed", "must be an integer from 0 to 2^64 - 1", seed)
    return int(seed)


def _scale(scale, d: int) -> float:
    if scale is None:
        return default_scale(d)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale):
        raise InputError("scale", "must be a finite real number (default 1/sqrt(d))", scale)
    return float(scale)


def _dtype(dtype) -> str:
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name if dtype is not None and _is_dtype(dtype) else None
    if name not in DTYPES:
        raise InputError("dtype", f"must be one of {', '.join(DTYPES)}", dtype)
    return name


def _is_dtype(x) -> bool:
    try:
        np.dtype(x)
    except (TypeError, ValueError):
        return False
    return True


def _check_memory(algo, N: int, d: int, backward: bool, reference: bool, itemsize: int) -> None:
    """Refuse up front a numeric run whose arrays would not fit in this machine's memory, naming the sizes."""
    nd = (9 if backward else 5) * N * d  # inputs, dO, outputs and gradients, the forward's outputs
    nn = algo.square_arrays[1 if backward else 0] * N * N  # N x N slow arrays the schedule materialises
    need = (nd + nn) * itemsize + (nd * 8 if reference else 0) + (ref_bytes(N, d, backward) if reference else 0)
    have = estimate.available_bytes()
    if need > 0.8 * have:
        raise InputError(
            "N",
            f"needs about {need / 2**30:.1f} GiB for a numeric run of {algo.name} at N={N:,}, d={d} "
            f"({nn // (N * N) if N else 0} N x N arrays of {itemsize} bytes"
            f"{' and the float64 reference' if reference else ''}); {have / 2**30:.1f} GiB are available: "
            "use count_only=True (--count-only), reference=False (--no-reference) or a smaller N",
            N,
        )


def ref_bytes(N: int, d: int, backward: bool) -> int:
    """Bytes the float64 reference holds at once (its own accounting: row blocks of O(N * block) memory)."""
    from iosim.algorithms.reference import reference_memory

    return int(reference_memory(N, d, backward))


class _OutOfMemory:
    """Turn a MemoryError inside a numeric run into an InputError naming the sizes (never a traceback)."""

    def __init__(self, algorithm: str, N: int, d: int, what: str) -> None:
        self.algorithm, self.N, self.d, self.what = algorithm, N, d, what

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if kind is not None and issubclass(kind, MemoryError):
            raise InputError(
                "N",
                f"ran out of memory in the {self.what} of a numeric run of {self.algorithm} at N={self.N:,}, "
                f"d={self.d} ({error or 'MemoryError'}; {estimate.available_bytes() / 2**30:.1f} GiB available now): "
                "use "
                "count_only=True (--count-only), reference=False (--no-reference) or a smaller N",
                self.N,
            ) from None
        return False


def _estimated_steps(t: Tiling, N: int, d: int, backward: bool, mask=None) -> int:
    """Tile steps of a schedule with tiling ``t``: what a count-only run's time is proportional to. With a mask
    (other than none or causal) the schedule visits only the nonzero tiles (plus one test per block row and
    column): the steps scale by the mask's fraction of nonzero tiles on this tiling."""
    from iosim.theory.io_model import _is_structured_fast, tile_sums

    sparse = mask is not None and not _is_structured_fast(mask)
    if t.Br and t.Bc:
        Tr, Tc = -(-N // t.Br), -(-N // t.Bc)
        steps = tile_sums(N, t.Br, t.Bc, mask).tiles + Tr + Tc if sparse else Tr * Tc
    elif t.B:
        Tn = -(-N // t.B)
        tiles = tile_sums(N, t.B, t.B, mask).tiles if sparse else Tn * Tn
        steps = 3 * tiles * -(-d // t.B) + N
    else:
        steps = N * N
    return steps * (2 if backward else 1)


def _check_time(t: Tiling, N: int, d: int, backward: bool, allow_long: bool, mask=None, count_only=True) -> None:
    """The long-run rule (:mod:`iosim.estimate`) for a count-only or a numeric run (with its reference)."""
    # a random mask is counted by the estimate below, the closed form and the run: that alone may be too long
    counting = estimate.check_mask(mask, passes=3, allow_long=allow_long, tiling=t) if mask is not None else 0.0
    steps = _estimated_steps(t, N, d, backward, mask)
    if count_only:
        seconds, what = estimate.count_only_seconds(steps), f"a count-only run with {t}"
    else:
        seconds, what = estimate.numeric_seconds(N, d, steps, backward), f"a numeric run with {t}"
    seconds += counting
    remedy = "use a larger M or a smaller N" + ("" if count_only else ", or count_only=True (--count-only)")
    estimate.check(seconds, what, allow_long=allow_long, parameter="N", value=N, remedy=remedy)


def _check_arrays(Q, K, V, N, d) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    arrays = {}
    for name, x in (("Q", Q), ("K", K), ("V", V)):
        if x is None:
            raise InputError(name, "must be given together with Q, K and V (or none of them, with N and d)")
        try:
            a = np.asarray(x)
        except (TypeError, ValueError) as e:
            raise InputError(name, "must be a 2-D array of real numbers of shape (N, d)", type(x).__name__) from e
        if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
            raise InputError(name, "must be a non-empty 2-D array of shape (N, d)", f"shape {a.shape}")
        if not np.issubdtype(a.dtype, np.number) or np.iscomplexobj(a) or a.dtype == np.bool_:
            raise InputError(name, "must hold real numbers", f"dtype {a.dtype}")
        if not np.all(np.isfinite(a)):
            raise InputError(name, "must hold only finite values (no NaN or inf)", "non-finite entries")
        arrays[name] = a
    shape = arrays["Q"].shape
    for name in ("K", "V"):
        if arrays[name].shape != shape:
            raise InputError(name, f"must have the shape of Q {shape}", f"shape {arrays[name].shape}")
    if shape[0] > MAX_N or shape[1] > MAX_D:
        raise InputError("Q", f"must have at most {MAX_N:,} rows and {MAX_D:,} columns", f"shape {shape}")
    if N is not None and N != shape[0]:
        raise InputError("N", f"must match the rows of Q ({shape[0]}) when arrays are given", N)
    if d is not None and d != shape[1]:
        raise InputError("d", f"must match the columns of Q ({shape[1]}) when arrays are given", d)
    return arrays["Q"], arrays["K"], arrays["V"], shape[0], shape[1]


def _check_dO(dO, N: int, d: int) -> np.ndarray:
    """The upstream gradient dO: validated like Q, K, V (shape N x d, real, finite)."""
    try:
        a = np.asarray(dO)
    except (TypeError, ValueError) as e:
        raise InputError("dO", "must be a 2-D array of real numbers", type(dO).__name__) from e
    if a.ndim != 2 or a.shape != (N, d):
        raise InputError("dO", f"must be a 2-D array of the shape of Q ({N}, {d})", f"shape {a.shape}")
    if not np.issubdtype(a.dtype, np.number) or np.iscomplexobj(a) or a.dtype == np.bool_:
        raise InputError("dO", "must hold real numbers", f"dtype {a.dtype}")
    if not np.all(np.isfinite(a)):
        raise InputError("dO", "must hold only finite values (no NaN or inf)", "non-finite entries")
    return a


def _logsumexp_error(L, L_ref) -> float:
    """max |L - L_ref|, where a fully masked row's -inf must match exactly (then it counts as 0)."""
    same_inf = np.isneginf(L) & np.isneginf(L_ref)
    with np.errstate(invalid="ignore"):
        return float(np.max(np.where(same_inf, 0.0, np.abs(L - L_ref)), initial=0.0))


def _all_finite(outputs: dict, names) -> bool:
    """Every output finite; L may be -inf (a fully masked row's logsumexp), never NaN or +inf."""

    def ok(name, x):
        return bool(np.all(np.isfinite(x) | (np.isneginf(x) if name == "L" else False)))

    return all(outputs.get(n) is None or ok(n, outputs[n]) for n in names)


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


@_trace_memory_is_input
def run(
    algorithm: str,
    *,
    M: int,
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
    M = _positive_int("M", M, MAX_M)
    if problem is not None or gqa != "per-head" or splits != 1 or mla != "shared":
        problem = _problem_arg(problem, N, d, causal, Q, dtype)
        if not _is_plain(problem, gqa, splits, mla):
            opts = dict(backward=backward, count_only=count_only, tiling=tiling, dtype=dtype, seed=seed, scale=scale)
            opts.update(strict=strict, trace=trace, reference=reference, allow_long=allow_long, mask=mask)
            opts.update(kv_policy=kv_policy, given=Q is not None or K is not None or V is not None or dO is not None)
            return _run_problem(algo, problem, M, gqa, splits, mla, Br, Bc, B, **opts)
        N, d, causal = problem.N_q, problem.d_qk, problem.causal
    explicit = _explicit_tiles(algo, Br, Bc, B)
    backward, causal, count_only = _flag("backward", backward), _flag("causal", causal), _flag("count_only", count_only)
    strict, trace, reference = _flag("strict", strict), _flag("trace", trace), _flag("reference", reference)
    allow_long = _flag("allow_long", allow_long)
    if not isinstance(tiling, str) or tiling not in RULES:
        raise InputError("tiling", f"must be one of {', '.join(RULES)}", tiling)
    dtype = _dtype(dtype)
    if backward:
        if not algo.has_backward:
            have = [name for name, a in registry.REGISTRY.items() if a.has_backward]
            raise InputError(
                "backward", f"is not implemented for {algorithm}; algorithms with one: {', '.join(have)}", backward
            )
    elif dO is not None:
        raise InputError("dO", "is only used with backward=True", "an array")
    given = Q is not None or K is not None or V is not None
    seed = None if given else _seed(seed)
    if given:
        if count_only:
            raise InputError("count_only", "cannot be combined with given Q, K, V (count-only runs have no data)")
        Q, K, V, N, d = _check_arrays(Q, K, V, N, d)
    else:
        if N is None or d is None:
            raise InputError("N and d", "must be given when Q, K, V are not")
        N, d = _positive_int("N", N, MAX_N), _positive_int("d", d, MAX_D)
    scale = _scale(scale, d)
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
        t, t_bwd = _explicit_tiling(algo, explicit, t, t_bwd, N, d, M, causal_arg, strict)
    np_dtype = np.dtype(dtype)
    if count_only:
        _check_time(t_bwd or t, N, d, backward, allow_long, tmask if masked else None)
    else:
        _check_memory(algo, N, d, backward, reference, np_dtype.itemsize)
        _check_time(t_bwd or t, N, d, backward, allow_long, tmask if masked else None, count_only=False)
        rng = np.random.default_rng(seed)
        if not given:
            Q, K, V = (rng.standard_normal((N, d)) for _ in range(3))
        if dO is not None:
            dO = _check_dO(dO, N, d)
        elif backward:
            dO = rng.standard_normal((N, d))
    if dO is not None and count_only:
        raise InputError("dO", "cannot be combined with count_only=True (count-only runs have no data)")

    # A count-only run of a built-in algorithm uses the counters-only memory (its loop nest is checked against the
    # tile table by the test suite); a traced run and every user-registered algorithm keep the tile table.
    fast = count_only and algo.builtin and not trace
    mem = TwoLevelMemory(M, strict=strict, trace=trace and not backward, fast=fast)
    data = (None, None, None) if count_only else (Q, K, V)
    with _OutOfMemory(algorithm, N, d, "simulated forward"):
        outputs = algo.forward(mem, *data, N, d, t, scale, causal_arg, np_dtype)
    errors: dict[str, float] = {}
    allowed = tmask if masked and not count_only and reference else None  # the reference takes its rows per block
    if not count_only and reference:
        # an overflow shows as result.finite, with one warning below
        with np.errstate(all="ignore"), _OutOfMemory(algorithm, N, d, "float64 reference"):
            O_ref, L_ref = attention_forward(Q, K, V, scale=scale, causal=causal, mask=allowed)
        errors["O"] = float(np.max(np.abs(outputs["O"] - O_ref)))
        if outputs.get("L") is not None:
            errors["L"] = _logsumexp_error(outputs["L"], L_ref)
    lb, lb_name = bounds.lower_bound(N, d, M, mask=tmask if masked else None, causal=causal)
    fwd = PassResult(
        "forward",
        mem.stats(),
        algo.predict_forward(N, d, M, t, causal_arg),
        lb,
        lb_name,
        errors,
        t,
        count_only or _all_finite(outputs, ("O", "L")),
    )
    passes = {"forward": fwd}
    pass_trace = mem.trace()
    if backward:
        # a fresh fast memory: the backward is a separate kernel
        mem_bwd = TwoLevelMemory(M, strict=strict, trace=trace, fast=fast)
        with _OutOfMemory(algorithm, N, d, "simulated backward"):
            grads = algo.backward(
                mem_bwd, *data, None if count_only else dO, outputs, N, d, t_bwd, scale, causal_arg, np_dtype
            )
        errors_bwd: dict[str, float] = {}
        if not count_only and reference:
            with np.errstate(all="ignore"), _OutOfMemory(algorithm, N, d, "float64 reference"):
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
            count_only or _all_finite(grads, ("dQ", "dK", "dV")),
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


# ---------------------------------------------------------------------------------------------------------------
# Whole problems (iosim.problem.Problem): batch, heads, GQA, N_q != N_k, split-KV, paged KV, MLA.
# ---------------------------------------------------------------------------------------------------------------
PROBLEM_ALGORITHMS = ("flash1", "flash2")
BACKWARD_FLOOR = "compulsory (read Q, O, dO, L, K/V once per KV head; write dQ, dK, dV)"
ONE_HEAD_ALGORITHMS = ("standard", "square-tiling")  # one head, any N_q, N_k, d_qk, d_v


def _problem_arg(problem, N, d, causal, Q, dtype) -> Problem:
    """The problem of a run: the one given, or the one-head problem of N and d (schedule options without one)."""
    if problem is None:
        if N is None or d is None:
            raise InputError("problem", "or N and d must be given with gqa, splits or mla")
        return Problem(N=_positive_int("N", N, MAX_N), d=_positive_int("d", d, MAX_D), causal=bool(causal))
    if not isinstance(problem, Problem):
        raise InputError("problem", "must be an iosim.Problem", type(problem).__name__)
    if N is not None or d is not None or Q is not None:
        raise InputError("N, d", "must not be given with problem= (the problem holds N_q, N_k, d_qk, d_v)", (N, d))
    if causal:
        raise InputError("causal", "is a field of the problem (Problem(causal=True)) when problem= is given", causal)
    return problem


def _is_plain(p: Problem, gqa: str, splits, mla: str) -> bool:
    """Whether a problem and its schedule are the seed papers' case (one head, N_q = N_k, no split, no latent)."""
    return p.is_single and gqa == "per-head" and splits == 1 and mla == "shared"


def _explicit_tiles(algo, Br, Bc, B) -> dict:
    """The explicit tiles given (validated: positive, and of the algorithm's kind)."""
    given = {k: _positive_int(k, v, MAX_N) for k, v in (("Br", Br), ("Bc", Bc), ("B", B)) if v is not None}
    if not given:
        return given
    square = algo.name in ("standard", "square-tiling")
    if not algo.builtin:
        raise InputError(
            ", ".join(given), f"apply to the built-in algorithms, not to {algo.name}", tuple(given.values())
        )
    if square and ("Br" in given or "Bc" in given):
        raise InputError("Br, Bc", f"apply to flash1 and flash2; {algo.name} takes B (square tiles)", (Br, Bc))
    if not square and "B" in given:
        raise InputError("B", f"applies to standard and square-tiling; {algo.name} takes Br and Bc", B)
    return given


def _explicit_tiling(algo, given: dict, t, t_bwd, N, d, M, causal_arg, strict: bool):
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


def _problem_schedule(algo, p: Problem, gqa, splits, mla, B) -> tuple[int, str]:
    """Validate the schedule options against the algorithm and the problem: (splits, mla)."""
    if gqa not in GQA_POLICIES:
        raise InputError("gqa", f"must be one of {', '.join(GQA_POLICIES)}", gqa)
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
    if mla not in MLA_POLICIES:
        raise InputError("mla", f"must be one of {', '.join(MLA_POLICIES)}", mla)
    if mla == "naive" and not p.latent:
        raise InputError("mla", "naive applies to a latent (MLA) problem: Problem(latent=True)", mla)
    splits = _positive_int("splits", splits, p.N_k) if not isinstance(splits, bool) else splits
    if isinstance(splits, bool):
        raise InputError("splits", f"must be an integer from 1 to N_k = {p.N_k:,}", splits)
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


def _problem_inputs(p: Problem, rng):
    """Standard-normal Q (B H_q N_q x d_qk), K and V (B H_kv N_k rows; the latent: V = K's first d_v columns) in
    logical order, and the paged storage: (Q, K, V, K_stored, V_stored, table)."""
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


class _QueryRows:
    """A mask over the whole sequence (N_k x N_k) as a problem's queries see it: query row q is its row q + offset
    (the reference's ``rows(r0, r1)``)."""

    def __init__(self, mask, offset: int) -> None:
        self.mask, self.offset = mask, offset

    def rows(self, r0: int, r1: int) -> np.ndarray:
        return self.mask.rows(r0 + self.offset, r1 + self.offset)


def problem_reference(p: Problem, Q, K, V, scale: float, mask=None):
    """The float64 reference of a problem, head by head: query head h uses key/value head h // g; causal is
    bottom-right (offset N_k - N_q); ``mask``: a TileMask over N_k x N_k whose last N_q rows are the queries'.
    Returns (O, L) in (b, h_q, r) row order."""
    shape = dict(causal=p.causal, offset=p.offset) if mask is None else dict(mask=_QueryRows(mask, p.offset))
    O = np.empty((Q.shape[0], p.d_v))
    L = np.empty(Q.shape[0])
    for b in range(p.B):
        for h in range(p.H_q):
            q = (b * p.H_q + h) * p.N_q
            k = (b * p.H_kv + h // p.g) * p.N_k
            O[q : q + p.N_q], L[q : q + p.N_q] = attention_forward(
                Q[q : q + p.N_q], K[k : k + p.N_k], V[k : k + p.N_k], scale=scale, **shape
            )
    return O, L


def problem_reference_backward(p: Problem, Q, K, V, dO, scale: float, mask=None):
    """The float64 reference gradients of a problem, head by head (as :func:`problem_reference`): dQ in (b, h_q, r)
    row order; dK, dV in (b, h_kv, c) order, each key/value head's the sum over its g query heads. ``mask``: as
    :func:`problem_reference`, in place of the causal field."""
    shape = dict(causal=p.causal, offset=p.offset) if mask is None else dict(mask=_QueryRows(mask, p.offset))
    dQ = np.empty_like(Q, dtype=np.float64)
    dK = np.zeros(K.shape)
    dV = np.zeros(V.shape)
    for b in range(p.B):
        for h in range(p.H_q):
            q = slice((b * p.H_q + h) * p.N_q, (b * p.H_q + h + 1) * p.N_q)
            k0 = (b * p.H_kv + h // p.g) * p.N_k
            k = slice(k0, k0 + p.N_k)
            dq, dk, dv = attention_backward(Q[q], K[k], V[k], dO[q], scale=scale, **shape)
            dQ[q] = dq
            dK[k] += dk
            dV[k] += dv
    return dQ, dK, dV


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
    return tuple(int(x) for x in seen_counts(*tmask.args[:3], p.N_q, p.N_k - p.N_q, p.N_k))


def problem_seen(p: Problem, mask) -> tuple[int, int] | None:
    """:func:`_seen` of a ``mask`` argument (a ``--mask`` string, a Mask, an array or None) over problem ``p``: what
    its compulsory traffic reads (:meth:`iosim.problem.Problem.compulsory`)."""
    if mask is None or (isinstance(mask, str) and mask in ("none", "dense")):
        return _seen(p, None)
    from iosim.algorithms.tile_masks import DENSE
    from iosim.masks import compile_mask

    tm = compile_mask(mask, p.N_k, p.causal)
    return None if tm.kind == DENSE else _seen(p, tm)


def _problem_mask(p: Problem, mask, policy):
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
    tm = compile_mask(mask, p.N_k, p.causal, "skip" if policy is None else policy)
    return None if tm.kind == DENSE else tm


def _run_problem(algo, p: Problem, M: int, gqa, splits, mla, Br, Bc, B, **o) -> Result:
    """:func:`run` over a whole problem (flash1, flash2; :mod:`iosim.algorithms.decoding`)."""
    from iosim.algorithms import decoding
    from iosim.masks import check_policy, compile_mask
    from iosim.theory import io_model
    from iosim.theory.tiling import problem_tiling

    check_policy(o["kv_policy"], None)  # checked with or without a mask (None: skip over a problem)
    masked = not (o["mask"] is None or (isinstance(o["mask"], str) and o["mask"] in ("none", "dense")))
    backward = _flag("backward", o["backward"])
    if algo.name not in PROBLEM_ALGORITHMS and backward:
        return _run_by_heads(algo, p, M, gqa, splits, mla, Br, Bc, B, masked, o)
    splits, mla = _problem_schedule(algo, p, gqa, splits, mla, B)
    tmask = _problem_mask(p, o["mask"], o["kv_policy"]) if masked else None
    if not masked and p.causal and o["kv_policy"] == "paper":  # the causal field under the policy asked for
        tmask = compile_mask(None, p.N_k, True, "paper")
    if backward:
        _problem_backward_check(algo, p, splits)
    trace = _flag("trace", o["trace"])
    if o["given"]:
        raise InputError("Q, K, V", "are drawn from seed for a problem (give the arrays for one head with N and d)")
    if not isinstance(o["tiling"], str) or o["tiling"] not in RULES:
        raise InputError("tiling", f"must be one of {', '.join(RULES)}", o["tiling"])
    count_only, strict = _flag("count_only", o["count_only"]), _flag("strict", o["strict"])
    reference, allow_long = _flag("reference", o["reference"]), _flag("allow_long", o["allow_long"])
    dtype = _dtype(o["dtype"])
    seed = _seed(o["seed"])
    scale = _scale(o["scale"], p.d_qk)
    Br = None if Br is None else _positive_int("Br", Br, MAX_N)
    Bc = None if Bc is None else _positive_int("Bc", Bc, MAX_N)
    if algo.name in ONE_HEAD_ALGORITHMS:
        return _run_one_head_problem(
            algo, p, M, B, count_only, strict, reference, dtype, seed, scale, o["tiling"], allow_long, tmask, trace
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
    passes_n = 3 if backward else 1  # the backward: about twice the forward's tile steps and arithmetic
    # a random mask: every tile of every group is tested by the run, and once more by the closed form's summary
    draws = (groups + 1) * -(-rows // t.Br) * -(-p.N_k // t.Bc) * (tmask.tile_tests(t.Br, t.Bc) if tmask else 0)
    # one head of N_q x N_k per group: the numeric estimate's arithmetic is per head (N_q N_k d), times the heads
    if count_only:
        seconds = estimate.count_only_seconds(steps * passes_n)
    else:
        flops = estimate.NUMERIC_N2D * p.B * p.H_q * p.N_q * p.N_k * (p.d_qk + p.d_v)
        seconds = (estimate.numeric_seconds(1, 1, steps, False) + flops) * passes_n
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
    }
    errors: dict[str, float] = {}
    if count_only:
        Q = K = V = Ks = Vs = table = None
    else:
        Q, K, V, Ks, Vs, table = _problem_inputs(p, np.random.default_rng(seed))
    data = [None if x is None else np.ascontiguousarray(x, dtype=np_dtype) for x in (Q, Ks, Vs)]
    if algo.name == "flash2":
        O, L = decoding.flash2_problem(
            mem, p, *data, table, Br=t.Br, Bc=t.Bc, gqa=gqa, splits=splits, mla=mla, combine_rows=bm, scale=scale,
            dtype=np_dtype, mask=tmask,
        )  # fmt: skip
        outputs = {"O": O, "L": L}
        predicted = io_model.flash2_problem(p, t.Br, t.Bc, gqa, splits, mla, bm, tmask)
    else:
        O, l_, m = decoding.flash1_problem(
            mem, p, *data, table, Br=t.Br, Bc=t.Bc, gqa=gqa, mla=mla, scale=scale, dtype=np_dtype, mask=tmask
        )
        with np.errstate(divide="ignore"):
            L = None if m is None else m + np.log(l_)
        outputs = {"O": O, "l": l_, "m": m, "L": L}
        predicted = io_model.flash1_problem(p, t.Br, t.Bc, gqa, mla, tmask)
    schedule["thread_blocks"] = predicted.thread_blocks
    if not count_only and reference:
        O_ref, L_ref = problem_reference(p, Q, K, V, scale, tmask)
        errors["O"] = float(np.max(np.abs(outputs["O"] - O_ref)))
        errors["L"] = _logsumexp_error(outputs["L"], L_ref)
    seen = _seen(p, tmask)
    lb = float(sum(p.compulsory(seen).values()))
    fwd = PassResult(
        "forward", mem.stats(), predicted, lb, "compulsory (read Q, K/V once per KV head, write O)", errors, t,
        count_only or _all_finite(outputs, ("O", "L")),
    )  # fmt: skip
    passes = {"forward": fwd}
    if backward:
        passes["backward"], bwd_trace = _problem_backward_pass(
            algo.name, p, M, gqa, rows, o["tiling"], Br, Bc, strict, count_only, reference, np_dtype, seed, scale,
            outputs, (Q, K, V), schedule, trace, tmask, seen,
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


def _run_by_heads(algo, p: Problem, M: int, gqa, splits, mla, Br, Bc, B, masked: bool, o: dict) -> Result:
    """The backward of standard attention and square tiling over a problem, under any mask (flash1 and flash2 have their
    own problem backward, :mod:`iosim.algorithms.decoding`; the forward of these two over a problem is
    :func:`_run_one_head_problem`): the B H_q query heads one after another, each the one-head schedule of :func:`run`
    on its own rows against its key/value head (GQA ``per-head``), so every array's counts are the heads' sum and the
    peak one head's (:func:`iosim.theory.io_model.heads_problem`). In the backward of a group of g > 1 query heads each
    head writes its dK, dV as partials (``dKpart``, ``dVpart``, as FlashAttention-2's GQA backward writes them expanded)
    and the group sum of :mod:`iosim.algorithms.decoding` adds the g partials of each key/value head into dK, dV
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
            o["mask"] if masked else True,
        )
    if o["given"]:
        raise InputError("Q, K, V", "are drawn from seed for a problem (give the arrays for one head with N and d)")
    if _flag("trace", o["trace"]):
        raise InputError("trace", f"is not recorded for {what} over a problem (one head: N and d)", True)
    backward, count_only = _flag("backward", o["backward"]), _flag("count_only", o["count_only"])
    allow_long = _flag("allow_long", o["allow_long"])
    N, d, heads = p.N_q, p.d_qk, p.B * p.H_q
    algo_t = algo.backward_tiling(N, d, M, o["tiling"]) if backward else algo.choose_tiling(N, d, M, o["tiling"])
    steps = heads * _estimated_steps(algo_t, N, d, backward) + (heads * N if backward else 0)
    seconds = estimate.count_only_seconds(steps) if count_only else estimate.numeric_seconds(N, d, steps, backward)
    estimate.check(seconds, f"{what} of {algo.name} over {p}", allow_long=allow_long, parameter="problem",
                   value=str(p))  # fmt: skip
    if backward and p.g > 1 and M < 2 * d:
        raise InputError("M", f"must be at least 2 d = {2 * d} words for the GQA backward's group sum of dK, dV", M)
    seed = _seed(o["seed"])
    one = dict(M=M, causal=p.causal, mask=o["mask"], kv_policy=o["kv_policy"], backward=backward, tiling=o["tiling"],
               dtype=o["dtype"], scale=o["scale"], strict=o["strict"], reference=o["reference"], allow_long=True,
               Br=Br, Bc=Bc, B=B)  # fmt: skip
    if not count_only:
        rng = np.random.default_rng(seed)
        Q, K, V = _problem_inputs(p, rng)[:3]
        dO = rng.standard_normal((heads * N, d)) if backward else None
    runs = []
    for b in range(p.B):
        for h in range(p.H_q):  # query head h reads key/value head h // g
            if count_only:
                runs.append(run(algo.name, N=N, d=d, count_only=True, **one))
                continue
            q, k = (b * p.H_q + h) * N, (b * p.H_kv + h // p.g) * N
            grad = dict(dO=dO[q : q + N]) if backward else {}
            runs.append(run(algo.name, Q=Q[q : q + N], K=K[k : k + N], V=V[k : k + N], **grad, **one))
    first = runs[0]
    seen = problem_seen(p, o["mask"] if masked else None)
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
        if not count_only and _flag("reference", o["reference"]):  # the summed dK, dV against the float64 sums
            from iosim.masks import compile_mask

            tm = compile_mask(o["mask"] if masked else None, N, p.causal)
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


def _gqa_reduction(p: Problem, M: int, bwd: PassResult, outputs: dict, count_only: bool):
    """The group sum after a head-by-head backward of g > 1 query heads per key/value head: the per-head passes
    wrote dK, dV (renamed ``dKpart``, ``dVpart``); :func:`iosim.algorithms.decoding.sum_group` reads the g partials
    of each key/value head, R = :func:`iosim.theory.io_model.group_sum_rows` keys at a time, and writes dK, dV."""
    from iosim.algorithms import decoding
    from iosim.theory import io_model

    def renamed(per: dict) -> dict:
        return {{"dK": "dKpart", "dV": "dVpart"}.get(n, n): c for n, c in per.items()}

    R = io_model.group_sum_rows(p, M)
    mem = TwoLevelMemory(M, fast=count_only)
    out = dict(outputs)
    for name in ("dK", "dV"):
        d = p.d_qk if name == "dK" else p.d_v
        ids = mem.ids(**{f"{name}part": (p.B * p.H_q * p.N_k, d), name: (p.B * p.H_kv * p.N_k, d)})
        part = None if count_only else np.ascontiguousarray(outputs[name])
        total = None if count_only else np.empty((p.B * p.H_kv * p.N_k, d), dtype=part.dtype)
        bufs = (None, None) if count_only else (np.empty(R * d, part.dtype), np.empty(R * d, part.dtype))
        mem.call(decoding.sum_group, ids, part, total, p.B * p.H_kv, p.g, p.N_k, d, R, *bufs)
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
                           seen=None) -> tuple:  # fmt: skip
    """The flash2 (flash1) backward over a problem on a fresh memory of M words, reading the forward's O and L (O,
    l and m); dO is drawn from ``seed`` after Q, K, V. Fills ``outputs`` with dQ, dK, dV.
    Returns the pass and its trace (the run's trace, as for one head)."""
    from iosim.algorithms import decoding
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
        _problem_inputs(p, rng)  # the same draws as the forward's, then dO
        dO = rng.standard_normal((Rtot, p.d_v))
        stats = (outputs["l"], outputs["m"]) if name == "flash1" else (outputs["L"],)
        data = (*inputs, outputs["O"], dO, *stats)
    run_backward = decoding.flash1_backward_problem if name == "flash1" else decoding.flash2_backward_problem
    dQ, dK, dV = run_backward(mem, p, *data, Br=t.Br, Bc=t.Bc, gqa=gqa, scale=scale, dtype=np_dtype, mask=mask)
    outputs.update(dQ=dQ, dK=dK, dV=dV)
    schedule["backward_thread_blocks"] = predicted.thread_blocks
    if not count_only and reference:
        refs = problem_reference_backward(p, *inputs, dO, scale, mask)
        for name, x, ref in zip(("dQ", "dK", "dV"), (dQ, dK, dV), refs, strict=True):
            errors[name] = float(np.max(np.abs(x - ref)))
    result = PassResult(
        "backward", mem.stats(), predicted, float(sum(p.compulsory_backward(seen).values())), BACKWARD_FLOOR, errors, t,
        count_only or _all_finite(outputs, ("dQ", "dK", "dV")),
    )  # fmt: skip
    return result, mem.trace()


def _run_one_head_problem(
    algo, p: Problem, M, B, count_only, strict, reference, dtype, seed, scale, rule, allow_long, tmask=None, trace=False
) -> Result:
    """Standard attention (Algorithm 0) or square tiling over a problem: each of the B H_q query heads in turn, its
    own schedule of N_q rows against its key/value head's N_k keys (GQA ``per-head``), widths d_qk and d_v; causal
    bottom-right, or the TileMask ``tmask`` over the whole N_k x N_k sequence with the queries its last N_q rows
    (:func:`_problem_mask`). Exact counts: :func:`iosim.theory.io_model.standard_forward` with N_k and d_v (the
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
        t = Tiling("explicit", B=_positive_int("B", B, MAX_N))
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
        Q, K, V, _, _, _ = _problem_inputs(p, np.random.default_rng(seed))
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
            errors["L"] = _logsumexp_error(outputs["L"], L_ref)
    seen = _seen(p, tmask)
    fwd = PassResult(
        "forward", mem.stats(), predicted, float(sum(p.compulsory(seen).values())),
        "compulsory (read Q, K/V once per KV head, write O)", errors, t, count_only or _all_finite({"O": O}, ("O",)),
    )  # fmt: skip
    return Result(
        algo.name, p.N_q, p.d_qk, M, p.causal, count_only, dtype, t, {"forward": fwd}, outputs, seed, scale,
        mem.trace(), tmask.label if tmask else "causal" if p.causal else "none", tmask.policy if tmask else "paper", p,
        {"gqa": "per-head", "splits": 1, "mla": None, "thread_blocks": None} if heads > 1 else {"thread_blocks": None},
        seen,
    )  # fmt: skip

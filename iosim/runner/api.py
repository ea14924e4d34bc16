"""The front door: :func:`run` one algorithm under the memory model and get counts, bounds and errors."""

from __future__ import annotations

import functools
import inspect
import warnings
from dataclasses import dataclass, fields, replace

import numpy as np

from iosim.algorithms.reference import attention_backward, attention_forward
from iosim.base.errors import InputError
from iosim.memory_model import TraceTooLargeError, TwoLevelMemory
from iosim.runner import registry
from iosim.runner.inputs import check_arrays, check_dO, problem_arrays
from iosim.runner.problem_runs import combine_rows, explicit_tiling, is_plain, problem_arg, problem_seen, run_problem
from iosim.runner.references import all_finite, logsumexp_error, problem_reference, problem_reference_backward
from iosim.runner.results import PassResult, Result
from iosim.runner.validate import (
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
from iosim.spec.problem import Problem
from iosim.spec.schedule import Schedule, explicit_tiles, from_objects
from iosim.theory import bounds

# Re-exported: the names other modules and users reach through iosim.runner.api (sizes, the problem helpers).
__all__ = [
    "DTYPES", "MAX_D", "MAX_M", "MAX_N", "MAX_SEED", "PassResult", "Result", "algorithm_names", "combine_rows",
    "problem_reference", "problem_reference_backward", "problem_seen", "run", "run_keywords", "SCHEDULE_OPTIONS",
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


# The schedule's options: keywords of run() until its keyword form was shortened; now fields of iosim.Schedule only.
SCHEDULE_OPTIONS = ("tiling", "Br", "Bc", "B", "gqa", "splits", "mla", "kv_policy", "pages")


def short_keywords(name: str, moved: dict[str, str], forms: str):
    """A front door's keywords checked before any work (``run``'s and ``hierarchy``'s): a keyword that moved onto an
    object (``moved``: the keyword, and the rest of its one line: which object takes it now) is refused in one line
    naming that object; a missing or unknown keyword in one line too, with the door's ``forms``."""

    def decorate(fn):
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            for k in kwargs:
                if k in moved:
                    raise InputError(f"{name}(): {k}", moved[k])
            try:
                signature.bind(*args, **kwargs)
            except TypeError as e:
                raise InputError(name, f"takes {forms}: {e}") from None
            return fn(*args, **kwargs)

        return wrapper

    return decorate


# run's schedule options, each refused in one line naming iosim.Schedule (short_keywords)
_MOVED = {k: f"is a schedule option now: pass iosim.Schedule(algorithm, {k}=...) in place of the algorithm's name "
          "(or run(problem, schedule, M))" for k in SCHEDULE_OPTIONS}  # fmt: skip


@short_keywords("run", _MOVED, "(algorithm or schedule, *, M, ...) or (problem, schedule, M)")
def run(
    algorithm: str | Schedule | Problem,
    schedule: Schedule | str | None = None,
    M: int | None = None,
    *,
    N: int | None = None,
    d: int | None = None,
    problem: Problem | None = None,
    Q=None,
    K=None,
    V=None,
    dO=None,
    backward: bool = False,
    causal: bool = False,
    mask=None,
    count_only: bool = False,
    dtype: str = "float64",
    seed: int = 0,
    scale: float | None = None,
    strict: bool = True,
    trace: bool = False,
    reference: bool = True,
    allow_long: bool = False,
) -> Result:
    """Run an algorithm under a fast memory of ``M`` words and return counts, prediction, bounds and errors.

    Two forms, the same run: the keyword form ``run("flash2", N=1024, d=64, M=16384)`` (the first argument an
    algorithm's name or an :class:`iosim.Schedule`; the problem one head of N x d, or ``problem=``), and the objects
    form ``run(problem, schedule, M)`` (an :class:`iosim.Problem`, a Schedule or an algorithm's name, the memory).
    The schedule's options (the tiling rule, explicit tiles Br, Bc or B, the GQA policy, split-KV's splits, MLA's
    read of V, the empty-block policy kv_policy, flash1's paged reads) are fields of :class:`iosim.Schedule`, not
    keywords of ``run``: ``run(iosim.Schedule("flash2", Br=64, Bc=32), N=1024, d=64, M=16384)``.

    Inputs are either the caller's Q, K, V (N x d each; then N and d come from them) or random standard-normal
    arrays of size N x d drawn from ``seed``. ``count_only`` runs the same schedule without arithmetic (and without
    allocating N x d data), so it scales to N = 2^20. ``strict=False`` records a capacity overflow instead of
    raising :class:`iosim.memory_model.CapacityError`.

    ``backward=True`` (or ``Schedule(..., backward=True)``) runs the forward (on its own memory of M words), then
    the backward on a fresh memory of M words, reading the forward's outputs (O and l, m or L, or P) as the paper's
    backward does. ``dO`` is the upstream gradient (N x d; drawn from ``seed`` after Q, K, V when not given).
    ``passes`` holds both passes' counts; ``errors`` are then those of dQ, dK, dV against
    :func:`iosim.algorithms.reference.attention_backward`.

    ``trace=True`` records every load, store, alloc, free and initialisation of the requested pass
    (``result.trace``; :meth:`iosim.memory_model.Trace.replay` reproduces the counts). ``reference=False`` skips the
    float64 reference (no ``errors``). A run (count-only, or numeric with its reference) estimated at over a minute
    needs ``allow_long=True``; over an hour, or a numeric run whose arrays would not fit in memory, is refused up
    front (:class:`InputError`; the rule and its costs: :mod:`iosim.runner.estimate`).
    Outputs that are not finite (finite inputs whose scores overflow) give a warning and ``result.finite`` False.

    ``mask`` (an :mod:`iosim.masking.masks` pattern, a ``--mask`` string such as ``"window:128"``, or an N x N boolean
    array)
    masks the scores; ``causal=True`` is the causal mask. Built-in algorithms skip the tiles the mask empties; the
    schedule's ``kv_policy`` decides whether the outer-loop operands of a block whose tiles are all empty load.

    ``problem`` (an :class:`iosim.spec.problem.Problem`: batch, query and key/value heads, N_q, N_k, d_qk, d_v, causal
    bottom-right, MLA latent, page size, dtypes) replaces N and d. A one-head problem with N_q = N_k and the default
    schedule runs the algorithms above unchanged.
    """
    given = locals()
    numerics = {k: given[k] for k in _RUN_KEYWORDS if k != "backward"}  # the Schedule holds the pass
    if isinstance(algorithm, Problem):  # the objects form: a keyword of the Problem or the Schedule is refused
        spec, options = from_objects(algorithm, schedule, {**numerics, **({"backward": backward} if backward else {})})
    else:
        if schedule is not None:
            raise InputError("schedule", "is given with a problem as the first argument: run(problem, schedule, M)")
        if M is None:
            raise InputError("M", "must be given: the fast memory's size in words")
        spec = algorithm if isinstance(algorithm, Schedule) else Schedule(algorithm)
        if backward is not False:
            spec = replace(spec, backward=backward)
        options = {**numerics, **spec.run_options()}
    result = _run(spec.algorithm, M, **options)
    result.spec = spec
    return result


def run_keywords(algorithm: str, **options) -> Result:
    """:func:`run` with the schedule's options given as keywords beside run's own (what the command line's flags map
    to): they build the :class:`iosim.Schedule` (checked first), the rest are :func:`run`'s keywords."""
    fields = {k: options.pop(k) for k in SCHEDULE_OPTIONS if k in options}
    schedule = Schedule(algorithm, backward=options.pop("backward", False), **fields)
    return run(schedule, **options)


# The body's options, each with its default, from one list each: run's keywords (its signature, the public form)
# and the Schedule's fields (its dataclass). :func:`_run` takes both as keywords (the problem run calls it per head).
_RUN_KEYWORDS = {k: p.default for k, p in inspect.signature(run).parameters.items() if p.kind is p.KEYWORD_ONLY}
_OPTIONS = {**_RUN_KEYWORDS, **{f.name: f.default for f in fields(Schedule) if f.name in SCHEDULE_OPTIONS}}
# What the problem run takes of them as keywords (the schedule's gqa, splits, mla and tiles go positionally).
_PROBLEM_RUN_OPTIONS = ("backward", "count_only", "tiling", "dtype", "seed", "scale", "strict", "trace", "reference",
                        "allow_long", "mask", "kv_policy", "pages")  # fmt: skip


@_trace_memory_is_input
def _run(algorithm: str, M: int | None = None, **options) -> Result:
    """:func:`run`'s body: ``options`` are run's keywords and the Schedule's fields (:data:`_OPTIONS`; the ones not
    given take their defaults), checked here or by the problem run (:func:`iosim.runner.problem_runs.run_problem`,
    which calls it back for each head of a head-by-head run)."""
    unknown = sorted(options.keys() - _OPTIONS.keys())
    if unknown:  # a caller's slip inside iosim (run's own keywords are checked by _short_keywords)
        raise TypeError(f"_run() got unexpected keyword arguments: {', '.join(unknown)}")
    a = {**_OPTIONS, **options}
    algo = registry.get(algorithm)
    M = positive_int("M", M, MAX_M)
    problem, gqa, splits, mla, pages = a["problem"], a["gqa"], a["splits"], a["mla"], a["pages"]
    if problem is not None or gqa != "per-head" or splits != 1 or mla != "shared" or pages != "pieces":
        problem = problem_arg(problem, a["N"], a["d"], a["causal"], a["Q"], a["dtype"])
        if not is_plain(problem, gqa, splits, mla, pages):
            opts = {k: a[k] for k in _PROBLEM_RUN_OPTIONS}
            opts["arrays"] = (a["Q"], a["K"], a["V"], a["dO"])
            return run_problem(algo, problem, M, gqa, splits, mla, a["Br"], a["Bc"], a["B"], _run, **opts)
        a.update(N=problem.N_q, d=problem.d_qk, causal=problem.causal)
        if a["Q"] is not None or a["K"] is not None or a["V"] is not None:  # one head's arrays: (B, H, N, d) or (N, d)
            a["Q"], a["K"], a["V"], a["dO"] = problem_arrays(problem, a["Q"], a["K"], a["V"], a["dO"])
    h = _OneHead.check(algo, M, a)  # every option, checked there
    fwd, outputs, pass_trace = h.forward()
    passes = {"forward": fwd}
    if h.backward:
        passes["backward"], grads, pass_trace = h.backward_pass(outputs)
        outputs = {**outputs, **grads}
    return h.result(passes, outputs, pass_trace, problem)


@dataclass
class _OneHead:
    """One head's run, checked (:meth:`check`), then its passes and its result: the body of :func:`run`."""

    algo: registry.Algorithm
    M: int
    N: int
    d: int
    Q: np.ndarray | None
    K: np.ndarray | None
    V: np.ndarray | None
    dO: np.ndarray | None
    backward: bool
    count_only: bool
    strict: bool
    trace: bool
    reference: bool
    dtype: str
    seed: int | None
    scale: float
    tmask: object  # the compiled mask (iosim.algorithms.tile_masks.TileMask)
    t: object  # the forward's tiling, then the backward's
    t_bwd: object

    @property
    def masked(self) -> bool:  # a mask other than the causal one (the causal flag has its own closed forms)
        return not self.tmask.is_causal and self.tmask.label != "none"

    @property
    def causal(self) -> bool:
        return self.tmask.is_causal

    @property
    def causal_arg(self):  # what the algorithm receives as ``causal``: the compiled mask (built-in), the flag (user's)
        return self.tmask if self.algo.builtin else self.causal

    @property
    def allowed(self):  # the mask the reference takes its rows from (a mask other than causal, numeric, referenced)
        return self.tmask if self.masked and not self.count_only and self.reference else None

    @property
    def fast(self) -> bool:  # a count-only run of a built-in algorithm uses the counters-only memory (its loop nest
        return self.count_only and self.algo.builtin and not self.trace  # is checked against the tile table by tests)

    @classmethod
    def check(cls, algo, M: int, a: dict) -> _OneHead:
        """Every argument checked, the inputs drawn and the tilings chosen, before any work (the long-run rule and
        the memory check included)."""
        name = algo.name
        explicit = explicit_tiles(algo, a["Br"], a["Bc"], a["B"])
        backward, count_only = flag("backward", a["backward"]), flag("count_only", a["count_only"])
        strict, trace, reference = (
            flag("strict", a["strict"]),
            flag("trace", a["trace"]),
            flag("reference", a["reference"]),
        )
        causal, allow_long = flag("causal", a["causal"]), flag("allow_long", a["allow_long"])
        dtype = dtype_arg(a["dtype"])
        Q, K, V, dO, N, d = a["Q"], a["K"], a["V"], a["dO"], a["N"], a["d"]
        if backward and not algo.has_backward:
            have = [n for n, x in registry.REGISTRY.items() if x.has_backward]
            raise InputError("backward", f"is not implemented for {name}; algorithms with one: {', '.join(have)}", True)
        if not backward and dO is not None:
            raise InputError("dO", "is only used with backward=True", "an array")
        given = Q is not None or K is not None or V is not None
        seed = None if given else seed_arg(a["seed"])
        if given:
            if count_only:
                raise InputError("count_only", "cannot be combined with given Q, K, V (count-only runs have no data)")
            Q, K, V, N, d = check_arrays(Q, K, V, N, d)
        else:
            if N is None or d is None:
                raise InputError("N and d", "must be given when Q, K, V are not")
            N, d = positive_int("N", N, MAX_N), positive_int("d", d, MAX_D)
        scale = scale_arg(a["scale"], d)
        from iosim.masking.masks import compile_mask

        tmask = compile_mask(a["mask"], N, causal, a["kv_policy"], allow_long=allow_long)
        h = cls(algo, M, N, d, Q, K, V, dO, backward, count_only, strict, trace, reference, dtype, seed, scale, tmask,
                None, None)  # fmt: skip
        if h.masked and not algo.builtin:
            raise InputError("mask", f"is only supported by the built-in algorithms, not by {name}", tmask.label)
        h.t = algo.choose_tiling(N, d, M, a["tiling"])
        h.t_bwd = algo.backward_tiling(N, d, M, a["tiling"]) if backward else None  # a too-small M fails fast
        if explicit:
            h.t, h.t_bwd = explicit_tiling(algo, explicit, h.t, h.t_bwd, N, d, M, h.causal_arg, strict)
        h.draw(allow_long)
        if dO is not None and count_only:
            raise InputError("dO", "cannot be combined with count_only=True (count-only runs have no data)")
        return h

    def draw(self, allow_long: bool) -> None:
        """The long-run rule (and, numeric, the memory check), then the random inputs the caller did not give."""
        mask = self.tmask if self.masked else None
        if self.count_only:
            check_time(self.t_bwd or self.t, self.N, self.d, self.backward, allow_long, mask, algorithm=self.algo.name)
            return
        check_memory(self.algo, self.N, self.d, self.backward, self.reference, np.dtype(self.dtype).itemsize)
        check_time(self.t_bwd or self.t, self.N, self.d, self.backward, allow_long, mask, count_only=False)
        rng = np.random.default_rng(self.seed)
        if self.Q is None:
            self.Q, self.K, self.V = (rng.standard_normal((self.N, self.d)) for _ in range(3))
        if self.dO is not None:
            self.dO = check_dO(self.dO, self.N, self.d)
        elif self.backward:
            self.dO = rng.standard_normal((self.N, self.d))

    @property
    def data(self) -> tuple:
        return (None, None, None) if self.count_only else (self.Q, self.K, self.V)

    def forward(self):
        """The forward pass on its own memory of M words: (its PassResult, the outputs, its trace)."""
        N, d, algo = self.N, self.d, self.algo
        mem = TwoLevelMemory(self.M, strict=self.strict, trace=self.trace and not self.backward, fast=self.fast)
        with OutOfMemory(algo.name, N, d, "simulated forward"):
            outputs = algo.forward(mem, *self.data, N, d, self.t, self.scale, self.causal_arg, np.dtype(self.dtype))
        errors: dict[str, float] = {}
        if not self.count_only and self.reference:  # an overflow shows as result.finite, with one warning
            with np.errstate(all="ignore"), OutOfMemory(algo.name, N, d, "float64 reference"):
                O_ref, L_ref = attention_forward(self.Q, self.K, self.V, scale=self.scale, causal=self.causal,
                                                 mask=self.allowed)  # fmt: skip
            errors["O"] = float(np.max(np.abs(outputs["O"] - O_ref)))
            if outputs.get("L") is not None:
                errors["L"] = logsumexp_error(outputs["L"], L_ref)
        predicted = algo.predict_forward(N, d, self.M, self.t, self.causal_arg)
        finite = self.count_only or all_finite(outputs, ("O", "L"))
        return (
            PassResult("forward", mem.stats(), predicted, *self.bound(False), errors, self.t, finite),
            outputs,
            mem.trace(),
        )

    def backward_pass(self, outputs: dict):
        """The backward on a fresh memory of M words (a separate kernel), reading the forward's outputs."""
        N, d, algo = self.N, self.d, self.algo
        mem = TwoLevelMemory(self.M, strict=self.strict, trace=self.trace, fast=self.fast)
        dO = None if self.count_only else self.dO
        with OutOfMemory(algo.name, N, d, "simulated backward"):
            grads = algo.backward(mem, *self.data, dO, outputs, N, d, self.t_bwd, self.scale, self.causal_arg,
                                  np.dtype(self.dtype))  # fmt: skip
        errors: dict[str, float] = {}
        if not self.count_only and self.reference:
            with np.errstate(all="ignore"), OutOfMemory(algo.name, N, d, "float64 reference"):
                refs = attention_backward(self.Q, self.K, self.V, dO, scale=self.scale, causal=self.causal,
                                          mask=self.allowed)  # fmt: skip
            for name, ref in zip(("dQ", "dK", "dV"), refs, strict=True):
                errors[name] = float(np.max(np.abs(grads[name] - ref)))
        predicted = algo.predict_backward(N, d, self.M, self.t_bwd, self.causal_arg)
        finite = self.count_only or all_finite(grads, ("dQ", "dK", "dV"))
        p = PassResult("backward", mem.stats(), predicted, *self.bound(True), errors, self.t_bwd, finite)
        return p, grads, mem.trace()

    def bound(self, backward: bool) -> tuple:
        mask = self.tmask if self.masked else None
        return bounds.lower_bound(self.N, self.d, self.M, backward=backward, mask=mask, causal=self.causal)

    def result(self, passes: dict, outputs: dict, pass_trace, problem) -> Result:
        if problem is None:
            problem = Problem(
                N=self.N, d=self.d, causal=self.causal, dtype_q="fp64" if self.dtype == "float64" else "fp32"
            )
        result = Result(self.algo.name, self.N, self.d, self.M, self.causal, self.count_only, self.dtype,
                        self.t_bwd or self.t, passes, outputs, self.seed, self.scale, pass_trace, self.tmask.label,
                        self.tmask.policy, problem)  # fmt: skip
        if not result.finite:
            bad = [name for name, p in passes.items() if not p.finite]
            warnings.warn(
                f"{self.algo.name}: the {' and '.join(bad)} outputs are not finite (NaN or inf) although the inputs "
                f"are: the scores overflow {self.dtype} (scale x max|Q K^T| too large); the counts are exact, the "
                "outputs are not",
                RuntimeWarning,
                stacklevel=3,
            )
        return result

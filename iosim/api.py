"""The front door: :func:`run` one algorithm under the memory model and get counts, bounds and errors."""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import numpy as np

from iosim import bounds, registry
from iosim.algorithms.reference import attention_backward, attention_forward, default_scale
from iosim.errors import InputError
from iosim.io_model import Prediction
from iosim.memory_model import Stats, TwoLevelMemory
from iosim.tiling import RULES, Tiling

DTYPES = ("float64", "float32")


@dataclass
class PassResult:
    """Counts, prediction, bound and errors of one pass (forward or backward)."""

    name: str
    stats: Stats
    predicted: Prediction
    lower_bound: float
    lower_bound_name: str
    errors: dict[str, float] = field(default_factory=dict)
    tiling: Tiling | None = None  # the blocks this pass ran with (the backward may choose its own)

    @property
    def exact(self) -> bool:
        """Whether the simulated counts equal the closed form, array by array and in peak."""
        return self.stats.per_array == self.predicted.per_array and self.stats.peak == self.predicted.peak


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
        """A JSON-ready summary (what ``iosim run --json`` prints)."""
        main = self.main
        out = {
            "algorithm": self.algorithm,
            "pass": main.name,
            "N": self.N,
            "d": self.d,
            "M": self.M,
            "causal": self.causal,
            "count_only": self.count_only,
            "dtype": self.dtype,
            "regime": self.regime,
            "tiling": self.tiling.as_dict(),
            "reads": main.stats.reads,
            "writes": main.stats.writes,
            "total": main.stats.total,
            "init_writes": main.stats.init_writes,
            "peak": main.stats.peak,
            "predicted_total": main.predicted.total,
            "exact": main.exact,
            "lower_bound": main.lower_bound,
            "lower_bound_name": main.lower_bound_name,
            "max_abs_error": self.max_abs_error,
            "errors": dict(main.errors),
            "per_array": {k: vars(v) for k, v in main.stats.per_array.items()},
        }
        if len(self.passes) > 1:
            out["passes"] = {
                name: {
                    "reads": p.stats.reads,
                    "writes": p.stats.writes,
                    "total": p.stats.total,
                    "init_writes": p.stats.init_writes,
                    "peak": p.stats.peak,
                    "predicted_total": p.predicted.total,
                    "exact": p.exact,
                    "lower_bound": p.lower_bound,
                    "lower_bound_name": p.lower_bound_name,
                    "tiling": None if p.tiling is None else p.tiling.as_dict(),
                    "errors": dict(p.errors),
                    "per_array": {k: vars(v) for k, v in p.stats.per_array.items()},
                }
                for name, p in self.passes.items()
            }
            total = sum(p.stats.total for p in self.passes.values())
            out["total_all_passes"] = total
        return out


def algorithm_names() -> list[str]:
    """The names of the registered algorithms."""
    return registry.algorithms()


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise InputError(name, "must be a positive integer", value)
    return int(value)


def _check_arrays(Q, K, V, N, d) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    arrays = {}
    for name, x in (("Q", Q), ("K", K), ("V", V)):
        if x is None:
            raise InputError(name, "must be given together with Q, K and V (or none of them, with N and d)")
        a = np.asarray(x)
        if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
            raise InputError(name, "must be a non-empty 2-D array of shape (N, d)", f"shape {a.shape}")
        if not np.issubdtype(a.dtype, np.number) or np.iscomplexobj(a):
            raise InputError(name, "must hold real numbers", f"dtype {a.dtype}")
        if not np.all(np.isfinite(a)):
            raise InputError(name, "must hold only finite values (no NaN or inf)", "non-finite entries")
        arrays[name] = a
    shape = arrays["Q"].shape
    for name in ("K", "V"):
        if arrays[name].shape != shape:
            raise InputError(name, f"must have the shape of Q {shape}", f"shape {arrays[name].shape}")
    if N is not None and N != shape[0]:
        raise InputError("N", f"must match the rows of Q ({shape[0]}) when arrays are given", N)
    if d is not None and d != shape[1]:
        raise InputError("d", f"must match the columns of Q ({shape[1]}) when arrays are given", d)
    return arrays["Q"], arrays["K"], arrays["V"], shape[0], shape[1]


def _check_dO(dO, N: int, d: int) -> np.ndarray:
    """The upstream gradient dO: validated like Q, K, V (shape N x d, real, finite)."""
    a = np.asarray(dO)
    if a.ndim != 2 or a.shape != (N, d):
        raise InputError("dO", f"must be a 2-D array of the shape of Q ({N}, {d})", f"shape {a.shape}")
    if not np.issubdtype(a.dtype, np.number) or np.iscomplexobj(a):
        raise InputError("dO", "must hold real numbers", f"dtype {a.dtype}")
    if not np.all(np.isfinite(a)):
        raise InputError("dO", "must hold only finite values (no NaN or inf)", "non-finite entries")
    return a


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
    """
    algo = registry.get(algorithm)
    M = _positive_int("M", M)
    if tiling not in RULES:
        raise InputError("tiling", f"must be one of {', '.join(RULES)}", tiling)
    if dtype not in DTYPES:
        raise InputError("dtype", f"must be one of {', '.join(DTYPES)}", dtype)
    if backward:
        if not algo.has_backward:
            have = [name for name, a in registry.REGISTRY.items() if a.has_backward]
            raise InputError(
                "backward", f"is not implemented for {algorithm}; algorithms with one: {', '.join(have)}", backward
            )
    elif dO is not None:
        raise InputError("dO", "is only used with backward=True", "an array")
    rng = np.random.default_rng(seed)
    if Q is not None or K is not None or V is not None:
        Q, K, V, N, d = _check_arrays(Q, K, V, N, d)
    else:
        if N is None or d is None:
            raise InputError("N and d", "must be given when Q, K, V are not")
        N, d = _positive_int("N", N), _positive_int("d", d)
        if not count_only:
            Q, K, V = (rng.standard_normal((N, d)) for _ in range(3))
    if dO is not None:
        dO = _check_dO(dO, N, d)
    elif backward and not count_only:
        dO = rng.standard_normal((N, d))
    if scale is None:
        scale = default_scale(d)
    elif not np.isfinite(scale):
        raise InputError("scale", "must be a finite number", scale)

    t = algo.choose_tiling(N, d, M, tiling)
    t_bwd = algo.backward_tiling(N, d, M, tiling) if backward else None  # before any work: a too-small M fails fast
    np_dtype = np.dtype(dtype)
    mem = TwoLevelMemory(M, strict=strict)
    data = (None, None, None) if count_only else (Q, K, V)
    outputs = algo.forward(mem, *data, N, d, t, scale, causal, np_dtype)
    errors: dict[str, float] = {}
    if not count_only:
        O_ref, L_ref = attention_forward(Q, K, V, scale=scale, causal=causal)
        errors["O"] = float(np.max(np.abs(outputs["O"] - O_ref)))
        if outputs.get("L") is not None:
            errors["L"] = float(np.max(np.abs(outputs["L"] - L_ref)))
    lb, lb_name = bounds.lower_bound(N, d, M)
    fwd = PassResult(
        "forward",
        mem.stats(),
        algo.predict_forward(N, d, M, t, causal),
        lb,
        lb_name,
        errors,
        t,
    )
    passes = {"forward": fwd}
    if backward:
        mem_bwd = TwoLevelMemory(M, strict=strict)  # a fresh fast memory: the backward is a separate kernel
        grads = algo.backward(mem_bwd, *data, None if count_only else dO, outputs, N, d, t_bwd, scale, causal, np_dtype)
        errors_bwd: dict[str, float] = {}
        if not count_only:
            refs = attention_backward(Q, K, V, dO, scale=scale, causal=causal)
            for name, ref in zip(("dQ", "dK", "dV"), refs, strict=True):
                errors_bwd[name] = float(np.max(np.abs(grads[name] - ref)))
        lb_bwd, lb_bwd_name = bounds.lower_bound(N, d, M, backward=True)
        passes["backward"] = PassResult(
            "backward",
            mem_bwd.stats(),
            algo.predict_backward(N, d, M, t_bwd, causal),
            lb_bwd,
            lb_bwd_name,
            errors_bwd,
            t_bwd,
        )
        outputs = {**outputs, **grads}
    return Result(algorithm, N, d, M, bool(causal), bool(count_only), dtype, t_bwd or t, passes, outputs)

"""What a run returns: :class:`Result` (every pass's counts, the closed form, the bounds, the errors, the outputs, and
the problem, schedule and memory it came from) and :class:`PassResult` (one pass)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from iosim.memory_model import Stats, Trace
from iosim.spec.problem import Problem
from iosim.spec.schedule import Schedule
from iosim.theory import bounds
from iosim.theory.io_model import Prediction
from iosim.theory.tiling import Tiling


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
    mask: str = "none"  # the mask's label (``causal`` for the causal flag); see iosim.masking.masks
    kv_policy: str = "paper"  # the empty-block policy (iosim.algorithms.tile_masks.POLICIES)
    problem: Problem | None = None  # what was counted (provenance): B, heads, N_q, N_k, d_qk, d_v, dtypes
    schedule: dict = field(default_factory=dict)  # GQA policy, splits, MLA read, thread blocks (problem runs)
    seen: tuple[int, int] | None = None  # a mask over a problem: (rows that see a key, keys seen), per head
    # (iosim.spec.problem.SeenTotals: over the whole problem, a mask that differs per (b, h))
    spec: Schedule | None = None  # the schedule asked for (iosim.spec.schedule.Schedule), stamped by run()

    @property
    def bytes_per_array(self) -> dict[str, int]:
        """Bytes moved per array (reads + writes), each array at its dtype
        (:meth:`iosim.spec.problem.Problem.bytes_of`)."""
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
        from iosim.base.version import __version__

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
        out["memory"] = {"levels": "two-level", "M": self.M}
        if self.spec is not None:
            out["schedule_spec"] = self.spec.as_dict()
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

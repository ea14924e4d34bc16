"""How a problem is scheduled: the second of the three objects a run is made of (what: :class:`iosim.Problem`;
how: :class:`Schedule`; on what memory: ``M`` words of fast memory, or a hierarchy for :func:`iosim.hierarchy`).

A :class:`Schedule` names the algorithm and the pass, the tiling rule or explicit tiles, and over a problem the GQA
policy, split-KV's splits, MLA's read of V and the empty-block policy under a mask. Each field is checked once, in
``__post_init__``; ``as_dict()`` is its provenance in every JSON result. ``iosim.run(problem, schedule, M)`` runs it;
``iosim.run("flash2", N=..., d=..., M=...)`` builds the same objects from keywords.

>>> from iosim import Problem, Schedule, run
>>> r = run(Problem(H_q=4, H_kv=1, N_q=1, N_k=256, d=32), Schedule("flash2", gqa="packed"), 4096)
>>> r.stats.total == r.predicted.total
True
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from iosim.base.errors import InputError
from iosim.masking.masks import check_policy
from iosim.runner import registry
from iosim.runner.validate import MAX_N, positive_int
from iosim.spec.problem import GQA_POLICIES, MLA_POLICIES, PAGE_READS, Problem
from iosim.theory.tiling import RULES

SQUARE = ("standard", "square-tiling")  # the algorithms whose tiles are square (B); flash1, flash2 take Br and Bc


def explicit_tiles(algo: registry.Algorithm, Br, Bc, B) -> dict:
    """The explicit tiles given (validated: positive, and of the algorithm's kind)."""
    given = {k: positive_int(k, v, MAX_N) for k, v in (("Br", Br), ("Bc", Bc), ("B", B)) if v is not None}
    if not given:
        return given
    if not algo.builtin:
        raise InputError(
            ", ".join(given), f"apply to the built-in algorithms, not to {algo.name}", tuple(given.values())
        )
    if algo.name in SQUARE and ("Br" in given or "Bc" in given):
        raise InputError("Br, Bc", f"apply to flash1 and flash2; {algo.name} takes B (square tiles)", (Br, Bc))
    if algo.name not in SQUARE and "B" in given:
        raise InputError("B", f"applies to standard and square-tiling; {algo.name} takes Br and Bc", B)
    return given


@dataclass(frozen=True)
class Schedule:
    """How to schedule a problem: ``algorithm`` (a registered name), ``backward`` (the pass), ``tiling`` ("fit" or
    "paper") or explicit tiles (``Br``, ``Bc`` for flash1 and flash2; ``B`` for standard and square tiling), and
    over a problem ``gqa`` ("per-head" or "packed"), ``splits`` (split-KV, flash2), ``mla`` ("shared" or "naive"),
    ``pages`` (flash1 over a paged cache: "pieces", an outer step per page piece, or "gather", a column block's keys
    gathered from their pages first) and ``kv_policy`` (None: the run's default; "paper" or "skip": whether an empty
    block's outer operands load)."""

    algorithm: str
    backward: bool = False
    tiling: str = "fit"
    Br: int | None = None
    Bc: int | None = None
    B: int | None = None
    gqa: str = "per-head"
    splits: int = 1
    mla: str = "shared"
    kv_policy: str | None = None
    pages: str = "pieces"

    def __post_init__(self) -> None:
        algo = registry.get(self.algorithm)
        if not isinstance(self.backward, (bool, np.bool_)):
            raise InputError("backward", "must be True or False", self.backward)
        object.__setattr__(self, "backward", bool(self.backward))
        if self.backward and not algo.has_backward:
            raise InputError("backward", f"is not implemented for {self.algorithm}", self.backward)
        if not isinstance(self.tiling, str) or self.tiling not in RULES:
            raise InputError("tiling", f"must be one of {', '.join(RULES)}", self.tiling)
        explicit_tiles(algo, self.Br, self.Bc, self.B)
        if not isinstance(self.gqa, str) or self.gqa not in GQA_POLICIES:
            raise InputError("gqa", f"must be one of {', '.join(GQA_POLICIES)}", self.gqa)
        positive_int(
            "splits", self.splits, MAX_N
        )  # at most N_k and flash2's alone: checked against the problem by the run
        if not isinstance(self.mla, str) or self.mla not in MLA_POLICIES:
            raise InputError("mla", f"must be one of {', '.join(MLA_POLICIES)}", self.mla)
        check_policy(self.kv_policy, None)
        if not isinstance(self.pages, str) or self.pages not in PAGE_READS:
            raise InputError("pages", f"must be one of {', '.join(PAGE_READS)}", self.pages)

    @property
    def pass_name(self) -> str:
        return "backward" if self.backward else "forward"

    def as_dict(self) -> dict:
        """The schedule as it was asked for (provenance in a result's JSON)."""
        return asdict(self)

    def run_options(self) -> dict:
        """The keywords of :func:`iosim.run` this schedule stands for (all but the algorithm)."""
        out = self.as_dict()
        del out["algorithm"]
        return out


def from_objects(problem: Problem, schedule, options: dict) -> tuple[Schedule, dict]:
    """A problem and a schedule (a :class:`Schedule` or an algorithm's name) as the keywords of a keyword entry
    point (``iosim.run``, ``iosim.replay``): the schedule and the keywords ``options`` plus the problem's and the
    schedule's. A keyword that belongs to one of the objects is refused in one line."""
    if isinstance(schedule, str):
        schedule = Schedule(schedule)
    if not isinstance(schedule, Schedule):
        raise InputError("schedule", "must be an iosim.Schedule or an algorithm's name", type(schedule).__name__)
    clash = sorted(k for k, v in options.items() if v is not None and k in {*schedule.as_dict(), "problem", "N", "d"})
    if options.get("causal"):
        clash.append("causal")
    if clash:
        raise InputError(clash[0], "belongs to the Schedule or the Problem when they are given as objects")
    return schedule, {**options, "problem": problem, **schedule.run_options()}

"""The kernels each schedule launches, declared as the real implementations launch them (docs/hierarchy-launches.md).

A schedule's trace is cut into **pieces** (:func:`iosim.hierarchy.ctas.cut`: fast memory empty again at each end).
Every schedule and pass here **names** its kernels, in launch order, each with

* ``select``: which pieces are its work: ``("init",)`` the memset's (the trace's initialisations), ``("writes",
  X)`` the pieces that store array X, ``("reads", X)`` those that load X, ``("rest",)`` every other piece (the
  main kernel; a piece that moves only operands, such as a column block no query row sees under ``paper``, stays
  in it); ``("convert",)`` dQ's conversion (:data:`CONVERT_DQ`), which :func:`append_convert_dq` appends after the
  schedule's launches (it is no piece of the schedule's trace);
* ``grid``: ``piece`` (one CTA per piece of each unit: flash2's row block i, the backward's column block j, a
  product's output tile) or ``unit`` (one CTA per (batch, head) unit, or per KV head when packed, looping over
  its pieces inside: FlashAttention-1's forward and backward kernels);
* ``atomic``: the arrays its CTAs accumulate into with atomic adds (flash2's backward adds dQ_i in fp32);
* ``splits``: split-KV's main kernel (s > 1): a unit's pieces are (row block i, split k) with k fastest, as the
  schedule runs them; its grid puts the row block fastest (flash-attn 2's ``flash_fwd_splitkv_kernel``:
  blockIdx.x the row block, blockIdx.y the split, blockIdx.z the (batch, head)), which :meth:`Launches.grid_order`
  gives.

:func:`assign` maps the pieces onto the kernels and refuses a trace whose pieces do not follow the declared order.
:func:`check_races` refuses a launch whose CTAs would race: a region one CTA stores that another CTA of the same
launch loads or stores (a read-modify-write that is not atomic). FlashAttention-1's forward read-modify-writes O_i,
l_i, m_i at every column block: one CTA per column block would race, one CTA per head does not.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from iosim.base.errors import InputError
from iosim.hierarchy.ctas import REQ_WIDTH, Cut
from iosim.memory_model.core import INIT


@dataclass(frozen=True)
class Kernel:
    """One kernel of a launch sequence (module docstring)."""

    name: str
    models: str
    select: tuple
    grid: str = "piece"
    atomic: tuple = ()
    splits: int = 1


_FA1_FWD = "FlashAttention-1's fmha_fwd_loop_kernel: one thread block per (batch, head), column blocks looped inside"
_GROUP_SUM = Kernel("GQA group sum", "the sum of dK, dV over a KV head's g query heads", ("reads", "dKpart", "dVpart"))
_FA1_BWD = "FlashAttention-1's fmha_bwd_dq_dk_dv_loop_kernel: one thread block per (batch, head), column blocks inside"

KERNELS = {
    ("flash2", False): [
        Kernel("flash2 forward", "flash-attn 2 flash_fwd_kernel: one CTA per (row block, batch, head)", ("rest",)),
    ],
    ("flash1", False): [
        Kernel("memset O, l, m", "cudaMemset of O, l, m (Algorithm 1, step 2)", ("init",)),
        Kernel("flash1 forward", _FA1_FWD, ("rest",), grid="unit"),
    ],
    ("flash2", True): [
        Kernel("memset dQ", "cudaMemset of the dQ accumulator (dq_accum)", ("init",)),
        Kernel("preprocess D", "flash-attn 2 flash_bwd_dot_do_o_kernel: D = rowsum(dO o O)", ("writes", "D")),
        Kernel(
            "flash2 backward",
            "flash-attn 2 flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel: one CTA per (column block, batch, head), "
            "dQ_i added atomically in fp32",
            ("rest",),
            atomic=("dQ",),
        ),
        _GROUP_SUM,
    ],
    ("flash1", True): [
        Kernel("memset dQ, dK, dV", "cudaMemset of dQ, dK, dV (Algorithm 4, steps 3 and 6)", ("init",)),
        Kernel("flash1 backward", _FA1_BWD, ("rest",), grid="unit"),
        _GROUP_SUM,
    ],
    ("standard", False): [
        Kernel("S = Q K^T", "a GEMM: one CTA per output tile of S", ("writes", "S")),
        Kernel("P = softmax(S)", "a row softmax: one CTA per block of rows", ("writes", "P")),
        Kernel("O = P V", "a GEMM: one CTA per output tile of O", ("writes", "O")),
    ],
    ("standard", True): [
        Kernel("dV = P^T dO", "a GEMM: one CTA per output tile", ("writes", "dV")),
        Kernel("dP = dO V^T", "a GEMM: one CTA per output tile", ("writes", "dP")),
        Kernel("dS = softmax backward", "a row kernel: one CTA per block of rows", ("writes", "dS")),
        Kernel("dQ = dS K", "a GEMM: one CTA per output tile", ("writes", "dQ")),
        Kernel("dK = dS^T Q", "a GEMM: one CTA per output tile", ("writes", "dK")),
    ],
    ("square-tiling", False): [
        Kernel("phase 1 (S, L)", "square tiling's first kernel: one CTA per row tile", ("writes", "L")),
        Kernel("phase 2 (O)", "square tiling's second kernel: one CTA per row tile", ("writes", "O")),
    ],
    ("square-tiling", True): [
        Kernel("dS", "square tiling's backward phase 1: one CTA per row tile", ("writes", "dS")),
        Kernel("dV", "a product: one CTA per output tile", ("writes", "dV")),
        Kernel("dQ", "a product: one CTA per output tile", ("writes", "dQ")),
        Kernel("dK", "a product: one CTA per output tile", ("writes", "dK")),
    ],
}


def split_kv(s: int) -> list[Kernel]:
    """flash2's forward under split-KV with s splits: the split kernel (one CTA per (row block, split, batch, head),
    each writing its partial O_i and logsumexp into Opart, Lpart), then the combine kernel (one CTA per block of
    rows, reading the s partials and writing O, L)."""
    return [
        Kernel(
            "flash2 split-KV forward",
            "flash-attn 2 flash_fwd_splitkv_kernel: one CTA per (row block, split, batch, head), writing Opart, Lpart",
            ("rest",),
            splits=s,
        ),
        Kernel(
            "split-KV combine",
            "flash-attn 2 flash_fwd_splitkv_combine_kernel: one CTA per block of rows, reading the s partials",
            ("reads", "Lpart"),
        ),
    ]


def kernels(algorithm: str, backward: bool, splits: int = 1) -> list[Kernel]:
    """The kernels ``algorithm``'s pass launches, in order (module docstring); ``splits`` > 1: flash2's forward under
    split-KV (:func:`split_kv`). An algorithm registered by a user declares none: its memset (if it initialises
    memory), then one kernel with a CTA per piece, which :func:`check_races` refuses if its pieces read-modify-write
    one another's regions."""
    if splits != 1 and (algorithm, bool(backward)) == ("flash2", False):
        return split_kv(int(splits))
    if (algorithm, bool(backward)) in KERNELS:
        return KERNELS[(algorithm, bool(backward))]
    return [Kernel("memset", "cudaMemset of what it initialises", ("init",)),
            Kernel(algorithm, "a user schedule: one CTA per piece", ("rest",))]  # fmt: skip


# dQ's conversion (flash2's backward, where dQ's output dtype is not its fp32 accumulator's): a launch after the
# schedule's, which iosim run does not count (the paper's schedule ends with dQ in HBM). It reads the accumulator,
# DQ_ACCUM (dQ's own addresses: the same lines), and writes DQ_OUT (an array of its own, at the output dtype).
DQ_ACCUM, DQ_OUT = "dq_accum", "dQ_out"
CONVERT_DQ = Kernel(
    "convert dQ",
    "flash-attn 2 flash_bwd_convert_dq_kernel: one CTA per (row block, batch, head), reading dq_accum (fp32) and "
    "writing dQ at the output dtype",
    ("convert",),
)


@dataclass(frozen=True)
class Launches:
    """The declared launches of one unit's trace: launch k runs CTAs ``launch_ptr[k]:launch_ptr[k + 1]``; CTA c's
    requests are rows ``cta_ptr[c]:cta_ptr[c + 1]`` of the cut's requests. ``kernels`` are the launched ones (a
    declared kernel with no piece, such as the combine without splits, is not launched)."""

    kernels: list[Kernel]
    launch_ptr: np.ndarray
    cta_ptr: np.ndarray

    @property
    def ctas(self) -> int:
        return len(self.cta_ptr) - 1

    def grid_order(self, k: int) -> np.ndarray:
        """The CTAs of launch k in its grid's order: piece order, except split-KV's main kernel, whose (row block,
        split) pieces run with the row block fastest (module docstring)."""
        c0, c1 = int(self.launch_ptr[k]), int(self.launch_ptr[k + 1])
        ids = np.arange(c0, c1, dtype=np.int64)
        s = self.kernels[k].splits
        if s == 1:
            return ids
        if (c1 - c0) % s:
            raise InputError("splits", f"must cut every row block into {s} pieces; the split kernel has {c1 - c0}", s)
        return ids.reshape(-1, s).T.ravel()


def _piece_kernel(kinds: list[Kernel], names: list[str], reqs: np.ndarray, has_init: bool) -> int:
    for k, kern in enumerate(kinds):
        sel = kern.select
        if sel[0] == "init" and has_init:
            return k
        want = 1 if sel[0] == "writes" else 0
        for array in sel[1:] if sel[0] in ("writes", "reads") else ():  # any of the arrays named
            if array in names and np.any((reqs[:, 1] == names.index(array)) & (reqs[:, 0] == want)):
                return k
    for k, kern in enumerate(kinds):
        if kern.select[0] == "rest":
            return k
    return -1


def assign(cut, trace, kinds: list[Kernel]) -> Launches:
    """Map the cut's pieces onto the declared kernels (module docstring); the CTAs of each launch by its grid."""
    names = list(trace.names)
    ev = np.asarray(trace.events)
    of = np.empty(cut.pieces, np.int64)
    for p in range(cut.pieces):
        lo, hi = cut.piece_ptr[p], cut.piece_ptr[p + 1]
        s, e = cut.piece_events[p]
        of[p] = _piece_kernel(kinds, names, cut.requests[lo:hi], bool(np.any(ev[s:e, 0] == INIT)))
        if of[p] < 0 or (p and of[p] < of[p - 1]):
            raise InputError(
                "schedule",
                f"its piece {p} does not follow the declared launches ({', '.join(k.name for k in kinds)})",
                names[int(cut.requests[lo, 1])] if hi > lo else p,
            )
    launched, launch_ptr, cta_ptr = [], [0], [0]
    for k, kern in enumerate(kinds):
        ps = np.flatnonzero(of == k)
        if not len(ps):
            continue
        launched.append(kern)
        if kern.grid == "unit":
            cta_ptr.append(int(cut.piece_ptr[ps[-1] + 1]))
        else:
            cta_ptr.extend(int(cut.piece_ptr[p + 1]) for p in ps)
        launch_ptr.append(len(cta_ptr) - 1)
    return Launches(launched, np.asarray(launch_ptr, np.int64), np.asarray(cta_ptr, np.int64))


@njit(cache=True)
def _race(req, cta_ptr, c0, c1, aoff, cols, atomic, owner):  # noqa: N803
    """The first request index of CTAs c0:c1 that touches a region another CTA stores (non-atomic), else -1."""
    for op in (1, 0):  # stores claim their words first, then every load and store is checked against the owners
        for c in range(c0, c1):
            for k in range(cta_ptr[c], cta_ptr[c + 1]):
                w, a, r0, nr, q0, nc = req[k, 0], req[k, 1], req[k, 2], req[k, 3], req[k, 4], req[k, 5]
                if aoff[a] < 0 or atomic[a] or (op == 1 and w != 1):
                    continue
                for r in range(r0, r0 + nr):
                    base = aoff[a] + r * cols[a]
                    for q in range(q0, q0 + nc):
                        o = owner[base + q]
                        if op == 1:
                            if o >= 0 and o != c:
                                return k
                            owner[base + q] = c
                        elif o >= 0 and o != c:
                            return k
    return -1


def check_races(cut, trace, launches: Launches) -> None:
    """Refuse a launch in which a region one CTA stores is loaded or stored by another CTA (module docstring). The
    arrays checked are those the launch both loads and stores (its read-modify-writes; a pure output, such as a
    product's tiles, is written once by each CTA), word by word."""
    names = list(trace.names)
    req = cut.requests
    for k, kern in enumerate(launches.kernels):
        c0, c1 = int(launches.launch_ptr[k]), int(launches.launch_ptr[k + 1])
        rows = req[launches.cta_ptr[c0] : launches.cta_ptr[c1]]
        stored = np.unique(rows[(rows[:, 0] == 1) & (rows[:, 6] > 0)][:, 1]) if len(rows) else []
        loaded = set(rows[rows[:, 0] == 0][:, 1].tolist()) if len(rows) else set()
        stored = [a for a in stored if int(a) in loaded]  # read-modify-written in this launch
        aoff = np.full(len(names), -1, np.int64)
        cols = np.array([trace.shapes[n][1] for n in names], np.int64)
        total = 0
        for a in stored:
            if names[a] in kern.atomic:
                continue
            aoff[a] = total
            total += trace.shapes[names[a]][0] * cols[a]
        if total == 0 or c1 - c0 < 2:
            continue
        atomic = np.array([n in kern.atomic for n in names], np.bool_)
        owner = np.full(total, -1, np.int32)
        bad = _race(req, launches.cta_ptr, c0, c1, aoff, cols, atomic, owner)
        if bad >= 0:
            raise InputError(
                "schedule",
                f"launch '{kern.name}' would race: its thread blocks read-modify-write {names[int(req[bad, 1])]} "
                "(one stores a region another loads or stores, not atomically); such a kernel runs one thread "
                "block per head",
                kern.grid,
            )


def append_convert_dq(cut: Cut, launched: Launches, names: list, shapes: dict, Br: int) -> tuple:
    """The cut, launches, names and shapes with dQ's conversion appended (:data:`CONVERT_DQ`): one CTA per row block
    of Br rows of the unit's dQ (the backward kernel's row block, as flash-attn's kBlockM), each loading its rows of
    :data:`DQ_ACCUM` and storing them to :data:`DQ_OUT`; every row once, so exactly the words of dQ each way."""
    rows, width = shapes["dQ"]
    names = [*names, DQ_ACCUM, DQ_OUT]
    shapes = {**shapes, DQ_ACCUM: (rows, width), DQ_OUT: (rows, width)}
    a_in, a_out = len(names) - 2, len(names) - 1
    req = []
    for r0 in range(0, rows, Br):
        br = min(Br, rows - r0)
        req += [(0, a_in, r0, br, 0, width, br * width), (1, a_out, r0, br, 0, width, br * width)]
    new = np.asarray(req, np.int64).reshape(-1, REQ_WIDTH)
    ends = len(cut.requests) + np.arange(2, len(new) + 1, 2, dtype=np.int64)  # each CTA: its load, its store
    events = np.concatenate((cut.piece_events, np.full((len(ends), 2), -1, np.int64)))  # no trace events
    cut = Cut(np.concatenate((cut.requests, new)), np.concatenate((cut.piece_ptr, ends)), events)
    cta_ptr = np.concatenate((launched.cta_ptr, ends))  # the schedule's last CTA ends at its last request
    launch_ptr = np.append(launched.launch_ptr, len(cta_ptr) - 1)
    return cut, Launches([*launched.kernels, CONVERT_DQ], launch_ptr, cta_ptr), names, shapes

"""The long-run rule, in one place: every path that can run for a long time estimates its time first.

A run estimated at over :data:`LONG_SECONDS` (a minute) needs the caller's consent (``allow_long=True`` in the API,
``--yes`` on the command line); over :data:`MAX_SECONDS` (an hour) it is refused. The refusal is an
:class:`~iosim.base.errors.InputError` naming the parameter that makes it long and the estimate, raised before any work.

The costs per unit are fitted to CPU time (``time.process_time``; the runs are single-threaded) by
``python experiments/bench/estimates.py --fit`` on the 2-core development machine, which prints estimate / measured
for every path below on a grid of sizes (docs/benchmarks.md has the table: every ratio within 0.5-2 but square
tiling's count-only backward, and a count-only backward and ``block_sparse``'s count of a random mask over a
problem, which the problem drivers price; the CUDA simulator has a benchmark of its own). Each is a cost per unit
of work, so it carries over to the problem drivers:

- count-only schedule: :data:`COUNT_STEP` per tile step (:func:`iosim.runner.validate.estimated_steps`), least squares
over
  flash1, flash2, standard and square tiling forward and backward at N = 2^17-2^20: 4 ns (measured 2.5-5.3 ns; flash1
  is the slowest, square tiling's forward the fastest; the fit gives 3.3-3.4 ns). Square tiling's count-only backward
  costs about 0.35 ns times B per tile step (it walks the rows of its tiles), so its estimate is 0.13 of its time at
  B = 78: the estimate gets the tiling, not the algorithm, and standard attention's backward, on the same kind of
  tiling, costs 4 ns a step;
- numeric schedule plus its float64 reference: :data:`NUMERIC_N2D` per N_q N_k (d_qk + d_v) (2 N^2 d for one head),
  :data:`NUMERIC_BACKWARD` times that for a backward run (its forward, the backward and both references), plus
  :data:`NUMERIC_STEP` per tile step; least squares over the four algorithms, forward and backward, N = 2048-8192,
  d = 32-128, M = 1024-16384, gives 0.34-0.35 ns, 2.5-2.7 and 0.75-0.97 us; taken as 0.38 ns, 2.5 and 0.8 us, the
  middle of the grid's spread (standard attention's forward, which writes and reads S and P, takes about twice
  flash2's time);
- a kernel on the CUDA simulator (``iosim check`` without a GPU): :data:`SIMULATOR_N2D` = 12 us per N_q N_k d of a
  head (three times that for a kernel with a backward), the geometric middle of 3.5-25 us measured over the four
  kernels at N = 32-64, d = 16-32 (``python experiments/bench/simulator.py``, its own benchmark: the simulator's
  threads race unless its module swap is made thread-safe, which that benchmark does). The simulator's time moves by
  two to three times between runs on this shared machine (its threads contend for the interpreter), and the kernels
  differ by four times (flash1's the cheapest, square tiling's the dearest), so its ratios span about 0.5-3;
- a cache replay, the traced run and the ops' derivation included (flash1 and flash2 at N = 512 and 1024): 3.4-5 ns
  per operand access under LRU, 0.6 of that under FIFO, 26 ns under Belady's OPT (its trace and next-use array);
  taken as :data:`REPLAY_ACCESS` = 5 ns, 3 ns and 40 ns, and at least N^2 d accesses before the run;
- the pebble search (A*): 110-260 us per expanded state on graphs of 20-28 vertices (matmul:2x2x2, attention:2x1,
  matmul:2x2x3 with M = 3, each stopped at its ``max_states``), taken as :data:`PEBBLE_STATE` = 150 us, so the
  default 400,000 states is estimated at a minute (the ask is for more);
- counting a random mask (``random:S``, ``random-blocks``, ``bigbird``): :data:`MASK_SCAN_DRAW` = 0.27 ns per draw
  of a count of the whole mask (:attr:`TileMask.scan_tests`; measured 0.4 ns: ``iosim bounds`` over ``random:0.01``
  at N = 32768 makes one count, a one-head run about two and a half), :data:`MASK_DRAW` = 2 ns per draw of a tile's
  test (:meth:`TileMask.visit_tests`, :meth:`TileMask.tile_tests`). A one-head run is priced as three counts (its
  time estimate, its closed form and the run), which errs long: the estimate and the closed form share one count,
  and a run's random-element tiles stop at their first allowed and first forbidden element;
- a shared-L2 launch (:func:`iosim.hierarchy`): 0.32-0.44 us per tile request of all its CTAs, the unit's run and
  LRU included (H100 preset: flash2 at N = 32k, 2.5 and 19 million requests; decoding at N_k = 1M, 0.3 and 1.2
  million), taken as :data:`HIERARCHY_REQUEST` = 0.6 us (Belady's OPT replays the line stream once more: twice
  that).
"""

from __future__ import annotations

from iosim.base.errors import InputError
from iosim.memory_model.core import available_bytes  # noqa: F401 (the memory model's, used here by name)

LONG_SECONDS = 60.0
MAX_SECONDS = 3600.0

COUNT_STEP = 4e-9
NUMERIC_N2D = 3.8e-10  # per N_q N_k (d_qk + d_v): 2 N^2 d for one head
NUMERIC_BACKWARD = 2.5  # a backward run (its forward, the backward and both references) on the arithmetic
NUMERIC_STEP = 8e-7
SIMULATOR_N2D = 1.2e-5
REPLAY_ACCESS = 5e-9
REPLAY_OPT_FACTOR = 8.0  # Belady's OPT costs about 8 times an LRU access (it holds the trace and its next uses)
REPLAY_FIFO_FACTOR = 0.6  # FIFO about 0.6 of LRU (no reordering on a hit)
PEBBLE_STATE = 1.5e-4
COUNT_BACKWARD = 2.0  # a count-only backward tile step over a problem moves about twice a forward step's operands
SQUARE_BACKWARD_PER_B = 3.5e-10  # square tiling's count-only backward: about 0.35 ns x B a tile step (its products)
MASK_DRAW = 2e-9  # a draw of a tile's test (TileMask.visit_tests, tile_tests)
MASK_SCAN_DRAW = 2.7e-10  # a draw of a count of the whole mask (TileMask.scan_tests)
HIERARCHY_REQUEST = 6e-7


def describe(seconds: float) -> str:
    """``seconds`` in words: '40 s', '12 minutes', '3.5 hours'."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} minutes"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds / 86400:,.0f} days"


def check(seconds: float, what: str, *, allow_long, parameter: str, value=None, remedy: str = "") -> float:
    """Apply the rule to ``what`` (a run described in words) estimated at ``seconds``: over an hour an InputError on
    ``parameter`` (the size that makes it long); over a minute an InputError on ``allow_long`` unless it is True."""
    if not isinstance(allow_long, bool):
        raise InputError("allow_long", "must be True or False", allow_long)
    tail = f"; {remedy}" if remedy else ""
    if seconds > MAX_SECONDS:
        raise InputError(
            parameter,
            f"gives {what} of about {describe(seconds)} (estimated; the limit is {MAX_SECONDS / 3600:.0f} hour){tail}",
            value,
        )
    if seconds > LONG_SECONDS and not allow_long:
        raise InputError(
            "allow_long",
            f"must be True (--yes) for {what} estimated at about {describe(seconds)} (over a minute){tail}",
            allow_long,
        )
    return seconds


def count_only_seconds(steps: int, per_step: float = COUNT_STEP) -> float:
    return steps * per_step


def count_step(algorithm: str | None, backward: bool, tiling) -> float:
    """The cost of one count-only tile step of ``algorithm``'s pass on ``tiling``: :data:`COUNT_STEP`, except square
    tiling's backward, whose step grows with its tile side B (:data:`SQUARE_BACKWARD_PER_B`)."""
    B = getattr(tiling, "B", None)
    if algorithm == "square-tiling" and backward and B:
        return max(COUNT_STEP, SQUARE_BACKWARD_PER_B * B)
    return COUNT_STEP


def numeric_seconds(N: int, d: int, steps: int, backward: bool, heads: int = 1) -> float:  # noqa: N803
    """A numeric run and its float64 reference: arithmetic (N^2 (d_qk + d_v) = 2 N^2 d per head) plus per-tile
    overhead (``steps``: every head's)."""
    return heads * N * N * 2 * d * NUMERIC_N2D * (NUMERIC_BACKWARD if backward else 1) + steps * NUMERIC_STEP


def simulator_seconds(cases, heads: int, batch: int = 1, backward: bool = False) -> float:
    """A kernel on the CUDA simulator over ``cases`` (objects with N_q, N_k, d)."""
    work = sum(c.N_q * max(c.N_k, 1) * c.d for c in cases) * heads * batch
    return work * SIMULATOR_N2D * (3 if backward else 1)


def replay_seconds(accesses: int, policies) -> float:
    per = {"opt": REPLAY_OPT_FACTOR, "fifo": REPLAY_FIFO_FACTOR}
    return sum(accesses * REPLAY_ACCESS * per.get(p, 1.0) for p in policies)


def pebble_seconds(max_states: int) -> float:
    return max_states * PEBBLE_STATE


def _mask_draws(mask, passes: int, tiling=None) -> tuple[int, int]:
    """Generator draws of ``passes`` counts of ``mask`` (:attr:`TileMask.scan_tests` each) and, with a tiling (an
    object with Br and Bc, or B), those of testing its tiles (:meth:`TileMask.visit_tests`): a random mask's schedule
    tests every tile, empty or not, and so does its tile summary (the estimate's and the closed form's, shared):
    two visits of every tile whatever ``passes``."""
    scan = getattr(mask, "scan_tests", 0)
    visits = 0
    if scan and tiling is not None:
        Br = getattr(tiling, "Br", None) or getattr(tiling, "B", None)
        Bc = getattr(tiling, "Bc", None) or getattr(tiling, "B", None)
        if Br and Bc:
            visits = 2 * -(-mask.N // Br) * -(-mask.N // Bc) * mask.visit_tests(Br, Bc)
    return scan * passes, visits


def mask_seconds(mask, passes: int = 1, tiling=None) -> float:
    """Counting a mask ``passes`` times (and testing the tiles of ``tiling``, when given): its scans' draws (0 for
    the masks counted in closed form or from a table) at :data:`MASK_SCAN_DRAW` each, its tile tests' at
    :data:`MASK_DRAW`."""
    scan, visits = _mask_draws(mask, passes, tiling)
    return scan * MASK_SCAN_DRAW + visits * MASK_DRAW


def check_mask(mask, *, passes: int, allow_long, tiling=None) -> float:
    """The rule for the time spent counting a random mask (the parameter named is the mask), ``passes`` times and,
    with ``tiling``, testing its tiles."""
    scan, visits = _mask_draws(mask, passes, tiling)
    if not scan + visits:
        return 0.0
    what = f"a count of the mask {mask.label} at N = {mask.N:,} ({scan + visits:,} generator draws)"
    remedy = "use a smaller N, larger blocks or a structured mask"
    return check(mask_seconds(mask, passes, tiling), what, allow_long=allow_long, parameter="mask", value=mask.label,
                 remedy=remedy)  # fmt: skip

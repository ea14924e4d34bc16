"""The long-run rule, in one place: every path that can run for a long time estimates its time first.

A run estimated at over :data:`LONG_SECONDS` (a minute) needs the caller's consent (``allow_long=True`` in the API,
``--yes`` on the command line); over :data:`MAX_SECONDS` (an hour) it is refused. The refusal is an
:class:`~iosim.errors.InputError` naming the parameter that makes it long and the estimate, raised before any work.

The costs per unit are measured on the 2-core development machine (rounded up, so an estimate errs long):

- count-only schedule: about 5 ns per tile step (experiments/bench/cpu.py), taken as 20 ns;
- numeric schedule plus its float64 reference: 1.2-8 ns per N^2 d of a forward (4-52 ns backward) and 1.2-2 us
  per tile step at small M (flash1/flash2/standard/square-tiling, N = 1024, d = 64): taken as 1.5 ns per N^2 d
  (three times that backward) plus 3 us per tile step;
- a kernel on the CUDA simulator: 12 s at N = 256, d = 16 (about 12 us per N_q N_k d of one head), taken as 15 us;
- a cache replay, the traced run and the ops' derivation included (experiments/bench/estimates.py, flash2 at
  N = 512 and 1024, quiet): 3.4 ns per operand access under LRU (FIFO is faster), 26 ns under Belady's OPT (its
  trace and next-use array); taken as 5 ns and 40 ns, and at least N^2 d accesses before the run;
- the pebble search (A*): about 10 us per expanded state (measured 3-6 us on matmul and attention graphs);
- counting a random mask (``random:S``, ``random-blocks``, ``bigbird``): about 0.6 ns per generator draw (2^32
  elements of ``random:0.01`` in 2.7 s, compile included), taken as 2 ns, :attr:`TileMask.scan_tests` draws a
  count. A run is priced as three counts (its time estimate, its closed form and the run), which errs long: the
  estimate and the closed form summarise the same tiling and share one count (the summary is kept), and a run's
  random-element tiles stop at their first allowed and first forbidden element;
- a shared-L2 launch (:func:`iosim.hierarchy`): 0.32-0.44 us per tile request of all its CTAs, the unit's run and
  LRU included (H100 preset: flash2 at N = 32k, 2.5 and 19 million requests; decoding at N_k = 1M, 0.3 and 1.2
  million), taken as 0.6 us (Belady's OPT replays the line stream once more: twice that).
"""

from __future__ import annotations

from iosim.errors import InputError
from iosim.memory_model.core import available_bytes  # noqa: F401 (the memory model's, used here by name)

LONG_SECONDS = 60.0
MAX_SECONDS = 3600.0

COUNT_STEP = 2e-8
NUMERIC_N2D = 1.5e-9
NUMERIC_STEP = 3e-6
SIMULATOR_N2D = 1.5e-5
REPLAY_ACCESS = 5e-9
REPLAY_OPT_FACTOR = 8.0  # Belady's OPT costs about 8 times an LRU access (it holds the trace and its next uses)
PEBBLE_STATE = 1e-5
MASK_DRAW = 2e-9
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


def count_only_seconds(steps: int) -> float:
    return steps * COUNT_STEP


def numeric_seconds(N: int, d: int, steps: int, backward: bool) -> float:  # noqa: N803
    """A numeric run and its float64 reference: arithmetic (N^2 d) plus per-tile overhead."""
    return N * N * d * NUMERIC_N2D * (3 if backward else 1) + steps * NUMERIC_STEP


def simulator_seconds(cases, heads: int, batch: int = 1, backward: bool = False) -> float:
    """A kernel on the CUDA simulator over ``cases`` (objects with N_q, N_k, d)."""
    work = sum(c.N_q * max(c.N_k, 1) * c.d for c in cases) * heads * batch
    return work * SIMULATOR_N2D * (3 if backward else 1)


def replay_seconds(accesses: int, policies) -> float:
    per = {"opt": REPLAY_OPT_FACTOR}
    return sum(accesses * REPLAY_ACCESS * per.get(p, 1.0) for p in policies)


def pebble_seconds(max_states: int) -> float:
    return max_states * PEBBLE_STATE


def _mask_tests(mask, passes: int, tiling=None) -> int:
    """Generator draws of ``passes`` counts of ``mask`` (:attr:`TileMask.scan_tests` each) plus, with a tiling (an
    object with Br and Bc, or B), the tests of its tiles (:meth:`TileMask.visit_tests`): a random mask's schedule
    tests every tile, empty or not, and so does its tile summary (the estimate's and the closed form's, shared):
    two visits of every tile whatever ``passes``."""
    scan = getattr(mask, "scan_tests", 0)
    tests = scan * passes
    if scan and tiling is not None:
        Br = getattr(tiling, "Br", None) or getattr(tiling, "B", None)
        Bc = getattr(tiling, "Bc", None) or getattr(tiling, "B", None)
        if Br and Bc:
            tests += 2 * -(-mask.N // Br) * -(-mask.N // Bc) * mask.visit_tests(Br, Bc)
    return tests


def mask_seconds(mask, passes: int = 1, tiling=None) -> float:
    """Counting a mask ``passes`` times (and testing the tiles of ``tiling``, when given): its generator draws (0
    for the masks counted in closed form or from a table) at :data:`MASK_DRAW` each."""
    return _mask_tests(mask, passes, tiling) * MASK_DRAW


def check_mask(mask, *, passes: int, allow_long, tiling=None) -> float:
    """The rule for the time spent counting a random mask (the parameter named is the mask), ``passes`` times and,
    with ``tiling``, testing its tiles."""
    tests = _mask_tests(mask, passes, tiling)
    if not tests:
        return 0.0
    what = f"a count of the mask {mask.label} at N = {mask.N:,} ({tests:,} generator draws)"
    remedy = "use a smaller N, larger blocks or a structured mask"
    return check(tests * MASK_DRAW, what, allow_long=allow_long, parameter="mask", value=mask.label,
                 remedy=remedy)  # fmt: skip

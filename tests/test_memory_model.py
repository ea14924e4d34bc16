"""The tile-aware memory model: handles and residency, schedule errors, capacity, the event trace and its replay,
the counters-only fast memory, and the plain-Python schedule API (iosim.memory_model.schedule)."""

import doctest

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings
from iosim.algorithms.reference import default_scale
from iosim.memory_model import (
    MAX_TILES,
    CapacityError,
    FastTile,
    Memory,
    ScheduleError,
    Stats,
    TwoLevelMemory,
    alloc,
    alloc_vec,
    core,
    free,
    init_slow,
    load,
    load_vec,
    schedule,
    store,
    store_to,
    store_vec,
)
from numba import njit

from iosim.runner import registry

BUILTIN = ("standard", "flash1", "flash2", "square-tiling")
N, D, M = 67, 5, 400  # ragged: no block size divides N


# ---------------------------------------------------------------------------------------------------------------
# Small @njit drivers (module level: Numba caches them, and TwoLevelMemory.call derives their count-only variants).
# ---------------------------------------------------------------------------------------------------------------


@njit(cache=True)
def _double_free(W, a):
    h = alloc(W, a, 0, 2, 0, 2)
    free(W, h)
    free(W, h)


@njit(cache=True)
def _store_after_free(W, a):
    h = load(W, a, None, 0, 2, 0, 2, None)
    free(W, h)
    store(W, h, None, None)


@njit(cache=True)
def _region(W, a, r0, nr, c0, nc):
    free(W, alloc(W, a, r0, nr, c0, nc))


@njit(cache=True)
def _too_many_tiles(W, a, n):
    for i in range(n):
        alloc(W, a, i, 1, 0, 1)


@njit(cache=True)
def _leak(W, a, b):
    free(W, load(W, a, None, 0, 1, 0, 3, None))
    load(W, b, None, 1, 2, 0, 1, None)


@njit(cache=True)
def _overflow(W, a):
    h1 = alloc(W, a, 0, 2, 0, 4)  # 8 words
    h2 = alloc(W, a, 2, 1, 0, 4)  # 4 more
    free(W, h1)
    free(W, h2)


@njit(cache=True)
def _copy_rows(W, ia, A, ib, B, il, lsrc, Br):
    """B = 2 A block by block, and l -> l (a vector round trip), with a memset of l: every kind of op."""
    n, m = A.shape
    buf = np.empty((Br, m))
    init_slow(W, il, n)
    for r0 in range(0, n, Br):
        br = min(Br, n - r0)
        h = load(W, ia, A, r0, br, 0, m, buf)
        for r in range(br):
            for c in range(m):
                buf[r, c] *= 2.0
        store_to(W, h, buf, ib, B, r0, 0)
        free(W, h)
    v = np.empty(n)
    hv = load_vec(W, il, lsrc, 0, n, v)
    hs = alloc_vec(W, il, 0, n)
    store_vec(W, hv, v, lsrc)
    free(W, hs)
    free(W, hv)


def _python_copy_rows(mem, A, B, l_, Br):
    """:func:`_copy_rows` written with the schedule API."""
    n = A.shape[0]
    mem.init(l_, 0.0)
    for r0 in range(0, n, Br):
        t = mem.load(A, rows=(r0, min(n, r0 + Br)))
        t.data *= 2.0
        mem.store(t, to=B)
        mem.free(t)
    v = mem.load(l_)
    s = mem.alloc(l_)
    mem.store(v)
    mem.free(s, v)


# ---------------------------------------------------------------------------------------------------------------
# Handles, data and residency
# ---------------------------------------------------------------------------------------------------------------


def test_load_store_by_handle_copy_data_and_count_per_array():
    mem = TwoLevelMemory(100)
    q, o = mem.ids(Q=(5, 4), O=(5, 4))
    src, out = np.arange(20.0).reshape(5, 4), np.full((5, 4), np.nan)
    dst = np.zeros((3, 4))
    h = load(mem.W, q, src, 1, 3, 0, 4, dst)
    assert np.array_equal(dst, src[1:4]) and mem.resident == 12
    (tile,) = mem.resident_tiles()
    assert (tile.handle, tile.array, tile.r0, tile.nr, tile.c0, tile.nc, tile.words) == (h, "Q", 1, 3, 0, 4, 12)
    store_to(mem.W, h, dst, o, out, 2, 0)
    assert np.array_equal(out[2:5], src[1:4]) and np.isnan(out[:2]).all()
    free(mem.W, h)
    s = mem.stats()
    assert (s.reads, s.writes, s.total, s.peak, mem.resident) == (12, 12, 24, 12, 0)
    assert s.per_array["Q"].reads == 12 and s.per_array["O"].writes == 12
    assert mem.resident_tiles() == []


def test_vectors_scratch_and_init_writes():
    mem = TwoLevelMemory(10)
    l_, m = mem.ids(l=(6,), m=(6,))
    v, buf = np.arange(6.0), np.zeros(6)
    hl = load_vec(mem.W, l_, v, 2, 3, buf)
    assert np.array_equal(buf[:3], v[2:5])
    hm = alloc_vec(mem.W, m, 0, 4)
    store_vec(mem.W, hm, buf, v)
    init_slow(mem.W, m, 6)
    assert mem.resident_by_array() == {"l": 3, "m": 4}
    free(mem.W, hl)
    free(mem.W, hm)
    s = mem.stats()
    assert s.peak == 7 and s.at_peak == {"l": 3, "m": 4}
    assert s.per_array["m"] == core.ArrayCounts(0, 10, 6) and s.init_writes == 6
    assert np.array_equal(v[:4], [2.0, 3.0, 4.0, 0.0])  # buf[:4] written to its region


def test_residency_and_the_composition_at_the_peak():
    mem = TwoLevelMemory(1000)
    q, k, s = mem.ids(Q=(10, 4), K=(10, 4), S=(10, 10))
    hq = load(mem.W, q, None, 0, 5, 0, 4, None)
    hk = load(mem.W, k, None, 0, 3, 0, 4, None)
    hs = alloc(mem.W, s, 0, 5, 0, 3)
    assert mem.resident_by_array() == {"Q": 20, "K": 12, "S": 15}
    assert [t.array for t in mem.resident_tiles()] == ["Q", "K", "S"]  # oldest first
    free(mem.W, hk)
    free(mem.W, hs)
    hk = load(mem.W, k, None, 3, 2, 0, 4, None)  # a smaller peak later does not move at_peak
    assert [t.handle for t in mem.resident_tiles()] == [hq, hk]
    free(mem.W, hk)
    free(mem.W, hq)
    st_ = mem.stats()
    assert st_.peak == 47 and st_.at_peak == {"Q": 20, "K": 12, "S": 15} and sum(st_.at_peak.values()) == st_.peak
    mem.check()


def test_count_only_helpers_take_none():
    mem = TwoLevelMemory(50)
    (k,) = mem.ids(K=(4, 8))
    h = load(mem.W, k, None, 0, 4, 0, 8, None)
    store(mem.W, h, None, None)
    free(mem.W, h)
    s = mem.stats()
    assert (s.reads, s.writes, s.peak) == (32, 32, 32)


def test_stats_add_merges_arrays():
    a, b = TwoLevelMemory(10), TwoLevelMemory(10)
    free(a.W, load(a.W, a.array_id("Q", (4, 4)), None, 0, 2, 0, 2, None))
    free(b.W, load(b.W, b.array_id("Q", (4, 4)), None, 0, 1, 0, 3, None))
    free(b.W, load(b.W, b.array_id("K", (4, 4)), None, 0, 1, 0, 1, None))
    s = a.stats() + b.stats()
    assert s.reads == 8 and s.per_array["Q"].reads == 7 and s.per_array["K"].reads == 1 and s.peak == 4


@pytest.mark.parametrize("bad", [0, -5, 2.5, "7", True, None])
def test_bad_capacity(bad):
    with pytest.raises(ValueError, match="M"):
        TwoLevelMemory(bad)


def test_bad_array_registration():
    mem = TwoLevelMemory(10)
    with pytest.raises(ValueError, match="shape"):
        mem.array_id("Q", (2, 3, 4))
    mem.array_id("Q", (2, 3))
    with pytest.raises(ValueError, match="registered with shape"):
        mem.array_id("Q", (3, 3))


# ---------------------------------------------------------------------------------------------------------------
# Schedule errors and capacity (the Numba path: recorded by the helpers, raised by TwoLevelMemory.call)
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", [_double_free, _store_after_free], ids=["double free", "store after free"])
def test_stale_handle_is_a_schedule_error(driver):
    mem = TwoLevelMemory(100)
    (a,) = mem.ids(K_j=(4, 4))
    with pytest.raises(ScheduleError, match="stale"):
        mem.call(driver, a)


def test_stale_handle_error_names_the_array():
    mem = TwoLevelMemory(100)
    (a,) = mem.ids(K_j=(4, 4))
    match = r"K_j region rows \[0, 2\) x cols \[0, 2\).*stale handle: its tile was freed"
    with pytest.raises(ScheduleError, match=match):
        mem.call(_double_free, a)


@pytest.mark.parametrize(
    "region",
    [(3, 2, 0, 2), (0, 2, 5, 1), (-1, 2, 0, 2), (0, 2, -1, 1), (2, -1, 0, 2), (0, 2, 0, -3)],
    ids=["rows outside", "cols outside", "r0 < 0", "c0 < 0", "negative rows", "negative cols"],
)
def test_region_outside_or_negative_names_array_region_and_shape(region):
    mem = TwoLevelMemory(100)
    (a,) = mem.ids(S_ij=(4, 5))
    with pytest.raises(ScheduleError) as e:
        mem.call(_region, a, *region)
    assert e.value.array == "S_ij" and e.value.region == region
    assert "S_ij" in str(e.value) and "outside" in str(e.value) and "4 x 5" in str(e.value)
    assert mem.stats().peak == 0  # an op that records an error does nothing else


def test_more_than_max_tiles_is_a_schedule_error():
    mem = TwoLevelMemory(10_000)
    (a,) = mem.ids(m_i=(MAX_TILES + 1, 1))
    with pytest.raises(ScheduleError, match=f"more than {MAX_TILES} tiles") as e:
        mem.call(_too_many_tiles, a, MAX_TILES + 1)
    assert e.value.array == "m_i" and e.value.region == (MAX_TILES, 1, 0, 1)


def test_tiles_left_resident_are_named():
    mem = TwoLevelMemory(100)
    a, b = mem.ids(Q=(2, 3), l_i=(3,))
    with pytest.raises(ScheduleError, match=r"left resident.*l_i\[1:3, 0:1\]") as e:
        mem.call(_leak, a, b)
    assert e.value.array == "l_i" and e.value.region == (1, 2, 0, 1)


def test_a_fast_buffer_smaller_than_its_tile():
    mem = TwoLevelMemory(100)
    (q,) = mem.ids(Q=(4, 4))
    load(mem.W, q, np.ones((4, 4)), 0, 4, 0, 4, np.zeros((2, 4)))
    assert "smaller than its tile" in str(mem.schedule_error()) and mem.resident == 0


def test_strict_capacity_raises_with_array_words_free_and_M():
    mem = TwoLevelMemory(10)
    (s,) = mem.ids(S_ij=(4, 4))
    with pytest.raises(CapacityError) as e:
        mem.call(_overflow, s)
    err = e.value
    assert (err.array, err.needed, err.free, err.M) == ("S_ij", 4, 2, 10)
    assert "S_ij" in str(err) and "M=10" in str(err)


def test_non_strict_records_the_overflow_and_runs_on():
    mem = TwoLevelMemory(10, strict=False)
    (s,) = mem.ids(S=(4, 4))
    mem.call(_overflow, s)
    assert mem.overflowed and mem.stats().peak == 12 > mem.M and mem.stats().overflowed
    assert mem.overflow_error().needed == 4 and mem.resident == 0


# ---------------------------------------------------------------------------------------------------------------
# The event trace
# ---------------------------------------------------------------------------------------------------------------


def _copy_rows_memory(trace: bool, fast: bool = False, **kw) -> tuple[TwoLevelMemory, np.ndarray]:
    mem = TwoLevelMemory(64, trace=trace, fast=fast, **kw)
    ia, ib, il = mem.ids(A=(7, 3), B=(7, 3), l=(7,))
    A, B, lv = np.arange(21.0).reshape(7, 3), np.full((7, 3), np.nan), np.arange(7.0)
    mem.call(_copy_rows, ia, A, ib, B, il, lv, 3)
    assert np.array_equal(B, 2 * A)
    return mem, B


def test_trace_records_every_event_in_order_with_resident_words_after_it():
    mem, _ = _copy_rows_memory(trace=True)
    rec = list(mem.trace().records())
    ops = [(r["op"], r["array"], r["r0"], r["nr"], r["words"], r["resident"]) for r in rec]
    assert ops == [
        ("init", "l", 0, 7, 7, 0),
        ("load", "A", 0, 3, 9, 9),
        ("store", "B", 0, 3, 9, 9),
        ("free", "A", 0, 3, 9, 0),
        ("load", "A", 3, 3, 9, 9),
        ("store", "B", 3, 3, 9, 9),
        ("free", "A", 3, 3, 9, 0),
        ("load", "A", 6, 1, 3, 3),
        ("store", "B", 6, 1, 3, 3),
        ("free", "A", 6, 1, 3, 0),
        ("load", "l", 0, 7, 7, 7),
        ("alloc", "l", 0, 7, 7, 14),
        ("store", "l", 0, 7, 7, 14),
        ("free", "l", 0, 7, 7, 7),
        ("free", "l", 0, 7, 7, 0),
    ]
    assert rec[1]["handle"] == rec[3]["handle"] != rec[4]["handle"]  # a free names the tile it releases
    assert mem.trace().replay() == mem.stats()


def test_trace_off_costs_nothing_and_on_matches_the_counts():
    off, _ = _copy_rows_memory(trace=False)
    on, _ = _copy_rows_memory(trace=True)
    assert off.trace() is None and off.W.size == core.E0 and off.W[core._NEV] == 0  # no event rows at all
    assert off.stats() == on.stats() and off.stats().at_peak == on.stats().at_peak


def test_a_trace_that_outgrows_its_buffer_is_rerun_to_the_exact_size():
    mem, B = _copy_rows_memory(trace=True, trace_capacity=4)
    assert len(mem.trace()) == 15 and np.array_equal(B, 2 * np.arange(21.0).reshape(7, 3))
    assert mem.trace().replay() == mem.stats()


def test_replay_at_another_M_and_a_trace_that_is_not_from_this_model():
    mem, _ = _copy_rows_memory(trace=True)
    trace = mem.trace()
    with pytest.raises(CapacityError):
        trace.replay(M=10, strict=True)
    assert trace.replay(M=10).overflowed
    trace.events[3, core._EV_HANDLE] += 1  # free a handle that was never issued
    with pytest.raises(ScheduleError, match="diverged at event [34]"):
        trace.replay()


# ---------------------------------------------------------------------------------------------------------------
# Every built-in algorithm: fast memory == checked counts; a traced run replays to the same counts and peak
# ---------------------------------------------------------------------------------------------------------------


def _run(name: str, backward: bool, causal: bool, **memory) -> TwoLevelMemory:
    algo = registry.get(name)
    t = algo.choose_tiling(N, D, M, "fit")
    fwd_mem = TwoLevelMemory(M, **(memory if not backward else {}))
    fwd = algo.forward(fwd_mem, None, None, None, N, D, t, default_scale(D), causal, np.float64)
    if not backward:
        return fwd_mem
    mem = TwoLevelMemory(M, **memory)
    t_bwd = algo.backward_tiling(N, D, M, "fit")
    algo.backward(mem, None, None, None, None, fwd, N, D, t_bwd, default_scale(D), causal, np.float64)
    return mem


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("name", BUILTIN)
def test_builtin_fast_memory_and_trace_replay_match_the_checked_counts(name, backward, causal):
    checked = _run(name, backward, causal).stats()
    fast = _run(name, backward, causal, fast=True)
    assert fast.fast and fast.stats() == checked and fast.stats().at_peak == checked.at_peak
    traced = _run(name, backward, causal, trace=True)
    assert traced.stats() == checked and len(traced.trace()) > 0
    replayed = traced.trace().replay()
    assert replayed == checked and replayed.peak == checked.peak and replayed.at_peak == checked.at_peak


# ---------------------------------------------------------------------------------------------------------------
# The plain-Python schedule API
# ---------------------------------------------------------------------------------------------------------------


def test_schedule_module_examples():
    assert doctest.testmod(schedule).failed == 0
    assert doctest.testmod(core).failed == 0


def test_python_schedule_makes_the_same_trace_as_the_numba_driver():
    numba_mem, _ = _copy_rows_memory(trace=True)
    mem = Memory(64, trace=True)
    A = mem.slow("A", np.arange(21.0).reshape(7, 3))
    B, l_ = mem.slow("B", shape=(7, 3)), mem.slow("l", np.arange(7.0))
    _python_copy_rows(mem, A, B, l_, 3)
    mem.finish()
    assert np.array_equal(mem.trace().events, numba_mem.trace().events)  # handles included
    assert mem.stats() == numba_mem.stats() and np.array_equal(B.data, 2 * A.data)
    assert np.array_equal(l_.data, np.zeros(7))  # init wrote 0 and the round trip kept it


def test_python_schedule_data_tiles_and_vectors():
    q = np.random.default_rng(0).standard_normal((8, 4))
    with Memory(100) as mem:
        Q, O, m = mem.slow("Q", q), mem.slow("O", shape=(8, 4)), mem.slow("m", shape=(8,))
        assert Q.data is q and np.isnan(O.data).all() and m.is_vector and not Q.is_vector
        Q_i = mem.load(Q, rows=(2, 5), cols=(1, 3))
        assert isinstance(Q_i, FastTile) and Q_i.shape == (3, 2) and Q_i.region == (2, 3, 1, 2) and Q_i.words == 6
        assert np.array_equal(Q_i.data, q[2:5, 1:3])
        Q_i.data[0, 0] = 99.0  # the fast copy, not the slow array
        assert q[2, 1] != 99.0
        m_i = mem.alloc(m, rows=(2, 5), fill=-np.inf)
        assert m_i.shape == (3,) and np.all(m_i.data == -np.inf)
        m_i.data = Q_i.data.max(axis=1)  # assigning .data writes into the fast copy
        O_i = mem.alloc(O, rows=(2, 5))
        O_i.data += 1.0
        assert mem.resident_by_array() == {"Q": 6, "m": 3, "O": 12}
        assert [t.array for t in mem.resident_tiles()] == ["Q", "m", "O"]
        mem.store(m_i)
        mem.store(O_i)
        mem.store(Q_i, to=O, rows=(5, 8), cols=(2, 4))
        expected_m = m_i.data.copy()
        mem.free(Q_i, m_i, O_i)
        assert repr(Q_i) == "FastTile(Q[2:5, 1:3], freed)" and not Q_i.live
    assert np.array_equal(m.data[2:5], expected_m) and expected_m[0] == 99.0 and np.isnan(m.data[:2]).all()
    assert np.array_equal(O.data[2:5], np.ones((3, 4))) and O.data[5, 2] == 99.0
    assert (
        np.array_equal(O.data[6:8, 2:4], q[3:5, 1:3]) and np.isnan(O.data[:2]).all() and np.isnan(O.data[5:, :2]).all()
    )
    s = mem.stats()
    assert (s.per_array["Q"].reads, s.per_array["O"].writes, s.per_array["m"].writes, s.peak) == (6, 18, 3, 21)


def test_python_schedule_count_only_has_no_data_and_counts_the_same():
    def run(mem, q):
        Q, O = mem.slow("Q", q, shape=(9, 3)), mem.slow("O", shape=(9, 3))
        mem.init(O, 0.0)
        for r0 in range(0, 9, 4):
            t = mem.load(Q, rows=(r0, min(9, r0 + 4)))
            mem.store(t, to=O)
            mem.free(t)
        return mem.finish(), O

    numeric, O = run(Memory(20), np.ones((9, 3)))
    counted, O_none = run(Memory(20, count_only=True), None)
    assert numeric == counted and O_none.data is None and np.array_equal(O.data, np.ones((9, 3)))
    assert counted.per_array["O"] == core.ArrayCounts(0, 54, 27)
    mem = Memory(20, count_only=True)
    t = mem.alloc(mem.slow("S", shape=(2, 2)))
    assert t.data is None
    with pytest.raises(ValueError, match="count-only"):
        t.data = 1.0


def test_python_schedule_wraps_a_two_level_memory():
    model = TwoLevelMemory(50, trace=True)
    mem = Memory.wrap(model, dtype=np.float32)
    A = mem.slow("A", np.ones((4, 4)))
    assert A.data.dtype == np.float32
    mem.free(mem.load(A, rows=(0, 2)))
    assert model.stats().reads == 8 and len(model.trace()) == 2 and mem.M == 50
    with pytest.raises(ValueError, match="TwoLevelMemory"):
        Memory.wrap(mem)


def test_python_schedule_trace_grows_beyond_the_buffer():
    model = TwoLevelMemory(50, trace=True, trace_capacity=4)
    mem = Memory.wrap(model)
    A = mem.slow("A", shape=(10, 2))
    for r in range(10):
        t = mem.load(A, rows=(r, r + 1))
        mem.store(t)
        mem.free(t)
    s = mem.finish()
    assert len(mem.trace()) == 30 and mem.trace().replay() == s and mem.resident_tiles() == []


def _one_tile():
    mem = Memory(100)
    A = mem.slow("A", np.zeros((4, 6)))
    return mem, A, mem.load(A, rows=(1, 3), cols=(2, 5))


def test_python_schedule_stale_handles_raise_at_once_naming_array_and_region():
    mem, A, t = _one_tile()
    mem.free(t)
    for op in (lambda: mem.free(t), lambda: mem.store(t), lambda: mem.store(t, to=A)):
        with pytest.raises(ScheduleError, match=r"stale.*") as e:
            op()
        assert e.value.array == "A" and e.value.region == (1, 2, 2, 3)
        assert "A region rows [1, 3) x cols [2, 5)" in str(e.value)


def test_python_schedule_foreign_tiles_and_arrays():
    mem, A, t = _one_tile()
    other, B, u = _one_tile()
    with pytest.raises(ScheduleError, match="another Memory") as e:
        mem.free(u)
    assert e.value.array == "A" and e.value.region == (1, 2, 2, 3)
    with pytest.raises(ScheduleError, match="another Memory"):
        mem.load(B)
    with pytest.raises(ScheduleError, match="another Memory"):
        mem.store(t, to=B)
    mem.free(t)
    other.free(u)


@pytest.mark.parametrize(
    "rows, cols, region",
    [((3, 5), None, (3, 2, 0, 6)), ((0, 2), (4, 7), (0, 2, 4, 3)), ((-1, 1), None, (-1, 2, 0, 6))],
    ids=["rows outside", "cols outside", "negative start"],
)
@pytest.mark.parametrize("op", ["load", "alloc"])
def test_python_schedule_region_outside_raises_at_once(op, rows, cols, region):
    mem = Memory(100)
    A = mem.slow("A", np.zeros((4, 6)))
    with pytest.raises(ScheduleError, match="outside the array") as e:
        getattr(mem, op)(A, rows, cols)
    assert e.value.array == "A" and e.value.region == region and "4 x 6" in str(e.value)


def test_python_schedule_negative_size_and_store_to_another_shape():
    mem = Memory(100)
    A, l_ = mem.slow("A", np.zeros((4, 6))), mem.slow("l", np.zeros(4))
    with pytest.raises(ScheduleError, match="negative size") as e:
        mem.load(l_, rows=(3, 1))
    assert e.value.array == "l" and e.value.region == (3, -2, 0, 1)
    mem = Memory(100)
    A = mem.slow("A", np.zeros((4, 6)))
    t = mem.load(A, rows=(0, 2))
    with pytest.raises(ScheduleError, match="another shape") as e:
        mem.store(t, rows=(0, 3))
    assert e.value.array == "A" and e.value.region == (0, 3, 0, 6)
    with pytest.raises(ScheduleError, match="another shape"):
        mem.store(t, rows=(3, 5))  # same shape, but rows 3:5 of a 4-row array lie outside it


def test_python_schedule_too_many_tiles_and_leaks():
    mem = Memory(10_000)
    m = mem.slow("m", shape=(100,))
    tiles = [mem.alloc(m, rows=(i, i + 1)) for i in range(MAX_TILES)]
    with pytest.raises(ScheduleError, match=f"more than {MAX_TILES} tiles") as e:
        mem.alloc(m, rows=(MAX_TILES, MAX_TILES + 1))
    assert e.value.array == "m"
    mem = Memory(100)
    with pytest.raises(ScheduleError, match=r"2 tile\(s\) left resident.*K\[0:2, 0:3\]"):
        with mem:
            K = mem.slow("K", shape=(4, 3))
            mem.load(K, rows=(0, 2))
            mem.alloc(K, rows=(2, 4))
    del tiles
    with pytest.raises(KeyError), Memory(100) as mem:  # an exception inside the block is not masked by the check
        mem.load(mem.slow("K", shape=(4, 3)))
        raise KeyError("the schedule's own error")


def test_python_schedule_capacity_strict_raises_at_the_op_and_non_strict_runs_on():
    mem = Memory(10)
    S = mem.slow("S_ij", shape=(4, 4))
    mem.alloc(S, rows=(0, 2))
    with pytest.raises(CapacityError) as e:
        mem.alloc(S, rows=(2, 3))
    assert (e.value.array, e.value.needed, e.value.free, e.value.M) == ("S_ij", 4, 2, 10)
    mem = Memory(10, strict=False)
    S = mem.slow("S_ij", shape=(4, 4))
    a, b = mem.alloc(S, rows=(0, 2)), mem.alloc(S, rows=(2, 3))
    mem.free(a, b)
    s = mem.finish()
    assert s.overflowed and s.peak == 12


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda mem, A: mem.load(A, rows=(0.5, 2)), "rows must be a pair"),
        (lambda mem, A: mem.load(A, rows=2), "rows must be a pair"),
        (lambda mem, A: mem.load(A, cols=(0, 1, 2)), "cols must be a pair"),
        (lambda mem, A: mem.load(A, rows=(True, 2)), "rows must be a pair"),
        (lambda mem, A: mem.load("A"), "expected a SlowArray"),
        (lambda mem, A: mem.free(3), "needs a FastTile"),
        (lambda mem, A: mem.store(None), "needs a FastTile"),
        (lambda mem, A: mem.load(mem.slow("v", shape=(3,)), cols=(0, 2)), "vector"),
        (lambda mem, A: mem.slow("A", shape=(2, 2)), "already placed"),
        (lambda mem, A: mem.slow("", shape=(2, 2)), "name"),
        (lambda mem, A: mem.slow("X"), "data or its shape"),
        (lambda mem, A: mem.slow("X", shape=(2, -1)), "shape"),
        (lambda mem, A: mem.slow("X", shape=(2, 2, 2)), "shape"),
        (lambda mem, A: mem.slow("X", np.zeros((2, 2)), shape=(3, 3)), "shape"),
        (lambda mem, A: mem.init(None, 0.0), "expected a SlowArray"),
    ],
)
def test_python_schedule_bad_arguments_are_clear_value_errors(call, message):
    mem = Memory(100)
    A = mem.slow("A", np.zeros((4, 6)))
    with pytest.raises(ValueError, match=message):
        call(mem, A)
    assert mem.resident == 0


def test_python_schedule_on_a_fast_memory_counts_the_same_and_still_catches_a_double_free():
    def run(mem):
        A, S = mem.slow("A", shape=(8, 8)), mem.slow("S", shape=(8, 8))
        for r0 in (0, 4):
            t, s = mem.load(A, rows=(r0, r0 + 4)), mem.alloc(S, rows=(r0, r0 + 4), cols=(0, 2))
            mem.store(s)
            mem.free(t, s)
        return mem.finish()

    checked, fast = run(Memory(64, count_only=True)), run(Memory(64, fast=True, count_only=True))
    assert checked == fast and checked.at_peak == fast.at_peak == {"A": 32, "S": 8}
    mem = Memory(64, fast=True)
    t = mem.load(mem.slow("A", shape=(4, 4)))
    mem.free(t)
    with pytest.raises(ScheduleError, match="stale"):
        mem.free(t)


# ---------------------------------------------------------------------------------------------------------------
# Property: random schedules of valid ops
# ---------------------------------------------------------------------------------------------------------------

SHAPES = {"Q": (7, 5), "S": (9, 9), "l": (6,)}


@st.composite
def _schedules(draw):
    """A list of ops: ("load" | "alloc", array, r0, r1, c0, c1), ("store", k) or ("free", k) on the k-th live tile."""
    ops, live = [], 0
    for _ in range(draw(st.integers(1, 30))):
        kind = draw(st.sampled_from(["load", "alloc", "store", "free"] if live else ["load", "alloc"]))
        if kind in ("store", "free"):
            ops.append((kind, draw(st.integers(0, live - 1))))
            live -= kind == "free"
            continue
        name = draw(st.sampled_from(sorted(SHAPES)))
        rows, cols = SHAPES[name][0], (SHAPES[name] + (1,))[1]
        r0 = draw(st.integers(0, rows))
        c0 = draw(st.integers(0, cols))
        ops.append((kind, name, r0, draw(st.integers(r0, rows)), c0, draw(st.integers(c0, cols))))
        live += 1
    return ops


def _play(mem: Memory, ops) -> list[FastTile]:
    arrays = {name: mem.slow(name, shape=shape) for name, shape in SHAPES.items()}
    live: list[FastTile] = []
    high = 0
    for op in ops:
        if op[0] in ("load", "alloc"):
            kind, name, r0, r1, c0, c1 = op
            a = arrays[name]
            live.append(getattr(mem, kind)(a, (r0, r1), None if a.is_vector else (c0, c1)))
        elif op[0] == "store":
            mem.store(live[op[1]])
        else:
            mem.free(live.pop(op[1]))
        high = max(high, sum(t.words for t in live))
        by_array: dict[str, int] = {}
        for t in live:
            by_array[t.array.name] = by_array.get(t.array.name, 0) + t.words
        assert mem.resident == sum(t.words for t in live) and mem.peak == high
        assert mem.resident_by_array() == {k: v for k, v in by_array.items() if v}
        if not mem.model.fast:  # the model's tile table: the live tiles, oldest first
            assert [t.handle for t in mem.resident_tiles()] == [t.handle for t in live]
    return live


@settings(max_examples=60, deadline=None)
@given(_schedules(), st.integers(1, 200))
def test_random_schedules_residency_peak_and_replay(ops, M_):
    mem = Memory(M_, strict=False, trace=True, count_only=True)
    live = _play(mem, ops)
    s_live = mem.stats()
    assert sum(s_live.at_peak.values()) == s_live.peak
    assert s_live.overflowed == (s_live.peak > M_)
    mem.free(*live)
    s = mem.finish()
    assert isinstance(s, Stats) and mem.trace().replay() == s and mem.trace().replay().at_peak == s.at_peak
    fast = Memory(M_, strict=False, fast=True, count_only=True)
    fast.free(*_play(fast, ops))
    assert fast.finish() == s and fast.stats().at_peak == s.at_peak

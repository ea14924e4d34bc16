import numpy as np
import pytest
from iosim.memory_model import CapacityError, TwoLevelMemory, alloc, free, init_slow, load, load_vec, store, store_vec


def test_load_store_count_words_per_array_and_copy_data():
    mem = TwoLevelMemory(100)
    q, o = mem.ids("Q", "O")
    src = np.arange(20.0).reshape(5, 4)
    dst = np.full((3, 4), np.nan)
    out = np.zeros((5, 4))
    load(mem.W, q, src, 1, 3, 0, 4, dst)
    assert np.array_equal(dst, src[1:4])
    assert mem.resident == 12
    store(mem.W, o, dst, out, 2, 3, 1, 2)
    assert np.array_equal(out[2:5, 1:3], src[1:4, :2])
    free(mem.W, 12)
    s = mem.stats()
    assert (s.reads, s.writes, s.total, s.peak) == (12, 6, 18, 12)
    assert s.per_array["Q"].reads == 12 and s.per_array["O"].writes == 6
    assert mem.resident == 0


def test_vectors_scratch_and_init_writes():
    mem = TwoLevelMemory(10)
    l_, m = mem.ids("l", "m")
    v = np.arange(6.0)
    buf = np.zeros(6)
    load_vec(mem.W, l_, v, 2, 3, buf)
    assert np.array_equal(buf[:3], v[2:5])
    alloc(mem.W, m, 4)
    store_vec(mem.W, m, buf, v, 0, 3)
    init_slow(mem.W, m, 6)
    free(mem.W, 7)
    s = mem.stats()
    assert s.peak == 7
    assert s.per_array["m"].writes == 9 and s.per_array["m"].init_writes == 6
    assert s.init_writes == 6


def test_count_only_helpers_take_none():
    mem = TwoLevelMemory(50)
    (k,) = mem.ids("K")
    load(mem.W, k, None, 0, 4, 0, 8, None)
    store(mem.W, k, None, None, 0, 4, 0, 8)
    s = mem.stats()
    assert (s.reads, s.writes, s.peak) == (32, 32, 32)


def _overflowing_driver(W, aid):
    alloc(W, aid, 8)
    alloc(W, aid, 5)
    free(W, 13)


def test_strict_capacity_raises_with_array_words_free_and_M():
    mem = TwoLevelMemory(10)
    (s,) = mem.ids("S_ij")
    with pytest.raises(CapacityError) as e:
        mem.call(_overflowing_driver, s)
    err = e.value
    assert (err.array, err.needed, err.free, err.M) == ("S_ij", 5, 2, 10)
    assert "S_ij" in str(err) and "M=10" in str(err)


def test_non_strict_records_overflow():
    mem = TwoLevelMemory(10, strict=False)
    (s,) = mem.ids("S")
    mem.call(_overflowing_driver, s)
    assert mem.overflowed and mem.stats().peak == 13 > mem.M
    assert mem.overflow_error().needed == 5


@pytest.mark.parametrize("bad", [0, -5, 2.5, "7", True, None])
def test_bad_capacity(bad):
    with pytest.raises(ValueError, match="M"):
        TwoLevelMemory(bad)


def test_stats_add_merges_arrays():
    a, b = TwoLevelMemory(10), TwoLevelMemory(10)
    load(a.W, a.array_id("Q"), None, 0, 2, 0, 2, None)
    load(b.W, b.array_id("Q"), None, 0, 1, 0, 3, None)
    load(b.W, b.array_id("K"), None, 0, 1, 0, 1, None)
    s = a.stats() + b.stats()
    assert s.reads == 8 and s.per_array["Q"].reads == 7 and s.per_array["K"].reads == 1 and s.peak == 4

"""experiments/bench/gpu_waves.py: the plan's launch arithmetic, the simulated words against a closed form written
here, the verdict on synthetic rows, and (slow) the rows pipeline end to end on the CUDA simulator. The timings and
ceilings themselves come only from a GPU lease; nothing here asserts a time."""

import math
import os

import pytest

pytest.importorskip("numba_cuda", reason="numba-cuda is not installed (pip install -e '.[cuda]')")

from numba.core import config  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "experiments", "bench")
SIMULATED = bool(config.ENABLE_CUDASIM)


@pytest.fixture
def gw(monkeypatch):
    monkeypatch.syspath_prepend(BENCH)
    import gpu_waves

    return gpu_waves


def closed_form(B, H, N, d, Br):
    """flash2 forward, full attention: Q read once, K and V once per row block (Tr = ceil(N / Br) times), O and L
    written once; (reads, writes, init writes) per array, times B H."""
    Tr = -(-N // Br)
    per = {"Q": (N * d, 0, 0), "K": (Tr * N * d, 0, 0), "V": (Tr * N * d, 0, 0), "O": (0, N * d, 0), "L": (0, N, 0)}
    return {k: [B * H * x for x in v] for k, v in per.items()}


def test_plan_ctas_waves_and_residency(gw):
    row = gw.plan_row((4, 16, 4096, 64), "rt16x16v", 16, 64, 2, 132)
    assert (row["Tr"], row["CTAs"]) == (256, 256 * 64)
    assert row["waves"] == pytest.approx(256 * 64 / (132 * 2))
    assert row["M"] == 2 * 64 * (16 + 64) + 2 * 16 + 16 * 64
    ragged = gw.plan_row((1, 3, 37, 8), "sim2x4v", 16, 8, None, 132)
    assert (ragged["Tr"], ragged["CTAs"], ragged["waves"]) == (3, 9, None)
    res = gw.residency((4, 16, 4096, 64), 128, 2, 132, 60 * 2**20)
    assert res["K+V bytes per head"] == 2 * 4096 * 64 * 4 and res["K+V bytes in all"] == 64 * 2 * 2**20
    assert res["heads in flight"] == math.ceil(132 * 2 / 32) + 1 and res["K,V re-reads from"] == "L2"
    assert gw.residency((1, 4, 2**20, 128), 16, 2, 132, 60 * 2**20)["K,V re-reads from"].startswith("DRAM")


def test_every_planned_launch_fills_at_least_four_waves(gw):
    """Even at the most blocks per SM the threads (2048 / 256) and shared memory (228 KiB, 1 KiB reserved per
    block) allow, each planned grid is at least 4 waves of 132 SMs."""
    from iosim.algorithms.cuda import flash_fast as ff

    B, H, N, d = gw.CASE
    for name, Br, Bc in gw.planned():
        v = ff.VARIANTS[name]
        most = min(2048 // v.threads, 228 * 1024 // (ff.kernel_words(v, Br, Bc, d) * 4 + 1024))
        assert gw.plan_row(gw.CASE, name, Br, Bc, most)["waves"] >= 4, (Br, most)
        assert gw.plan_row(gw.CASE, name, Br, Bc, most)["CTAs"] == -(-N // Br) * B * H


@pytest.mark.parametrize("case,Br,Bc", [((4, 16, 4096, 64), Br, 64) for Br in (128, 64, 32, 16, 8)]
                         + [((1, 3, 200, 16), 64, 16), ((2, 1, 37, 8), 16, 8)])  # fmt: skip
def test_simulated_words_equal_the_closed_form(gw, case, Br, Bc):
    per = gw.simulated(case, Br, Bc)
    assert per == closed_form(*case, Br)
    assert gw.total_words(per) == sum(r + w for r, w, _ in closed_form(*case, Br).values())


def _row(Br, words, ms, gbs):
    return {"kind": "flash2", "variant": "v", "Br": Br, "Bc": 64, "words": words, "ms": ms, "words GB/s": gbs}


CEIL = {"L2 GB/s": 10000.0, "HBM GB/s": 4000.0}


def test_verdict_says_not_tested_when_no_launch_is_io_bound(gw):
    v = gw.verdict([_row(128, 1e9, 1.0, 1000.0), _row(16, 8e9, 4.0, 2000.0)], CEIL)
    assert v["tested"] is False and v["I/O-bound"] == []
    assert v["why"].startswith("not tested: no launch reaches 50% of L2 bandwidth (highest 20.0%, v Br=16 Bc=64)")
    assert v["all launches (context)"]["pairs agreeing"] == 1
    one = gw.verdict([_row(128, 1e9, 1.0, 1000.0), _row(16, 8e9, 4.0, 6000.0)], CEIL)
    assert one["tested"] is False and one["why"].startswith("not tested: only one launch (v Br=16 Bc=64)")
    assert one["above the HBM ceiling"] == ["v Br=16 Bc=64"]


def test_verdict_among_io_bound_launches_agreeing_and_not(gw):
    slow_small = _row(256, 5e8, 9.0, 100.0)  # not I/O-bound: its disagreement is context only
    agree = [_row(64, 1e9, 1.0, 6000.0), _row(32, 2e9, 2.0, 7000.0), _row(16, 4e9, 4.0, 8000.0), slow_small]
    v = gw.verdict(agree, CEIL)
    assert v["tested"] is True and v["agrees"] is True
    o = v["ordering"]
    assert (o["launches"], o["pairs"], o["pairs agreeing"], o["spearman"]) == (3, 3, 3, 1.0)
    assert o["ms per Mword max/min"] == pytest.approx(1.0)
    assert v["all launches (context)"]["pairs agreeing"] == 3  # of 6: slow_small disagrees with all three
    disagree = [_row(64, 1e9, 4.0, 6000.0), _row(32, 2e9, 2.0, 7000.0), _row(16, 4e9, 1.0, 8000.0)]
    v = gw.verdict(disagree, CEIL)
    assert v["tested"] is True and v["agrees"] is False
    assert (v["ordering"]["pairs agreeing"], v["ordering"]["spearman"]) == (0, -1.0)
    assert v["ordering"]["ms per Mword max/min"] == pytest.approx(16.0)
    same = gw.verdict([_row(64, 1e9, 1.0, 6000.0), _row(65, 1e9, 2.0, 6000.0)], CEIL)
    assert same["tested"] is False and "move the same words" in same["why"]


def test_spearman_gives_ties_their_mean_rank(gw):
    """Ranks x (1.5, 1.5, 3), y (1, 2, 3): covariance 1.5, variances 1.5 and 2."""
    assert gw._spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(1.5 / math.sqrt(1.5 * 2))
    assert gw._spearman([1, 1], [1, 2]) is None


class FixedTimer:
    """Stands in for gpu.Timer on the simulator (its CUDA events give no time): runs the launch once, says 2 ms."""

    reps, seconds = 1, 0.0

    def median_ms(self, fn):
        fn()
        return 2.0


@pytest.mark.skipif(not SIMULATED, reason="simulator thread layouts")
def test_rows_pipeline_on_the_simulator(gw):
    """rows() end to end on the CUDA simulator (about 10 s) with a tiny case, a simulator thread layout, tiny
    ceilings and a fixed 2 ms per launch: the counters against the closed form, the NumPy slice reference, the
    rates, and the verdict fed by the measured ceilings (one I/O-bound launch: not tested)."""
    from numba import cuda

    plan = (("sim2x4v", 16, 8),)
    tiny = (("L2", 64, 3), ("HBM", 256, 1))
    rows = gw.rows(cuda, FixedTimer(), case=(1, 2, 37, 8), plan=plan, ceilings=tiny, threads=4)
    assert [r["kind"] for r in rows] == ["ceiling", "ceiling", "flash2", "verdict"], rows
    for r, (name, words, reps) in zip(rows[:2], tiny, strict=True):
        assert "error" not in r and r["ceiling"] == name and r["bytes"] == words * 4 * reps
        assert r["GB/s"] == pytest.approx(words * 4 * reps / 2e6)
    row = rows[2]
    assert "error" not in row, row
    assert row["counters equal simulator"] and row["words per array"] == closed_form(1, 2, 37, 8, 16)
    words = sum(r + w for r, w, _ in closed_form(1, 2, 37, 8, 16).values())
    assert row["words"] == words and row["bytes"] == 4 * words and row["CTAs"] == 3 * 2
    assert row["words GB/s"] == pytest.approx(4 * words / 2e6)
    assert row["fraction of L2"] == pytest.approx(4 * words / (64 * 4 * 3))
    assert row["TFLOP/s"] == pytest.approx(4 * 2 * 37 * 37 * 8 / 2e9)
    assert row["rel err vs NumPy (slice)"] < 1e-5
    assert rows[3]["tested"] is False and rows[3]["why"].startswith("not tested: only one launch (sim2x4v Br=16")


def test_bad_options_exit_2_with_one_line(gw, capsys):
    with pytest.raises(SystemExit) as e:
        gw.main(["--reps", "0"])
    assert e.value.code == 2 and "--reps must be >= 1" in capsys.readouterr().err


def test_plan_lines_hold_words_waves_and_residency(gw):
    lines = gw.plan_lines(blocks={entry: 2 for entry in gw.planned()})
    assert [x["Br"] for x in lines] == [Br for _, Br, _ in gw.planned()]
    for x in lines:
        assert x["words per array"] == closed_form(*gw.CASE, x["Br"]) and x["bytes"] == 4 * x["words"]
        assert x["waves"] == pytest.approx(x["CTAs"] / (132 * 2)) and x["K,V re-reads from"] == "L2"


def test_extra_entries_are_planned_only_where_their_variant_exists(gw, monkeypatch):
    from iosim.algorithms.cuda import flash_fast as ff

    assert gw.planned()[: len(gw.PLAN)] == gw.PLAN
    monkeypatch.delitem(ff.VARIANTS, "rt16x16v4", raising=False)
    assert gw.planned() == gw.PLAN
    monkeypatch.setitem(ff.VARIANTS, "rt16x16v4", ff.Variant("rt16x16v4", 16, 16, 4, "64 registers", True))
    assert gw.planned() == gw.PLAN + gw.EXTRA


@pytest.mark.skipif(not SIMULATED, reason="simulator thread layouts")
def test_a_row_block_smaller_than_the_row_groups_is_exact():
    """The plan's Br = 8 on 16 row groups, in small: Br = 2 on sim4x2v's 4 row groups (half the groups on slack
    rows, their sums dropped): O and L equal a float64 reference, the counters the closed form (Tr = 19)."""
    import numpy as np
    from iosim.algorithms.cuda import flash_fast as ff
    from iosim.algorithms.reference import attention_forward

    rng = np.random.default_rng(0)
    Q, K, V = (rng.standard_normal((1, 1, 37, 8)).astype(np.float32) for _ in range(3))
    r = ff.flash2_forward_fast(Q, K, V, variant_name="sim4x2v", Br=2, Bc=16, count=True)
    O, L = attention_forward(Q[0, 0], K[0, 0], V[0, 0])
    assert np.max(np.abs(r.outputs["O"][0, 0] - O)) < 2e-5 and np.max(np.abs(r.outputs["L"][0, 0] - L)) < 2e-5
    assert {k: [c.reads, c.writes, c.init_writes] for k, c in r.counts.items()} == closed_form(1, 1, 37, 8, 2)


@pytest.mark.gpu
@pytest.mark.skipif(SIMULATED, reason="needs a CUDA GPU (run with IOSIM_GPU=1 on a GPU machine)")
def test_gpu_rows_at_a_small_case(gw):
    """On a device: the ceilings and two row-block sizes at (1, 8, 1024, 64); counters, numerics, nothing timed."""
    from numba import cuda

    if not cuda.is_available():
        pytest.skip("no CUDA GPU")
    import gpu as bench

    plan = (("rt16x16v", 64, 64), ("rt16x16v", 8, 64))
    ceilings = (("L2", 2**20, 4), ("HBM", 2**24, 1))
    rows = gw.rows(cuda, bench.Timer(cuda, 3, 0.2), case=(1, 8, 1024, 64), plan=plan, ceilings=ceilings)
    assert [r["kind"] for r in rows] == ["ceiling", "ceiling", "flash2", "flash2", "verdict"], rows
    assert all(r["GB/s"] > 0 for r in rows[:2]), rows[:2]
    for row, (_, Br, _) in zip(rows[2:4], plan, strict=True):
        assert "error" not in row, row
        assert row["counters equal simulator"] and row["words per array"] == closed_form(1, 8, 1024, 64, Br)
        assert row["rel err vs NumPy (slice)"] < 1e-5 and row["blocks/SM"] >= 1

"""Stray accesses: a load/store site that moves one argument, then another, in the same launch (an overrun that
lands wholly inside the next allocated argument, which no bounds check on the one argument sees). Reported like an
out-of-bounds access (one line: kernel, site, program, arrays, offsets; exit 1; ``AccessError`` in Python); a
kernel that picks its pointer at run time declares the site; every example kernel counts with nothing flagged.

The launchers are in tests/_kernel_launches.py (kernels written for these tests).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from iosim.base.errors import InputError
from iosim.kernels.counting import AccessError, Recorder, access_problem

FILE = str(Path(__file__).with_name("_kernel_launches.py"))
EXAMPLES = Path(__file__).parents[1] / "iosim" / "kernels" / "examples"


# --- the recorder alone (no kernel) --------------------------------------------------------------------------------
def _recorder():
    rec = Recorder()
    rec.register("A", 1000, 64, 4)  # 16 elements
    rec.register("B", 1064, 64, 4)  # the next 16, right after A
    rec.register("A_view", 1016, 16, 4)  # elements 4..7 of A
    rec.begin_launch("k")
    return rec


def _lanes(start, n):
    return 1000 + 4 * np.arange(start, start + n)


SITE = (("k.py", 10, 4),)


def _a_then_b(kind, n):
    """A recorder whose site SITE moved n elements of A in program 0, then n of B in program 1 (the last access's
    result returned beside it)."""
    rec = _recorder()
    rec.begin_program((0, 0, 0))
    rec.access(_lanes(0, n), kind, 4, site=SITE)
    rec.begin_program((1, 0, 0))
    return rec, rec.access(_lanes(16, n), kind, 4, site=SITE)


def test_a_site_that_moves_a_then_b_is_stray_and_the_lanes_stay_where_they_land():
    rec, switched_off = _a_then_b("w", 8)
    assert switched_off is None  # inside B: nothing switched off
    counts = rec.result("triton", 0.0)
    assert counts.stray_lanes == 8 and counts.out_of_bounds_lanes == 0
    assert counts.per_array["B"].writes == 8  # counted where a GPU would move them
    assert access_problem(counts) == (
        "8 stray lanes (a site that moved one argument, then another): first, kernel k site k.py:10 program "
        "(1, 0, 0) stored 8 lanes inside B at element offsets [0, 1, 2, 3, 4, 5], past the end of A (16 elements, "
        "which the site moved in program (0, 0, 0)) at its offsets [16, 17, 18, 19, 20, 21]; a kernel that picks "
        "its pointer at run time declares the site ('selects_pointers')"
    )


def test_views_of_one_argument_other_sites_other_launches_and_unknown_sites_are_not_stray():
    rec = _recorder()
    a, b = (("k.py", 10, 4),), (("k.py", 10, 8),)  # two calls on one line: two sites
    rec.begin_program((0, 0, 0))
    rec.access(_lanes(0, 2), "r", 4, site=a)
    rec.access(_lanes(5, 2), "r", 4, site=a)  # inside A_view, a view of A: the same argument
    rec.access(_lanes(16, 4), "r", 4, site=b)
    rec.access(_lanes(16, 4), "r", 4, site=None)  # a backend that cannot tell
    rec.begin_launch("k")  # a new launch may hand the site another array
    rec.begin_program((0, 0, 0))
    rec.access(_lanes(20, 4), "r", 4, site=a)
    counts = rec.result("triton", 0.0)
    assert counts.stray == [] and counts.stray_lanes == 0 and access_problem(counts) is None


def test_an_access_spanning_two_arguments_is_out_of_bounds_naming_where_it_lands():
    rec = _recorder()
    rec.begin_program((2, 0, 0))
    out = rec.access(_lanes(12, 8), "w", 4, site=(("k.py", 3, 0),))
    assert out.tolist() == [False] * 4 + [True] * 4
    assert access_problem(rec.result("triton", 0.0)) == (
        "4 lanes out of bounds (<unattributed>): first, kernel k program (2, 0, 0) stored 4 lanes past the end of A "
        "(16 elements) at element offsets [16, 17, 18, 19], inside B"
    )


def test_selects_pointers_must_name_a_kernel_or_a_site_that_ran():
    rec, _ = _a_then_b("r", 4)
    assert rec.result("triton", 0.0, selects_pointers=["k.py:10"]).stray_lanes == 0
    assert rec.result("triton", 0.0, selects_pointers=["k"]).stray_lanes == 0
    with pytest.raises(InputError, match="'selects_pointers' must name a kernel launched \\(k\\) or a FILE.py:LINE"):
        rec.result("triton", 0.0, selects_pointers=["k.py:11"])
    with pytest.raises(InputError, match="must be a list of kernel names or FILE.py:LINE sites"):
        rec.result("triton", 0.0, selects_pointers=[3])


# --- which lanes a stray or out-of-bounds record describes, and against which base ----------------------------------
def _two_then_spill(origin: bool):
    """A recorder whose site moved A (16 elements at 1000) in program 0 and, in program 1, 2 lanes of B (16 at 1064)
    followed by 4 lanes of C (16 at 800, below A): by address (``origin`` False) or through B's pointer."""
    rec = Recorder()
    rec.begin_launch("k")
    a, b, c = (rec.register_argument(n, s, 64, 4) for n, s in (("A", 1000), ("B", 1064), ("C", 800)))
    rec.begin_program((0, 0, 0))
    rec.access(_lanes(0, 4), "r", 4, site=SITE, origin=a if origin else None)
    rec.begin_program((1, 0, 0))
    lanes = np.concatenate([1064 + 4 * np.arange(2), 800 + 4 * np.arange(4)])
    return rec, rec.access(lanes, "r", 4, site=SITE, origin=b if origin else None)


def test_a_stray_access_spilling_into_a_third_array_describes_only_the_lanes_inside_the_one_it_names():
    # by address: the access starts in B (stray: the site moved A); its 4 lanes in C lie past B (out of bounds, counted
    # there once); B's offsets are 0 and 1 (the old record measured C's lanes from B's base too: -66, -65, ...)
    rec, out = _two_then_spill(origin=False)
    assert out.tolist() == [False] * 2 + [True] * 4
    counts = rec.result("triton", 0.0)
    assert (counts.stray_lanes, counts.out_of_bounds_lanes) == (2, 4)
    assert counts.per_array["B"].reads == 2 and counts.per_array["<unattributed>"].reads == 4
    e = counts.stray[0]
    assert (e["own"], e["array"], e["lanes"], e["total"]) == ("A", "B", 2, 2)
    assert (e["offsets"], e["own_offsets"]) == ([0, 1], [16, 17])  # (1064 - 1064) / 4, (1064 - 1000) / 4
    # through B's pointer: B's 2 lanes are stray (the site moved A), C's 4 an overrun landing in C, stray too: 6
    # lanes, each once (the old count added the 6 lanes, then C's 4 again: 10)
    rec, out = _two_then_spill(origin=True)
    assert out.tolist() == [False] * 2 + [True] * 4  # outside B, the pointer's argument
    counts = rec.result("triton", 0.0)
    assert (counts.stray_lanes, counts.out_of_bounds_lanes) == (6, 0)
    assert counts.per_array["B"].reads == 2 and counts.per_array["C"].reads == 4
    e = counts.stray[0]
    assert (e["own"], e["array"], e["lanes"], e["total"]) == ("A", "B", 2, 6)
    assert (e["offsets"], e["own_offsets"]) == ([0, 1], [16, 17])


def test_an_overrun_landing_in_two_arrays_is_measured_from_the_first_ones_base():
    rec = Recorder()
    rec.begin_launch("k")
    a = rec.register_argument("A", 1000, 64, 4)
    rec.register_argument("B", 1064, 64, 4)
    rec.register_argument("C", 800, 64, 4)
    rec.begin_program((0, 0, 0))
    lanes = np.concatenate([1000 + 4 * np.arange(16, 19), 800 + 4 * np.arange(2)])  # B's 0..2, then C's 0..1
    rec.access(lanes, "w", 4, site=SITE, origin=a)
    counts = rec.result("triton", 0.0)
    e = counts.stray[0]
    assert (e["own"], e["array"], e["lanes"], e["total"]) == ("A", "B", 3, 5)
    assert (e["offsets"], e["own_offsets"]) == ([0, 1, 2], [16, 17, 18])  # C's lanes from B's base were -66, -65


def test_a_finished_launchs_arguments_are_not_consulted_by_the_next():
    # launch 1's X (64 elements at 1000) is freed; launch 2's A reuses 16 of its elements (1064..1127), B lies
    # elsewhere. The site moving A then B is stray with A its own (not X, whose bytes held A's); A's overrun past
    # its end into X's old bytes is out of bounds (not counted for X)
    rec = Recorder()
    rec.begin_launch("first")
    x = rec.register_argument("X", 1000, 256, 4)
    rec.begin_program((0,))
    rec.access(1000 + 4 * np.arange(64), "r", 4, site=(("k.py", 1, 0),), origin=x)
    rec.begin_launch("second")
    rec.register_argument("A", 1064, 64, 4)
    rec.register_argument("B", 2000, 64, 4)
    rec.begin_program((0,))
    rec.access(1064 + 4 * np.arange(4), "r", 4, site=SITE)  # by address (an untagged pointer)
    rec.begin_program((1,))
    rec.access(2000 + 4 * np.arange(4), "r", 4, site=SITE)
    rec.begin_program((2,))
    out = rec.access(1064 + 4 * np.arange(14, 18), "w", 4, site=(("k.py", 20, 0),))  # A's 14..17: 2 past its end
    assert out.tolist() == [False, False, True, True]
    counts = rec.result("triton", 0.0)
    e = counts.stray[0]
    assert (e["own"], e["array"], e["own_elements"], e["total"]) == ("A", "B", 16, 4)
    assert e["own_offsets"][:2] == [(2000 - 1064) // 4, (2004 - 1064) // 4]
    assert counts.out_of_bounds_lanes == 2 and counts.out_of_bounds[0]["offsets"] == [16, 17]
    assert counts.per_array["X"].reads == 64 and counts.per_array["X"].writes == 0
    assert counts.per_array["A"].writes == 2 and counts.per_array["<unattributed>"].writes == 2


def test_an_argument_handed_to_a_later_launch_again_is_still_one_array():
    rec = Recorder()
    for kernel in ("first", "second"):
        rec.begin_launch(kernel)
        x = rec.register_argument("X" if kernel == "first" else "Y", 1000, 64, 4)
        rec.begin_program((0,))
        rec.access(1000 + 4 * np.arange(16), "r", 4, site=(("k.py", 1, 0),), origin=x)
        rec.access(1000 + 4 * np.arange(16), "r", 4, site=(("k.py", 2, 0),))  # by address too
    counts = rec.result("triton", 0.0)
    assert {n: a.reads for n, a in counts.per_array.items()} == {"X": 64}
    assert counts.stray_lanes == 0 and counts.out_of_bounds_lanes == 0


def test_a_per_launch_copy_is_the_array_it_copies_never_the_range_a_freed_copy_left_at_its_bytes():
    # numba.cuda's simulator: launch 1 copies host X to 1000 and Out to 2000; launch 2 copies host Z to 1000 (X's
    # freed bytes) and Out to 3000; launch 3 copies X to 3000 (launch 2's Out's bytes). X is one array, Z another
    rec = Recorder()
    host = {}

    def launch(kernel, *args):
        rec.begin_launch(kernel)
        for k, (param, array, start) in enumerate(args):
            rid = rec.register_copy(param, start, 64, 4, host.get(array))
            host.setdefault(array, rid)
            rec.begin_program((k,))
            rec.access(start + 4 * np.arange(16), "w" if param == "Out" else "r", 4, site=(("k.py", k, 0),))

    launch("copy", ("X", "x", 1000), ("Out", "out", 2000))
    launch("copy", ("X", "z", 1000), ("Out", "out", 3000))
    launch("copy", ("X", "x", 3000), ("Out", "out", 1000))
    rec.register("d_out", 2000, 64, 4)  # a device array where launch 1's copy of Out was: an array of its own
    counts = rec.result("numba-cuda", 0.0, names={"d_out": (2000, 64)})
    assert {n: (a.reads, a.writes) for n, a in counts.per_array.items()} == {"X": (32, 0), "Out": (0, 48),
                                                                              "X#2": (16, 0)}  # fmt: skip
    assert counts.stray_lanes == 0 and counts.out_of_bounds_lanes == 0


def test_a_blocks_element_accesses_reach_the_recorder_in_thread_order_whatever_order_the_threads_ran():
    # numba-cuda's simulator runs a block's CUDA threads as Python threads; here threads 7, 6, ..., 0 read their
    # element of B one after another (the order a busy scheduler can pick): flushed, the lanes are 0..7 again
    import threading

    from iosim.kernels.numba_cuda_backend import _Session

    A, B = np.arange(8.0), np.arange(8.0, 16.0)
    rec = Recorder()
    rec.begin_launch("pick")
    a, b = (rec.register_argument(n, x.ctypes.data, x.nbytes, 8) for n, x in (("A", A), ("B", B)))
    s = _Session(rec, None, object, ())

    def read(arr, origin, t):
        s.note(arr, t, "r", origin)

    class Lane(threading.Thread):
        def __init__(self, arr, origin, t):
            super().__init__(target=lambda: read(arr, origin, t))
            self.thread_id = t

    for program, (arr, origin) in enumerate(((A, a), (B, b))):
        rec.begin_program((program, 0, 0))
        for t in reversed(range(8)):
            lane = Lane(arr, origin, t)
            lane.start()
            lane.join()
        s.flush()
    e = rec.result("numba-cuda", 0.0).stray[0]
    assert (e["own"], e["array"], e["lanes"]) == ("A", "B", 8)
    assert e["offsets"] == [0, 1, 2, 3, 4, 5]  # [7, 6, 5, 4, 3, 2] in the order the threads ran
    assert e["own_offsets"] == [(B.ctypes.data - A.ctypes.data) // 8 + k for k in range(6)]


# --- Triton kernels under the interpreter --------------------------------------------------------------------------
pytest.importorskip("triton")
pytest.importorskip("torch")

from iosim.kernels import count_batch, count_file  # noqa: E402

STRAY = (
    "iosim: error: 64 stray lanes (a site that moved one argument, then another): first, kernel strided_fwd site "
    "_kernel_launches.py:49 <- _kernel_launches.py:205 program (0, 1, 0) stored 32 lanes inside O at element "
    "offsets [0, 1, 2, 3, 4, 5], past the end of L (64 elements, which the site moved in program (0, 0, 0)) at its "
    "offsets [64, 65, 66, 67, 68, 69]; a kernel that picks its pointer at run time declares the site "
    "('selects_pointers')"
)


def test_a_logsumexp_store_overrunning_into_the_next_argument_is_one_line_exit_1(cli):
    # L holds one batch item of two; batch item 1's L rows (L offsets 64..127) land on O's first 64 elements
    rc, out, err = cli(f"{FILE}:launch_stray", "--N", "64", "--d", "16")
    assert rc == 1 and err.strip().splitlines() == [STRAY]
    assert "<unattributed>" not in out  # no lane outside every argument: bounds alone would see nothing


def test_in_python_the_stray_store_raises_access_error_with_the_counts():
    with pytest.raises(AccessError) as e:
        count_file(FILE, "launch_stray", "triton", dict(N=64, d=16), arrays=False)
    assert str(e.value) == STRAY.removeprefix("iosim: error: ")
    assert e.value.counts.stray_lanes == 64 and e.value.counts.per_array["L"].writes == 64
    counts, _, _ = count_file(FILE, "launch_stray", "triton", dict(N=64, d=16), arrays=False, strict=False)
    assert counts.stray[0]["array"] == "O" and counts.stray[0]["own"] == "L"


def test_a_kernel_picking_its_pointer_at_run_time_is_flagged_until_declared(cli):
    rc, _, err = cli(f"{FILE}:launch_pick", "--N", "4", "--d", "4")
    assert rc == 1 and "kernel pick site _kernel_launches.py:" in err and "loaded 16 lanes inside B" in err
    for declared in ("launch_pick_kernel", "launch_pick_site"):
        rc, out, err = cli(f"{FILE}:{declared}", "--N", "4", "--d", "4")
        assert rc == 0 and err == "", err
        assert "B        16" in out
    rc, _, err = cli(f"{FILE}:launch_pick_wrong", "--N", "4", "--d", "4")
    assert rc == 2 and err.strip() == (
        "iosim: error: launcher result 'selects_pointers' must name a kernel launched (pick) or a FILE.py:LINE site "
        "of one of its loads or stores, got '_kernel_launches.py:1'"
    )


def test_a_jitted_helper_called_from_two_lines_with_two_pointers_is_two_sites(cli):
    rc, out, err = cli(f"{FILE}:launch_two_calls", "--N", "4", "--d", "4")
    assert rc == 0 and err == "", err
    assert "B        16" in out


TRITON_EXAMPLES = {  # the project's Triton example launchers, small (the library launchers: tests/test_kernels_libs)
    "triton_flash2.py": dict(N=80, d=16, Br=32, Bc=16, H=2),
    "triton_flash2_masked.py": dict(N=80, d=16, Br=32, Bc=16, H=2),
    "triton_flash2_bwd.py": dict(N=80, d=16, Br=32, Bc=16, H=2, causal=True),
    "triton_decode_splitkv.py": dict(N=80, d=16, Bc=16, splits=3, H=4, kv_heads=2),
    "triton_flex_blocksparse.py": dict(N=80, d=16, Br=16, Bc=16, H=2),
    "torch_flex_template.py": dict(N=72, d=16, block=16, H=2, score="qkv"),
}


def test_every_triton_example_counts_with_nothing_flagged():
    jobs = [(str(EXAMPLES / name), None, params) for name, params in TRITON_EXAMPLES.items()]
    runs = count_batch(jobs, "triton", arrays=False, strict=False)
    for name, (counts, _, _) in zip(TRITON_EXAMPLES, runs, strict=True):
        assert counts.stray == [] and counts.stray_lanes == 0, (name, counts.stray)
        assert counts.out_of_bounds_lanes == 0, (name, counts.out_of_bounds)


NUMBA_FILE = str(Path(__file__).with_name("_kernel_numba_stray.py"))
NUMBA_LANES = str(Path(__file__).with_name("_kernel_numba_lane_order.py"))
NUMBA_COPIES = str(Path(__file__).with_name("_kernel_numba_copies.py"))


@pytest.fixture(scope="module")
def numba_runs():
    pytest.importorskip("numba")
    names = ["launch_pick", "launch_pick_declared", "launch_copy", "launch_two_calls"]
    jobs = [(NUMBA_FILE, n, {}) for n in names] + [(NUMBA_LANES, "launch_pick_reversed", {})]
    jobs += [(NUMBA_COPIES, n, {}) for n in ("launch_two_arrays", "launch_one_array_twice")]
    return [c for c, _, _ in count_batch(jobs, "numba-cuda", arrays=False, strict=False)]


def test_numba_cuda_sites_flag_a_kernel_picking_its_array_at_run_time(numba_runs):
    picked, declared, copied, helper, reversed_ = numba_runs[:5]
    # B's lanes 0..7 (threads 0..7 of block 1), A's offsets of them depend on where the simulator's copies of A and
    # B lie (B's address minus A's, in elements, then consecutive). Before the block's accesses were flushed in
    # thread order, a busy scheduler listed B's lanes out of order (one CI run of 2026-11-28; _kernel_numba_lane_order
    # forces thread 7 first, which listed [7, 6, 5, 4, 3, 2])
    for counts, kernel, line in ((picked, "pick", "_kernel_numba_stray.py:15"),
                                 (reversed_, "pick_reversed", "_kernel_numba_lane_order.py:34")):  # fmt: skip
        e = counts.stray[0]
        own = e["own_offsets"]
        assert own == [own[0] + k for k in range(6)] and (own[0] >= 8 or own[0] <= -8)  # B outside A
        side = "past the end of" if own[0] >= 8 else "before the start of"
        assert counts.stray_lanes == 8 and access_problem(counts) == (
            f"8 stray lanes (a site that moved one argument, then another): first, kernel {kernel} site {line} "
            f"program (1, 0, 0) loaded 8 lanes inside B at element offsets [0, 1, 2, 3, 4, 5], {side} A (8 "
            f"elements, which the site moved in program (0, 0, 0)) at its offsets {own}; a kernel that picks its "
            "pointer at run time declares the site ('selects_pointers')"
        )
        assert (e["own"], e["array"], e["total"]) == ("A", "B", 8)
        assert {n: (a.reads, a.writes) for n, a in counts.per_array.items()} == {"A": (8, 0), "B": (8, 0),
                                                                                  "Out": (0, 16)}  # fmt: skip
    assert declared.stray_lanes == 0 and declared.per_array["B"].reads == 8
    assert copied.stray_lanes == 0 and copied.out_of_bounds_lanes == 0
    assert helper.stray_lanes == 0 and helper.per_array["B"].reads == 8  # a device function's call sites differ


def test_numba_cuda_arrays_are_the_host_arrays_copied_whatever_bytes_their_copies_reuse(numba_runs):
    # copy_rows reads 16 elements of its X and writes 16 of Out per launch, two launches each; the simulator's copy of
    # Z (then of X again) lay at the bytes of the first launch's copy of X (then of Out), which named them X (Out)
    two, twice = numba_runs[5:]
    assert {n: (a.reads, a.writes) for n, a in two.per_array.items()} == {"X": (16, 0), "X#2": (16, 0),
                                                                           "Out": (0, 32)}  # fmt: skip
    assert {n: (a.reads, a.writes) for n, a in twice.per_array.items()} == {"X": (32, 0), "Out": (0, 32)}
    assert two.stray_lanes == twice.stray_lanes == 0 and two.out_of_bounds_lanes == twice.out_of_bounds_lanes == 0

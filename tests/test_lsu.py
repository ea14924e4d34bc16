"""The LSU level (iosim.hierarchy.lsu): sectors per warp request of the kernels' tile copies, held against
independent models written here (a literal thread-by-thread replay of the copy loops) and against the 62 kernel
launches Nsight Compute measured on the H100 (experiments/bench/gpu_h100/ncu-sweep.json)."""

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

import iosim  # noqa: F401 - maps the iosim.* namespace
from iosim.base.errors import InputError
from iosim.hierarchy import lsu

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_two_warps_copy_a_small_tile_by_hand():
    # A 3 x 20 float32 tile of an array with rows of 24 words, 64 threads (2 warps), one iteration each.
    # Warp 0 copies elements 0..31: row 0 (words 0-19: sectors 0, 1, 2) and row 1, columns 0-11 (words 24-35:
    # sectors 3, 4). Warp 1 copies 32..59: row 1, columns 12-19 (words 36-43: sectors 4, 5) and row 2 (words
    # 48-67: sectors 6, 7, 8). 5 + 5 = 10 sectors; sector 4 is counted by both requests.
    assert lsu.copy_sectors(3, 20, 24, 0, 64) == 10
    # Starting 4 words into a sector: warp 0 words 4-23 (0, 1, 2), 28-39 (3, 4); warp 1 words 40-47 (5),
    # 52-71 (6, 7, 8): 5 + 4 = 9.
    assert lsu.copy_sectors(3, 20, 24, 4, 64) == 9
    # One warp (32 threads) runs the same two groups of elements as two iterations: the same 10.
    assert lsu.copy_sectors(3, 20, 24, 0, 32) == 10


# ------------------------------------------------------------------------ an independent replay of the kernels
UNROLL = 4  # read off the PTX below (test_copy_loops_are_unrolled_four_times_in_the_ptx)


def replay_copy(requests, array_words_base, ld, r0, nr, c0, nc, threads):
    """Each thread's loop ``for e in range(tid, nr * nc, threads)`` run literally as the compiled code runs it: passes
    of UNROLL iterations while UNROLL remain, then the rest one by one in a second loop. A request: the lanes of one
    warp at one (code, iteration); its sectors: the distinct 32-byte chunks of their float32 addresses."""
    n = nr * nc
    tally = {}
    for tid in range(threads):
        mine = list(range(tid, n, threads))
        in_passes = len(mine) - len(mine) % UNROLL
        for it, e in enumerate(mine):
            word = array_words_base + (r0 + e // nc) * ld + c0 + e % nc
            code = "unrolled" if it < in_passes else "rest"
            tally.setdefault((code, it, tid // 32), set()).add(word * 4 // 32)
    requests.append(sum(len(s) for s in tally.values()))


def replay_flash2(N, d, Br, Bc, BH, threads, causal):
    ld, st = {}, {}
    Tr, Tc = -(-N // Br), -(-N // Bc)
    for bh in range(BH):
        for i in range(Tr):
            r0, br = i * Br, min(Br, N - i * Br)
            for name, r, n in (("Q", r0, br),):
                replay_copy(ld.setdefault(name, []), bh * N * d, d, r, n, 0, d, threads)
            warps = -(-threads // 32)
            ld.setdefault("mask", []).append(warps * Tc)  # the scan over blocks[i, :]
            for j in range(Tc):
                c0, bc = j * Bc, min(Bc, N - j * Bc)
                if causal and c0 > r0 + br - 1:
                    continue
                ld["mask"].append(warps)  # the skip test reads blocks[i, j]
                replay_copy(ld.setdefault("K", []), bh * N * d, d, c0, bc, 0, d, threads)
                replay_copy(ld.setdefault("V", []), bh * N * d, d, c0, bc, 0, d, threads)
            replay_copy(st.setdefault("O", []), bh * N * d, d, r0, br, 0, d, threads)
            replay_copy(st.setdefault("L", []), bh * N, 0, 0, 1, r0, br, threads)
    return {op: {a: 32 * sum(v) for a, v in t.items()} for op, t in (("ld", ld), ("st", st))}


def replay_square(N, d, B, BH, threads, causal):
    ld1, st1, ld2, st2 = {}, {}, {}, {}
    T, Td = -(-N // B), -(-d // B)
    for bh in range(BH):
        for i in range(T):
            r0, bi = i * B, min(B, N - i * B)
            for j in range(T):
                if causal and j > i:
                    continue
                c0, bj = j * B, min(B, N - j * B)
                for s in range(Td):
                    k0, bk = s * B, min(B, d - s * B)
                    replay_copy(ld1.setdefault("Q", []), bh * N * d, d, r0, bi, k0, bk, threads)
                    replay_copy(ld1.setdefault("K", []), bh * N * d, d, c0, bj, k0, bk, threads)
                replay_copy(st1.setdefault("S", []), bh * N * N, N, r0, bi, c0, bj, threads)
            replay_copy(st1.setdefault("L", []), bh * N, 0, 0, 1, r0, bi, threads)
            replay_copy(ld2.setdefault("L", []), bh * N, 0, 0, 1, r0, bi, threads)
            for c in range(Td):
                c0, bc = c * B, min(B, d - c * B)
                for k in range(T):
                    if causal and k > i:
                        continue
                    k0, bk = k * B, min(B, N - k * B)
                    replay_copy(ld2.setdefault("S", []), bh * N * N, N, r0, bi, k0, bk, threads)
                    replay_copy(ld2.setdefault("V", []), bh * N * d, d, k0, bk, c0, bc, threads)
                replay_copy(st2.setdefault("O", []), bh * N * d, d, r0, bi, c0, bc, threads)
    done = lambda t: {a: 32 * sum(v) for a, v in t.items()}  # noqa: E731
    return {"ld": done(ld1), "st": done(st1)}, {"ld": done(ld2), "st": done(st2)}


@pytest.mark.parametrize(("N", "d", "Br", "Bc", "BH", "threads"), [(37, 12, 5, 7, 3, 64), (29, 9, 4, 4, 2, 96)])
@pytest.mark.parametrize("causal", [False, True])
def test_flash2_equals_a_literal_replay(N, d, Br, Bc, BH, threads, causal):
    want = replay_flash2(N, d, Br, Bc, BH, threads, causal)
    got = lsu.predict("flash2_forward_kernel", N, d, {"Br": Br, "Bc": Bc}, BH, threads, causal)
    assert got["per_array"] == want
    assert got["ld"] == sum(want["ld"].values()) and got["st"] == sum(want["st"].values())


@pytest.mark.parametrize(("N", "d", "B", "BH", "threads"), [(23, 13, 5, 3, 64), (19, 6, 7, 2, 32)])
@pytest.mark.parametrize("causal", [False, True])
def test_square_tiling_equals_a_literal_replay(N, d, B, BH, threads, causal):
    p1, p2 = replay_square(N, d, B, BH, threads, causal)
    assert lsu.predict("square_phase1_kernel", N, d, {"B": B}, BH, threads, causal)["per_array"] == p1
    assert lsu.predict("square_phase2_kernel", N, d, {"B": B}, BH, threads, causal)["per_array"] == p2


# --------------------------------------------------------------------------------- against the H100's numbers
@pytest.fixture(scope="module")
def rows():
    return lsu.compare()


def test_the_41_sweep_launches_against_nsight(rows):
    assert len(rows) == 62 and len({r["label"] for r in rows}) == 41
    assert sum(r["kernel"] == "flash2_forward_kernel" for r in rows) == 20
    for r in rows:  # every launch exact, loads (flash2's mask reads included) and stores
        assert (r["ld"], r["st"]) == (r["measured_ld"], r["measured_st"]), (r["label"], r["kernel"])
        assert (r["mask"] > 0) == (r["kernel"] == "flash2_forward_kernel")
    # The unroll split only adds requests: one request per iteration is never above, and misses square tiling.
    assert all(r["plain_ld"] <= r["ld"] and r["plain_st"] <= r["st"] for r in rows)
    missed = [r for r in rows if (r["plain_ld"], r["plain_st"]) != (r["ld"], r["st"])]
    assert missed and all(r["kernel"].startswith("square") for r in missed)


@pytest.mark.slow  # three kernels compiled to PTX: about 50 s on two cores
def test_copy_loops_are_unrolled_four_times_in_the_ptx():
    """UNROLL from the compiled code: every loop of the two kernels that touches global memory holds UNROLL global
    accesses per pass (the unrolled loop) or 1 (the loop of the leftover iterations)."""
    code = textwrap.dedent(
        r"""
        import re
        import numba.cuda
        if "numba_cuda" not in numba.cuda.__file__:
            print("SKIP: numba.cuda is numba's own target here, not numba-cuda's (the cuda extra's redirect)")
            raise SystemExit(0)
        from numba.cuda.cudadrv import nvvm
        if not nvvm.is_available():
            print("SKIP: libNVVM not found: install numba-cuda[cu13] (the nvidia-nvvm wheel)")
            raise SystemExit(0)
        from numba import cuda
        from iosim.algorithms.cuda import ptx
        ptx.real_target()
        sigs = ptx.signatures()
        with ptx._target_cc_for_device_functions((9, 0)):
            for name in ("flash2_forward_kernel", "square_phase1_kernel", "square_phase2_kernel"):
                fn, sig = sigs[name]
                text, _ = cuda.compile_ptx(fn.py_func, sig, cc=(9, 0))
                for block in re.split(r"\n(?=\$L__BB\d+_\d+:)", text):
                    label = re.match(r"(\$L__BB\d+_\d+):", block)
                    if label and re.search(r"bra(?:\.uni)?\s+" + re.escape(label.group(1)) + ";", block):
                        n = len(re.findall(r"\b(?:ld|st)\.global\.", block))
                        if n:
                            print("LOOP", name, n)
        """
    )
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    if p.stdout.startswith("SKIP:"):
        pytest.skip(p.stdout.strip())
    assert p.returncode == 0, p.stderr[-4000:]
    loops = [line.split()[1:] for line in p.stdout.splitlines() if line.startswith("LOOP ")]
    assert {name for name, _ in loops} == {"flash2_forward_kernel", "square_phase1_kernel", "square_phase2_kernel"}
    assert {int(n) for _, n in loops} == {UNROLL, 1} and lsu.UNROLL == UNROLL


def test_mask_reads_are_what_flash2_adds_to_its_counted_words(rows):
    # Label 0 (N = 2048, d = 128, Br = Bc = 1, BH = 8, 128 threads): the counted words are 4 bytes each of Q once
    # and K, V per step; the rest of the measured load bytes is 2 reads x 2048 steps x 4 warps x 32 B per CTA.
    r = rows[0]
    counted = 8 * 2048 * (128 + 2048 * 2 * 128) * 4
    assert r["measured_ld"] - counted == 8 * 2048 * 2 * 2048 * 4 * 32 == r["mask"]


def test_the_docs_table_is_the_commands_output(rows):
    doc = (ROOT / "docs" / "hierarchy-hardware.md").read_text()
    start, end = "<!-- lsu-table: python -m iosim.hierarchy.lsu --table -->\n", "\n<!-- lsu-table end -->"
    assert start in doc and end in doc
    assert doc.split(start)[1].split(end)[0].strip() == lsu.table(rows).strip()


def test_bad_input():
    with pytest.raises(InputError) as e:
        lsu.predict("flash1_forward_kernel", 8, 8, {"Br": 2, "Bc": 2}, 1, 32)
    assert e.value.parameter == "kernel"
    for bad, name in ((dict(N=0), "N"), (dict(threads=2048), "threads"), (dict(BH=-1), "BH")):
        kw = {**dict(N=8, d=8, BH=1, threads=32), **bad}
        with pytest.raises(InputError) as e:
            lsu.predict("flash2_forward_kernel", kw["N"], kw["d"], {"Br": 2, "Bc": 2}, kw["BH"], kw["threads"])
        assert e.value.parameter == name
    with pytest.raises(InputError) as e:
        lsu.predict("square_phase1_kernel", 8, 8, {"Br": 2, "Bc": 2}, 1, 32)
    assert e.value.parameter == "tiles"
    assert lsu.main([]) == 2

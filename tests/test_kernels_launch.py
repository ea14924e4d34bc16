"""A kernel counted as its authors launch it (issue 31): launch options, @triton.autotune (one config pinned, or
several: each counted as its own run, naming the config that ran), @triton.heuristics, tensor descriptors and a
library-style host function all give flash2's closed form per array with nothing unattributed; an out-of-bounds
store is an error naming the kernel, the program and the offsets (exit 1); block sizes are read off the kernel and
a launcher or command line that says otherwise is refused (exit 2).

The launchers are in tests/_kernel_launches.py (kernels written for these tests).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")

from iosim.kernels.comparison import block_sizes, compare  # noqa: E402

FILE = str(Path(__file__).with_name("_kernel_launches.py"))
N, d = 100, 16
AS_LAUNCHED = ["launch", "launch_pinned", "launch_heur", "launch_desc", "launch_host", "launch_tuned"]


@pytest.fixture(scope="module")
def runs():
    from iosim.kernels import count_batch

    names = [*AS_LAUNCHED, "launch_swallows", "launch_says"]
    jobs = [(FILE, name, dict(N=N, d=d, Br=64)) for name in names]  # Br: taken only by launch_swallows
    return dict(zip(names, count_batch(jobs, "triton", arrays=False), strict=True))


def _equal(counts, numbers=None):
    blocks = block_sizes(counts, "flash2", d, numbers or {})
    cmp = compare(counts, "flash2", N, d, blocks["Br"], blocks["Bc"])
    assert cmp.equal, [vars(r) for r in cmp.rows]
    assert set(counts.per_array) == {"Q", "K", "V", "O", "L"}  # nothing unattributed
    assert counts.out_of_bounds_lanes == 0
    return blocks


@pytest.mark.parametrize("name", AS_LAUNCHED[:-1])
def test_each_way_of_launching_counts_the_closed_form_with_nothing_unattributed(runs, name):
    counts, numbers, _ = runs[name]
    assert _equal(counts, numbers) == {"Br": 32, "Bc": 16}
    assert counts.launches == 1 and counts.programs == 4


def test_launch_options_are_dropped_as_triton_drops_them_and_recorded(runs):
    info = runs["launch"][0].launch_info[0]
    assert info["options"] == {"num_warps": 4, "num_stages": 3}
    assert info["constexprs"] == {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_D": 16}
    assert info["grid"] == [4, 1, 1]
    assert info["shapes"]["Q"]["r"] == [[32, 16]] and info["shapes"]["K"]["r"] == [[16, 16]]


def test_a_pinned_autotune_config_is_counted_and_named(runs):
    info = runs["launch_pinned"][0].launch_info[0]
    assert info["config"] == "BLOCK_M=32,BLOCK_N=16,num_warps=4,num_ctas=1,num_stages=3"
    assert info["options"]["num_warps"] == 4


def test_several_autotune_configs_are_each_counted_at_their_own_block_sizes(runs):
    counts, _, _ = runs["launch_tuned"]
    assert len(counts.runs) == 2
    (c1, n1, _), (c2, n2, _) = counts.runs
    assert c1.config.startswith("BLOCK_M=32,BLOCK_N=16,num_warps=4") and c1.config.endswith("(config 1 of 2)")
    assert c2.config.startswith("BLOCK_M=16,BLOCK_N=32,num_warps=8") and c2.config.endswith("(config 2 of 2)")
    assert _equal(c1, n1) == {"Br": 32, "Bc": 16} and c1.programs == 4
    assert _equal(c2, n2) == {"Br": 16, "Bc": 32} and c2.programs == 7
    assert c2.per_array["K"].reads == 7 * N * d  # every one of the 7 row blocks reads all of K


def test_a_named_config_is_the_only_one_counted(cli):
    rc, out, err = cli(f"{FILE}:launch_tuned", "--N", "100", "--d", "16", "--like", "flash2", "--config",
                       "BLOCK_N=32", "--no-numerics")  # fmt: skip
    assert rc == 0, err
    assert "Br=16 Bc=32" in out and "autotune config 1 of" not in out and "autotune config 2 of 2" in out


def test_an_unknown_config_is_one_line_exit_2(cli):
    rc, _, err = cli(f"{FILE}:launch_tuned", "--N", "100", "--d", "16", "--config", "BLOCK_M=8")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "--config must name one config of autotuned kernel fwd" in err and "BLOCK_M=16,BLOCK_N=32" in err


def test_a_config_for_a_kernel_that_is_not_autotuned_is_one_line_exit_2(cli):
    rc, _, err = cli(f"{FILE}:launch", "--N", "100", "--d", "16", "--config", "BLOCK_M=32")
    assert rc == 2 and "--config names a config of an @triton.autotune kernel: this launcher launched none" in err


def test_a_store_past_the_end_of_the_logsumexp_is_an_error_naming_kernel_program_offsets(cli):
    # H = 2, N = 100, BLOCK_M = 32: program (3, h) stores rows 96..127 of head h unmasked; head 1's rows 100..127
    # lie past the end of M (2 x 100 elements): offsets 200..227
    rc, out, err = cli(f"{FILE}:launch_ragged", "--N", "100", "--d", "16", "--like", "flash2", "--no-numerics")
    assert rc == 1
    assert err.strip().splitlines() == [
        "iosim: error: 28 lanes out of bounds (<unattributed>): first, kernel strided_fwd program (3, 1, 0) "
        "stored 28 lanes past the end of L (200 elements) at element offsets [200, 201, 202, 203, 204, 205]"
    ]
    assert "<unattributed>" in out


def test_arrays_the_model_cannot_name_are_an_error_not_a_zero_verdict(cli):
    rc, out, err = cli(f"{FILE}:launch_unnamed", "--N", "100", "--d", "16", "--like", "flash2", "--no-numerics")
    assert rc == 1 and "0x" not in out
    assert "none of flash2's arrays (Q, K, V, O, L) was moved, only q_ptr" in err


def test_block_sizes_on_the_command_line_must_be_what_the_kernel_ran(cli):
    rc, _, err = cli(f"{FILE}:launch", "--N", "100", "--d", "16", "--like", "flash2", "--Br", "128", "--Bc", "32")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "--Br must be what the kernel ran: Br=32 (Q's loads are 32x16), but the command line says Br=128" in err


def test_a_launcher_that_swallows_block_sizes_is_caught(runs):
    from iosim.base.errors import InputError

    counts, numbers, _ = runs["launch_swallows"]  # told Br = 64, ran 32
    with pytest.raises(InputError, match="must be what the kernel ran: Br=32 .*the command line says Br=64"):
        block_sizes(counts, "flash2", d, numbers, {"Br": 64})


def test_a_launcher_returning_other_block_sizes_is_caught(runs):
    from iosim.base.errors import InputError

    counts, numbers, _ = runs["launch_says"]
    with pytest.raises(InputError, match="the launcher returned Br=64"):
        block_sizes(counts, "flash2", d, numbers)


def test_with_no_block_sizes_given_what_ran_is_used(cli):
    rc, out, err = cli(f"{FILE}:launch", "--N", "100", "--d", "16", "--like", "flash2", "--no-numerics")
    assert rc == 0, err
    assert "Br=32 Bc=16" in out and "launch fwd: grid (4, 1, 1)" in out and "num_warps=4" in out


# --- conventions: the logsumexp stored, the layouts declared ------------------------------------------------------
CONVENTIONS = ["launch_log2", "launch_log2_unsaid", "launch_bnhd", "launch_bnhd_undeclared", "launch_layout_unknown",
               "launch_decode_bhd", "launch_decode_bhd_undeclared"]  # fmt: skip


@pytest.fixture(scope="module")
def conv():
    from iosim.kernels import count_batch

    jobs = [(FILE, name, dict(N=N, d=d)) for name in CONVENTIONS]
    return dict(zip(CONVENTIONS, count_batch(jobs, "triton"), strict=True))


def _cmp(run, like="flash2", **kw):
    counts, numbers, arrays = run
    return compare(counts, like, N, d, arrays=arrays, scale=numbers.get("scale"), dtype=numbers.get("dtype"),
                   heads=numbers.get("H", 1), layout=numbers.get("layout"), logsumexp=numbers.get("logsumexp"),
                   **{"Br": 32, "Bc": 16, **kw})  # fmt: skip


def test_a_declared_log2_logsumexp_is_compared_like_with_like(conv):
    cmp = _cmp(conv["launch_log2"])
    assert cmp.equal and [n["output"] for n in cmp.numerics] == ["O", "L"] and cmp.numerics_ok


def test_an_undeclared_log2_logsumexp_is_outside_the_rule_and_says_which_convention_it_is(conv):
    cmp = _cmp(conv["launch_log2_unsaid"])
    L = next(n for n in cmp.numerics if n["output"] == "L")
    assert not L["ok"] and "'logsumexp': 'log2'" in L["hint"]
    assert next(n for n in cmp.numerics if n["output"] == "O")["ok"]


def test_a_declared_bnhd_layout_is_read_as_such(conv):
    cmp = _cmp(conv["launch_bnhd"])
    assert cmp.equal and cmp.numerics_ok and cmp.heads == 6


def test_a_declared_decode_layout_reads_batch_heads_d(conv):
    counts, numbers, arrays = conv["launch_decode_bhd"]
    assert arrays["Q"].shape == (1, 2, d)
    cmp = compare(counts, "decode-splitkv", N, d, Bc=16, heads=2, splits=2, arrays=arrays, layout="BHD",
                  scale=numbers["scale"])  # fmt: skip
    assert cmp.equal and cmp.numerics_ok


@pytest.mark.parametrize(
    "name, like, words",
    [("launch_bnhd_undeclared", "flash2", "read as BHND/HND/ND (undeclared) has B = 2, N = 3"),
     ("launch_layout_unknown", "flash2", "launcher result 'layout' must be one of BHND"),
     ("launch_decode_bhd_undeclared", "decode-splitkv", "has B = 1, N = 2; the model wants B = 1, N = 1")],
)  # fmt: skip
def test_an_undeclared_or_unknown_layout_is_one_line(conv, name, like, words):
    from iosim.base.errors import InputError

    with pytest.raises(InputError, match=words.replace("(", r"\(").replace(")", r"\)")) as e:
        _cmp(conv[name], like, splits=2)
    assert "\n" not in str(e.value)


# --- --like over a whole problem: GQA, empty splits, metadata rows ------------------------------------------------
DECODE = str(Path(__file__).resolve().parents[1] / "iosim" / "kernels" / "examples" / "triton_decode_splitkv.py")
DECODE_CASES = [dict(N=100, d=16, Bc=16, splits=4, H=4, kv_heads=1), dict(N=5, d=8, Bc=16, splits=3, H=2),
                dict(N=5, d=8, Bc=16, splits=3, H=2, skip_empty=True), dict(N=70, d=8, Bc=16, splits=4, H=4, kv_heads=2,
                                                                            skip_empty=True)]  # fmt: skip


@pytest.fixture(scope="module")
def decode_runs():
    from iosim.kernels import count_batch

    return count_batch([(DECODE, None, p) for p in DECODE_CASES], "triton")


def _decode_cmp(run, p):
    from iosim.kernels.comparison import Whole

    counts, numbers, arrays = run
    whole = Whole(H_kv=numbers["kv_heads"], empty_splits=numbers["empty_splits"])
    return compare(counts, "decode-splitkv", p["N"], p["d"], Bc=p["Bc"], heads=p["H"], splits=p["splits"],
                   arrays=arrays, scale=numbers["scale"], whole=whole)  # fmt: skip


@pytest.mark.parametrize("i", range(len(DECODE_CASES)))
def test_decode_over_the_whole_problem_equals_its_closed_form_with_metadata_rows(decode_runs, i):
    p = DECODE_CASES[i]
    cmp = _decode_cmp(decode_runs[i], p)
    assert cmp.equal and cmp.numerics_ok, [vars(r) for r in cmp.rows]
    rows = {r.array: r for r in cmp.rows}
    assert rows["lengths"].model_reads == p["splits"] * p["H"]  # metadata: a row of the model, in the total
    assert cmp.model_total == sum(r.model_reads + r.model_writes for r in cmp.rows)


def test_empty_splits_as_the_kernel_leaves_them(decode_runs):
    # N = 5, Bc = 16, 3 splits: chunks of 16 keys, splits 1 and 2 empty
    written, skipped = (_decode_cmp(decode_runs[k], DECODE_CASES[k]) for k in (1, 2))
    rw = {r.array: (r.reads, r.writes) for r in written.rows}
    rs = {r.array: (r.reads, r.writes) for r in skipped.rows}
    assert rw["O_part"] == (3 * 2 * 8, 3 * 2 * 8) and rs["O_part"] == (2 * 8, 2 * 8)
    assert rw["Q"] == (3 * 2 * 8, 0) and rs["Q"] == (2 * 8, 0)


def test_a_gqa_decode_says_how_often_it_reads_each_kv_head_and_sits_above_the_problems_lower_bound(decode_runs):
    cmp = _decode_cmp(decode_runs[0], DECODE_CASES[0])
    rows = {r.array: r for r in cmp.rows}
    assert rows["K"].reads == 4 * 100 * 16  # per-head: the one KV head read by each of the 4 query heads
    assert rows["K"].verdict.endswith("(g = 4 times per KV head: per-head)") and cmp.gqa == "per-head"
    assert cmp.lower_bound == 4 * 16 + 2 * 100 * 16 + 4 * 16 + 1  # q, K and V once, O, one length
    total = sum(r.reads + r.writes for r in cmp.rows)
    assert total / cmp.lower_bound > 1


def test_a_packed_gqa_kernel_is_read_once_per_kv_head():
    import numpy as np

    from iosim.kernels.comparison import Whole, decode_splitkv
    from iosim.kernels.counting import ArrayTraffic, KernelCounts

    want = decode_splitkv(100, 16, 4, 16, H_q=4, H_kv=1, gqa="packed")
    per = {k: ArrayTraffic(c.reads, c.writes, distinct_reads=c.reads) for k, c in want.items()
           if k in ("lengths", "Q", "K", "V", "O_part", "L_part", "O")}  # fmt: skip
    counts = KernelCounts("triton", per, 5, 2, np.zeros((5, 2), dtype=np.int64))
    cmp = compare(counts, "decode-splitkv", 100, 16, Bc=16, heads=4, splits=4, whole=Whole(H_kv=1))
    assert cmp.equal and cmp.gqa == "packed" and per["K"].reads == 100 * 16
    assert next(r for r in cmp.rows if r.array == "V").verdict.endswith("(once per KV head: packed)")


SAME = """
import numpy as np
from iosim.kernels import count, triton_backend
from iosim.kernels.examples.triton_flash2_bwd import launch as bwd
from tests._kernel_launches import launch_log2

def run(skip):
    triton_backend.SKIP_REPATCH = skip
    out = []
    for launcher in (lambda: bwd(N=70, d=16, Br=16, Bc=32, causal=True), lambda: launch_log2(N=70, d=16)):
        counts, arrays = count(launcher, "triton")
        out.append((counts.to_dict()["per_array"], counts.per_program.tolist(),
                    {k: v.double().numpy() for k, v in arrays.items() if hasattr(v, "double")}))
    return out

a, b = run(True), run(False)
for (pa, pp, xa), (pb, qq, xb) in zip(a, b):
    assert pa == pb and pp == qq, (pa, pb)
    assert xa.keys() == xb.keys() and all(np.array_equal(xa[k], xb[k], equal_nan=True) for k in xa)
print("same")
"""


def test_skipping_tritons_repatching_changes_no_count_and_no_output():
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(root))
    out = subprocess.run([sys.executable, "-c", SAME], capture_output=True, text=True, env=env, cwd=root, timeout=300)
    assert out.stdout.strip() == "same", out.stderr[-2000:]

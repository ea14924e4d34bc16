"""FlashAttention-2's backward over whole problems (iosim.Problem): batch and heads, GQA per-head (dK, dV expanded
to the query heads and summed per group) and packed, N_q != N_k with the bottom-right causal mask, d_qk != d_v.
Simulated == closed form per array and in peak on ragged grids; one head with N_q = N_k is the one-head backward
word for word; numerics against the float64 reference; one-line errors for what has no backward."""

import itertools

import numpy as np
import pytest
from iosim.algorithms import flash
from iosim.memory_model import TwoLevelMemory

import iosim
from iosim import InputError, Problem
from iosim.runner.api import run_keywords
from iosim.theory import io_model
from iosim.theory.tiling import flash_backward_tiling, problem_backward_tiling

HEADS = [(1, 1, 1), (2, 4, 2), (1, 6, 1), (1, 3, 3)]  # (B, H_q, H_kv)
LENGTHS = [(1, 37), (3, 50), (17, 17), (13, 40), (40, 13)]  # decoding, chunked prefill, square, N_q > N_k
TILES = [(3, 4), (7, 9), (16, 5)]


def _count(algo, p, Br, Bc, gqa, fast):
    G, _, R = p.groups(gqa)
    br = min(Br, R)
    M = getattr(io_model, f"{algo}_backward_problem_working_set")(p.d_qk, p.d_v, br, Bc) + 64
    mem = TwoLevelMemory(M, fast=fast)
    nargs = 7 if algo == "flash1" else 6  # flash1 reads l and m, flash2 L
    getattr(flash, f"{algo}_backward_problem")(mem, p, *(None,) * nargs, Br=br, Bc=Bc, gqa=gqa, scale=1.0)
    return mem.stats(), getattr(io_model, f"{algo}_backward_problem")(p, br, Bc, gqa), M


@pytest.mark.parametrize("algo", ["flash1", "flash2"])
@pytest.mark.parametrize("gqa", ["per-head", "packed"])
def test_backward_counts_equal_closed_form_grid(algo, gqa):
    """4 head shapes x 5 length pairs x 3 tilings x causal or not (120 problems) per policy, checked memory on a
    third of them."""
    for k, ((B, Hq, Hkv), (Nq, Nk), (Br, Bc), causal) in enumerate(
        itertools.product(HEADS, LENGTHS, TILES, (False, True))
    ):
        p = Problem(B=B, H_q=Hq, H_kv=Hkv, N_q=Nq, N_k=Nk, d_qk=6, d_v=5, causal=causal)
        stats, pred, M = _count(algo, p, Br, Bc, gqa, fast=k % 3 != 0)
        assert stats.per_array == pred.per_array, (p, Br, Bc)
        assert stats.peak == pred.peak <= M, (p, Br, Bc)


@pytest.mark.parametrize("N, d, Br, Bc, causal", [(1, 1, 1, 1, False), (17, 6, 3, 4, False), (33, 5, 7, 9, True),
                                                  (40, 8, 16, 5, True), (64, 16, 16, 16, True)])  # fmt: skip
@pytest.mark.parametrize("algo", ["flash1", "flash2"])
def test_one_head_problem_is_the_one_head_backward(algo, N, d, Br, Bc, causal):
    p = Problem(N=N, d=d, causal=causal)
    nargs = 7 if algo == "flash1" else 6
    one = TwoLevelMemory(10**6)
    getattr(flash, f"{algo}_backward")(one, *(None,) * nargs, N=N, d=d, Br=Br, Bc=Bc, scale=1.0, causal=causal)
    prob = TwoLevelMemory(10**6)
    getattr(flash, f"{algo}_backward_problem")(prob, p, *(None,) * nargs, Br=Br, Bc=Bc, gqa="per-head", scale=1.0)
    assert one.stats().per_array == prob.stats().per_array
    assert one.stats().peak == prob.stats().peak
    a = getattr(io_model, f"{algo}_backward")(N, d, Br, Bc, causal)
    b = getattr(io_model, f"{algo}_backward_problem")(p, Br, Bc)
    assert (a.per_array, a.peak) == (b.per_array, b.peak)


@pytest.mark.parametrize("N, d, M", [(17, 6, 200), (113, 16, 2000), (64, 64, 30000)])
def test_one_head_backward_tiling_is_the_one_head_rule(N, d, M):
    p = Problem(N=N, d=d)
    for rule, algo in itertools.product(("fit", "paper"), ("flash1", "flash2")):
        a = flash_backward_tiling(algo, N, d, M, rule)
        b = problem_backward_tiling(p, M, rule, N, algorithm=algo)
        assert (a.Br, a.Bc) == (b.Br, b.Bc)


def test_packed_loads_kv_once_per_kv_head_and_needs_no_group_sum():
    p = Problem(B=2, H_q=8, H_kv=2, N_q=5, N_k=64, d_qk=8, d_v=8, causal=True)
    per = io_model.flash2_backward_problem(p, 8, 16, "per-head").per_array
    packed = io_model.flash2_backward_problem(p, 8, 16, "packed").per_array
    assert packed["K"].reads == p.B * p.H_kv * p.N_k * p.d_qk
    assert per["K"].reads == p.g * packed["K"].reads
    assert "dKpart" not in packed and per["dKpart"].reads == per["dKpart"].writes == p.B * p.H_q * p.N_k * p.d_qk
    assert per["dK"].writes == packed["dK"].writes == p.B * p.H_kv * p.N_k * p.d_qk


PROBLEMS = [
    Problem(B=2, H_q=4, H_kv=2, N_q=13, N_k=40, d_qk=6, d_v=5, causal=True),
    Problem(B=1, H_q=3, H_kv=1, N_q=40, N_k=13, d_qk=7, d_v=4, causal=True),
    Problem(B=1, H_q=6, H_kv=1, N_q=1, N_k=37, d_qk=5, d_v=5),
    Problem(B=2, H_q=3, H_kv=3, N_q=17, N_k=23, d_qk=4, d_v=6),
]


@pytest.mark.parametrize("p", PROBLEMS, ids=str)
@pytest.mark.parametrize("gqa", ["per-head", "packed"])
@pytest.mark.parametrize("algo", ["flash1", "flash2"])
def test_backward_numerics_and_counts_through_run(algo, p, gqa):
    r = iosim.run(iosim.Schedule(algo, gqa=gqa), M=700, problem=p, backward=True, seed=3)
    b = r.passes["backward"]
    assert b.exact
    assert b.stats.peak <= 700
    assert set(b.errors) == {"dQ", "dK", "dV"}
    assert max(b.errors.values()) < 1e-10
    for name in ("dQ", "dK", "dV"):
        assert np.isfinite(r.outputs[name]).all()
    assert r.tiling == b.tiling
    count = iosim.run(iosim.Schedule(algo, gqa=gqa), M=700, problem=p, backward=True, count_only=True)
    assert count.passes["backward"].stats.per_array == b.stats.per_array


def test_reference_backward_sums_the_group():
    p = Problem(B=1, H_q=2, H_kv=1, N_q=3, N_k=4, d_qk=2, d_v=3)
    rng = np.random.default_rng(0)
    Q, K, V, dO = (rng.standard_normal(s) for s in ((6, 2), (4, 2), (4, 3), (6, 3)))
    dQ, dK, dV = iosim.runner.references.problem_reference_backward(p, Q, K, V, dO, 0.5)
    ref = [iosim.algorithms.reference.attention_backward(Q[h * 3 : h * 3 + 3], K, V, dO[h * 3 : h * 3 + 3],
                                                         scale=0.5) for h in range(2)]  # fmt: skip
    np.testing.assert_allclose(dK, ref[0][1] + ref[1][1])
    np.testing.assert_allclose(dV, ref[0][2] + ref[1][2])
    np.testing.assert_allclose(dQ[3:], ref[1][0])


@pytest.mark.parametrize(
    "kw, parameter",
    [
        (dict(algorithm="standard"), "backward"),
        (dict(splits=2), "splits"),
        (dict(problem=Problem(B=1, H_q=2, H_kv=1, N_q=3, N_k=32, d_qk=8, d_v=8, page_size=8)), "page_size"),
        (dict(problem=Problem(B=1, H_q=2, H_kv=1, N_q=3, N_k=32, d_qk=8, d_v=4, latent=True)), "latent"),
    ],
)
def test_backward_refusals_are_one_line(kw, parameter):
    kw = {"algorithm": "flash2", "problem": Problem(B=1, H_q=2, H_kv=1, N_q=3, N_k=32, d_qk=8, d_v=8), **kw}
    with pytest.raises(InputError) as e:
        run_keywords(kw.pop("algorithm"), M=5000, backward=True, count_only=True, **kw)
    assert e.value.parameter == parameter
    assert "\n" not in str(e.value)


def test_cli_backward_over_a_problem(capsys):
    from iosim.cli import main

    args = ["--backward", "--batch", "2", "--heads", "4", "--kv-heads", "2", "--Nq", "5", "--Nk", "30", "--d", "8"]
    assert main(["run", "flash2", *args, "--M", "2000", "--causal", "--count-only"]) == 0
    out = capsys.readouterr().out
    assert "dKpart" in out and "exact (per array and peak)" in out
    assert main(["compare", *args, "--M", "2000"]) == 0
    out = capsys.readouterr().out
    assert "packed" in out and "flash1" in out and "not run: standard" in out
    assert main(["run", "standard", *args, "--M", "2000"]) == 2


# --- masks other than the causal field over a problem: with N_q = N_k and per-head GQA, each (b, query head) is the
# one-head masked schedule under the same empty-block policy (a problem's default is skip, one head's paper) ---
MASKS = ["window:5", "blockdiag:7,9,7", "prefix:6", "dilated:4:2", "random:0.3"]


@pytest.mark.parametrize("policy", ["paper", "skip"])
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("algo", ["flash1", "flash2"])
def test_masked_problem_is_heads_times_one_head(algo, mask, policy):
    p = Problem(B=2, H_q=3, H_kv=1, N_q=23, N_k=23, d_qk=6, d_v=6)
    r = iosim.run(iosim.Schedule(algo, kv_policy=policy), M=500, problem=p, mask=mask, seed=1)
    one = iosim.run(iosim.Schedule(algo, kv_policy=policy), M=500, N=23, d=6, mask=mask, count_only=True)
    fwd = r.passes["forward"]
    assert fwd.exact and max(fwd.errors.values()) < 1e-10
    assert fwd.stats.peak == one.stats.peak
    assert fwd.stats.per_array == {
        n: type(c)(c.reads * 6, c.writes * 6, c.init_writes * 6) for n, c in one.stats.per_array.items()
    }
    q = Problem(B=2, H_q=2, H_kv=2, N_q=23, N_k=23, d_qk=6, d_v=6)
    rb = iosim.run(iosim.Schedule(algo, kv_policy=policy), M=500, problem=q, mask=mask, backward=True, seed=2)
    bwd = rb.passes["backward"]
    assert bwd.exact and max(bwd.errors.values()) < 1e-10
    count = iosim.run(
        iosim.Schedule(algo, kv_policy=policy), M=500, problem=q, mask=mask, backward=True, count_only=True
    )
    assert count.passes["backward"].stats.per_array == bwd.stats.per_array
    one_b = iosim.run(
        iosim.Schedule(algo, kv_policy=policy), M=500, N=23, d=6, mask=mask, backward=True, count_only=True
    )
    per = one_b.passes["backward"].stats.per_array
    assert bwd.stats.per_array == {n: type(c)(c.reads * 4, c.writes * 4, c.init_writes * 4) for n, c in per.items()}
    assert bwd.stats.peak == one_b.passes["backward"].stats.peak


def test_masked_problem_file_mask(tmp_path):
    allowed = np.random.default_rng(0).random((19, 19)) < 0.4
    path = tmp_path / "m.npy"
    np.save(path, allowed)
    r = iosim.run("flash2", M=400, problem=Problem(B=1, H_q=2, H_kv=2, N_q=19, N_k=19, d_qk=5, d_v=5),
                  mask=f"file:{path}", backward=True)  # fmt: skip
    assert r.passes["forward"].exact and r.passes["backward"].exact
    assert max(r.passes["backward"].errors.values()) < 1e-10


@pytest.mark.parametrize(
    "fields, kw, parameter",
    [
        (dict(H_q=4, H_kv=2), dict(gqa="packed"), "gqa per-head"),
        (dict(N_q=10), {}, "N_q = N_k"),
        (dict(d_v=4), {}, "d_qk = d_v"),
    ],
)
def test_masked_problem_refusals_are_one_line(fields, kw, parameter):
    """A masked backward over a problem for standard attention runs the heads one after another (iosim.runner.api.
    _run_by_heads): the refusal names the mask and what the problem or schedule lacks (flash1 and flash2 take every
    shape natively; the forward of standard attention and square tiling takes any N_q <= N_k, d_qk, d_v)."""
    p = Problem(**{"B": 1, "H_q": 2, "H_kv": 2, "N_q": 20, "N_k": 20, "d_qk": 8, "d_v": 8, **fields})
    with pytest.raises(InputError) as e:
        run_keywords("standard", M=5000, problem=p, mask="window:4", count_only=True, backward=True, **kw)
    assert e.value.parameter == "mask" and f"has not {parameter}" in str(e.value)
    assert "\n" not in str(e.value)


def test_masked_backward_with_groups_sums_the_partials():
    """A masked backward with g > 1: per-head partials summed by the group sum, equal to the float64 sums."""
    p = Problem(B=1, H_q=4, H_kv=2, N_q=20, N_k=20, d_qk=8, d_v=8)
    r = iosim.run("flash2", M=5000, problem=p, mask="window:4", backward=True, seed=2)
    assert r.passes["forward"].exact and r.passes["backward"].exact
    assert max(r.passes["backward"].errors.values()) < 1e-12 and r.outputs["dK"].shape == (2 * 20, 8)


@pytest.mark.parametrize("algo", ["flash1", "flash2"])
def test_backward_trace_replays_to_the_counts(algo):
    p = Problem(B=2, H_q=4, H_kv=2, N_q=5, N_k=30, d_qk=8, d_v=6, causal=True)
    r = iosim.run(algo, M=2000, problem=p, backward=True, trace=True, count_only=True)
    assert r.trace.replay().per_array == r.passes["backward"].stats.per_array


@pytest.mark.parametrize("algo", ["flash1", "flash2"])
@pytest.mark.parametrize("gqa", ["per-head", "packed"])
def test_backward_peak_is_exact_when_only_the_short_last_column_block_is_visible(algo, gqa):
    """Issue 32, point 6: a window over the last keys leaves only the short last column block (20 = 2 x 7 + 6)
    visible; the closed-form peak is that block's working set (it was B_c's: flash2 per-head predicted 576 where
    the schedule peaks at 508), and the explicit-tile refusal uses it (M = 520 runs flash2 per-head, refused
    before)."""
    p = Problem(H_q=16, H_kv=1, N_q=2, N_k=20, d=16)
    r = iosim.run(
        iosim.Schedule(algo, Br=8, Bc=7, gqa=gqa), problem=p, M=4000, mask="window:5", count_only=True, backward=True
    )
    bwd = r.passes["backward"]
    assert bwd.exact and bwd.stats.peak == bwd.predicted.peak
    if algo == "flash2" and gqa == "per-head":
        assert bwd.stats.peak == 508
        ok = iosim.run(
            iosim.Schedule(algo, Br=8, Bc=7), problem=p, M=520, mask="window:5", count_only=True, backward=True
        )
        assert ok.passes["backward"].stats.peak == 508
    M = bwd.stats.peak - 1
    with pytest.raises(InputError) as e:
        iosim.run(
            iosim.Schedule(algo, Br=8, Bc=7, gqa=gqa),
            problem=p,
            M=max(M, r.passes["forward"].stats.peak),
            mask="window:5",
            count_only=True,
            backward=True,
        )
    assert e.value.parameter == "Br, Bc"


def test_backward_bytes_follow_the_kernels_dtypes():
    """Issue 32, point 7: dQ is accumulated in fp32 (flash-attn's dq_accum): its read-modify-writes are fp32 bytes,
    the word count unchanged; dK, dV are written at the K/V dtype, dO read at the output's."""
    p = Problem(B=1, H_q=4, H_kv=2, N_q=20, N_k=30, d=16, dtype_q="bf16", dtype_kv="fp8", dtype_o="bf16")
    r = iosim.run(iosim.Schedule("flash2", gqa="packed"), problem=p, M=4000, count_only=True, backward=True)
    words = {n: c.reads + c.writes for n, c in r.stats.per_array.items()}
    same = iosim.run(
        iosim.Schedule("flash2", gqa="packed"),
        problem=Problem(B=1, H_q=4, H_kv=2, N_q=20, N_k=30, d=16),
        M=4000,
        count_only=True,
        backward=True,
    )
    assert words == {n: c.reads + c.writes for n, c in same.stats.per_array.items()}  # words do not see dtypes
    b = r.bytes_per_array
    assert b["dQ"] == 4 * words["dQ"] and b["dO"] == 2 * words["dO"]
    assert b["dK"] == words["dK"] and b["dV"] == words["dV"]
    assert Problem(N=4, d=4).dtype_of("dQ") == "fp64"  # a problem computed in fp64 accumulates in fp64

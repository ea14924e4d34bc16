"""Masks over whole problems (algorithms/flash.py with iosim.algorithms.tile_masks' problem rows): every mask
kind on every problem shape flash1 and flash2 run (batch, GQA per-head and packed, N_q < N_k and decoding, split-KV,
paged KV, MLA), forward and backward, under both empty-block policies. The mask covers the whole sequence (N_k x
N_k) and the queries are its last N_q rows, so every mask is aligned bottom-right as the causal field is.

Checked here: simulated == closed form per array and in peak on ragged grids; outputs and gradients equal the
float64 reference; hand counts that do not go through the mask oracle (a sliding window at decoding reads exactly
the key tiles that meet the window); the causal mask given as a mask equals the causal field; refusals."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import iosim
from iosim import Problem
from iosim.base.errors import InputError
from iosim.cli import main
from iosim.runner.api import run_keywords

MASKS = ["window:5", "window:4:causal", "bigbird:4:1:1:2", "random:0.3", "random-blocks:0.4:3x5", "prefix:6",
         "dilated:9:2", "BD"]  # fmt: skip
SHAPES = [(3, 29), (1, 40), (17, 40), (29, 29)]


def _mask(m: str, Nk: int) -> str:  # noqa: N803
    return f"blockdiag:{Nk // 3},{Nk - Nk // 3}" if m == "BD" else m


def _exact(r) -> bool:
    return all(ps.stats.per_array == ps.predicted.per_array and ps.stats.peak == ps.predicted.peak
               for ps in r.passes.values())  # fmt: skip


def _grid():
    schedules = [{}, {"splits": 3}, {"page_size": 6}, {"latent": True}]
    for algo, m, shape, gqa, policy, sched in itertools.product(
        ["flash1", "flash2"], MASKS, SHAPES, ["per-head", "packed"], [None, "paper"], schedules
    ):
        if not (algo == "flash1" and "splits" in sched):
            yield algo, m, shape, gqa, policy, sched


def _problem(shape, sched) -> tuple[Problem, dict]:
    Nq, Nk = shape
    latent = sched.get("latent", False)
    p = Problem(B=2, H_q=4, H_kv=1 if latent else 2, N_q=Nq, N_k=Nk, d_qk=6, d_v=5, latent=latent,
                page_size=sched.get("page_size"))  # fmt: skip
    return p, ({"splits": sched["splits"]} if "splits" in sched else {})


@pytest.mark.parametrize("algo, m, shape, gqa, policy, sched", list(_grid()))
def test_counts_equal_closed_form(algo, m, shape, gqa, policy, sched):
    """Forward (and, without the inference options, backward) counts per array and peak, on a ragged grid."""
    p, kw = _problem(shape, sched)
    for bwd in (False, True) if not sched else (False,):
        r = run_keywords(algo, problem=p, M=900, gqa=gqa, mask=_mask(m, p.N_k), kv_policy=policy, count_only=True,
                      Br=4, Bc=5, backward=bwd, **kw)  # fmt: skip
        assert _exact(r)
        assert r.kv_policy == (policy or "skip")


@pytest.mark.parametrize("m", MASKS)
@pytest.mark.parametrize("algo", ["flash1", "flash2"])
@pytest.mark.parametrize("gqa", ["per-head", "packed"])
def test_numerics_forward_and_backward(algo, m, gqa):
    """Outputs and gradients against the float64 reference (mask rows N_k - N_q .. N_k - 1 for the queries)."""
    p = Problem(B=2, H_q=4, H_kv=2, N_q=11, N_k=31, d_qk=6, d_v=5)
    r = iosim.run(
        iosim.Schedule(algo, gqa=gqa, Br=4, Bc=5), problem=p, M=900, mask=_mask(m, p.N_k), backward=True, seed=3
    )
    assert _exact(r) and r.finite
    for ps in r.passes.values():
        assert ps.errors and max(ps.errors.values()) < 1e-12


@pytest.mark.parametrize("sched", [{"splits": 3}, {"page_size": 6}, {"latent": True}])
def test_numerics_inference_schedules(sched):
    p, kw = _problem((3, 29), sched)
    r = run_keywords("flash2", problem=p, M=900, gqa="packed", mask="window:7", Br=4, Bc=5, seed=2, **kw)
    assert _exact(r) and max(r.errors.values()) < 1e-12


def test_sliding_window_decoding_by_hand():
    """A window of W keys at decoding (N_q = 1): the query row is the mask's last row, so it sees keys
    [N_k - W, N_k); flash2 with B_c | N_k - W reads exactly the W keys' K and V rows once per KV head (packed) or per
    query head (per-head), and Q once per thread block: counted here by hand, not through the mask oracle."""
    B, Hq, Hkv, Nk, d, W, Bc = 2, 8, 2, 1024, 16, 128, 64
    p = Problem(B=B, H_q=Hq, H_kv=Hkv, N_q=1, N_k=Nk, d=d)
    for gqa, loads in (("packed", B * Hkv), ("per-head", B * Hq)):
        r = iosim.run(iosim.Schedule("flash2", gqa=gqa, Bc=Bc), problem=p, M=20000, mask=f"window:{W}", count_only=True)
        per = r.stats.per_array
        assert per["K"].reads == per["V"].reads == loads * W * d
        assert per["Q"].reads == B * Hq * d and per["O"].writes == B * Hq * d
    # flash1 (K/V outer): the same K, V words; the one query row block streams past the W / Bc tiles it sees
    r = iosim.run(
        iosim.Schedule("flash1", gqa="packed", Bc=Bc), problem=p, M=20000, mask=f"window:{W}", count_only=True
    )
    assert r.stats.per_array["K"].reads == B * Hkv * W * d
    assert r.stats.per_array["Q"].reads == B * Hq * d * (W // Bc)


def test_chunked_prefill_window_is_bottom_right():
    """A chunk of N_q queries at the end of N_k keys under window:W:causal: query q sees keys
    (q + N_k - N_q - W, q + N_k - N_q]; the reference built from that definition (not from the mask module)
    equals the run's output."""
    p = Problem(B=1, H_q=1, H_kv=1, N_q=7, N_k=20, d=4)
    r = iosim.run(iosim.Schedule("flash2", Br=3, Bc=4), problem=p, M=600, mask="window:5:causal", seed=5)
    rng = np.random.default_rng(5)
    Q, K, V = rng.standard_normal((7, 4)), rng.standard_normal((20, 4)), rng.standard_normal((20, 4))
    S = Q @ K.T / 2.0
    q, c = np.arange(7)[:, None] + 13, np.arange(20)[None, :]
    S[(c > q) | (c <= q - 5)] = -np.inf
    P = np.exp(S - S.max(axis=1, keepdims=True))
    np.testing.assert_allclose(r.outputs["O"], (P / P.sum(axis=1, keepdims=True)) @ V, atol=1e-12)


@pytest.mark.parametrize("algo", ["flash1", "flash2"])
def test_causal_mask_equals_causal_field(algo):
    p = Problem(B=2, H_q=4, H_kv=2, N_q=9, N_k=30, d=6)
    pc = Problem(B=2, H_q=4, H_kv=2, N_q=9, N_k=30, d=6, causal=True)
    for gqa in ("per-head", "packed"):
        kw = dict(M=900, gqa=gqa, Br=4, Bc=5, count_only=True, backward=True)
        a = run_keywords(algo, problem=p, mask="causal", **kw)
        b = run_keywords(algo, problem=pc, **kw)
        for name in ("forward", "backward"):
            assert a.passes[name].stats.per_array == b.passes[name].stats.per_array


def test_paper_policy_loads_the_outer_operand_of_empty_blocks():
    """Block-diagonal documents at decoding: the query sees only its own document's keys; skip reads those, paper
    also reads every other K_j, V_j piece flash1 meets (Algorithm 5 loads before testing)."""
    p = Problem(B=1, H_q=2, H_kv=1, N_q=1, N_k=40, d=4)
    kw = dict(M=900, gqa="packed", mask="blockdiag:30,10", Bc=5, count_only=True)
    skip = run_keywords("flash1", problem=p, kv_policy="skip", **kw)
    paper = run_keywords("flash1", problem=p, kv_policy="paper", **kw)
    assert skip.stats.per_array["K"].reads == 10 * 4 and paper.stats.per_array["K"].reads == 40 * 4
    assert skip.stats.per_array["Q"].reads == paper.stats.per_array["Q"].reads == 2 * 2 * 4
    assert _exact(skip) and _exact(paper)


def test_refusals_are_one_line():
    p = Problem(B=1, H_q=2, H_kv=1, N_q=30, N_k=20, d=4)
    with pytest.raises(InputError) as e:
        iosim.run("flash2", problem=p, M=900, mask="window:4", count_only=True)
    assert e.value.parameter == "mask" and "N_q <= N_k" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(InputError) as e:  # a file mask must cover the whole sequence, N_k x N_k
        iosim.run("flash2", problem=Problem(N_q=3, N_k=9, d=4), M=900, mask=np.ones((3, 9), bool), count_only=True)
    assert e.value.parameter == "mask" and "\n" not in str(e.value)


def test_cli(capsys):
    args = ["--batch", "2", "--heads", "8", "--kv-heads", "2", "--Nq", "1", "--Nk", "4096", "--d", "64", "--M",
            "16384", "--mask", "window:1024", "--count-only"]  # fmt: skip
    assert main(["run", "flash2", "--gqa", "packed", *args]) == 0
    out = capsys.readouterr().out
    assert "window:1024 (kv policy skip)" in out and "exact (per array and peak)" in out
    bad = ["--batch", "1", "--Nq", "5000", "--Nk", "4096", "--d", "64", "--M", "16384", "--mask", "window:4"]
    assert main(["run", "flash2", *bad, "--count-only"]) == 2
    err = capsys.readouterr().err
    assert "mask" in err and "N_q <= N_k" in err and err.count("\n") == 1


@pytest.mark.parametrize("gqa", ["per-head", "packed"])
def test_pebble_adapter_over_a_masked_problem(gqa):
    """The problem drivers under a mask, played as a red-blue pebbling: legal, complete, the game's I/O equal to
    iosim's, the outputs equal to the float64 reference."""
    from iosim.pebble.from_run import pebble_run

    p = Problem(B=1, H_q=4, H_kv=2, N_q=2, N_k=7, d=2)
    for algo in ("flash1", "flash2"):
        r = pebble_run(algo, M=80, problem=p, gqa=gqa, mask="window:3:causal")
        assert r.legal and r.io_matches and r.outcome.complete and r.max_error < 1e-12
        assert r.mask == "window:3:causal"


def test_long_mask_work_is_priced_up_front():
    """A random mask over a large problem: every tile of every head is tested (about 60 ns a tile at S = 0.5, the
    rate TileMask.tile_tests prices); over a minute asks, over an hour refuses naming the mask, before any work."""
    p = Problem(H_q=32, N=1 << 20, d=64)
    with pytest.raises(InputError) as e:
        iosim.run("flash2", problem=p, M=65536, mask="random:0.5", count_only=True)
    assert e.value.parameter == "allow_long" and "tile tests of the mask" in str(e.value)
    with pytest.raises(InputError) as e:
        iosim.run("flash2", problem=Problem(B=64, H_q=32, N=1 << 20, d=64), M=65536, mask="random:0.5",
                  count_only=True, allow_long=True)  # fmt: skip
    assert e.value.parameter == "mask" and "\n" not in str(e.value)


# --- standard attention and square tiling: each query head its own one-head schedule of N_q rows (the mask's last
# N_q rows) against N_k keys; standard attention computes every tile whatever the mask, square tiling skips the
# tiles the mask empties in both phases ---
ONE_HEAD_SHAPES = [(3, 29, 6, 5), (1, 29, 6, 6), (17, 29, 5, 6), (29, 29, 6, 6)]


@pytest.mark.parametrize("m", ["causal", *MASKS])
@pytest.mark.parametrize("algo", ["standard", "square-tiling"])
def test_one_head_algorithms_under_a_mask_over_any_shape(algo, m):
    """Counts per array and peak equal the closed form (square_tiling_problem on the mask's tile summary; standard
    attention's dense words), count-only equals numeric, outputs equal the float64 reference."""
    for Nq, Nk, dqk, dv in ONE_HEAD_SHAPES:
        p = Problem(B=2, H_q=4, H_kv=2, N_q=Nq, N_k=Nk, d_qk=dqk, d_v=dv)
        for B in (None, 4):
            r = iosim.run(iosim.Schedule(algo, B=B), problem=p, M=900, mask=_mask(m, Nk), seed=1)
            c = iosim.run(iosim.Schedule(algo, B=B), problem=p, M=900, mask=_mask(m, Nk), count_only=True)
            assert _exact(r) and r.finite and max(r.errors.values()) < 1e-12, (Nq, Nk, B)
            assert c.stats.per_array == r.stats.per_array and c.stats.peak == r.stats.peak
            assert r.mask.startswith(_mask(m, Nk)) and r.kv_policy == "skip"
    if algo == "standard":  # the dense baseline: the mask changes no word
        dense = iosim.run(iosim.Schedule(algo, B=4), problem=p, M=900, count_only=True)
        assert dense.stats.per_array == c.stats.per_array


def test_square_tiling_sliding_window_decoding_by_hand():
    """A window of W keys at decoding: the one query row meets the W / B key tiles of [N_k - W, N_k) when B divides
    N_k - W, so square tiling reads exactly W keys of K and V per query head, Q once per tile and writes S on W words:
    counted here by hand, not through the mask oracle."""
    Hq, Hkv, Nk, d, W, B = 4, 2, 512, 16, 96, 32
    p = Problem(H_q=Hq, H_kv=Hkv, N_q=1, N_k=Nk, d=d)
    r = iosim.run(iosim.Schedule("square-tiling", B=B), problem=p, M=8000, mask=f"window:{W}:causal", count_only=True)
    per = r.stats.per_array
    assert per["K"].reads == per["V"].reads == Hq * (W + 1) * d - Hq * d  # window:W:causal sees W keys
    assert per["Q"].reads == Hq * d * (W // B) and per["S"].writes == Hq * W
    assert r.lower_bound == Hq * 2 * d + Hkv * W * 2 * d  # the floor: the keys the query sees, once per KV head


def test_compare_ranks_every_algorithm_under_a_mask_at_decoding(capsys):
    argv = ["compare", "--heads", "4", "--kv-heads", "2", "--Nq", "2", "--Nk", "300", "--d", "16", "--M", "4000",
            "--mask", "window:64:causal", "--count-only"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "not run" not in out and "square-tiling" in out and "standard" in out
    assert out.count(" yes ") == 6  # flash1, flash2 (per-head, packed), square tiling, standard: all exact


@pytest.mark.parametrize("algo", ["standard", "square-tiling"])
def test_one_head_algorithms_trace_one_head_and_refuse_many(algo, tmp_path, capsys):
    """One head with N_q != N_k: the trace is recorded and replays to the counts; over B H_q > 1 heads (each head's
    schedule addresses its own rows) trace and show refuse in one line, exit 2, before writing anything."""
    p = Problem(N_q=3, N_k=20, d_qk=4, d_v=3)
    r = iosim.run(algo, problem=p, M=300, mask="window:3", trace=True, count_only=True)
    assert r.trace is not None and r.trace.replay().per_array == r.stats.per_array
    with pytest.raises(InputError) as e:
        iosim.run(algo, problem=Problem(H_q=2, N_q=3, N_k=20, d=4), M=300, trace=True, count_only=True)
    assert e.value.parameter == "trace" and "\n" not in str(e.value)
    many = ["--heads", "2", "--Nq", "3", "--Nk", "20", "--d", "4", "--M", "300"]
    out = tmp_path / "t.csv"
    for argv in (["trace", algo, *many, "-o", str(out)], ["show", algo, *many, "--text"]):
        assert main(argv) == 2
        err = [x for x in capsys.readouterr().err.splitlines() if not x.startswith("iosim: compiling")]
        assert len(err) == 1 and "trace" in err[0]
    assert not out.exists()

"""Backward passes: reference gradients vs finite differences, algorithms vs the reference, exact counts vs io_model,
peak <= M, count-only == numeric, the API/CLI surface and bad inputs."""

import dataclasses
import json

import numpy as np
import pytest
from conftest import ODD_D, ODD_N
from hypothesis import given, settings
from hypothesis import strategies as st
from iosim.algorithms.reference import (
    attention_backward,
    attention_forward,
    default_scale,
    naive_backward,
    naive_forward,
)
from iosim.memory_model import CapacityError

import iosim
from iosim import InputError, cli
from iosim.runner import registry
from iosim.theory import io_model

CORE = ("standard", "flash1", "flash2")  # the backward passes of this file's issue
BACKWARD = [name for name in iosim.algorithm_names() if registry.get(name).has_backward]


def _M_for(name, N, d):
    """A capacity that forces several blocks at these sizes but fits the forward and the backward."""
    return max(registry.get(name).min_M(N, d, backward=True), 9 * d + 60)


def _inputs(N, d, seed):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((N, d)) for _ in range(4))


# ---------------------------------------------------------------------------------------------------------------
# The reference
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("N, d, causal, scale", [(3, 2, False, None), (5, 3, True, None), (4, 4, False, 0.7)])
def test_reference_backward_matches_central_finite_differences(N, d, causal, scale):
    Q, K, V, dO = _inputs(N, d, seed=N * d)

    def loss(Q, K, V):
        return float(np.sum(attention_forward(Q, K, V, scale=scale, causal=causal)[0] * dO))

    grads = attention_backward(Q, K, V, dO, scale=scale, causal=causal)
    h = 1e-6
    for which, g in enumerate(grads):
        fd = np.zeros_like(g)
        for idx in np.ndindex(*g.shape):
            args_p = [Q.copy(), K.copy(), V.copy()]
            args_m = [Q.copy(), K.copy(), V.copy()]
            args_p[which][idx] += h
            args_m[which][idx] -= h
            fd[idx] = (loss(*args_p) - loss(*args_m)) / (2 * h)
        np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)


# ---------------------------------------------------------------------------------------------------------------
# Numerics of the algorithms
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CORE)
@pytest.mark.parametrize("N", ODD_N)
@pytest.mark.parametrize("d", ODD_D)
@pytest.mark.parametrize("causal", [False, True])
def test_float64_gradients_match_reference(name, N, d, causal):
    Q, K, V, dO = _inputs(N, d, seed=N + d)
    M = _M_for(name, N, d)
    r = iosim.run(name, Q=Q, K=K, V=V, dO=dO, M=M, causal=causal, backward=True)
    refs = attention_backward(Q, K, V, dO, causal=causal)
    for g, ref in zip(("dQ", "dK", "dV"), refs, strict=True):
        assert np.all(np.isfinite(r.outputs[g])), f"an element of {g} was never written"
        assert r.errors[g] <= 1e-10 * max(1.0, np.abs(ref).max()), g
    assert r.stats.peak <= M and r.passes["forward"].stats.peak <= M
    assert r.main.exact, (r.stats.per_array, r.predicted.per_array)
    assert r.passes["forward"].exact


@pytest.mark.parametrize("name", CORE)
@pytest.mark.parametrize("causal", [False, True])
def test_float32_gradients_follow_flashattention_rule(name, causal):
    N, d = 203, 59
    Q, K, V, dO = _inputs(N, d, seed=7)
    r = iosim.run(name, Q=Q, K=K, V=V, dO=dO, M=_M_for(name, N, d), causal=causal, backward=True, dtype="float32")
    refs = attention_backward(Q, K, V, dO, causal=causal)
    _, _, P32 = naive_forward(Q, K, V, default_scale(d), causal, np.float32)
    naive = naive_backward(Q, K, V, dO, P32, default_scale(d), np.float32)
    for g, ref, nv in zip(("dQ", "dK", "dV"), refs, naive, strict=True):
        assert r.outputs[g].dtype == np.float32
        naive_err = np.abs(nv - ref).max()
        assert r.errors[g] <= 3 * naive_err + 1e-6 * max(1.0, np.abs(ref).max()), (g, r.errors[g], naive_err)


# ---------------------------------------------------------------------------------------------------------------
# Exact counts
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CORE)
@pytest.mark.parametrize("N", [1, 7, 64, 100, 203, 257])
@pytest.mark.parametrize("causal", [False, True])
def test_count_only_equals_numeric_and_io_model(name, N, causal):
    d = 16
    for M in (_M_for(name, N, d), 700, 1000, 5000):
        if M < registry.get(name).min_M(N, d, backward=True):
            continue
        num = iosim.run(name, N=N, d=d, M=M, causal=causal, backward=True)
        cnt = iosim.run(name, N=N, d=d, M=M, causal=causal, backward=True, count_only=True)
        assert cnt.stats == num.stats
        assert cnt.passes["forward"].stats == num.passes["forward"].stats
        assert all(cnt.outputs[g] is None for g in ("dQ", "dK", "dV"))
        assert num.main.exact and num.stats.peak <= M
        assert num.stats.per_array == num.predicted.per_array


def test_standard_one_and_two_pass_dS_sweeps_are_exact():
    """2N + 1 <= M: rows of P and dP swept once; otherwise twice in chunks. Both match the closed form."""
    d = 3
    for N, M in ((50, 101), (50, 100), (50, 60), (9, 5)):
        r = iosim.run("standard", N=N, d=d, M=M, backward=True, causal=True)
        assert r.main.exact and r.stats.peak <= M
        sweeps = 1 if io_model.softmax_backward_rows(N, M) else 2
        assert r.stats.per_array["dP"].reads == sweeps * N * N


def test_closed_forms_reduce_to_the_papers_forms():
    """docs/theory.md B0, B1, B2 (B2 with the inner load of O_i dropped), initialisation writes included."""
    N, d = 1000, 64
    for Bc in (1, 7, 64, 333, 1000):
        Tc = io_model.cdiv(N, Bc)
        Br = min(Bc, d)
        p1 = io_model.flash1_backward(N, d, Br, Bc)
        assert p1.total == 4 * N * d + Tc * (5 * N * d + 2 * N) + 3 * N * d
        assert p1.init_writes == 3 * N * d
        p2 = io_model.flash2_backward(N, d, Br, Bc)
        assert p2.total == 6 * N * d + N + Tc * (4 * N * d + 2 * N) + N * d
        assert p2.init_writes == N * d
    N = 100
    p0 = io_model.standard_backward(N, d, M=10**6, B=N)
    assert p0.total == 7 * N * N + 8 * N * d


def test_causal_skips_reduce_the_backward():
    for name in ("flash1", "flash2"):
        full = iosim.run(name, N=300, d=16, M=4000, backward=True, count_only=True)
        half = iosim.run(name, N=300, d=16, M=4000, backward=True, count_only=True, causal=True)
        assert half.stats.total < full.stats.total and half.main.exact
    s_full = iosim.run("standard", N=100, d=16, M=4000, backward=True, count_only=True)
    s_causal = iosim.run("standard", N=100, d=16, M=4000, backward=True, count_only=True, causal=True)
    assert s_full.stats == s_causal.stats  # mask applied, counts unchanged


def test_count_only_backward_scales_to_a_million_rows():
    for name in ("flash1", "flash2"):
        r = iosim.run(name, N=2**20, d=128, M=65536, count_only=True, backward=True)
        assert r.main.exact and r.stats.peak <= 65536


@settings(max_examples=30, deadline=None)
@given(
    name=st.sampled_from(CORE),
    size=st.tuples(st.integers(1, 300), st.integers(1, 70), st.integers(0, 30000), st.booleans()),
)
def test_backward_peak_within_M_and_counts_exact(name, size):
    N, d, extra, causal = size
    M = registry.get(name).min_M(N, d, backward=True) + extra
    r = iosim.run(name, N=N, d=d, M=M, causal=causal, count_only=True, backward=True)
    assert r.stats.peak <= M and r.passes["forward"].stats.peak <= M
    assert r.main.exact and r.passes["forward"].exact


# ---------------------------------------------------------------------------------------------------------------
# Tiling and capacity
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ("flash1", "flash2"))
def test_backward_fit_is_the_largest_block_that_fits(name):
    N, d, M = 1000, 64, 32768
    t = registry.get(name).backward_tiling(N, d, M, "fit")
    ws = io_model.flash1_backward_working_set if name == "flash1" else io_model.flash2_backward_working_set
    assert t.Br == min(t.Bc, d) and ws(d, t.Br, t.Bc) <= M
    assert ws(d, min(t.Bc + 1, d), t.Bc + 1) > M


@pytest.mark.parametrize("name", ("flash1", "flash2"))
def test_paper_tiling_overflows_the_backward(name):
    """Algorithm 4's Bc = ceil(M/4d), Br = min(Bc, d) holds about 3M in the backward: strict mode raises."""
    with pytest.raises(CapacityError):
        iosim.run(iosim.Schedule(name, tiling="paper"), N=1024, d=64, M=16384, backward=True, count_only=True)
    r = iosim.run(
        iosim.Schedule(name, tiling="paper"), N=1024, d=64, M=16384, backward=True, count_only=True, strict=False
    )
    assert r.stats.peak > r.M and r.stats.overflowed and r.main.exact


def test_too_small_M_for_the_backward_names_M():
    d = 16
    M = registry.get("flash1").min_M(64, d, backward=True) - 1
    iosim.run("flash1", N=64, d=d, M=M)  # the forward alone fits
    with pytest.raises(InputError, match="^M "):
        iosim.run("flash1", N=64, d=d, M=M, backward=True)


# ---------------------------------------------------------------------------------------------------------------
# API and CLI
# ---------------------------------------------------------------------------------------------------------------


def test_result_has_both_passes():
    fwd_only = iosim.run("flash2", N=100, d=16, M=2000, seed=3)
    r = iosim.run("flash2", N=100, d=16, M=2000, seed=3, backward=True)
    assert list(r.passes) == ["forward", "backward"] and r.main is r.passes["backward"]
    assert r.passes["forward"].stats == fwd_only.stats  # the forward is unchanged by the backward
    assert r.passes["forward"].errors["O"] == fwd_only.errors["O"]
    assert set(r.errors) == {"dQ", "dK", "dV"}
    assert r.tiling == r.passes["backward"].tiling != r.passes["forward"].tiling
    assert r.lower_bound == iosim.theory.bounds.lower_bound(100, 16, 2000, backward=True)[0]
    d = r.as_dict()
    assert d["pass"] == "backward" and set(d["errors"]) == {"dQ", "dK", "dV"}
    assert d["passes"]["forward"]["total"] == fwd_only.stats.total
    assert d["total_all_passes"] == r.passes["forward"].stats.total + r.stats.total
    json.dumps(d)


def test_random_dO_is_reproducible_and_forward_inputs_unchanged():
    a = iosim.run("flash1", N=40, d=8, M=700, seed=5, backward=True)
    b = iosim.run("flash1", N=40, d=8, M=700, seed=5, backward=True)
    np.testing.assert_array_equal(a.outputs["dQ"], b.outputs["dQ"])
    f = iosim.run("flash1", N=40, d=8, M=700, seed=5)
    np.testing.assert_array_equal(a.outputs["O"], f.outputs["O"])


@pytest.mark.parametrize(
    "kwargs, parameter",
    [
        (dict(dO=np.ones((5, 4))), "dO"),  # dO without backward
        (dict(backward=True, dO=np.ones((6, 4))), "dO"),  # wrong shape
        (dict(backward=True, dO=np.ones((5,))), "dO"),
        (dict(backward=True, dO=np.full((5, 4), np.nan)), "dO"),
        (dict(backward=True, dO=np.full((5, 4), np.inf)), "dO"),
        (dict(backward=True, dO=np.full((5, 4), "x")), "dO"),
        (dict(backward=True, dO=np.ones((5, 4), dtype=complex)), "dO"),
    ],
)
def test_bad_dO(kwargs, parameter):
    Q = np.ones((5, 4))
    with pytest.raises(InputError) as e:
        iosim.run("flash2", Q=Q, K=Q, V=Q, M=500, **kwargs)
    assert e.value.parameter == parameter


def test_algorithm_without_backward_is_an_input_error(monkeypatch):
    fwd_only = dataclasses.replace(registry.get("flash2"), name="fwd-only", backward=None, predict_backward=None)
    monkeypatch.setitem(registry.REGISTRY, "fwd-only", fwd_only)
    iosim.run("fwd-only", N=8, d=4, M=500)
    with pytest.raises(InputError) as e:
        iosim.run("fwd-only", N=8, d=4, M=500, backward=True)
    assert e.value.parameter == "backward" and "fwd-only" in str(e.value)


def test_cli_run_backward_json(capsys):
    assert cli.main(["run", "flash2", "--backward", "--N", "50", "--d", "8", "--M", "600", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["pass"] == "backward" and out["exact"]
    assert set(out["errors"]) == {"dQ", "dK", "dV"} and max(out["errors"].values()) < 1e-12
    assert set(out["passes"]) == {"forward", "backward"}
    assert out["total_all_passes"] == out["passes"]["forward"]["total"] + out["passes"]["backward"]["total"]


def test_cli_run_and_compare_backward(capsys):
    assert cli.main(["run", "flash1", "--backward", "--causal", "--N", "50", "--d", "8", "--M", "600"]) == 0
    out = capsys.readouterr().out
    assert "backward" in out and "dQ max abs error" in out and "total, both passes" in out
    assert cli.main(["compare", "--backward", "--count-only", "--N", "256", "--d", "32", "--M", "4096"]) == 0
    out = capsys.readouterr().out
    assert "backward" in out and "Thm 1.1" in out
    for name in CORE:
        assert name in out
    assert cli.main(["run", "flash1", "--backward", "--N", "50", "--d", "8", "--M", "60"]) == 2
    assert "M must be at least" in capsys.readouterr().err

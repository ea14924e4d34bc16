"""Forward passes: numerics vs the float64 reference, exact counts vs io_model, peak <= M, count-only == numeric."""

import numpy as np
import pytest
from conftest import ODD_D, ODD_N
from iosim.algorithms.reference import attention_forward, default_scale, naive_forward
from iosim.memory_model import CapacityError

import iosim
from iosim.theory import io_model

ALGOS = iosim.algorithm_names()


def _M_for(name, N, d):
    """A capacity that forces several blocks at these sizes but fits every algorithm."""
    return max(iosim.runner.api.registry.get(name).min_M(N, d), 6 * d + 40)


@pytest.mark.parametrize("name", ALGOS)
@pytest.mark.parametrize("N", ODD_N)
@pytest.mark.parametrize("d", ODD_D)
@pytest.mark.parametrize("causal", [False, True])
def test_float64_matches_reference(name, N, d, causal):
    M = _M_for(name, N, d)
    r = iosim.run(name, N=N, d=d, M=M, causal=causal, seed=N + d)
    assert np.all(np.isfinite(r.outputs["O"])), "an output element was never written"
    O_ref, _ = attention_forward(
        *(np.random.default_rng(N + d).standard_normal((N, d)) for _ in range(3)), causal=causal
    )
    assert r.errors["O"] <= 1e-12 * max(1.0, np.abs(O_ref).max())
    if "L" in r.errors:
        assert r.errors["L"] <= 1e-12 * max(1.0, np.log(N) + 10)
    assert r.stats.peak <= M
    assert r.main.exact, (r.stats.per_array, r.predicted.per_array)


@pytest.mark.parametrize("name", ALGOS)
@pytest.mark.parametrize("causal", [False, True])
def test_float32_follows_flashattention_rule(name, causal, rng):
    N, d = 203, 59
    Q, K, V = (rng.standard_normal((N, d)) for _ in range(3))
    r = iosim.run(name, Q=Q, K=K, V=V, M=_M_for(name, N, d), causal=causal, dtype="float32")
    assert r.outputs["O"].dtype == np.float32
    O_ref, _ = attention_forward(Q, K, V, causal=causal)
    naive_err = np.abs(naive_forward(Q, K, V, default_scale(d), causal, np.float32)[0] - O_ref).max()
    assert r.errors["O"] <= 2 * naive_err + 1e-6


@pytest.mark.parametrize("name", ALGOS)
@pytest.mark.parametrize("N", [1, 7, 64, 100, 203, 256, 257])
@pytest.mark.parametrize("causal", [False, True])
def test_count_only_equals_numeric_and_io_model(name, N, causal):
    d = 16
    for M in (_M_for(name, N, d), 1000, 5000):
        num = iosim.run(name, N=N, d=d, M=M, causal=causal)
        cnt = iosim.run(name, N=N, d=d, M=M, causal=causal, count_only=True)
        assert cnt.stats == num.stats
        assert cnt.outputs["O"] is None
        assert num.main.exact and num.stats.peak <= M


def test_count_only_scales_to_a_million_rows():
    """N = 2^20, d = 128: no N x d data is allocated and the counts equal the closed form."""
    for name in ("flash1", "flash2"):
        r = iosim.run(name, N=2**20, d=128, M=65536, count_only=True)
        assert r.main.exact and r.stats.peak <= 65536
    r = iosim.run("flash1", N=2**20, d=128, M=65536, count_only=True, causal=True)
    assert r.main.exact


def test_flash_counts_match_the_papers_formulas():
    """docs/theory.md: F1 = 2Nd + Tc(3Nd + 4N) (+ Nd + 2N init), F2 = 2Nd(1 + Tr) + N."""
    for N, d, M in [(1000, 64, 20000), (1023, 32, 5000), (4096, 128, 65536)]:
        f1 = iosim.run("flash1", N=N, d=d, M=M, count_only=True)
        Tc = -(-N // f1.tiling.Bc)
        assert f1.stats.total == 2 * N * d + Tc * (3 * N * d + 4 * N) + N * d + 2 * N
        assert f1.stats.init_writes == N * d + 2 * N
        f2 = iosim.run("flash2", N=N, d=d, M=M, count_only=True)
        Tr = -(-N // f2.tiling.Br)
        assert f2.stats.total == 2 * N * d * (1 + Tr) + N


def test_standard_counts_match_S0_when_a_row_fits():
    """docs/theory.md S0: R(N,d,N) + N^2 + 2N^2 + R(N,N,d) + Nd with R(m,k,n) = mk ceil(n/B) + kn ceil(m/B)."""
    N, d, M = 300, 40, 3000
    r = iosim.run("standard", N=N, d=d, M=M, count_only=True)
    B = r.tiling.B

    def R(m, k, n):
        return m * k * -(-n // B) + k * n * -(-m // B)

    assert r.stats.total == R(N, d, N) + N * N + 2 * N * N + R(N, N, d) + N * d


def test_standard_two_pass_softmax_when_a_row_does_not_fit():
    r = iosim.run("standard", N=300, d=8, M=200)
    assert r.stats.per_array["S"].reads == 2 * 300 * 300
    assert r.main.exact and r.errors["O"] < 1e-12


def test_causal_skips_blocks():
    full = iosim.run("flash2", N=512, d=32, M=4000, count_only=True)
    causal = iosim.run("flash2", N=512, d=32, M=4000, count_only=True, causal=True)
    assert causal.stats.per_array["K"].reads < 0.7 * full.stats.per_array["K"].reads
    assert causal.main.exact


def test_paper_tiling_overflows_small_M_under_strict_capacity():
    """FlashAttention's Bc = ceil(M/4d), Br = min(Bc, d) needs more than M words for M below about 4 d^2."""
    with pytest.raises(CapacityError) as e:
        iosim.run(iosim.Schedule("flash1", tiling="paper"), N=1024, d=64, M=4096, count_only=True)
    assert e.value.M == 4096
    r = iosim.run(iosim.Schedule("flash1", tiling="paper"), N=1024, d=64, M=4096, count_only=True, strict=False)
    ws = io_model.flash_working_set(64, 16, 16)
    assert r.stats.peak == ws > 4096 and r.stats.overflowed
    ok = iosim.run(iosim.Schedule("flash1", tiling="paper"), N=1024, d=64, M=65536, count_only=True)
    assert (ok.tiling.Bc, ok.tiling.Br) == (256, 64) and ok.main.exact


def test_fit_tiling_is_the_largest_that_fits():
    for name in ("flash1", "flash2"):
        for N, d, M in [(1000, 64, 20000), (50, 8, 300), (4096, 128, 65536)]:
            t = iosim.run(name, N=N, d=d, M=M, count_only=True).tiling
            big = "Bc" if name == "flash1" else "Br"
            b = getattr(t, big) + 1
            if b <= N:
                s = min(b, d, N)
                br, bc = (s, b) if name == "flash1" else (b, s)
                assert io_model.flash_working_set(d, br, bc) > M

"""The golden reference: row blocks equal the dense formula, fully masked rows, the extended-precision products are
exact, its memory is O(N * block), and a numeric run that runs out of memory is a one-line error."""

from fractions import Fraction

import numpy as np
import pytest
from iosim.algorithms import reference
from iosim.algorithms.reference import (
    attention_backward,
    attention_forward,
    attention_forward_backward,
    matmul_extended,
    naive_backward,
    naive_forward,
)

import iosim
from iosim import InputError


def dense(Q, K, V, dO, scale, causal, offset):
    """The textbook dense formulas, N_q x N_k matrices and all."""
    S = scale * Q @ K.T
    if causal:
        S = np.where(np.tri(*S.shape, offset, dtype=bool), S, -np.inf)
    m = S.max(1, keepdims=True)
    seen = np.isfinite(m)
    P = np.exp(S - np.where(seen, m, 0))
    s = P.sum(1, keepdims=True)
    P /= np.where(seen, s, 1)
    O = P @ V
    with np.errstate(divide="ignore"):
        L = np.where(seen, m + np.log(s), -np.inf)[:, 0]
    dS = P * (dO @ V.T - np.sum(dO * O, 1, keepdims=True))
    return O, L, scale * dS @ K, scale * dS.T @ Q, P.T @ dO


@pytest.mark.parametrize(("N_q", "N_k", "d"), [(1, 1, 3), (17, 17, 5), (23, 9, 4), (9, 23, 7)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block", [1, 4, None])
def test_row_blocks_equal_the_dense_formulas(N_q, N_k, d, causal, block):
    rng = np.random.default_rng(N_q * N_k + d)
    Q, dO = rng.standard_normal((2, N_q, d))
    K, V = rng.standard_normal((2, N_k, d))
    offset = N_k - N_q  # bottom-right: N_q > N_k gives rows that see no key
    want = dense(Q, K, V, dO, 0.4, causal, offset)
    got = attention_forward_backward(Q, K, V, dO, 0.4, causal, offset=offset, block=block)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-13)
    assert np.array_equal(attention_forward(Q, K, V, 0.4, causal, offset=offset, block=block)[0], got[0])
    assert all(
        np.array_equal(a, b)
        for a, b in zip(attention_backward(Q, K, V, dO, 0.4, causal, offset=offset, block=block), got[2:], strict=True)
    )


def test_fully_masked_rows_have_zero_output_minus_inf_logsumexp_and_zero_gradients():
    rng = np.random.default_rng(1)
    Q, dO = rng.standard_normal((2, 7, 4))
    K, V = rng.standard_normal((2, 3, 4))
    O, L, dQ, dK, dV = attention_forward_backward(Q, K, V, dO, causal=True, offset=-4)  # rows 0..3 see nothing
    assert np.all(O[:4] == 0) and np.all(L[:4] == -np.inf) and np.all(dQ[:4] == 0)
    assert np.all(np.isfinite(O[4:])) and np.all(np.isfinite(L[4:]))
    for prec in ("float64", "extended"):
        assert np.all(attention_forward(Q, K, V, causal=True, offset=-4, precision=prec)[1][:4] == -np.inf)
    for dtype in (np.float32, np.float16, "bfloat16"):
        import ml_dtypes

        dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
        On, Ln, P = naive_forward(Q, K, V, 0.5, True, dt, offset=-4)
        assert np.all(On[:4] == 0) and np.all(Ln[:4] == -np.inf) and np.all(np.isfinite(On))
        assert all(np.all(np.isfinite(g)) for g in naive_backward(Q, K, V, dO, P, 0.5, dt))


def test_extended_products_are_exact_to_longdouble():
    rng = np.random.default_rng(2)
    A = rng.standard_normal((3, 300)) * np.exp2(rng.integers(-30, 30, (3, 300)))
    B = rng.standard_normal((300, 2))
    got = matmul_extended(A, B)
    for i in range(3):
        for j in range(2):
            exact = sum(Fraction(float(A[i, k])) * Fraction(float(B[k, j])) for k in range(300))
            mag = sum(abs(Fraction(float(A[i, k])) * Fraction(float(B[k, j]))) for k in range(300))
            err = abs(Fraction(*got[i, j].as_integer_ratio()) - exact)
            assert err <= 4 * np.finfo(np.longdouble).eps * mag  # one rounding of the exact sum, not float64's


def test_extended_golden_is_more_precise_than_float64():
    rng = np.random.default_rng(3)
    Q, K, V = rng.standard_normal((3, 40, 8))
    O64, _ = attention_forward(Q, K, V)
    Oex, _ = attention_forward(Q, K, V, precision="extended")
    assert Oex.dtype == np.longdouble
    assert 0 < np.max(np.abs(O64 - Oex)) < 1e-14  # float64's own rounding shows against the extended golden


def test_reference_memory_is_O_N_block():
    """N = 65536, d = 64: the forward's row blocks hold ~200 MB, not the 32 GiB of an N x N matrix."""
    small = reference.reference_memory(65536, 64, backward=False)
    assert small < 300 * 2**20
    assert reference.reference_memory(65536, 64, backward=True) < 400 * 2**20
    assert reference.default_block(65536) == 128


def test_a_numeric_run_out_of_memory_is_an_input_error_naming_the_sizes(monkeypatch):
    def no_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate 32.0 GiB")

    monkeypatch.setattr("iosim.runner.api.attention_forward", no_memory)
    with pytest.raises(InputError, match=r"ran out of memory in the float64 reference .* N=64, d=8"):
        iosim.run("flash2", N=64, d=8, M=1000)
    r = iosim.run("flash2", N=64, d=8, M=1000, reference=False)  # the reference skipped: counts and outputs
    assert r.errors == {} and r.outputs["O"].shape == (64, 8)

"""iosim.check, the numerical cross-check API, on plain NumPy callables (no CUDA needed)."""

import numpy as np
import pytest

import iosim
from iosim.check import QUICK_D, QUICK_N
from iosim.errors import InputError


def naive(Q, K, V, *, causal, scale):
    S = scale * Q @ np.swapaxes(K, -1, -2)
    if causal:
        S = np.where(np.tril(np.ones(S.shape[-2:], dtype=bool)), S, -np.inf)
    m = S.max(-1, keepdims=True)
    P = np.exp(S - m)
    s = P.sum(-1, keepdims=True)
    return P / s @ V, (m + np.log(s))[..., 0]


def naive_backward(Q, K, V, O, dO, L, *, causal, scale):
    S = scale * Q @ np.swapaxes(K, -1, -2)
    if causal:
        S = np.where(np.tril(np.ones(S.shape[-2:], dtype=bool)), S, -np.inf)
    P = np.exp(S - L[..., None])
    dV = np.swapaxes(P, -1, -2) @ dO
    dS = P * (dO @ np.swapaxes(V, -1, -2) - np.sum(dO * O, -1, keepdims=True)) * scale
    return {"dQ": dS @ K, "dK": np.swapaxes(dS, -1, -2) @ Q, "dV": dV}


def test_a_correct_float32_implementation_passes_forward_and_backward():
    report = iosim.check(naive, quick=True, backward=naive_backward)
    assert report.passed, str(report)
    assert {r.passname for r in report.rows} == {"forward", "backward"}
    assert {(r.N, r.d) for r in report.rows} == {(n, d) for n in QUICK_N for d in QUICK_D}
    assert "PASSED" in report.summary()


def test_backward_found_as_an_attribute_and_dict_outputs():
    def fn(Q, K, V, *, causal, scale):
        O, L = naive(Q, K, V, causal=causal, scale=scale)
        return {"O": O, "L": L}

    fn.backward = naive_backward
    report = iosim.check(fn, N=(9,), d=(5,), heads=1)
    assert report.passed
    assert {r.output for r in report.rows} == {"O", "L", "dQ", "dK", "dV"}


@pytest.mark.parametrize(
    "bug",
    [
        lambda Q, K, V, causal, scale: naive(Q, K, V, causal=causal, scale=1.0),  # forgot the softmax scale
        lambda Q, K, V, causal, scale: naive(Q, K, V, causal=False, scale=scale),  # ignores the mask
        lambda Q, K, V, causal, scale: naive(Q, K, V, causal=causal, scale=scale)[0] + 1e-5,  # a small bias
    ],
    ids=["no-scale", "no-mask", "bias"],
)
def test_wrong_implementations_fail(bug):
    report = iosim.check(lambda Q, K, V, *, causal, scale: bug(Q, K, V, causal, scale), N=(17,), d=(16,))
    assert not report.passed
    assert report.failures and "FAILED" in report.summary()


def test_a_wrong_gradient_fails_with_the_3x_rule():
    def bad_backward(*args, **kw):
        g = naive_backward(*args, **kw)
        g["dK"] = g["dK"] * (1 + 1e-4)
        return g

    report = iosim.check(naive, N=(17,), d=(16,), causal=(False,), backward=bad_backward)
    assert [r.output for r in report.failures] == ["dK"]


def test_float64_implementation_checked_in_float64():
    def fn(Q, K, V, *, causal, scale):
        assert Q.dtype == np.float64
        return naive(Q, K, V, causal=causal, scale=scale)

    assert iosim.check(fn, N=(17,), d=(7,), dtype="float64").passed


def test_inputs_can_be_converted_by_a_callable_and_outputs_read_through_dlpack():
    class Wrapped:  # an array type that only speaks DLPack
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    def fn(Q, K, V, *, causal, scale):
        assert isinstance(Q, Wrapped)
        O, L = naive(Q.a, K.a, V.a, causal=causal, scale=scale)
        return Wrapped(O), Wrapped(L)

    assert iosim.check(fn, N=(9,), d=(4,), inputs=Wrapped, heads=1).passed


def test_user_errors():
    with pytest.raises(InputError):
        iosim.check(naive, N=(0,))
    with pytest.raises(InputError):
        iosim.check(naive, dtype="int32")
    with pytest.raises(InputError):
        iosim.check(naive, inputs="jax")
    with pytest.raises(InputError):
        iosim.check(naive, heads=0)


def test_report_table_lists_every_output():
    report = iosim.check(naive, N=(5,), d=(3,), causal=(True,), heads=1)
    lines = report.table().splitlines()
    assert len(lines) == 2 + len(report.rows)  # header, rule, rows
    assert str(report).endswith(report.summary())

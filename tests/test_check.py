"""iosim.check, the numerical cross-check API, on plain NumPy callables (no CUDA needed): correct implementations
pass on every shape (N = 1 included) and dtype, broken ones fail with a clear row, bad outputs are rows."""

import importlib

import numpy as np
import pytest

import iosim
from iosim.base.errors import InputError
from iosim.kernels.check import ALIGNS, DISTRIBUTIONS, QUICK_D, QUICK_N

check_module = importlib.import_module("iosim.kernels.check")


def _keep(nq, nk, align="bottom-right", below=0):
    return np.tri(nq, nk, (nk - nq if align == "bottom-right" else 0) - below, dtype=bool)


def attention(Q, K, V, *, causal, scale, work=np.float32, align="bottom-right", max_sub=True, below=0, drop=0):
    """A correct attention in ``work`` precision (float32 for every low-precision input), with knobs that break it."""
    Q, K, V = (np.asarray(x, dtype=work) for x in (Q, K, V))
    group = Q.shape[1] // K.shape[1]
    K, V = np.repeat(K, group, axis=1), np.repeat(V, group, axis=1)
    if drop:
        K, V = K[..., :-drop, :], V[..., :-drop, :]
    S = work(scale) * Q @ np.swapaxes(K, -1, -2)
    nq, nk = S.shape[-2:]
    if causal or below:
        S = np.where(_keep(nq, nk, align, below) if causal else ~np.eye(nq, nk, dtype=bool), S, -np.inf)
    m = S.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0) if max_sub else np.zeros_like(m)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        P = np.exp(S - m)
        s = P.sum(-1, keepdims=True)
        O = P / np.where(s > 0, s, 1) @ V
        return O, (m + np.log(s))[..., 0]


def attention_backward(Q, K, V, O, dO, L, *, causal, scale, work=np.float32, align="bottom-right", bug=None):
    Q, K, V, O, dO = (np.asarray(x, dtype=work) for x in (Q, K, V, O, dO))
    H, H_kv = Q.shape[1], K.shape[1]
    group = H // H_kv
    Ke, Ve = np.repeat(K, group, axis=1), np.repeat(V, group, axis=1)
    S = work(scale) * Q @ np.swapaxes(Ke, -1, -2)
    nq, nk = S.shape[-2:]
    if causal:
        S = np.where(_keep(nq, nk, align), S, -np.inf)
    finite = np.isfinite(L)[..., None]
    with np.errstate(over="ignore"):
        P = np.where(finite, np.exp(S - np.where(finite, L[..., None], 0)), 0)
    dV = np.swapaxes(P, -1, -2) @ dO
    dS = P * (dO @ np.swapaxes(Ve, -1, -2) - np.sum(dO * O, -1, keepdims=True)) * work(scale)
    dQ, dK = dS @ Ke, np.swapaxes(dS, -1, -2) @ Q
    if bug == "transposed":  # dS instead of dS^T: the shapes agree when N_q = N_k, the values do not
        dK = dS @ Q
    if bug == "doubled":
        dV = 2 * dV
    B, _, N_k, d = K.shape
    return dQ, dK.reshape(B, H_kv, group, N_k, d).sum(2), dV.reshape(B, H_kv, group, N_k, d).sum(2)


attention.backward = attention_backward


def _with(**kw):
    def fn(Q, K, V, *, causal, scale):
        return attention(Q, K, V, causal=causal, scale=scale, **kw)

    def bwd(*args, causal, scale):
        bwd_kw = {k: v for k, v in kw.items() if k in ("work", "align", "bug")}
        return attention_backward(*args, causal=causal, scale=scale, **bwd_kw)

    fn.backward = bwd
    return fn


# --- correct implementations pass ----------------------------------------------------------------------------------


def test_a_correct_float32_implementation_passes_forward_and_backward_on_every_quick_distribution():
    report = iosim.check(attention, quick=True)
    assert report.passed, report.table(failures_only=True)
    assert {r.passname for r in report.rows} == {"forward", "backward"}
    assert {r.distribution for r in report.rows} == {"normal", "large", "near-ties", "dominant", "masked-rows"}
    assert {(r.N, r.d) for r in report.rows if r.distribution == "normal"} >= {(n, d) for n in QUICK_N for d in QUICK_D}
    assert any(r.N != r.N_k for r in report.rows)
    assert "PASSED" in report.summary()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_N_equal_1_passes_and_the_floor_sets_the_bound_of_the_zero_gradients(dtype):
    """At N = 1 the exact dQ and dK are 0 and the naive baseline lands on 0: the rule alone would allow nothing."""
    work = np.float64 if dtype == "float64" else np.float32
    report = iosim.check(_with(work=work), N=(1,), d=(16, 59), dtype=dtype)
    assert report.passed, report.table(failures_only=True)
    for r in report.rows:
        if r.output in ("dQ", "dK"):
            assert r.floor > 0 and r.bound >= r.floor


def test_float64_is_judged_against_an_extended_precision_golden():
    """The float64 naive baseline no longer equals the golden (the old rule collapsed to a few ulps), and a float64
    implementation's own rounding shows as a nonzero error within the bound."""
    report = iosim.check(_with(work=np.float64), N=(17, 113), d=(16,), dtype="float64")
    assert report.passed, report.table(failures_only=True)
    assert all(r.baseline > 0 for r in report.rows if r.N > 1)
    assert max(r.error for r in report.rows) > 0


def test_float64_computed_in_float32_fails_the_float64_check():
    report = iosim.check(_with(work=np.float32), N=(17,), d=(16,), dtype="float64", causal=(False,))
    assert {r.output for r in report.failures} >= {"O", "dQ", "dK", "dV"}


def test_bfloat16_inputs_and_bfloat16_outputs():
    import ml_dtypes

    def fn(Q, K, V, *, causal, scale):
        assert Q.dtype == ml_dtypes.bfloat16
        O, L = attention(Q, K, V, causal=causal, scale=scale)
        return O.astype(ml_dtypes.bfloat16), L  # outputs that come back in bfloat16

    report = iosim.check(fn, quick=True, dtype="bfloat16", backward=False)
    assert report.passed, report.table(failures_only=True)


def test_backward_found_as_an_attribute_and_dict_outputs():
    def fn(Q, K, V, *, causal, scale):
        O, L = attention(Q, K, V, causal=causal, scale=scale)
        return {"O": O, "L": L}

    fn.backward = lambda *a, **kw: dict(zip(("dQ", "dK", "dV"), attention_backward(*a, **kw), strict=True))
    report = iosim.check(fn, N=(9,), d=(5,), heads=1)
    assert report.passed
    assert {r.output for r in report.rows} == {"O", "L", "dQ", "dK", "dV"}


def test_layouts_grouped_query_heads_and_top_left_alignment():
    def bnhd(Q, K, V, *, causal, scale):
        O, L = attention(*(np.swapaxes(x, 1, 2) for x in (Q, K, V)), causal=causal, scale=scale)
        return np.swapaxes(O, 1, 2), L  # a non-contiguous view, as many libraries return

    report = iosim.check(bnhd, quick=True, layout="BNHD", heads=4, heads_kv=2, backward=False)
    assert report.passed, report.table(failures_only=True)
    assert "BNHD" in report.summary() and "H_kv=2" in report.summary()
    # a (B, H, N, d) implementation handed (B, N, H, d) inputs is wrong: failed rows, not an exception
    assert not iosim.check(attention, N=(17,), d=(16,), layout="BNHD", heads=3, backward=False).passed

    top_left = _with(align="top-left")
    assert iosim.check(top_left, quick=True, causal_align="top-left").passed
    wrong = iosim.check(top_left, quick=True, causal=(True,), backward=False)  # bottom-right expected
    assert {r.distribution for r in wrong.failures} >= {"masked-rows"} and all(r.N != r.N_k for r in wrong.failures)


def test_gqa_backward_sums_the_group():
    report = iosim.check(attention, N=(17,), d=(8,), heads=4, heads_kv=1)
    assert report.passed, report.table(failures_only=True)


# --- broken implementations fail with a clear row ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bug", "dtype", "distributions", "where"),
    [
        (dict(max_sub=False), "float16", ("normal", "large"), "large"),  # overflows on large logits only
        (dict(max_sub=False), "float32", ("normal", "large"), "large"),
        (dict(below=1), "float32", ("normal",), "normal"),  # masks the diagonal
        (dict(drop=1), "float32", ("normal",), "normal"),  # drops the last key
        (dict(bug="transposed"), "float32", ("normal",), "normal"),
        (dict(bug="doubled"), "float32", ("normal",), "normal"),
    ],
    ids=["no-max-subtraction-f16", "no-max-subtraction-f32", "masked-diagonal", "dropped-last-key", "transposed-dK",
         "doubled-dV"],
)  # fmt: skip
def test_broken_kernels_fail_with_a_row_naming_the_distribution(bug, dtype, distributions, where):
    report = iosim.check(_with(**bug), quick=True, dtype=dtype, distributions=distributions)
    assert not report.passed
    assert {r.distribution for r in report.failures} == {where}
    assert "FAIL" in report.table(failures_only=True)


def test_one_over_d_scale_fails():
    def one_over_d(Q, K, V, *, causal, scale):
        return attention(Q, K, V, causal=causal, scale=scale**2)

    report = iosim.check(one_over_d, quick=True)
    assert not report.passed and {r.output for r in report.failures} >= {"O", "L"}


def test_a_small_bias_and_a_wrong_gradient_fail():
    bias = iosim.check(lambda Q, K, V, **kw: attention(Q, K, V, **kw)[0] + 1e-5, N=(17,), d=(16,))
    assert bias.failures and "FAILED" in bias.summary()

    def bad_backward(*args, **kw):
        dQ, dK, dV = attention_backward(*args, **kw)
        return dQ, dK * (1 + 1e-4), dV

    report = iosim.check(attention, N=(17,), d=(16,), causal=(False,), backward=bad_backward)
    assert {r.output for r in report.failures} == {"dK"}  # in every distribution that runs on (17, 16)


# --- bad outputs are rows, never exceptions -------------------------------------------------------------------------


def test_wrong_shapes_missing_outputs_and_exceptions_are_failed_rows():
    def transposed(Q, K, V, *, causal, scale):
        return np.swapaxes(attention(Q, K, V, causal=causal, scale=scale)[0], -1, -2)

    report = iosim.check(transposed, N=(9,), d=(4,), causal=(False,), backward=False)
    assert not report.passed and "shape (1, 2, 4, 9), expected (1, 2, 9, 4)" in report.rows[0].note

    def raises(Q, K, V, *, causal, scale):
        raise RuntimeError("kernel launch failed")

    report = iosim.check(raises, N=(9,), d=(4,), causal=(False,))
    assert "raised RuntimeError: kernel launch failed" in report.rows[0].note and not report.passed

    report = iosim.check(lambda Q, K, V, **kw: (None, None), N=(9,), d=(4,), causal=(False,))
    assert report.rows[0].note == "no output O"

    def nan(Q, K, V, **kw):
        O, L = attention(Q, K, V, **kw)
        O[..., 0, 0] = np.nan
        return O, L

    report = iosim.check(nan, N=(9,), d=(4,), causal=(False,), heads=1, backward=False)
    assert {r.output for r in report.failures} == {"O"} and report.failures[0].where == "(0, 0, 0)"


def test_fully_masked_rows_accept_either_infinite_logsumexp():
    def plus_inf(Q, K, V, **kw):
        O, L = attention(Q, K, V, **kw)
        return O, np.where(np.isfinite(L), L, np.inf)  # flash-attn's convention

    report = iosim.check(plus_inf, quick=True, distributions=("masked-rows",), causal=(True,), backward=False)
    assert report.passed, report.table(failures_only=True)


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
        O, L = attention(Q.a, K.a, V.a, causal=causal, scale=scale)
        return Wrapped(O), Wrapped(L)

    assert iosim.check(fn, N=(9,), d=(4,), inputs=Wrapped, heads=1).passed


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        (dict(N=(0,)), "N"),
        (dict(dtype="int32"), "dtype must be one of float64, float32, float16, bfloat16"),
        (dict(dtype="float8"), "dtype"),
        (dict(inputs="jax"), "inputs"),
        (dict(heads=0), "heads"),
        (dict(heads=3, heads_kv=2), "heads_kv must divide heads"),
        (dict(layout="NHD"), "layout must be one of BHND, BNHD"),
        (dict(distributions=("gaussian",)), "distribution must be one of " + ", ".join(DISTRIBUTIONS)),
        (dict(distributions=()), "distributions"),
        (dict(causal_align="middle"), "causal_align must be one of " + ", ".join(ALIGNS)),
    ],
)
def test_user_errors(kwargs, parameter):
    with pytest.raises(InputError, match=parameter):
        iosim.check(attention, **kwargs)


def test_report_table_lists_every_output():
    report = iosim.check(attention, N=(5,), d=(3,), causal=(True,), heads=1)
    lines = report.table().splitlines()
    assert len(lines) == 2 + len(report.rows)  # header, rule, rows
    assert str(report).endswith(report.summary())
    assert {r.set_by for r in report.rows} <= {"rule", "floor"}


def test_floor_is_first_order_in_u_and_never_zero():
    """The floor scales with the unit roundoff and stays positive where the output is exactly 0 (N = 1 gradients)."""
    rng = np.random.default_rng(0)
    Q, K, V, dO = (rng.standard_normal((1, 1, 1, 4)) for _ in range(4))
    gold = check_module._golden(Q, K, V, dO, 0.5, False, 0, 1, "extended", True)
    f16 = check_module._floors(Q, K, V, dO, gold, 0.5, False, 0, 1, 2.0**-11, 2.0**-24, True)
    f32 = check_module._floors(Q, K, V, dO, gold, 0.5, False, 0, 1, 2.0**-24, 2.0**-24, True)
    for name in ("O", "dQ", "dK", "dV"):
        assert np.all(f32[name] > 0) and np.all(f16[name] > 100 * f32[name])
    assert np.max(np.abs(gold["dQ"])) < 1e-18 and np.max(np.abs(gold["dK"])) < 1e-18  # exactly 0, to longdouble

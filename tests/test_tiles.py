"""The drivers' shared arithmetic helpers (iosim.algorithms._tiles)."""

import math

import hypothesis.strategies as st
import numpy as np
from hypothesis import given, settings
from iosim.algorithms._tiles import exp_nonpos
from numba import njit


@njit(cache=True)
def _exp_rows(x, out):
    for i in range(x.size):  # the loop shape of the row updates: LLVM vectorises it
        out[i] = exp_nonpos(x[i])


def _compiled(x):
    x = np.ascontiguousarray(x, dtype=np.float64)
    out = np.empty_like(x)
    _exp_rows(x, out)
    return out


def _ulps(a, b):
    return np.abs(a - b) / np.spacing(np.maximum(np.abs(b), np.finfo(np.float64).smallest_subnormal))


def test_compiled_exp_is_within_one_ulp_of_libm_on_the_whole_range():
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [
            -rng.uniform(0, 1e-6, 10_000),
            -rng.uniform(0, 1, 100_000),
            -rng.uniform(0, 50, 100_000),
            -rng.uniform(700, 746, 10_000),  # results below the smallest normal number
            -np.arange(0, 745) * math.log(2),  # near the exact powers of two
        ]
    )
    got, want = _compiled(x), np.array([math.exp(v) for v in x])
    assert _ulps(got, want).max() <= 1.0


def test_compiled_exp_special_values():
    x = np.array([0.0, -0.0, -np.inf, -745.2, -746.0, -1e300, -5e-324, np.nan])
    got = _compiled(x)
    assert got[0] == 1.0 and got[1] == 1.0  # the row maximum's entry is exactly 1, as with libm
    assert got[2] == 0.0 and got[3] == math.exp(-745.2) and got[4] == 0.0 and got[5] == 0.0
    assert got[6] == 1.0
    assert np.isnan(got[7])  # a NaN score (overflowed inputs) stays visible


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=-800.0, max_value=0.0))
def test_compiled_exp_matches_the_python_body(x):
    assert _ulps(_compiled([x]), np.array([exp_nonpos(x)]))[0] <= 1.0

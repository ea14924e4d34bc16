"""The Python API's inputs: every mistake is an InputError naming the parameter and the accepted range."""

import numpy as np
import pytest
from conftest import RESULT_KEYS

import iosim
from iosim import InputError
from iosim.runner.api import run_keywords


def test_algorithms_lists_the_core_three():
    assert {"standard", "flash1", "flash2"} <= set(iosim.algorithm_names())


def test_result_fields(rng):
    Q, K, V = (rng.standard_normal((33, 8)) for _ in range(3))
    r = iosim.run("flash2", Q=Q, K=K, V=V, M=500)
    assert (r.N, r.d, r.M) == (33, 8, 500)
    assert r.stats.total == r.stats.reads + r.stats.writes == r.predicted.total
    assert r.lower_bound > 0 and r.tiling.rule == "fit"
    assert r.max_abs_error < 1e-12
    d = r.as_dict()
    assert set(RESULT_KEYS) <= set(d)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        (dict(algorithm="flash3", N=4, d=4, M=100), "algorithm"),
        (dict(algorithm="flash1", N=4, d=4, M=10), "M"),
        (dict(algorithm="flash2", N=0, d=4, M=100), "N"),
        (dict(algorithm="flash2", N=4, d=-1, M=100), "d"),
        (dict(algorithm="flash2", N=4, d=4, M=0), "M"),
        (dict(algorithm="flash2", N=4.5, d=4, M=100), "N"),
        (dict(algorithm="flash2", N=4, d=4, M=100, tiling="best"), "tiling"),
        (dict(algorithm="flash2", N=4, d=4, M=100, dtype="float16"), "dtype"),
        (dict(algorithm="flash2", d=4, M=100), "N and d"),
        (dict(algorithm="standard", N=4, d=4, M=2), "M"),
    ],
)
def test_bad_sizes_name_the_parameter(kwargs, param):
    name = kwargs.pop("algorithm")
    with pytest.raises(InputError) as e:
        run_keywords(name, **kwargs)
    assert e.value.parameter == param
    assert str(e.value).startswith(param)


def test_bad_arrays(rng):
    Q = rng.standard_normal((10, 4))
    with pytest.raises(InputError, match="K must have the shape of Q"):
        iosim.run("flash2", Q=Q, K=Q[:9], V=Q, M=100)
    with pytest.raises(InputError, match="^K must be given"):
        iosim.run("flash2", Q=Q, V=Q, M=100)
    bad = Q.copy()
    bad[3, 1] = np.nan
    with pytest.raises(InputError, match="^V must hold only finite values"):
        iosim.run("flash2", Q=Q, K=Q, V=bad, M=100)
    bad[3, 1] = np.inf
    with pytest.raises(InputError, match="^Q must hold only finite"):
        iosim.run("flash2", Q=bad, K=Q, V=Q, M=100)
    with pytest.raises(InputError, match="^Q must be a non-empty 2-D array"):
        iosim.run("flash2", Q=Q[0], K=Q[0], V=Q[0], M=100)
    with pytest.raises(InputError, match="^N must match"):
        iosim.run("flash2", Q=Q, K=Q, V=Q, N=11, M=100)
    with pytest.raises(InputError, match="^Q must hold real numbers"):
        iosim.run("flash2", Q=Q.astype(complex), K=Q, V=Q, M=100)


def test_seed_is_reproducible():
    a = iosim.run("flash1", N=20, d=3, M=100, seed=7)
    b = iosim.run("flash1", N=20, d=3, M=100, seed=7)
    assert np.array_equal(a.outputs["O"], b.outputs["O"])

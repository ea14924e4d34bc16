"""iosim's own numba.cuda kernels counted automatically under the CUDA simulator equal their hand-written counters.

The kernels count the words they move into int64 counters (``count=True``); iosim.kernels counts every element
each thread touches through a kernel argument. Equal per array: a cross-check of both. Tiny sizes (the simulator
runs every CUDA thread as a Python thread). conftest.py switches the simulator on before numba is imported.
"""

from __future__ import annotations

import numpy as np
import pytest

from iosim.kernels import count

pytest.importorskip("numba_cuda")
cuda = pytest.importorskip("numba.cuda")
if not cuda.is_available() and not getattr(cuda, "simulator_enabled", False):
    from numba.core import config

    if not config.ENABLE_CUDASIM:
        pytest.skip("a real GPU run (IOSIM_GPU=1): the counting needs the simulator", allow_module_level=True)

from iosim.algorithms.cuda import flash, square_tiling, standard  # noqa: E402

META = {"blocks", "cnt"}


def _inputs(N, d, k=3, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((N, d)).astype(np.float32) for _ in range(k)]


def _both(go):
    box = {}
    counts, _ = count(lambda: box.update(run=go()), "numba-cuda")
    hand = box["run"].counts
    auto = {k: v for k, v in counts.per_array.items() if k not in META}
    return counts, hand, auto


def _assert_equal(hand, auto):
    assert set(auto) == set(hand), (sorted(auto), sorted(hand))
    for name, c in hand.items():
        assert (auto[name].reads, auto[name].writes) == (c.reads, c.writes), name


@pytest.mark.parametrize("causal", [False, True])
def test_flash2_forward(causal):
    Q, K, V = _inputs(37, 8)
    counts, hand, auto = _both(lambda: flash.flash2_forward(Q, K, V, Br=16, Bc=8, causal=causal, count=True))
    _assert_equal(hand, auto)
    assert counts.programs == 3 and counts.launches == 1
    assert counts.per_array["cnt"].atomics > 0  # the counters' own atomics, under their own name


def test_flash1_forward():
    Q, K, V = _inputs(20, 4)
    counts, hand, auto = _both(lambda: flash.flash1_forward(Q, K, V, Br=8, Bc=8, causal=True, count=True))
    auto.pop("L", None)  # logsumexp_kernel: for checking only, its counters are off
    for name in ("m", "l"):  # logsumexp_kernel reads m and l once more (uncounted by hand)
        if name in auto:
            auto[name] = type(auto[name])(**{**auto[name].__dict__, "reads": auto[name].reads - 20,
                                             "read_bytes": auto[name].read_bytes - 80})  # fmt: skip
    _assert_equal(hand, auto)


def test_flash2_backward_with_atomics():
    Q, K, V, dO = _inputs(24, 4, k=4)
    fwd = flash.flash2_forward(Q, K, V, Br=8, Bc=8, causal=True)
    O, L = fwd.outputs["O"], fwd.outputs["L"]
    counts, hand, auto = _both(lambda: flash.flash2_backward(Q, K, V, O, dO, L, Br=8, Bc=8, causal=True, count=True))
    _assert_equal(hand, auto)
    assert auto["dQ"].atomics == auto["dQ"].reads  # dQ += dS K_j: a read and a write per element, as atomics


def test_square_tiling_and_standard():
    Q, K, V = _inputs(12, 4)
    _, hand, auto = _both(lambda: square_tiling.square_tiling_forward(Q, K, V, B=4, count=True))
    _assert_equal(hand, auto)
    # standard attention's kernels are generic (a product C = A Bm, a softmax): the launcher names the arrays
    dev = {k: cuda.to_device(x) for k, x in zip("QKV", (Q, K, V), strict=True)}
    box = {}

    def go():
        box["run"] = standard.standard_forward(dev["Q"], dev["K"], dev["V"], B=4, M=64, count=True)
        return {**dev, **box["run"].outputs}

    counts, _ = count(go, "numba-cuda")
    assert counts.kernels == ["matmul_kernel", "softmax_rows_kernel", "matmul_kernel"]
    _assert_equal(box["run"].counts, {k: v for k, v in counts.per_array.items() if k not in META})

"""Causal problems form N(N+1)/2 scores, not N^2: the dense lower bounds count those (docs/theory.md, "How the
lower bound is chosen"), and every causal schedule's measured words stay at or above the bound printed for it."""

from __future__ import annotations

import math

import pytest

import iosim
from iosim.theory import bounds


@pytest.mark.parametrize(("N", "d", "M"), [(1024, 64, 16384), (4096, 128, 4096), (203, 59, 1000), (1, 16, 100)])
@pytest.mark.parametrize("backward", [False, True])
def test_causal_bounds_count_the_causal_scores(N, d, M, backward):
    Z = N * (N + 1) // 2
    value, name = bounds.lower_bound(N, d, M, backward=backward, causal=True)
    expected = [4 * N * d if not backward else 7 * N * d, max(0.0, min(Z * d * d / (8 * M), Z / 8) - M)]
    if M >= d * d:
        expected.append(max(0.0, Z * d * d / (4 * (M + d * d)) - M))
    else:
        expected.append(max(0.0, 2 * Z * d / math.sqrt(M) - 2 * M))
    if backward:  # the backward has no any-matmul bound
        expected.pop(1)
    assert value == pytest.approx(max(expected))
    assert value <= bounds.lower_bound(N, d, M, backward=backward)[0]  # never above the dense bound
    assert name == "trivial" or name.endswith("causal scores")


@pytest.mark.parametrize("algorithm", ["flash1", "flash2", "square-tiling", "standard"])
@pytest.mark.parametrize(
    ("N", "d", "M"),
    [pytest.param(2048, 32, 2048, marks=pytest.mark.slow), (1024, 64, 32768), (777, 16, 200)],  # 2048: 14-20 s
)
def test_every_causal_schedule_moves_at_least_its_lower_bound(algorithm, N, d, M):
    r = iosim.run(algorithm, N=N, d=d, M=M, causal=True, count_only=True, backward=True)
    for p in r.passes.values():
        assert p.stats.total >= p.lower_bound, (algorithm, p.name, p.lower_bound_name)

"""The algorithm registry: one entry per algorithm name, tying its driver, tiling rule and closed form together."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from algorithms import flash, standard
from iosim import io_model, tiling
from iosim.errors import InputError
from iosim.io_model import Prediction
from iosim.tiling import Tiling


@dataclass(frozen=True)
class Algorithm:
    """An algorithm as iosim knows it.

    ``forward(mem, Q, K, V, N, d, tiling, scale, causal, dtype)`` returns a dict of named outputs that
    includes "O" and, where the algorithm produces it, "L" (the row logsumexp); ``predict_forward(N, d, M,
    tiling, causal)`` is its exact closed form in :mod:`iosim.io_model`.
    """

    name: str
    title: str
    citation: str
    choose_tiling: Callable[[int, int, int, str], Tiling]
    forward: Callable[..., dict]
    predict_forward: Callable[..., Prediction]

    def min_M(self, N: int, d: int) -> int:
        """The smallest M for which the ``fit`` rule finds a tiling."""
        lo, hi = 1, 1
        while True:
            try:
                self.choose_tiling(N, d, hi, "fit")
                break
            except InputError:
                lo, hi = hi + 1, hi * 2
        while lo < hi:
            mid = (lo + hi) // 2
            try:
                self.choose_tiling(N, d, mid, "fit")
                hi = mid
            except InputError:
                lo = mid + 1
        return lo


def _standard_forward(mem, Q, K, V, N, d, t, scale, causal, dtype):
    O, S, P = standard.standard_forward(mem, Q, K, V, N=N, d=d, B=t.B, scale=scale, causal=causal,
                                        dtype=dtype)
    return {"O": O, "S": S, "P": P}


def _flash1_forward(mem, Q, K, V, N, d, t, scale, causal, dtype):
    O, l_, m = flash.flash1_forward(mem, Q, K, V, N=N, d=d, Br=t.Br, Bc=t.Bc, scale=scale, causal=causal,
                                    dtype=dtype)
    L = None if m is None else m + np.log(l_)  # computed outside the model, for checking only
    return {"O": O, "l": l_, "m": m, "L": L}


def _flash2_forward(mem, Q, K, V, N, d, t, scale, causal, dtype):
    O, L = flash.flash2_forward(mem, Q, K, V, N=N, d=d, Br=t.Br, Bc=t.Bc, scale=scale, causal=causal,
                                dtype=dtype)
    return {"O": O, "L": L}


REGISTRY: dict[str, Algorithm] = {
    a.name: a
    for a in [
        Algorithm(
            "standard",
            "Standard attention (Algorithm 0), S and P materialised, tiled products",
            "Dao et al., NeurIPS 2022, Algorithm 0",
            lambda N, d, M, rule: tiling.square_tiling("standard", N, d, M, rule),
            _standard_forward,
            lambda N, d, M, t, causal: io_model.standard_forward(N, d, M, t.B, causal),
        ),
        Algorithm(
            "flash1",
            "FlashAttention (Algorithm 1/2): K/V outer loop, O, l, m round-trip through slow memory",
            "Dao et al., NeurIPS 2022, Algorithm 1",
            lambda N, d, M, rule: tiling.flash_tiling("flash1", N, d, M, rule),
            _flash1_forward,
            lambda N, d, M, t, causal: io_model.flash1_forward(N, d, t.Br, t.Bc, causal),
        ),
        Algorithm(
            "flash2",
            "FlashAttention-2 forward: Q outer loop, O and logsumexp L written once",
            "Dao, FlashAttention-2, 2023",
            lambda N, d, M, rule: tiling.flash_tiling("flash2", N, d, M, rule),
            _flash2_forward,
            lambda N, d, M, t, causal: io_model.flash2_forward(N, d, t.Br, t.Bc, causal),
        ),
    ]
}


def get(name: str) -> Algorithm:
    if name not in REGISTRY:
        raise InputError("algorithm", f"must be one of {', '.join(REGISTRY)}", name)
    return REGISTRY[name]


def algorithms() -> list[str]:
    """The names of all registered algorithms."""
    return list(REGISTRY)

"""The algorithm registry: one entry per algorithm name, tying its driver, tiling rule and closed form together."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from iosim import io_model, tiling
from iosim.algorithms import flash, square_tiling, standard
from iosim.errors import InputError
from iosim.io_model import Prediction
from iosim.tiling import Tiling


@dataclass(frozen=True)
class Algorithm:
    """An algorithm as iosim knows it.

    ``forward(mem, Q, K, V, N, d, tiling, scale, causal, dtype)`` returns a dict of named outputs that
    includes "O" and, where the algorithm produces it, "L" (the row logsumexp); ``predict_forward(N, d, M,
    tiling, causal)`` is its exact closed form in :mod:`iosim.io_model`.

    Optional backward pass (None when the algorithm has none):
    ``backward(mem, Q, K, V, dO, fwd, N, d, tiling, scale, causal, dtype)`` returns a dict with "dQ", "dK", "dV"
    (None each in count-only mode, where every data argument is None); ``fwd`` is the dict the forward returned
    (its outputs O, l, m, L, P as the paper's backward reads them). ``predict_backward(N, d, M, tiling, causal)`` is
    the backward's exact closed form. ``choose_backward_tiling(N, d, M, rule)`` picks the backward's blocks when they
    differ from the forward's (its working set is larger); None means the backward reuses the forward's tiling.
    """

    name: str
    title: str
    citation: str
    choose_tiling: Callable[[int, int, int, str], Tiling]
    forward: Callable[..., dict]
    predict_forward: Callable[..., Prediction]
    backward: Callable[..., dict] | None = None
    predict_backward: Callable[..., Prediction] | None = None
    choose_backward_tiling: Callable[[int, int, int, str], Tiling] | None = None

    @property
    def has_backward(self) -> bool:
        return self.backward is not None

    def backward_tiling(self, N: int, d: int, M: int, rule: str) -> Tiling:
        """The tiling the backward pass runs with (the forward's unless the algorithm chooses its own)."""
        choose = self.choose_backward_tiling or self.choose_tiling
        return choose(N, d, M, rule)

    def min_M(self, N: int, d: int, backward: bool = False) -> int:
        """The smallest M for which the ``fit`` rule finds a tiling (of the forward and, if asked, the backward)."""

        def fits(M: int) -> bool:
            try:
                self.choose_tiling(N, d, M, "fit")
                if backward:
                    self.backward_tiling(N, d, M, "fit")
            except InputError:
                return False
            return True

        lo, hi = 1, 1
        while not fits(hi):
            lo, hi = hi + 1, hi * 2
        while lo < hi:
            mid = (lo + hi) // 2
            if fits(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo


def _standard_forward(mem, Q, K, V, N, d, t, scale, causal, dtype):
    O, S, P = standard.standard_forward(mem, Q, K, V, N=N, d=d, B=t.B, scale=scale, causal=causal, dtype=dtype)
    return {"O": O, "S": S, "P": P}


def _flash1_forward(mem, Q, K, V, N, d, t, scale, causal, dtype):
    O, l_, m = flash.flash1_forward(mem, Q, K, V, N=N, d=d, Br=t.Br, Bc=t.Bc, scale=scale, causal=causal, dtype=dtype)
    L = None if m is None else m + np.log(l_)  # computed outside the model, for checking only
    return {"O": O, "l": l_, "m": m, "L": L}


def _flash2_forward(mem, Q, K, V, N, d, t, scale, causal, dtype):
    O, L = flash.flash2_forward(mem, Q, K, V, N=N, d=d, Br=t.Br, Bc=t.Bc, scale=scale, causal=causal, dtype=dtype)
    return {"O": O, "L": L}


def _standard_backward(mem, Q, K, V, dO, fwd, N, d, t, scale, causal, dtype):
    dQ, dK, dV = standard.standard_backward(
        mem, Q, K, V, fwd["P"], dO, N=N, d=d, B=t.B, scale=scale, causal=causal, dtype=dtype
    )
    return {"dQ": dQ, "dK": dK, "dV": dV}


def _flash1_backward(mem, Q, K, V, dO, fwd, N, d, t, scale, causal, dtype):
    O, l_, m = fwd["O"], fwd["l"], fwd["m"]
    dQ, dK, dV = flash.flash1_backward(
        mem, Q, K, V, O, dO, l_, m, N=N, d=d, Br=t.Br, Bc=t.Bc, scale=scale, causal=causal, dtype=dtype
    )
    return {"dQ": dQ, "dK": dK, "dV": dV}


def _flash2_backward(mem, Q, K, V, dO, fwd, N, d, t, scale, causal, dtype):
    dQ, dK, dV = flash.flash2_backward(
        mem, Q, K, V, fwd["O"], dO, fwd["L"], N=N, d=d, Br=t.Br, Bc=t.Bc, scale=scale, causal=causal, dtype=dtype
    )
    return {"dQ": dQ, "dK": dK, "dV": dV}


def _square_tiling_forward(mem, Q, K, V, N, d, t, scale, causal, dtype):
    O, L, S = square_tiling.square_tiling_forward(
        mem, Q, K, V, N=N, d=d, B=t.B, scale=scale, causal=causal, dtype=dtype
    )
    return {"O": O, "L": L, "S": S}


def _square_tiling_backward(mem, Q, K, V, dO, fwd, N, d, t, scale, causal, dtype):
    dQ, dK, dV, dS = square_tiling.square_tiling_backward(
        mem, Q, K, V, fwd["O"], fwd["L"], fwd["S"], dO, N=N, d=d, B=t.B, scale=scale, causal=causal, dtype=dtype
    )
    return {"dQ": dQ, "dK": dK, "dV": dV, "dS": dS}


REGISTRY: dict[str, Algorithm] = {
    a.name: a
    for a in [
        Algorithm(
            "standard",
            "Standard attention (Algorithm 0), S and P materialised, tiled products",
            "Dao et al., NeurIPS 2022, Algorithm 0 (backward: Algorithm 3)",
            lambda N, d, M, rule: tiling.square_tiling("standard", N, d, M, rule),
            _standard_forward,
            lambda N, d, M, t, causal: io_model.standard_forward(N, d, M, t.B, causal),
            backward=_standard_backward,
            predict_backward=lambda N, d, M, t, causal: io_model.standard_backward(N, d, M, t.B, causal),
        ),
        Algorithm(
            "flash1",
            "FlashAttention (Algorithm 1/2): K/V outer loop, O, l, m round-trip through slow memory",
            "Dao et al., NeurIPS 2022, Algorithm 1 (backward: Algorithm 4)",
            lambda N, d, M, rule: tiling.flash_tiling("flash1", N, d, M, rule),
            _flash1_forward,
            lambda N, d, M, t, causal: io_model.flash1_forward(N, d, t.Br, t.Bc, causal),
            backward=_flash1_backward,
            predict_backward=lambda N, d, M, t, causal: io_model.flash1_backward(N, d, t.Br, t.Bc, causal),
            choose_backward_tiling=lambda N, d, M, rule: tiling.flash_backward_tiling("flash1", N, d, M, rule),
        ),
        Algorithm(
            "flash2",
            "FlashAttention-2 forward: Q outer loop, O and logsumexp L written once",
            "Dao, FlashAttention-2, 2023 (forward and backward, Algorithms 1-2)",
            lambda N, d, M, rule: tiling.flash_tiling("flash2", N, d, M, rule),
            _flash2_forward,
            lambda N, d, M, t, causal: io_model.flash2_forward(N, d, t.Br, t.Bc, causal),
            backward=_flash2_backward,
            predict_backward=lambda N, d, M, t, causal: io_model.flash2_backward(N, d, t.Br, t.Bc, causal),
            choose_backward_tiling=lambda N, d, M, rule: tiling.flash_backward_tiling("flash2", N, d, M, rule),
        ),
        Algorithm(
            "square-tiling",
            "Saha-Ye square tiling (Algorithm 1, stable form); small-cache backward (a construction)",
            "Saha & Ye, ICML 2024, Algorithm 1 (backward: in the regime of Li et al., arXiv 2410.09397)",
            lambda N, d, M, rule: tiling.saha_ye_tiling(N, d, M, rule),
            _square_tiling_forward,
            lambda N, d, M, t, causal: io_model.square_tiling_forward(N, d, t.B, causal),
            backward=_square_tiling_backward,
            predict_backward=lambda N, d, M, t, causal: io_model.square_tiling_backward(N, d, t.B, causal),
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

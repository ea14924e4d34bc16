"""How long :func:`iosim.check` takes over its default grid (every distribution and shape, forward and backward),
split into the time spent in the checked callable and the check's own time (inputs, golden, naive baseline,
floors, comparison).

Run: ``python experiments/bench/check_speed.py`` (float16; ``--dtype float32 bfloat16 float64`` for others,
``--repeat 3`` for three runs, ``--forward-only``). The callable is plain NumPy attention in float32 (float64 for
float64 inputs) with its backward (subnormal probabilities flushed to zero, as GPUs do, so that its own time is
not dominated by slow subnormal arithmetic). The 1-minute load average is printed beside each run: the
development machine is shared, and the timings move with it. Tests never assert timings.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from tabulate import tabulate

import iosim


def _work(x):
    return np.float64 if np.asarray(x).dtype == np.float64 else np.float32


def attention(Q, K, V, *, causal, scale):
    work = _work(Q)
    Q, K, V = (np.asarray(x, dtype=work) for x in (Q, K, V))
    S = work(scale) * Q @ np.swapaxes(K, -1, -2)
    N_q, N_k = S.shape[-2:]
    if causal:
        S = np.where(np.tri(N_q, N_k, N_k - N_q, dtype=bool), S, -np.inf)
    m = S.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    Z = S - m
    Z[Z < -60] = -np.inf
    P = np.exp(Z)
    s = P.sum(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        return P / np.where(s > 0, s, 1) @ V, (m + np.log(s))[..., 0]


def attention_backward(Q, K, V, O, dO, L, *, causal, scale):
    work = _work(Q)
    Q, K, V, O, dO = (np.asarray(x, dtype=work) for x in (Q, K, V, O, dO))
    S = work(scale) * Q @ np.swapaxes(K, -1, -2)
    N_q, N_k = S.shape[-2:]
    if causal:
        S = np.where(np.tri(N_q, N_k, N_k - N_q, dtype=bool), S, -np.inf)
    finite = np.isfinite(L)[..., None]
    Z = S - np.where(finite, L[..., None], 0)
    Z[(Z < -60) | ~finite] = -np.inf
    P = np.exp(Z)
    dS = P * (dO @ np.swapaxes(V, -1, -2) - np.sum(dO * O, -1, keepdims=True)) * work(scale)
    return dS @ K, np.swapaxes(dS, -1, -2) @ Q, np.swapaxes(P, -1, -2) @ dO


def timed(dtype: str, forward_only: bool = False) -> dict:
    spent = [0.0]

    def fn(*args, **kw):
        t0 = time.perf_counter()
        try:
            return attention(*args, **kw)
        finally:
            spent[0] += time.perf_counter() - t0

    def bwd(*args, **kw):
        t0 = time.perf_counter()
        try:
            return attention_backward(*args, **kw)
        finally:
            spent[0] += time.perf_counter() - t0

    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    report = iosim.check(fn, dtype=dtype, backward=False if forward_only else bwd)
    total = time.perf_counter() - t0
    return {
        "dtype": dtype,
        "passes": "forward" if forward_only else "forward+backward",
        "rows": len(report.rows),
        "passed": report.passed,
        "total_s": total,
        "callable_s": spent[0],
        "check_s": total - spent[0],
        "load_1min": load,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", nargs="+", default=["float16"])
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--forward-only", action="store_true")
    args = p.parse_args(argv)
    iosim.check(attention, N=(5,), d=(3,), backward=attention_backward)  # imports and first calls, untimed
    rows = [timed(dt, args.forward_only) for dt in args.dtype for _ in range(args.repeat)]
    print(tabulate(rows, headers="keys", floatfmt=".3g"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

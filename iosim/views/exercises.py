"""Exercises that count a student's numba.cuda kernel (docs/exercises/, docs/teaching.md).

Each exercise is a launcher file (``launch(**params)`` returning its arrays by name) whose kernels
:func:`iosim.kernels.count_file` counts under the CUDA simulator, word by word at every global load and store. The
student's counts stand beside two models of the same problem, both written here from the problem's sizes:

* the **lower bound**: the compulsory traffic (every input read once, every output written once) and, for the
  product, the tight bound for standard matrix multiplication 2mnk/sqrt(M) - 2M (docs/theory.md, L2), with M the
  shared-memory words of the tiled schedule; the larger of the two;
* **iosim's schedule**: the count of the tiled schedule the exercise asks for (softmax: one read of each row into
  shared memory, one write; the product with T x T tiles: A read ceil(n/T) times, B ceil(m/T) times, C written
  once; the attention tile loop: iosim's own flash2 run at the kernel's blocks, simulated).

A kernel passes when its outputs equal NumPy's (float32 tolerance) and it moves no more words than iosim's
schedule. The starter files fail (correct, but they re-read global memory); the reference files pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from iosim.base import outputs
from iosim.base.errors import InputError


@dataclass(frozen=True)
class Exercise:
    """One exercise: its default sizes, the arrays it reads and writes, and the two models (per array: [reads,
    writes]) as functions of the sizes."""

    name: str
    title: str
    params: dict
    inputs: tuple
    outputs: tuple


EXERCISES = {
    "softmax": Exercise("softmax", "Row softmax: Y = softmax(X) row by row", {"R": 8, "C": 32}, ("X",), ("Y",)),
    "matmul": Exercise("matmul", "Tiled matrix product: C = A B", {"m": 16, "k": 16, "n": 16}, ("A", "B"), ("C",)),
    "attention": Exercise(
        "attention",
        "An attention tile loop: O = softmax(Q K^T / sqrt(d)) V, L = logsumexp",
        {"N": 16, "d": 4},
        ("Q", "K", "V"),
        ("O", "L"),
    ),
}


def models(name: str, sizes: dict) -> tuple[dict, dict, str]:
    """(lower bound per array, iosim's schedule per array, how the bound was made) for exercise ``name``."""
    if name == "attention":
        return _attention_models(sizes)
    if name == "softmax":
        R, C = sizes["R"], sizes["C"]  # noqa: N806
        words = {"X": [R * C, 0], "Y": [0, R * C]}
        return words, dict(words), "compulsory: read X once, write Y once (a row of C words fits in shared memory)"
    m, k, n, T = sizes["m"], sizes["k"], sizes["n"], sizes["T"]  # noqa: N806
    compulsory = {"A": [m * k, 0], "B": [k * n, 0], "C": [0, m * n]}
    M = 2 * T * T  # noqa: N806
    hk = 2 * m * n * k / math.sqrt(M) - 2 * M
    schedule = {"A": [m * k * -(-n // T), 0], "B": [k * n * -(-m // T), 0], "C": [0, m * n]}
    total = m * k + k * n + m * n
    how = (f"max(compulsory {total:,}, 2mnk/sqrt(M) - 2M = {hk:,.0f} with M = 2T^2 = {M}): the tight bound for "
           "standard matrix multiplication (docs/theory.md, L2)")  # fmt: skip
    if hk > total:  # the bound is on the total; spread over the reads of A and B in proportion
        extra = hk - total
        compulsory = {"A": [m * k + extra / 2, 0], "B": [k * n + extra / 2, 0], "C": [0, m * n]}
    return compulsory, schedule, how


def _attention_models(sizes: dict) -> tuple[dict, dict, str]:
    """The attention tile loop: iosim's flash2 at the kernel's blocks (BR, BC), simulated (its counts do not depend
    on M once the blocks are given), and the compulsory traffic (Q, K, V read once; O and L written once)."""
    from iosim.runner import api

    N, d, Br, Bc = sizes["N"], sizes["d"], sizes["BR"], sizes["BC"]  # noqa: N806
    M = 2 * Br * d + 2 * Bc * d + Br * Bc + 2 * Br  # noqa: N806  (Q_i, O_i, K_j, V_j, S_ij, m_i, l_i)
    r = api.run_keywords("flash2", N=N, d=d, M=M, Br=Br, Bc=Bc, count_only=True, reference=False)
    schedule = {a: [v.reads, v.writes] for a, v in r.stats.per_array.items()}
    bound = {"Q": [N * d, 0], "K": [N * d, 0], "V": [N * d, 0], "O": [0, N * d], "L": [0, N]}
    how = f"compulsory: read Q, K, V once, write O and L once (iosim's flash2 at Br = {Br}, Bc = {Bc})"
    return bound, schedule, how


def _expected(name: str, arrays: dict) -> dict:
    """The exercise's outputs from NumPy in float64."""
    if name == "softmax":
        X = arrays["X"]  # noqa: N806
        e = np.exp(X - X.max(axis=1, keepdims=True))
        return {"Y": e / e.sum(axis=1, keepdims=True)}
    if name == "attention":
        S = arrays["Q"] @ arrays["K"].T / math.sqrt(arrays["Q"].shape[1])  # noqa: N806
        mx = S.max(axis=1, keepdims=True)
        e = np.exp(S - mx)
        return {"O": e @ arrays["V"] / e.sum(axis=1, keepdims=True), "L": mx + np.log(e.sum(axis=1, keepdims=True))}
    return {"C": arrays["A"] @ arrays["B"]}


def check(name: str, student: str, path=None, **sizes) -> dict:
    """Count the student's launcher file ``student`` for exercise ``name`` (sizes default to the exercise's), check
    its outputs against NumPy and its traffic against iosim's schedule; write the page to ``path`` (.html) if given.
    Returns the verdict's data (``passed``, per-array counts, the models)."""
    from iosim.kernels import count_file
    from iosim.views import html

    if name not in EXERCISES:
        raise InputError("exercise", f"must be one of {', '.join(EXERCISES)}", name)
    ex = EXERCISES[name]
    if path is not None:
        path = outputs.file("path", path, html.SUFFIXES)
    params = {**ex.params, **sizes}
    counts, numbers, arrays = count_file(str(student), backend="numba-cuda", params=params)
    if name == "matmul":
        params["T"] = int(numbers.get("T", 0)) or 8
    if name == "attention":
        params.update(BR=int(numbers["BR"]), BC=int(numbers["BC"]))
    bound, schedule, how = models(name, params)
    kernel = {a: [counts.per_array[a].reads, counts.per_array[a].writes] if a in counts.per_array else [0, 0]
              for a in (*ex.inputs, *ex.outputs)}  # fmt: skip
    want = _expected(name, {k: np.asarray(v, dtype=np.float64) for k, v in arrays.items()})
    got = {a: np.asarray(arrays[a], dtype=np.float64) for a in want}
    correct = all(got[a].shape == w.shape and np.allclose(got[a], w, rtol=1e-4, atol=1e-5) for a, w in want.items())
    total = sum(sum(v) for v in kernel.values())
    limit = sum(sum(v) for v in schedule.values())
    data = {
        "exercise": name, "title": ex.title, "file": Path(student).name, "sizes": params, "kernel": kernel,
        "bound": bound, "schedule": schedule, "how": how, "correct": correct, "total": total,
        "schedule_total": limit, "bound_total": sum(sum(v) for v in bound.values()),
        "passed": correct and total <= limit,
    }  # fmt: skip
    if path is not None:
        path.write_text(html.render("exercise", f"{ex.title}: {Path(student).name}", data), encoding="utf-8")
    return data

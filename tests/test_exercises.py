"""The numba.cuda exercises (docs/exercises, iosim.views.exercises): a student's kernel counted under the CUDA
simulator against the lower bound and iosim's schedule; each starter fails, each reference passes. The expected
counts are written here from the kernels' loops (an independent model), not taken from the checker."""

from __future__ import annotations

import json
import re

import pytest

from iosim.base.errors import InputError
from iosim.views import exercises

pytest.importorskip("numba.cuda")
DOCS = "docs/exercises"


def _page(path) -> dict:
    return json.loads(re.search(r"const PAGE = (\{.*?\});\n", path.read_text()).group(1))


def test_softmax_starter_fails_and_reference_passes(tmp_path):
    R, C = 6, 40  # noqa: N806
    starter = exercises.check("softmax", f"{DOCS}/softmax_starter.py", tmp_path / "s.html", R=R, C=C)
    assert starter["kernel"] == {"X": [3 * R * C, 0], "Y": [0, R * C]}  # three passes over each row
    assert starter["correct"] and not starter["passed"]
    ref = exercises.check("softmax", f"{DOCS}/softmax_reference.py", tmp_path / "r.html", R=R, C=C)
    assert ref["kernel"] == {"X": [R * C, 0], "Y": [0, R * C]} == ref["schedule"] == ref["bound"]
    assert ref["passed"]
    page = _page(tmp_path / "r.html")
    assert page["passed"] and page["kernel"] == ref["kernel"]
    assert "not yet" in (tmp_path / "s.html").read_text()


def test_matmul_starter_fails_and_reference_passes(tmp_path):
    m, k, n, T = 12, 20, 10, 8  # noqa: N806  (no size a multiple of the tile)
    starter = exercises.check("matmul", f"{DOCS}/matmul_starter.py", m=m, k=k, n=n)
    assert starter["kernel"] == {"A": [m * n * k, 0], "B": [m * n * k, 0], "C": [0, m * n]}  # a row and a column each
    assert starter["correct"] and not starter["passed"]
    ref = exercises.check("matmul", f"{DOCS}/matmul_reference.py", tmp_path / "m.html", m=m, k=k, n=n)
    # each block of C (ceil(m/T) x ceil(n/T) of them) reads its row band of A and its column band of B once
    row_blocks, col_blocks = -(-m // T), -(-n // T)
    assert ref["kernel"] == {"A": [m * k * col_blocks, 0], "B": [k * n * row_blocks, 0], "C": [0, m * n]}
    assert ref["kernel"] == ref["schedule"] and ref["passed"]
    assert ref["bound_total"] == m * k + k * n + m * n  # 2mnk/sqrt(2T^2) - 4T^2 is below the compulsory here


def test_bad_exercise_and_path(tmp_path):
    with pytest.raises(InputError, match="exercise must be one of softmax, matmul"):
        exercises.check("fft", f"{DOCS}/softmax_starter.py")
    with pytest.raises(InputError, match="must end in .html"):
        exercises.check("softmax", f"{DOCS}/softmax_starter.py", tmp_path / "x.txt")


def test_attention_tile_loop_starter_fails_and_reference_passes(tmp_path):
    """The attention tile loop at N = 18 (not a multiple of the blocks of 4), d = 4: the starter reloads Q_i for
    every K_j (Tc times), the reference keeps it (FlashAttention-2's loop: K and V read Tr times), equal to iosim's
    flash2 at the same blocks, array by array."""
    N, d, B = 18, 4, 4  # noqa: N806
    Tr = Tc = -(-N // B)  # noqa: N806
    starter = exercises.check("attention", f"{DOCS}/attention_starter.py", N=N, d=d)
    assert starter["kernel"]["Q"] == [Tc * N * d, 0] and starter["correct"] and not starter["passed"]
    ref = exercises.check("attention", f"{DOCS}/attention_reference.py", tmp_path / "a.html", N=N, d=d)
    want = {"Q": [N * d, 0], "K": [Tr * N * d, 0], "V": [Tr * N * d, 0], "O": [0, N * d], "L": [0, N]}
    assert ref["kernel"] == want == ref["schedule"] and ref["passed"]

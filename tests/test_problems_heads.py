"""Masks over a problem (every algorithm) and the backward of standard attention and square tiling over a problem:
the heads one after another (GQA per-head), each the one-head schedule; with g > 1 the backward's dK, dV partials
summed by the group sum (iosim.runner.problem_runs.run_by_heads). flash1 and flash2 have their own problem backward
(tests/test_problems_backward.py); here they must agree with the head-by-head view where both apply."""

import pytest

import iosim
from iosim import InputError, Problem
from iosim.cli import main
from iosim.runner.api import run_keywords
from iosim.theory import io_model

ALGORITHMS = ["flash2", "flash1", "standard", "square-tiling"]


@pytest.mark.parametrize("algo", ALGORITHMS)
@pytest.mark.parametrize("shape", [(2, 4, 2, 23, 6, True), (1, 3, 3, 17, 5, False)])
def test_backward_over_a_problem(algo, shape):
    """Simulated == closed form per array and in peak (both passes); the backward's dK, dV are the sums over each
    group of query heads of the per-head partials, equal to the float64 reference's sums; dQ per query head."""
    B, Hq, Hkv, N, d, causal = shape
    p = Problem(B=B, H_q=Hq, H_kv=Hkv, N=N, d=d, causal=causal)
    c = iosim.run(algo, problem=p, M=500, backward=True, count_only=True)
    n = iosim.run(algo, problem=p, M=500, backward=True, seed=5)
    for r in (c, n):
        assert all(ps.exact for ps in r.passes.values())
    assert n.stats.per_array == c.stats.per_array and n.stats.peak == c.stats.peak
    assert max(n.errors.values()) < 1e-12
    assert n.outputs["dQ"].shape == (B * Hq * N, d) and n.outputs["dK"].shape == (B * Hkv * N, d)
    one = iosim.run(algo, N=N, d=d, M=500, backward=True, causal=causal, count_only=True)
    heads, g = B * Hq, Hq // Hkv
    for name, cnt in one.stats.per_array.items():
        key = f"{name}part" if g > 1 and name in ("dK", "dV") else name
        assert c.stats.per_array[key].writes == heads * cnt.writes
    if g > 1:  # the group sum reads every partial once and writes dK, dV once per key/value head
        arrays, _ = io_model.group_sum(p, io_model.group_sum_rows(p, 500))
        assert c.stats.per_array["dK"].writes == arrays["dK"][1] == B * Hkv * N * d
        assert c.stats.per_array["dKpart"].reads == arrays["dKpart"][0] == B * Hq * N * d


@pytest.mark.parametrize("algo", ALGORITHMS)
@pytest.mark.parametrize("mask", ["blockdiag:5,12", "random:0.4:2"])
def test_mask_over_a_problem(algo, mask):
    """Heads one after another (standard, square tiling) or the problem's schedule (flash1, flash2, empty-block
    policy skip by default): B H_q times one head's counts under the same policy."""
    p = Problem(B=2, H_q=4, H_kv=2, N=17, d=5)
    c = iosim.run(algo, problem=p, M=400, mask=mask, count_only=True)
    n = iosim.run(algo, problem=p, M=400, mask=mask, seed=1)
    policy = "skip" if algo in ("flash1", "flash2") else "paper"
    one = iosim.run(iosim.Schedule(algo, kv_policy=policy), N=17, d=5, M=400, mask=mask, count_only=True)
    assert c.main.exact and n.main.exact and c.stats.peak == one.stats.peak
    assert c.stats.total == 8 * one.stats.total and n.stats.per_array == c.stats.per_array
    assert max(n.errors.values()) < 1e-12 and n.outputs["O"].shape == (8 * 17, 5)


@pytest.mark.parametrize(
    "problem, kwargs, parameter",
    [
        (dict(N_q=3, N_k=9, d=4), dict(backward=True), "backward"),
        (dict(N=9, d_qk=4, d_v=3), dict(backward=True), "backward"),
        (dict(N=9, d=4, page_size=4), dict(mask="window:2"), "page_size"),
        (dict(N=9, d=4), dict(backward=True, gqa="packed"), "backward"),
        (dict(N=9, d=4), dict(backward=True, splits=2), "backward"),
        (dict(N=9, d=4), dict(backward=True, trace=True), "trace"),
        (dict(N=9, d=4), dict(backward=True, M=5), "M"),
    ],
)  # fmt: skip
def test_by_heads_refusals_are_one_line(problem, kwargs, parameter):
    """Standard attention's backward over a problem runs head by head: what it needs, refused in one line."""
    p = Problem(B=1, H_q=4, H_kv=2, **problem)
    kwargs = {"M": 400, **kwargs}
    with pytest.raises(InputError) as e:
        run_keywords("standard", problem=p, count_only=True, **kwargs)
    assert e.value.parameter == parameter and "\n" not in str(e.value)


def test_cli_backward_and_mask_over_a_problem(capsys):
    argv = ["--heads", "4", "--kv-heads", "2", "--N", "32", "--d", "8", "--M", "1000", "--count-only"]
    assert main(["run", "square-tiling", "--backward", *argv]) == 0
    out = capsys.readouterr().out
    assert "dKpart" in out and "exact (per array and peak)" in out
    assert main(["compare", "--backward", *argv]) == 0
    out = capsys.readouterr().out
    assert "write dQ, dK, dV" in out and out.count(" yes ") >= 4
    assert main(["compare", "--mask", "window:4", *argv]) == 0
    assert main(["run", "standard", "--backward", *argv, "--gqa", "packed"]) == 2
    assert "gqa per-head" in capsys.readouterr().err

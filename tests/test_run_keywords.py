"""``iosim.run``'s short keyword form: the problem, memory and numerics keywords stay; the schedule's options are
fields of ``iosim.Schedule`` and, given to ``run`` as keywords, are refused in one line naming it. The counts of
each spelling are checked against closed forms written here from the papers' loops (FlashAttention-2's forward
reads Q once and K, V once per row block; its backward, Dao 2023 Algorithm 2 without the inner load of O_i,
reads K, V once and Q, dO, dQ, L, D once per column block), not against another run of the same spelling."""

from __future__ import annotations

import inspect

import pytest

import iosim
from iosim import InputError, Problem, Schedule
from iosim.runner.api import SCHEDULE_OPTIONS, run_keywords

KEPT = ["algorithm", "schedule", "M", "N", "d", "problem", "Q", "K", "V", "dO", "backward", "causal", "mask",
        "count_only", "dtype", "seed", "scale", "strict", "trace", "reference", "allow_long"]  # fmt: skip
MOVED = {"tiling": "paper", "Br": 4, "Bc": 4, "B": 4, "gqa": "packed", "splits": 2, "mla": "naive",
         "kv_policy": "skip", "pages": "gather"}  # fmt: skip


def _cdiv(a, b):
    return -(-a // b)


def flash2_forward_words(N, d, Br):  # noqa: N803
    """One head, no mask: reads Q (N d) once and K, V (2 N d) once per row block; writes O (N d) and L (N)."""
    return N * d + _cdiv(N, Br) * 2 * N * d + N * d + N


def flash2_backward_words(N, d, Bc):  # noqa: N803
    """One head, no mask: dQ zeroed in HBM (N d); the D pass reads dO, O (2 N d) and writes D (N); K, V read once
    (2 N d); per column block Q, dO, dQ (3 N d) and L, D (2 N) read and dQ written (N d); dK, dV written (2 N d)."""
    return N * d + 2 * N * d + N + 2 * N * d + _cdiv(N, Bc) * (4 * N * d + 2 * N) + 2 * N * d


def test_the_keyword_form_is_short():
    assert list(inspect.signature(iosim.run).parameters) == KEPT
    assert set(MOVED) == set(SCHEDULE_OPTIONS) and not set(SCHEDULE_OPTIONS) & set(KEPT)


@pytest.mark.parametrize("keyword", list(MOVED))
@pytest.mark.parametrize("form", ["keywords", "objects"])
def test_a_moved_keyword_is_one_line_naming_the_schedule(keyword, form):
    with pytest.raises(InputError) as e:
        if form == "keywords":
            iosim.run("flash2", N=16, d=4, M=4000, **{keyword: MOVED[keyword]})
        else:
            iosim.run(Problem(N=16, d=4), Schedule("flash2"), 4000, **{keyword: MOVED[keyword]})
    assert str(e.value) == (
        f"run(): {keyword} is a schedule option now: pass iosim.Schedule(algorithm, {keyword}=...) in place of the "
        "algorithm's name (or run(problem, schedule, M))"
    )
    assert e.value.parameter == f"run(): {keyword}"


@pytest.mark.parametrize(("N", "d", "Br", "Bc"), [(50, 8, 5, 3), (17, 4, 16, 5)])
def test_each_spelling_counts_the_closed_form(N, d, Br, Bc):  # noqa: N803
    schedule = Schedule("flash2", Br=Br, Bc=Bc, backward=True)
    spellings = {
        "schedule first": iosim.run(schedule, N=N, d=d, M=4000, count_only=True),
        "backward keyword": iosim.run(
            Schedule("flash2", Br=Br, Bc=Bc), N=N, d=d, M=4000, backward=True, count_only=True
        ),  # fmt: skip
        "objects": iosim.run(Problem(N=N, d=d), schedule, 4000, count_only=True),
        "run_keywords": run_keywords("flash2", N=N, d=d, M=4000, Br=Br, Bc=Bc, backward=True, count_only=True),
    }
    for name, r in spellings.items():
        assert r.spec == schedule, name
        assert (r.tiling.Br, r.tiling.Bc) == (Br, Bc), name
        assert r.passes["forward"].stats.total == flash2_forward_words(N, d, Br), name
        assert r.passes["backward"].stats.total == flash2_backward_words(N, d, Bc), name


@pytest.mark.parametrize("gqa", ["per-head", "packed"])
def test_schedule_options_over_a_problem(gqa):
    """GQA decoding, 4 query heads on one key/value head of 64 keys: per-head loads each K_j, V_j once per query
    head, packed once for the group (its 4 rows in one row block)."""
    p = Problem(H_q=4, H_kv=1, N_q=1, N_k=64, d=8)
    a = iosim.run(Schedule("flash2", gqa=gqa, Br=4, Bc=16), problem=p, M=4000, count_only=True)
    b = iosim.run(p, Schedule("flash2", gqa=gqa, Br=4, Bc=16), 4000, count_only=True)
    loads = 4 if gqa == "per-head" else 1
    for r in (a, b):
        per = r.stats.per_array
        assert per["K"].reads == per["V"].reads == loads * 64 * 8
        assert (per["Q"].reads, per["O"].writes, per["L"].writes) == (4 * 8, 4 * 8, 4)


def test_the_kept_keywords_work():
    """A numeric run through the kept keywords: the caller's arrays, backward, causal, dtype, trace, strict."""
    rng = __import__("numpy").random.default_rng(0)
    Q, K, V, dO = (rng.standard_normal((24, 4)) for _ in range(4))
    r = iosim.run("flash2", Q=Q, K=K, V=V, dO=dO, M=4000, backward=True, causal=True, dtype="float64", trace=True,
                  strict=True, reference=True, allow_long=False, scale=0.5)  # fmt: skip
    assert r.finite and max(r.errors.values()) < 1e-12 and r.trace is not None
    assert r.spec == Schedule("flash2", backward=True)
    c = iosim.run("flash1", N=24, d=4, M=4000, mask="window:5", seed=3, count_only=True)
    assert c.main.exact


def test_a_schedule_with_the_objects_form_still_refuses_problem_keywords():
    with pytest.raises(InputError, match="^N belongs to the Schedule or the Problem"):
        iosim.run(Problem(N=10, d=4), Schedule("flash2"), 1000, N=10)
    with pytest.raises(InputError, match="^schedule is given with a problem as the first argument"):
        iosim.run(Schedule("flash2"), Schedule("flash2"), 1000, N=10, d=4)

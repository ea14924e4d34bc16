"""The three objects of a run (a Problem, a Schedule, the memory M): ``iosim.run(problem, schedule, M)`` counts what
the keyword form counts, results carry the three as provenance, and the caller's own arrays run over any problem."""

import json

import numpy as np
import pytest

import iosim
from iosim import InputError, Problem, Schedule
from iosim.hierarchy import Machine


def reference(Q, K, V, g, causal, scale):
    """Attention in float64 over (B, H, N, d) arrays, written here from the definition (bottom-right causal)."""
    B, Hq, Nq, _ = Q.shape
    Nk = K.shape[2]
    O = np.zeros((B, Hq, Nq, V.shape[3]))
    for b in range(B):
        for h in range(Hq):
            S = scale * Q[b, h] @ K[b, h // g].T
            if causal:
                S[np.arange(Nk)[None, :] > np.arange(Nq)[:, None] + Nk - Nq] = -np.inf
            P = np.exp(S - S.max(axis=1, keepdims=True))
            O[b, h] = (P / P.sum(axis=1, keepdims=True)) @ V[b, h // g]
    return O


PROBLEMS = [
    Problem(B=2, H_q=4, H_kv=2, N_q=5, N_k=33, d_qk=16, d_v=8, causal=True),
    Problem(H_q=3, H_kv=1, N_q=1, N_k=47, d=12),
    Problem(B=2, H_q=2, H_kv=2, N_q=7, N_k=7, d=8),
]
SCHEDULES = [
    Schedule("flash2"),
    Schedule("flash2", gqa="packed", Br=4, Bc=5),
    Schedule("flash2", splits=3),
    Schedule("flash1", gqa="packed"),
    Schedule("standard"),
    Schedule("square-tiling", B=4),
]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: f"{s.algorithm}-{s.gqa}-{s.splits}")
@pytest.mark.parametrize("problem", PROBLEMS, ids=str)
def test_objects_count_what_the_keywords_count(problem, schedule):
    r = iosim.run(problem, schedule, 3000, count_only=True)
    k = iosim.run(schedule, M=3000, problem=problem, count_only=True)
    assert r.stats == k.stats and r.predicted.total == r.stats.total
    assert r.spec == schedule and k.spec == schedule
    out = json.loads(json.dumps(r.as_dict()))
    assert out["schedule_spec"] == schedule.as_dict() and out["memory"] == {"levels": "two-level", "M": 3000}
    assert out["problem"] == problem.as_dict()


def test_the_keyword_form_builds_the_schedule():
    r = iosim.run(iosim.Schedule("flash2", Br=10, Bc=12), N=100, d=16, M=2000)
    assert r.spec == Schedule("flash2", Br=10, Bc=12)
    assert r.as_dict()["schedule_spec"]["Br"] == 10
    assert iosim.run(Problem(N=100, d=16), "flash2", 2000).stats == iosim.run("flash2", N=100, d=16, M=2000).stats


@pytest.mark.parametrize(
    ("make", "parameter"),
    [
        (lambda: Schedule("nope"), "algorithm"),
        (lambda: Schedule("flash2", tiling="best"), "tiling"),
        (lambda: Schedule("flash2", B=4), "B"),
        (lambda: Schedule("standard", Br=4), "Br, Bc"),
        (lambda: Schedule("flash2", Br=0), "Br"),
        (lambda: Schedule("flash2", gqa="grouped"), "gqa"),
        (lambda: Schedule("flash2", splits=0), "splits"),
        (lambda: Schedule("flash2", mla="absorbed"), "mla"),
        (lambda: Schedule("flash2", kv_policy="lazy"), "kv_policy"),
        (lambda: Schedule("flash2", backward="yes"), "backward"),
        (lambda: iosim.run("flash2", N=10, d=4), "M"),
        (lambda: iosim.run("flash2", N=10, d=4, M=100, bogus=1), "run"),
        (lambda: iosim.run(Problem(N=10, d=4), Schedule("flash2"), 1000, gqa="packed"), "run(): gqa"),
        (lambda: iosim.run(Problem(N=10, d=4), Schedule("flash2"), 1000, N=10), "N"),
        (lambda: iosim.run(Problem(N=10, d=4), 5, 1000), "schedule"),
        (lambda: iosim.run("flash2", "flash1", 1000, N=10, d=4), "schedule"),
        (lambda: iosim.run(Problem(N=10, d=4), Schedule("flash2"), 0), "M"),
    ],
)
def test_each_object_is_checked_once_in_one_line(make, parameter):
    with pytest.raises(InputError) as e:
        make()
    assert str(e.value).startswith(parameter + " ") and "\n" not in str(e.value)


def arrays(p: Problem, seed=5):
    rng = np.random.default_rng(seed)
    Q = rng.standard_normal((p.B, p.H_q, p.N_q, p.d_qk))
    K = rng.standard_normal((p.B, p.H_kv, p.N_k, p.d_qk))
    V = K[..., : p.d_v].copy() if p.latent else rng.standard_normal((p.B, p.H_kv, p.N_k, p.d_v))
    return Q, K, V


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: f"{s.algorithm}-{s.gqa}-{s.splits}")
@pytest.mark.parametrize("problem", PROBLEMS, ids=str)
def test_the_callers_arrays_over_a_problem(problem, schedule):
    Q, K, V = arrays(problem)
    r = iosim.run(problem, schedule, 3000, Q=Q, K=K, V=V)
    want = reference(Q, K, V, problem.g, problem.causal, 1 / np.sqrt(problem.d_qk))
    got = r.outputs["O"].reshape(want.shape)
    assert np.max(np.abs(got - want)) < 1e-12 and r.errors["O"] < 1e-12
    assert r.seed is None and r.as_dict()["inputs"] == "given"
    assert r.stats.total == r.predicted.total  # the same schedule as with drawn arrays
    assert r.stats == iosim.run(problem, schedule, 3000, count_only=True).stats


def test_the_callers_arrays_paged_latent_and_backward():
    p = Problem(B=2, H_q=4, H_kv=1, N_q=3, N_k=40, d_qk=24, d_v=16, latent=True, page_size=8)
    Q, K, _ = arrays(p)
    r = iosim.run(p, Schedule("flash2", gqa="packed", mla="naive"), 6000, Q=Q, K=K)  # V: K's first d_v columns
    want = reference(Q, K, K[..., : p.d_v], p.g, False, 1 / np.sqrt(p.d_qk))
    assert np.max(np.abs(r.outputs["O"].reshape(want.shape) - want)) < 1e-12
    b = Problem(B=2, H_q=2, H_kv=1, N_q=9, N_k=9, d=8)
    Q, K, V = arrays(b)
    dO = np.random.default_rng(9).standard_normal((2, 2, 9, 8))
    one = iosim.run(b, Schedule("flash2", backward=True), 3000, Q=Q, K=K, V=V, dO=dO)
    again = iosim.run(b, Schedule("flash2", backward=True), 3000, Q=Q, K=K, V=V, dO=dO)
    other = iosim.run(b, Schedule("flash2", backward=True), 3000, Q=Q, K=K, V=V, dO=2 * dO)
    assert max(one.errors.values()) < 1e-12
    assert np.array_equal(one.outputs["dQ"], again.outputs["dQ"])  # the caller's dO, not a draw
    assert np.allclose(other.outputs["dQ"], 2 * one.outputs["dQ"])  # dQ is linear in dO


def test_torch_and_jax_arrays():
    torch = pytest.importorskip("torch", reason="torch (the triton extra) is not installed")
    p = PROBLEMS[0]
    Q, K, V = arrays(p)
    base = iosim.run(p, "flash2", 3000, Q=Q, K=K, V=V).outputs["O"]
    t = iosim.run(p, "flash2", 3000, Q=torch.tensor(Q, requires_grad=True), K=torch.tensor(K), V=torch.tensor(V))
    assert np.array_equal(t.outputs["O"], base)
    jnp = pytest.importorskip("jax.numpy", reason="jax (the pallas extra) is not installed")
    j = iosim.run(p, "flash2", 3000, Q=jnp.asarray(Q, dtype=jnp.float32), K=jnp.asarray(K), V=jnp.asarray(V))
    assert np.max(np.abs(j.outputs["O"] - base)) < 1e-5  # Q rounded to float32 by JAX


@pytest.mark.parametrize(
    ("change", "parameter"),
    [
        (dict(Q=np.zeros((2, 3, 5, 16))), "Q"),
        (dict(K=np.zeros((2, 2, 32, 16))), "K"),
        (dict(V=np.zeros((2, 2, 33, 9))), "V"),
        (dict(V=None), "V"),
        (dict(dO=np.zeros((2, 4, 5, 8))), "dO"),  # without backward
        (dict(Q=np.full((2, 4, 5, 16), np.nan)), "Q"),
        (dict(Q="abc"), "Q"),
        (dict(count_only=True), "count_only"),
    ],
)
def test_the_callers_arrays_checked_in_one_line(change, parameter):
    p = PROBLEMS[0]
    Q, K, V = arrays(p)
    kw = dict(Q=Q, K=K, V=V)
    kw.update(change)
    with pytest.raises(InputError) as e:
        iosim.run(p, "flash2", 3000, **kw)
    assert str(e.value).startswith(parameter + " ") and "\n" not in str(e.value)


def test_a_latent_v_that_is_not_k():
    p = Problem(H_q=2, H_kv=1, N_q=2, N_k=10, d_qk=8, d_v=4, latent=True)
    Q, K, V = arrays(p)
    with pytest.raises(InputError, match="^V must equal K's first"):
        iosim.run(p, "flash2", 2000, Q=Q, K=K, V=V + 1)


def test_replay_takes_the_same_objects():
    p = Problem(H_q=4, H_kv=2, N_q=20, N_k=50, d=8, causal=True)
    a = iosim.replay(p, Schedule("flash2", gqa="packed"), 600, policy="lru")
    b = iosim.replay("flash2", problem=p, M=600, gqa="packed", policy="lru")
    assert a.table() == b.table()
    with pytest.raises(InputError, match="^gqa belongs"):
        iosim.replay(p, Schedule("flash2"), 600, gqa="packed")
    with pytest.raises(InputError, match="^M must be given"):
        iosim.replay("flash2", N=10, d=4)


def test_hierarchy_takes_the_same_objects():
    p = Problem(B=2, H_q=4, H_kv=2, N_q=1, N_k=300, d=16)
    machine = Machine(P=2, C=4096, L=8)
    a = iosim.hierarchy(p, Schedule("flash2", gqa="packed"), 600, device=machine)
    b = iosim.hierarchy(Schedule("flash2", gqa="packed"), problem=p, M=600, device=machine)
    c = iosim.hierarchy(p, Schedule("flash2", gqa="packed"), machine, M=600)
    timeless = lambda r: {k: v for k, v in r.as_dict().items() if k != "seconds"}  # noqa: E731
    assert timeless(a) == timeless(b) == timeless(c)
    with pytest.raises(InputError, match="^hierarchy\\(\\): gqa is a schedule option now"):
        iosim.hierarchy(p, Schedule("flash2"), 600, device=machine, gqa="packed")
    with pytest.raises(InputError, match="^H_q belongs"):
        iosim.hierarchy(p, Schedule("flash2"), 600, device=machine, H_q=4)
    split = iosim.hierarchy(p, Schedule("flash2", splits=2), 600, device=machine)  # the split kernel, then combine
    assert [k["kernel"] for k in split.launches] == ["flash2 split-KV forward", "split-KV combine"]
    with pytest.raises(InputError, match="^schedule "):
        iosim.hierarchy("flash2", Schedule("flash2"), N=16, d=4, M=600, device=Machine(C=0))


def test_sweep_takes_problem_and_schedule_objects():
    problems = [Problem(H_q=4, H_kv=2, N_q=1, N_k=300, d=16), Problem(N=64, d=8, causal=True)]
    schedules = [Schedule("flash2", gqa="packed"), Schedule("flash1", Br=8, Bc=8)]
    recs = iosim.sweep({"problem": problems, "schedule": schedules, "M": [2000]}, as_frame=False)
    assert len(recs) == 4 and all(r["status"] == "ok" and r["exact"] for r in recs)
    for r, (p, s) in zip(recs, [(p, s) for p in problems for s in schedules], strict=True):
        assert r["total"] == iosim.run(p, s, 2000, count_only=True).stats.total
    with pytest.raises(InputError, match="^gqa belongs to the Schedule"):
        iosim.sweep({"schedule": schedules, "gqa": "packed", "N": 8, "d": 4, "M": 200})
    dt = iosim.sweep({"problem": Problem(N=8, d=4, dtype_q="bf16"), "M": 200}, executor="serial", as_frame=False)
    assert dt[0]["dtype_q"] == "bf16" and dt[0]["total_bytes"] < sum(  # a problem's dtypes are grid keys now
        r["total_bytes"] for r in iosim.sweep({"problem": Problem(N=8, d=4), "M": 200}, executor="serial",
                                              as_frame=False))  # fmt: skip


def test_the_pebble_adapter_takes_the_same_objects():
    from iosim.pebble.from_run import pebble_run

    p = Problem(H_q=2, H_kv=1, N_q=3, N_k=8, d=4, causal=True)
    a = pebble_run(p, Schedule("flash2", gqa="packed"), 200)
    b = pebble_run("flash2", M=200, problem=p, gqa="packed")
    assert a.outcome.io == b.outcome.io and a.outcome.io > 0
    with pytest.raises(InputError, match="^gqa belongs"):
        pebble_run(p, Schedule("flash2"), 200, gqa="packed")

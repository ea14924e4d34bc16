"""The cache replay (iosim.replay, iosim.views.cache_sim): LRU, FIFO and OPT pinned against naive pure-Python caches on
random traces; sanity on real schedules (OPT <= LRU, a cache that holds everything fetches each line once)."""

from collections import OrderedDict, deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import iosim
from iosim import InputError
from iosim.cli import main
from iosim.runner.api import run_keywords
from iosim.views import cache_sim as cs
from iosim.views.replay import operand_ops


def naive(addresses, writes, policy, capacity, L, write_allocate):  # noqa: N803
    """A textbook fully associative cache: (words fetched, words written), dirty lines flushed at the end."""
    lines = [a // L for a in addresses]
    resident: OrderedDict[int, bool] = OrderedDict()  # line -> dirty, in LRU order (or insertion order: FIFO)
    fifo: deque[int] = deque()
    fetched = written = 0
    for i, (line, w) in enumerate(zip(lines, writes, strict=True)):
        if line in resident:
            resident[line] = resident[line] or bool(w)
            if policy == "lru":
                resident.move_to_end(line)
            continue
        if w and not write_allocate:
            written += 1
            continue
        fetched += L
        if len(resident) == capacity:
            if policy == "lru":
                victim = next(iter(resident))
            elif policy == "fifo":
                victim = fifo.popleft()
            else:  # Belady: the resident line used again farthest in the future (never again: infinitely far)

                def next_use(x, i=i):
                    return next((k for k in range(i + 1, len(lines)) if lines[k] == x), len(lines))

                victim = max(resident, key=next_use)
            written += L * resident.pop(victim)
        resident[line] = bool(w)
        fifo.append(line)
    return fetched, written + L * sum(resident.values())


traces = st.integers(1, 120).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(0, 47), min_size=n, max_size=n),
        st.lists(st.booleans(), min_size=n, max_size=n),
    )
)


@settings(max_examples=150, deadline=None)
@given(
    trace=traces,
    policy=st.sampled_from(cs.POLICIES),
    capacity=st.integers(1, 9),
    L=st.sampled_from([1, 2, 4]),
    write_allocate=st.booleans(),
)
def test_policies_equal_naive_caches_on_random_traces(trace, policy, capacity, L, write_allocate):  # noqa: N803
    addresses, writes = trace
    assert cs.simulate(addresses, writes, policy, capacity, L, write_allocate) == naive(
        addresses, writes, policy, capacity, L, write_allocate
    )


@settings(max_examples=60, deadline=None)
@given(trace=traces, capacity=st.integers(1, 9))
def test_opt_fetches_no_more_than_lru_or_fifo(trace, capacity):
    addresses, writes = trace
    opt = cs.simulate(addresses, writes, "opt", capacity)[0]
    assert opt <= cs.simulate(addresses, writes, "lru", capacity)[0]
    assert opt <= cs.simulate(addresses, writes, "fifo", capacity)[0]


@pytest.mark.parametrize("algorithm", ["flash2", "flash1", "standard", "square-tiling"])
@pytest.mark.parametrize("backward", [False, True])
def test_replay_of_every_algorithm(algorithm, backward):
    r = iosim.replay(algorithm, N=29, d=7, M=400, backward=backward, causal=backward)
    assert set(r.policies) == {"lru", "opt", "fifo"}
    assert r.policies["opt"].total <= r.policies["lru"].total
    assert r.explicit_total == iosim.run(algorithm, N=29, d=7, M=400, backward=backward, causal=backward).stats.total
    # a cache that holds everything fetches each touched line once, under every policy
    big = iosim.replay(algorithm, N=29, d=7, M=400, backward=backward, causal=backward, cache_words=1 << 16, line=4)
    ops, _ = operand_ops(
        iosim.run(algorithm, N=29, d=7, M=400, backward=backward, causal=backward, trace=True).trace,
        algorithm,
        backward,
        29,
        4,
    )
    touched = len(set(_lines(ops, 4)))
    for p in big.policies.values():
        assert sum(p.fetched.values()) == 4 * touched


def _lines(ops, L):  # noqa: N803
    state = cs.new_state(cs.EMIT, 1, True, 1 << 20, L, 64)
    n = cs.access_count(ops)
    lines, flags = np.empty(n, np.int32), np.empty(n, np.int8)
    cs.run_ops(ops, *state, np.zeros(1 << 20, np.int32), lines, flags)
    return lines[: int(state[0][cs._NOUT])]


def test_flash2_lru_moves_more_than_the_explicit_schedule_and_opt_about_the_same():
    r = iosim.replay("flash2", N=128, d=16, M=1024, policy="lru,opt")
    assert r.ratio("lru") > 1.2
    assert 0.9 < r.ratio("opt") < 1.1
    assert r.policies["lru"].fetched["Q"] > r.explicit["Q"][0]  # LRU evicts Q_i while K_j, V_j stream past


def test_write_allocate_fetches_on_a_write_miss_and_no_write_allocate_writes_through():
    for policy in cs.POLICIES:
        assert cs.simulate(range(10), [True] * 10, policy, 2, 1, True) == (10, 10)
        assert cs.simulate(range(10), [True] * 10, policy, 2, 1, False) == (0, 10)
        assert cs.simulate([0, 0, 1, 0], [False, True, False, False], policy, 1, 2, True) == (2, 2)


def test_opt_refuses_a_trace_over_its_memory_limit():
    with pytest.raises(InputError, match="policy opt.*smaller N or --policy lru"):
        iosim.replay("flash2", N=64, d=8, M=1000, policy="opt", opt_limit_bytes=1000)


def test_cli_replay(capsys):
    assert (
        main(["replay", "flash2", "--N", "64", "--d", "8", "--M", "1000", "--policy", "lru,fifo", "--line", "8"]) == 0
    )
    out = capsys.readouterr().out
    assert "lru / explicit" in out and "fifo" in out and "line 8 word(s)" in out


def test_flash2_operand_trace_has_the_documented_accesses():
    """flash2 forward, per inner step (br x bc): S = Q_i K_j^T reads 2d and writes 1 per entry; the row sweep reads
    S, m_i, then reads and writes S, l_i, writes m_i, reads and writes O_i's row; O_i += P V_j reads O, then 2 bc,
    writes O per entry of O_i. Per row block, at the store of O_i: l_i, O_i's row (read+write), m_i, l_i (r+w)."""
    N, d = 20, 3  # noqa: N806
    r = iosim.run("flash2", N=N, d=d, M=100, count_only=True, trace=True)
    Br, Bc = r.tiling.Br, r.tiling.Bc  # noqa: N806
    ops, _ = operand_ops(r.trace, "flash2", False, N)
    expected = 0
    for r0 in range(0, N, Br):
        br = min(Br, N - r0)
        for c0 in range(0, N, Bc):
            bc = min(Bc, N - c0)
            expected += br * bc * (2 * d + 1) + br * (bc + 1 + 2 * bc + 2 + 1 + 2 * d) + br * d * (2 * bc + 2)
        expected += br * (1 + 2 * d + 1 + 2)
    assert cs.access_count(ops) == expected


# ------------------------------------------------------------------------------------------- replay over a problem
@pytest.mark.parametrize("algorithm", ["flash2", "flash1"])
@pytest.mark.parametrize("gqa", ["per-head", "packed"])
def test_replay_over_a_problem(algorithm, gqa):
    """flash1 and flash2 over a problem (GQA, N_q != N_k, causal bottom-right, d_qk != d_v): the explicit column is
    the problem run's counts; OPT moves no more than LRU; a cache that holds everything fetches each touched word
    of the slow arrays once, so at most their explicit reads."""
    p = iosim.Problem(B=2, H_q=4, H_kv=2, N_q=9, N_k=23, d_qk=6, d_v=5, causal=True)
    r = iosim.replay(algorithm, problem=p, M=500, gqa=gqa)
    run = iosim.run(iosim.Schedule(algorithm, gqa=gqa), problem=p, M=500, count_only=True)
    assert r.problem == p and r.explicit_total == run.stats.total
    assert r.policies["opt"].total <= r.policies["lru"].total
    big = iosim.replay(algorithm, problem=p, M=500, gqa=gqa, cache_words=1 << 16, policy="lru")
    fetched = big.policies["lru"].fetched
    assert fetched["Q"] == p.B * p.H_q * p.N_q * p.d_qk
    assert fetched["K"] == p.B * p.H_kv * p.N_k * p.d_qk and fetched["V"] == p.B * p.H_kv * p.N_k * p.d_v


def test_replay_of_a_batch_is_the_sum_of_its_items():
    """Two independent batch items replayed through LRU fetch, per slow array, twice what one item fetches: the
    second item's words are at addresses of their own, and LRU evicts the first item's lines before any of its."""
    one = iosim.replay("flash2", N=40, d=8, M=700, policy="lru", Br=9, Bc=7)
    two = iosim.replay("flash2", problem=iosim.Problem(B=2, N=40, d=8), M=700, policy="lru", Br=9, Bc=7)
    for name in ("Q", "K", "V", "O", "L"):
        assert two.policies["lru"].fetched[name] == 2 * one.policies["lru"].fetched[name]
        assert two.policies["lru"].written[name] == 2 * one.policies["lru"].written[name]
        assert two.explicit[name] == tuple(2 * x for x in one.explicit[name])


@pytest.mark.parametrize(
    "algorithm, problem, kwargs, parameter",
    [
        ("standard", dict(), {}, "algorithm"),
        ("square-tiling", dict(), {}, "algorithm"),
        ("flash2", dict(), dict(N=8, d=8), "N, d"),
    ],
)  # fmt: skip
def test_replay_over_a_problem_refusals(algorithm, problem, kwargs, parameter):
    p = iosim.Problem(B=2, H_q=2, H_kv=1, N_q=3, N_k=9, d=8, **problem)
    with pytest.raises(InputError) as e:
        iosim.replay(algorithm, problem=p, M=400, **kwargs)
    assert e.value.parameter == parameter and "\n" not in str(e.value)


def test_cli_replay_over_a_problem(capsys):
    argv = ["replay", "flash2", "--heads", "4", "--kv-heads", "1", "--Nq", "1", "--Nk", "64", "--d", "8", "--M", "600"]
    assert main([*argv, "--gqa", "packed", "--policy", "lru"]) == 0
    out = capsys.readouterr().out
    assert "H_q=4, H_kv=1, N_q=1, N_k=64" in out and "lru / explicit" in out
    assert main([*argv, "--page-size", "16", "--splits", "2", "--policy", "lru"]) == 0
    assert "page_table" in capsys.readouterr().out
    assert main([*argv, "--page-size", "65"]) == 2  # larger than N_k
    err = capsys.readouterr().err
    assert "page" in err and len(err.strip().splitlines()) == 1


# Every schedule over a problem replays: split-KV (partials and the combine step), paged KV (the page-table words),
# MLA's shared latent (V read from the resident K tile), the backward (per-head GQA's partials and their group sum),
# masks. A cache that holds everything fetches each word the computation reads once and writes each slow word it
# writes once (counted here from the problem's shapes, not from the schedule); OPT moves no more than LRU.
P = dict(B=2, H_q=4, H_kv=2, N_q=3, N_k=29, d_qk=6, d_v=5)


@pytest.mark.parametrize(
    "algorithm, fields, kwargs",
    [
        ("flash2", {}, dict(gqa="packed", splits=3)),
        ("flash2", dict(page_size=6), dict(gqa="per-head")),
        ("flash1", dict(page_size=6), dict(gqa="packed")),
        ("flash2", dict(H_kv=1, d_qk=8, latent=True), dict(gqa="packed")),
        ("flash1", dict(H_kv=1, d_qk=8, latent=True), dict(gqa="per-head")),
        ("flash2", dict(H_kv=1, d_qk=8, latent=True), dict(gqa="packed", mla="naive")),
        ("flash1", dict(H_kv=1, d_qk=8, latent=True), dict(gqa="per-head", mla="naive")),
        ("flash2", dict(causal=True, N_q=5), dict(gqa="per-head", backward=True)),
        ("flash1", dict(causal=True, N_q=5), dict(gqa="per-head", backward=True)),
        ("flash2", dict(N_q=5), dict(gqa="packed", backward=True, mask="window:4:causal")),
        ("flash2", {}, dict(gqa="packed", splits=3, mask="window:7")),
    ],
)  # fmt: skip
def test_replay_of_every_problem_schedule(algorithm, fields, kwargs):
    p = iosim.Problem(**{**P, **fields})
    backward = kwargs.get("backward", False)
    run = run_keywords(algorithm, problem=p, M=700, count_only=True, **kwargs)
    small = iosim.replay(algorithm, problem=p, M=700, policy="lru,opt", **kwargs)
    assert small.explicit_total == run.passes["backward" if backward else "forward"].stats.total
    assert small.policies["opt"].total <= small.policies["lru"].total
    big = iosim.replay(algorithm, problem=p, M=700, cache_words=1 << 18, policy="lru", **kwargs).policies["lru"]
    q_rows, kv_rows, dqk, dv = p.B * p.H_q * p.N_q, p.B * p.H_kv * p.N_k, p.d_qk, p.d_v
    masked = "mask" in kwargs
    assert big.fetched["Q"] == q_rows * dqk
    if not masked:
        assert big.fetched["K"] == kv_rows * dqk
        # a latent's V is K's first d_v columns at K's addresses: shared or naive, its words are fetched as K's
        assert big.fetched.get("V", 0) == (0 if p.latent else kv_rows * dv)
    if p.page_size:
        assert big.fetched["page_table"] == p.B * p.pages  # every page's entry, once
    if backward:
        assert big.written["dQ"] == q_rows * dqk and big.written["dK"] == kv_rows * dqk
        assert big.written["dV"] == kv_rows * dv
        if p.g > 1 and kwargs["gqa"] == "per-head":  # the partials, written per query head and read by the sum
            assert big.written["dKpart"] == p.B * p.H_q * p.N_k * dqk
    else:
        assert big.written["O"] == q_rows * dv
        if kwargs.get("splits", 1) > 1:  # each split's partials written once and read back by the combine step
            s = kwargs["splits"]
            assert big.written["Opart"] <= s * q_rows * dv and big.written["Lpart"] <= s * q_rows
            assert big.written["L"] == q_rows


def test_naive_mla_reads_v_from_ks_lines():
    """MLA's V is the latent's first d_v columns: a naive schedule loads it again, but from K's addresses, so a cache
    holding the latent fetches nothing more for it than the shared read (the explicit count still moves it twice)."""
    p = iosim.Problem(B=2, H_q=4, H_kv=1, N_q=3, N_k=40, d_qk=12, d_v=8, latent=True)
    kw = dict(problem=p, M=900, gqa="packed", cache_words=1 << 18, policy="lru")
    shared = iosim.replay("flash2", mla="shared", **kw)
    naive = iosim.replay("flash2", mla="naive", **kw)
    assert naive.explicit_total > shared.explicit_total  # the explicit schedule loads V's words again
    slow = ("Q", "K", "O", "L")  # the slow arrays (the on-chip S differs: naive's tiles are smaller)
    got, want = naive.policies["lru"], shared.policies["lru"]
    assert "V" not in got.fetched and all(got.fetched[a] == want.fetched[a] for a in slow)  # from lines already held
    assert got.fetched["K"] == p.B * p.H_kv * p.N_k * p.d_qk  # the latent once, V's reads included

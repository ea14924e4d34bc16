"""The hierarchy (iosim.hierarchy): thread blocks cut from the schedules' own traces, a shared L2, DRAM.

Exact sanity limits: C = 0 is the two-level count; an L2 that holds everything moves the compulsory traffic; one SM
running one block at a time shows the L2 the single-head trace itself. The segment LRU equals a naive line LRU on
random streams and cache_sim's line LRU on real launches; OPT (cache_sim's, write-validate) equals a naive Belady."""

from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from iosim.memory_model.core import INIT, LOAD, STORE

import iosim
from iosim import InputError
from iosim.hierarchy import ORDERS, Machine, Scheduler, ctas, device, hierarchy, l2, launches, presets
from iosim.runner.api import run_keywords
from iosim.views import cache_sim as cs

CASES = [
    ("flash2", False),
    ("flash2", True),
    ("flash1", False),
    ("flash1", True),
    ("square-tiling", False),
    ("square-tiling", True),
    ("standard", False),
]
SMALL = dict(N=96, d=16, M=1024)


def traced(algorithm, backward, **kw):
    args = {**SMALL, **kw}
    return iosim.run(algorithm, backward=backward, count_only=True, trace=True, reference=False, **args)


@pytest.mark.parametrize(("algorithm", "backward"), CASES)
def test_pieces_re_add_to_the_two_level_count(algorithm, backward):
    r = traced(algorithm, backward)
    c = ctas.cut(r.trace)
    reads = {n: 0 for n in r.trace.names}
    writes = dict(reads)
    for row in c.requests:
        name = r.trace.names[int(row[1])]
        (writes if row[0] else reads)[name] += int(row[6])
    for name, counts in r.stats.per_array.items():
        assert (reads[name], writes[name]) == (counts.reads, counts.writes), name
    # every piece starts and ends with fast memory empty, and the pieces tile the events that move words
    ev = r.trace.events
    for start, stop in c.piece_events:
        assert ev[stop - 1, 7] == 0 and (start == 0 or ev[start - 1, 7] == 0)


def declared(r, algorithm, backward):
    c = ctas.cut(r.trace)
    d = launches.assign(c, r.trace, launches.kernels(algorithm, backward))
    return c, [k.name for k in d.kernels], list(np.diff(d.launch_ptr))


def test_flash_cuts_are_the_outer_loops():
    """Pieces are the outer loops' steps; the declared kernels launch them: flash2's forward one CTA per row block,
    flash1's one CTA per head after the memset, flash2's backward the memset, D, one CTA per column block."""
    r = traced("flash2", False)
    Tr = -(-SMALL["N"] // r.tiling.Br)
    c, names, ctas_per = declared(r, "flash2", False)
    assert names == ["flash2 forward"] and c.pieces == Tr and ctas_per == [Tr]  # one CTA per row block i
    r = traced("flash1", False)
    c, names, ctas_per = declared(r, "flash1", False)
    assert names == ["memset O, l, m", "flash1 forward"] and ctas_per == [3, 1]
    assert c.pieces == 3 + -(-SMALL["N"] // r.tiling.Bc)  # the memsets of O, l, m; a piece per column block j
    r = traced("flash2", True)
    Tr, Tc = -(-SMALL["N"] // r.tiling.Br), -(-SMALL["N"] // r.tiling.Bc)
    c, names, ctas_per = declared(r, "flash2", True)
    assert names == ["memset dQ", "preprocess D", "flash2 backward"] and ctas_per == [1, Tr, Tc]


@pytest.mark.parametrize(("algorithm", "backward"), CASES)
@pytest.mark.parametrize("order", ORDERS)
def test_no_l2_is_the_two_level_count(algorithm, backward, order):
    r = hierarchy(
        algorithm,
        backward=backward,
        B=2,
        H_q=4,
        H_kv=2,
        **SMALL,
        device=Machine(P=3, C=0, L=4),
        scheduler=Scheduler(order=order),
    )
    one = traced(algorithm, backward).stats
    for name, c in r.per_array.items():
        want = one.per_array[name]
        assert (c.dram_read, c.dram_update) == (8 * want.reads, 8 * want.writes), name
        assert (c.l2_read, c.l2_update) == (8 * want.reads, 8 * want.writes), name
    assert r.dram == r.two_level == 8 * one.total and r.ratio == 1.0


def compulsory(res):
    """Naive: per line, L words fetched if its first access reads it, L written back if it is ever written."""
    lay_lines, flags = line_stream(res)
    first, written = {}, set()
    for line, f in zip(lay_lines.tolist(), flags.tolist(), strict=True):
        first.setdefault(line, f)
        if f:
            written.add(line)
    return res.L * sum(1 for f in first.values() if f == 0), res.L * len(written)


def line_stream(res):
    """The recorded request order as a line stream (a second pass of l2.line_stream on the same layout)."""
    lay = res.layout
    rec = res.record
    args = (rec[:, 0].copy(), rec[:, 1].copy(), len(rec), res.blocks[:, 1:].copy(), res.cut.requests, lay.kv)
    args += (lay.base, lay.stride, lay.lbase, lay.nl, lay.line_words)
    n = l2.line_stream(*args, np.zeros(0, np.int64), np.zeros(0, np.int8))
    lines, flags = np.empty(n, np.int64), np.empty(n, np.int8)
    l2.line_stream(*args, lines, flags)
    return lines, flags


@pytest.mark.parametrize(("algorithm", "backward"), CASES)
@pytest.mark.parametrize("policy", ["lru", "opt"])
def test_an_l2_holding_everything_moves_the_compulsory_traffic(algorithm, backward, policy):
    r = hierarchy(
        algorithm,
        backward=backward,
        B=2,
        H_q=2,
        H_kv=1,
        policy=policy,
        record=True,
        **SMALL,
        device=Machine(P=2, C=1 << 30, L=8),
    )
    assert (r.dram_read, r.dram_update) == compulsory(r)


@pytest.mark.parametrize(("algorithm", "backward"), CASES)
def test_one_sm_one_block_at_a_time_sees_the_single_head_trace(algorithm, backward):
    r = hierarchy(algorithm, backward=backward, record=True, **SMALL, device=Machine(P=1, blocks_per_sm=1, C=64, L=4))
    ev = r.trace.events
    moves = ev[(ev[:, 0] == LOAD) | (ev[:, 0] == STORE) | (ev[:, 0] == INIT)]
    seen = r.cut.requests[r.record[:, 1]]
    assert len(seen) == len(moves)
    assert np.array_equal(seen[:, 0], (moves[:, 0] != LOAD).astype(np.int64))
    assert np.array_equal(seen[:, 1:7], moves[:, 1:7])


def cache_sim_lru(lines, flags, capacity, L, n_aids, aid_of):  # noqa: N803
    """cache_sim's line LRU (write-validate) over a line stream, dirty lines flushed: (fetched, written) per aid."""
    state = cs.new_state(cs.LRU, capacity, 2, int(lines.max()) + 1, L, n_aids)
    h, _slot_of, line_of, dirty, prv, nxt, fetched, written = state
    cs._lru_chunk(len(lines), lines, (flags & 1).astype(np.int8), *state, aid_of)
    used = int(h[cs._USED])
    for line in line_of[:used][dirty[:used] != 0]:
        written[aid_of[line]] += L
    return fetched, written


@pytest.mark.parametrize(("algorithm", "backward"), CASES)
@pytest.mark.parametrize("C", [16, 96, 400])
def test_segment_lru_equals_cache_sim_line_lru_on_real_launches(algorithm, backward, C):  # noqa: N803
    r = hierarchy(algorithm, backward=backward, B=1, H_q=4, H_kv=2, record=True, **SMALL, device=Machine(P=3, C=C, L=4))
    lines, flags = line_stream(r)
    names = r.trace.names
    lay = r.layout
    aid_of = np.zeros(lay.n_lines, np.int32)
    ends = np.append(lay.lbase[1:], lay.n_lines)
    for a in range(len(names)):
        aid_of[lay.lbase[a] : ends[a]] = a
    fetched, written = cache_sim_lru(lines, flags, C // 4, 4, len(names), aid_of)
    for a, name in enumerate(names):
        c = r.per_array.get(name)
        got = (0, 0) if c is None else (c.l2_fill, c.l2_writeback)
        assert got == (int(fetched[a]), int(written[a])), name


def naive_line_cache(lines, writes, capacity, L, policy):  # noqa: N803
    """A textbook fully associative write-back, write-validate cache of ``capacity`` lines: (fetched, written)."""
    resident: OrderedDict[int, bool] = OrderedDict()
    fetched = written = 0
    for i, (line, w) in enumerate(zip(lines, writes, strict=True)):
        if line in resident:
            resident[line] = resident[line] or bool(w)
            resident.move_to_end(line)
            continue
        if not w:
            fetched += L
        if len(resident) == capacity:
            if policy == "lru":
                victim = next(iter(resident))
            else:

                def next_use(x, i=i):
                    return next((k for k in range(i + 1, len(lines)) if lines[k] == x), len(lines))

                victim = max(resident, key=next_use)
            written += L * resident.pop(victim)
        resident[line] = bool(w)
    return fetched, written + L * sum(resident.values())


streams = st.integers(1, 40).flatmap(
    lambda n_lines: st.tuples(
        st.just(n_lines),
        st.lists(st.booleans(), min_size=n_lines - 1, max_size=n_lines - 1),  # segment boundaries
        st.lists(st.tuples(st.integers(0, n_lines - 1), st.integers(0, n_lines - 1), st.booleans()), max_size=60),
    )
)


@settings(max_examples=200, deadline=None)
@given(stream=streams, capacity=st.integers(1, 12), L=st.sampled_from([1, 2]))
def test_segment_lru_equals_a_naive_line_lru_on_random_streams(stream, capacity, L):  # noqa: N803
    n_lines, cuts, reqs = stream
    starts = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [n_lines]
    seg_of = np.searchsorted(starts, np.arange(n_lines), side="right") - 1
    h = np.array([[-1, -1, 0]], np.int64)  # one partition: row 0 of the state arrays
    ns = len(starts) - 1
    res, dirty = np.zeros((1, ns), np.int32), np.zeros((1, ns), np.int8)
    prv, nxt = np.full((1, ns), -1, np.int32), np.full((1, ns), -1, np.int32)
    seg_aid = np.zeros(ns, np.int16)
    fill, wb = np.zeros(1, np.int64), np.zeros(1, np.int64)
    Lw = np.array([L], np.int64)  # noqa: N806
    lines, writes = [], []
    for a, b, w in reqs:  # a request: whole segments from a's to b's, ascending
        s0, s1 = sorted((seg_of[a], seg_of[b]))
        for s in range(s0, s1 + 1):
            k = starts[s + 1] - starts[s]
            if l2.touch(s, k, int(w), 0, capacity, L, Lw, 0, h, res, dirty, prv, nxt, seg_aid, wb) and not w:
                fill[0] += k * L
            lines += list(range(starts[s], starts[s + 1]))
            writes += [w] * k
    l2.flush((h, res, dirty, prv, nxt, seg_aid), Lw, wb)
    assert (int(fill[0]), int(wb[0])) == naive_line_cache(lines, writes, capacity, L, "lru")
    assert int(res.sum()) == min(h[0, 2], capacity) == h[0, 2]


@settings(max_examples=150, deadline=None)
@given(
    trace=st.lists(st.tuples(st.integers(0, 30), st.booleans()), min_size=1, max_size=100),
    capacity=st.integers(1, 9),
    policy=st.sampled_from(["lru", "opt"]),
)
def test_cache_sim_write_validate_equals_a_naive_cache(trace, capacity, policy):
    """The one addition to cache_sim (write_allocate=2: a write miss allocates without a fetch), LRU and OPT."""
    addresses, writes = zip(*trace, strict=True)
    assert cs.simulate(addresses, writes, policy, capacity, 1, 2) == naive_line_cache(
        list(addresses), list(writes), capacity, 1, policy
    )


@pytest.mark.parametrize(("algorithm", "backward"), [("flash2", False), ("flash2", True), ("square-tiling", False)])
def test_opt_is_a_floor_under_lru(algorithm, backward):
    kw = dict(backward=backward, B=2, H_q=2, device=Machine(P=3, C=256, L=4), **SMALL)
    lru, opt = hierarchy(algorithm, policy="lru", **kw), hierarchy(algorithm, policy="opt", **kw)
    assert opt.dram_read <= lru.dram_read and opt.two_level == lru.two_level


def test_gqa_shares_k_and_v_in_the_l2():
    kw = dict(N=256, d=16, M=2048, device=Machine(P=8, C=1 << 20, L=8), scheduler=Scheduler(order="swizzled"))
    mha = hierarchy("flash2", H_q=4, H_kv=4, **kw)
    gqa = hierarchy("flash2", H_q=4, H_kv=1, **kw)
    assert mha.two_level == gqa.two_level  # every query head loads its K/V tiles either way
    assert gqa.per_array["K"].dram_read * 4 == mha.per_array["K"].dram_read  # compulsory: one KV head, not four


def test_block_orders():
    from iosim.hierarchy import block_order

    pieces = np.arange(3)
    g = block_order("grid", pieces, 1, 2, 1)
    assert g[:, 0].tolist() == [0, 0, 1, 1, 2, 2] and g[:, 1].tolist() == [0, 1] * 3
    hg = block_order("head-grouped", pieces, 1, 2, 1)
    assert hg[:, 0].tolist() == [0, 1, 2] * 2 and hg[:, 1].tolist() == [0, 0, 0, 1, 1, 1]
    sw = block_order("swizzled", pieces, 1, 4, 2)
    assert sw[:4, 1].tolist() == [0, 1, 0, 1] and sw[:, 2].tolist() == [0] * 6 + [1] * 6
    for order in ORDERS:
        assert sorted(map(tuple, block_order(order, pieces, 2, 4, 2))) == sorted(
            map(tuple, block_order("grid", pieces, 2, 4, 2))
        )


def test_device_presets_have_sourced_figures():
    import csv

    from iosim.hierarchy.devices import _table_path

    table = presets()
    for name in ("A100", "H100", "H200", "RTX 4090"):
        assert name in table
    assert (table["H100"].sms, table["H100"].l2_bytes) == (132, 50 * 1024 * 1024)
    assert (table["A100"].sms, table["RTX 4090"].l2_bytes) == (108, 72 * 1024 * 1024)
    with open(_table_path(), newline="") as f:
        for row in csv.DictReader(f):
            if row["sms"]:
                for col in ("sms_source", "smem_bytes_source", "l2_source", "l2_line_source"):
                    assert "http" in row[col], (row["device"], col)
    assert device("h100") == table["H100"]


def test_preset_launch_blocks_per_sm():
    r = hierarchy("flash2", N=256, d=64, device="H100", M=16384)  # 32 KiB blocks: 228 KiB / 33 KiB = 6 per SM
    assert (r.P, r.blocks_per_sm, r.C, r.L) == (132, 6, 50 * 1024 * 1024 // 2, 64)


@pytest.mark.parametrize(
    ("kw", "parameter"),
    [
        (dict(P=0, C=16), "P (SMs)"),
        (dict(C=-1), "C (L2 words)"),
        (dict(C=16, L=3), "L (line words)"),
        (dict(C=2, L=4), "C (L2 words)"),
        (dict(C=16, scheduler=dict(order="zigzag")), "order"),
        (dict(C=16, policy="fifo"), "policy"),
        (dict(device="Z80"), "device"),
        (dict(device="H100", M=1 << 20), "M"),
        (dict(C=16, H_q=4, H_kv=3), "H_kv (key/value heads)"),
        (dict(device="A100", M=16384, blocks_per_sm=9), "blocks_per_sm"),
        (dict(), "C (L2 words)"),
    ],
)
def test_bad_input_names_the_parameter(kw, parameter):
    """A bad machine, scheduler or launch parameter is one InputError naming it (a machine's own fields where the
    Machine is made, the rest when the launch is checked)."""
    args = dict(N=64, d=16, M=512)
    machine = {k: kw.pop(k) for k in ("device", "P", "C", "L", "blocks_per_sm") if k in kw}
    with pytest.raises(InputError) as e:
        sched = Scheduler(**kw.pop("scheduler")) if "scheduler" in kw else None
        hierarchy("flash2", **{**args, **kw}, device=Machine(**machine), scheduler=sched)
    assert e.value.parameter == parameter


def test_cli_hierarchy(capsys):
    from iosim.cli import main

    assert (
        main(["hierarchy", "flash2", "--N", "256", "--d", "64", "--device", "H100", "--H-q", "4", "--H-kv", "2"]) == 0
    )
    out = capsys.readouterr().out
    assert "H100: P=132 SMs" in out and "DRAM:" in out and "L2 fill" in out
    same = ["--N", "256", "--d", "64", "--device", "H100", "--batch", "1", "--heads", "4", "--kv-heads", "2"]
    assert main(["hierarchy", "flash2", *same]) == 0  # iosim run's spellings, the same launch
    assert capsys.readouterr().out == out
    assert (
        main(["hierarchy", "flash2", "--N", "256", "--d", "64", "--P", "2", "--C", "0", "--M", "4096", "--json"]) == 0
    )
    import json

    d = json.loads(capsys.readouterr().out)
    assert d["dram"] == d["two_level"] and d["ratio"] == 1.0
    assert main(["hierarchy", "flash2", "--N", "64", "--d", "16", "--device", "nope"]) == 2
    assert "device must be one of" in capsys.readouterr().err


@pytest.mark.parametrize(("algorithm", "backward"), CASES)
def test_the_compulsory_estimate_is_what_a_whole_problem_l2_moves(algorithm, backward):
    r = hierarchy(algorithm, backward=backward, B=2, H_q=2, H_kv=1, **SMALL, device=Machine(P=2, C=1 << 30, L=8))
    assert r.compulsory == r.dram


def test_a_problem_gives_the_launch():
    """iosim.hierarchy(problem=Problem(...)) equals the same launch given field by field; a problem that is not an
    iosim.Problem and N beside a problem are one InputError each."""
    import iosim

    p = iosim.Problem(B=2, H_q=4, H_kv=2, N=96, d=16, causal=True, dtype_q="fp16")
    kw = dict(M=2048, device=Machine(P=4, C=4096, L=8), scheduler=Scheduler(order="swizzled"))
    a = iosim.hierarchy("flash2", problem=p, **kw)
    b = iosim.hierarchy("flash2", N=96, d=16, B=2, H_q=4, H_kv=2, causal=True, bytes_per_word=2, **kw)
    assert {**a.as_dict(), "seconds": 0} == {**b.as_dict(), "seconds": 0}
    for bad in ({"N": 64, "d": 16}, "B=1, N=64"):  # not an iosim.Problem
        with pytest.raises(iosim.InputError) as e:
            iosim.hierarchy("flash2", problem=bad, **kw)
        assert e.value.parameter == "problem"
    with pytest.raises(iosim.InputError) as e:
        iosim.hierarchy("flash2", problem=p, N=96, **kw)
    assert e.value.parameter == "N"


def test_explicit_tiles(capsys):
    """--Br/--Bc (flash1, flash2) and --B (the square tile) as iosim run takes them: the launch is cut from that
    schedule, its two-level words equal iosim.run's at the same tiles; a tile the algorithm does not take, or one
    over M, is refused in one line."""
    from iosim.cli import main

    h = hierarchy(iosim.Schedule("flash2", Br=24, Bc=40), N=200, d=16, M=4000, H_q=2, device=Machine(P=2, C=0))
    r = iosim.run(iosim.Schedule("flash2", Br=24, Bc=40), N=200, d=16, M=4000, count_only=True)
    assert h.tiling == "rule=explicit, Br=24, Bc=40" and h.two_level == 2 * r.stats.total
    s = hierarchy(iosim.Schedule("square-tiling", B=12), N=200, d=16, M=4000, device=Machine(P=2, C=0))
    assert (
        s.two_level
        == iosim.run(iosim.Schedule("square-tiling", B=12), N=200, d=16, M=4000, count_only=True).stats.total
    )
    base = ["hierarchy", "flash2", "--N", "200", "--d", "16", "--M", "4000", "--P", "2", "--C", "0"]
    assert main([*base, "--Br", "24", "--Bc", "40"]) == 0 and "Br=24, Bc=40" in capsys.readouterr().out
    for bad, word in ((["--B", "12"], "B applies"), (["--Br", "200", "--Bc", "200"], "working set")):
        assert main([*base, *bad]) == 2
        err = [x for x in capsys.readouterr().err.splitlines() if not x.startswith("iosim: compiling")]
        assert len(err) == 1 and word in err[0]


DECODING = [
    iosim.Problem(B=2, H_q=4, H_kv=2, N_q=1, N_k=300, d=16),
    iosim.Problem(B=2, H_q=4, H_kv=2, N=40, d=8),  # prefill: one head's (N, d) schedule per query head
    iosim.Problem(B=2, H_q=4, N_q=1, N_k=300, d_qk=24, d_v=16, latent=True),  # MLA: one shared latent (H_kv = 1)
    iosim.Problem(B=2, H_q=4, H_kv=2, N_q=3, N_k=300, d=16, page_size=7),  # a paged cache and its page table
    iosim.Problem(B=1, H_q=4, H_kv=1, N_q=5, N_k=70, d_qk=12, d_v=8, causal=True),
]


@pytest.mark.parametrize("gqa", ["per-head", "packed"])
@pytest.mark.parametrize("algorithm", ["flash1", "flash2", "standard", "square-tiling"])
def test_decoding_and_chunked_prefill_launches(algorithm, gqa):
    """A problem with N_q != N_k (and d_qk != d_v): the launch is B H_q copies of one query head's schedule
    (per-head) or B H_kv copies of one KV head's packed schedule. With no L2 DRAM is the two-level count, which is
    iosim.run's count of the whole problem word for word (forward; also under a mask); an L2 that holds everything
    reads each KV head's cache from DRAM once: per-head's g - 1 repeated K, V requests are L2 hits."""
    if gqa == "packed" and algorithm in ("standard", "square-tiling"):
        with pytest.raises(InputError) as e:
            hierarchy(iosim.Schedule(algorithm, gqa=gqa), problem=DECODING[0], M=3000, device=Machine(P=4, C=0))
        assert e.value.parameter == "gqa"
        return
    for p in DECODING:
        if (p.latent or p.page_size) and algorithm in ("standard", "square-tiling"):
            continue  # FlashAttention schedules only (iosim.run refuses them for these two)
        for mask in (None, "window:9") if not p.causal else (None,):
            for mla in ("shared", "naive") if p.latent else ("shared",):
                h = hierarchy(
                    iosim.Schedule(algorithm, gqa=gqa, mla=mla), problem=p, M=3000, mask=mask, device=Machine(P=4, C=0)
                )
                r = iosim.run(
                    iosim.Schedule(algorithm, gqa=gqa, mla=mla), problem=p, M=3000, mask=mask, count_only=True
                )
                assert h.two_level == h.dram == r.stats.total
                assert {n: c.two_level for n, c in h.per_array.items() if c.two_level} == {
                    n: c.reads + c.writes for n, c in r.stats.per_array.items() if c.reads + c.writes
                }
        if algorithm in ("flash1", "flash2") and not (p.latent or p.page_size) and (gqa == "packed" or p.g == 1):
            hb = hierarchy(
                iosim.Schedule(algorithm, gqa=gqa), problem=p, M=3000, backward=True, device=Machine(P=4, C=0)
            )
            rb = iosim.run(iosim.Schedule(algorithm, gqa=gqa), problem=p, M=3000, backward=True, count_only=True)
            assert hb.two_level == hb.dram == rb.passes["backward"].stats.total  # no group sum to leave out
        big = hierarchy(
            iosim.Schedule(algorithm, gqa=gqa),
            problem=p,
            M=3000,
            device=Machine(P=4, C=1 << 22, L=1),
            scheduler=Scheduler(order="swizzled"),
        )
        assert big.per_array["K"].dram == p.B * p.H_kv * p.N_k * p.d_qk
        if not p.latent:  # the shared latent has no V: it is read from the resident K tile
            assert big.per_array["V"].dram == p.B * p.H_kv * p.N_k * p.d_v
        if p.N_q != p.N_k or gqa == "packed":
            assert big.problem == p and big.gqa == gqa and big.as_dict()["problem"]["N_k"] == p.N_k


def test_decoding_cli(capsys):
    from iosim.cli import main

    argv = ["hierarchy", "flash2", "--Nq", "1", "--Nk", "300", "--d", "16", "--heads", "4", "--kv-heads", "2",
            "--P", "4", "--C", "0", "--M", "3000"]  # fmt: skip
    assert main([*argv, "--gqa", "packed"]) == 0
    out = capsys.readouterr().out
    assert "N_q=1, N_k=300" in out and "GQA packed" in out and "1.0000 of the two-level count" in out
    assert main([*argv, "--bytes-per-word", "3"]) == 2
    assert "--bytes-per-word" in capsys.readouterr().err
    with pytest.raises(InputError) as e:
        hierarchy(iosim.Schedule("flash2", gqa="packed"), N=64, d=16, M=3000, device=Machine(P=4, C=0))
    assert e.value.parameter == "gqa"


def test_long_launches_ask_and_huge_traces_are_refused(monkeypatch, capsys):
    """A launch estimated at over a minute (tile requests x iosim.runner.estimate.HIERARCHY_REQUEST) needs allow_long
    (--yes), over an hour is refused naming the size; a unit schedule whose trace would not fit in memory is refused
    naming N before the trace is allocated."""
    from iosim.cli import main
    from iosim.runner import estimate

    kw = dict(N=128, d=16, M=2000, device=Machine(P=2, C=0), H_q=2)
    monkeypatch.setattr(estimate, "HIERARCHY_REQUEST", 1.0)  # every request a second: any launch is long
    with pytest.raises(InputError) as e:
        hierarchy("flash2", **kw)
    assert e.value.parameter == "allow_long" and "tile requests" in str(e.value)
    requests = hierarchy("flash2", **kw, allow_long=True).requests  # a few hundred "seconds": consented, it runs
    assert 60 < requests * 1.0 < 3600
    monkeypatch.setattr(estimate, "HIERARCHY_REQUEST", 1e4)
    with pytest.raises(InputError) as e:
        hierarchy("flash2", **kw, allow_long=True)
    assert e.value.parameter == "N"
    monkeypatch.setattr(estimate, "HIERARCHY_REQUEST", 1.0)
    argv = ["hierarchy", "flash2", "--N", "128", "--d", "16", "--M", "2000", "--P", "2", "--C", "0", "--heads", "2"]
    assert main(argv) == 2 and "--yes" in capsys.readouterr().err
    assert main([*argv, "--yes"]) == 0
    monkeypatch.setattr(estimate, "HIERARCHY_REQUEST", 6e-7)
    monkeypatch.setattr(iosim.memory_model.core, "available_bytes", lambda: 100_000)
    with pytest.raises(InputError) as e:  # a trace past its first buffer (65,536 events) is checked
        hierarchy("flash2", N=2000, d=8, M=400, device=Machine(P=2, C=0))
    assert e.value.parameter == "N" and "GiB" in str(e.value) and "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------------------------------
# An independent model of the launches (issue 32): built from the schedules' definitions with nothing of iosim's
# counting (no trace, no cut, no layout, no L2 code): one launch per kernel, one CTA per row block (flash2's
# forward), per column block (the backward's main kernel) or per head (flash1's forward), MLA's V at the latent's
# first d_v columns (K's addresses), a line LRU (write-back, write-validate) and the clock of the README.


def _model_sees(mask, q, c, N_q, N_k):  # noqa: N803
    """Query row q sees key c: the mask's row q + N_k - N_q (bottom-right), as docs/theory.md defines it."""
    r = q + N_k - N_q
    if mask is None:
        return True
    if mask == "causal":
        return c <= r
    kind, w = mask.split(":")
    assert kind == "window"
    return abs(r - c) < int(w)


def _model_blocks(n, b):
    return [(s, min(b, n - s)) for s in range(0, n, b)]


def _model_unit(alg, backward, p, R, Br, Bc, mask, policy, mla, splits=1, M=100_000, convert=False):  # noqa: N803
    """One unit's kernels, in order: [(kernel name, [CTA requests])]; a request is (write, array, r0, nr, c0, nc).
    R packed rows (row x is query row x mod N_q)."""
    N_q, N_k, dqk, dv = p["N_q"], p["N_k"], p["d_qk"], p["d_v"]
    sees = mask if callable(mask) else (lambda x, c: _model_sees(mask, x % N_q, c, N_q, N_k))  # packed row x, key c

    def nonempty(r0, br, c0, bc):
        return any(sees(r, c) for r in range(r0, r0 + br) for c in range(c0, c0 + bc))

    kv = [("K", dqk)] + ([] if p.get("latent") and mla == "shared" else [("V", dv)])  # shared: V is in K_j
    loads_kv = [lambda c0, bc, name=name, w=w: (0, name, c0, bc, 0, w) for name, w in kv]
    if alg == "flash2" and not backward and splits > 1:  # Flash-Decoding: the split kernel, then the combine
        cols = _model_blocks(N_k, Bc)
        per = -(-len(cols) // splits)  # column blocks per split (the last splits ragged or empty)
        rows = _model_blocks(R, Br)
        part = {}
        for i, (r0, br) in enumerate(rows):
            for k in range(splits):
                mine = cols[k * per : (k + 1) * per]
                reqs = [(0, "Q", r0, br, 0, dqk)] if policy == "paper" and mine else []
                for c0, bc in mine:
                    if not nonempty(r0, br, c0, bc):
                        continue
                    if not reqs:
                        reqs.append((0, "Q", r0, br, 0, dqk))
                    reqs += [f(c0, bc) for f in loads_kv]
                part[i, k] = reqs + [(1, "Opart", k * R + r0, br, 0, dv), (1, "Lpart", r0, br, k, 1)]
        main = [part[i, k] for k in range(splits) for i in range(len(rows))]  # the grid: row block fastest
        Bm = min(R, M // (splits + 2 * dv + 1))  # the combine's rows: the s logsumexps, O_i, one partial, L_i
        combine = [[(0, "Lpart", r0, br, 0, splits)] + [(0, "Opart", k * R + r0, br, 0, dv) for k in range(splits)]
                   + [(1, "O", r0, br, 0, dv), (1, "L", r0, br, 0, 1)] for r0, br in _model_blocks(R, Bm)]  # fmt: skip
        return [("flash2 split-KV forward", main), ("split-KV combine", combine)]
    if alg == "flash2" and not backward:
        ctas_ = []
        for r0, br in _model_blocks(R, Br):
            reqs = [(0, "Q", r0, br, 0, dqk)] if policy == "paper" else []
            for c0, bc in _model_blocks(N_k, Bc):
                if not nonempty(r0, br, c0, bc):
                    continue
                if not reqs:
                    reqs.append((0, "Q", r0, br, 0, dqk))
                reqs += [f(c0, bc) for f in loads_kv]
            ctas_.append(reqs + [(1, "O", r0, br, 0, dv), (1, "L", r0, br, 0, 1)])
        return [("flash2 forward", ctas_)]
    if alg == "flash1" and not backward:
        memset = [[(1, "O", 0, R, 0, dv)], [(1, "l", 0, R, 0, 1)], [(1, "m", 0, R, 0, 1)]]
        one = []  # one CTA per head: the column blocks looped inside
        for c0, bc in _model_blocks(N_k, Bc):
            got = policy == "paper"
            if got:
                one += [f(c0, bc) for f in loads_kv]
            for r0, br in _model_blocks(R, Br):
                if not nonempty(r0, br, c0, bc):
                    continue
                if not got:
                    one += [f(c0, bc) for f in loads_kv]
                    got = True
                one += [(0, a, r0, br, 0, w) for a, w in (("Q", dqk), ("O", dv), ("l", 1), ("m", 1))]
                one += [(1, a, r0, br, 0, w) for a, w in (("O", dv), ("l", 1), ("m", 1))]
        return [("memset O, l, m", memset), ("flash1 forward", [one])]
    assert alg == "flash2" and backward
    memset = [[(1, "dQ", 0, R, 0, dqk)]]
    pre = [
        [(0, "dO", r0, br, 0, dv), (0, "O", r0, br, 0, dv), (1, "D", r0, br, 0, 1)] for r0, br in _model_blocks(R, Br)
    ]
    main = []
    for c0, bc in _model_blocks(N_k, Bc):
        reqs = [f(c0, bc) for f in loads_kv] if policy == "paper" else []
        got = policy == "paper"
        for r0, br in _model_blocks(R, Br):
            if not nonempty(r0, br, c0, bc):
                continue
            if not got:
                reqs += [f(c0, bc) for f in loads_kv]
                got = True
            reqs += [(0, a, r0, br, 0, w) for a, w in (("Q", dqk), ("dO", dv), ("dQ", dqk), ("L", 1), ("D", 1))]
            reqs.append((1, "dQ", r0, br, 0, dqk))
        main.append(reqs + [(1, "dK", c0, bc, 0, dqk), (1, "dV", c0, bc, 0, dv)])
    out = [("memset dQ", memset), ("preprocess D", pre), ("flash2 backward", main)]
    if convert:  # flash_bwd_convert_dq_kernel: a row block's dq_accum (dQ's lines) read, dQ written at its dtype
        out.append(("convert dQ", [[(0, "dq_accum", r0, br, 0, dqk), (1, "dQ_out", r0, br, 0, dqk)]
                                   for r0, br in _model_blocks(R, Br)]))  # fmt: skip
    return out


def _model_dram(alg, backward, p, Br, Bc, mask, policy, mla, gqa, P, C, L, splits=1, M=100_000, convert=False):  # noqa: N803
    """(per-array L2 fills, per-array write-backs, kernel names) of the whole launch, head-grouped order. ``mask``
    a string (the same at every head) or a function (b, h, row, key) of the mask's rows over N_k x N_k, each
    head under its own (the queries its last N_q rows)."""
    g = p["H_q"] // p["H_kv"]
    units = p["H_kv"] if gqa == "packed" else p["H_q"]
    R = p["N_q"] * (g if gqa == "packed" else 1)
    width = {"Q": p["d_qk"], "O": p["d_v"], "K": p["d_qk"], "V": p["d_v"], "dO": p["d_v"], "dQ": p["d_qk"],
             "dK": p["d_qk"], "dV": p["d_v"], "Opart": p["d_v"], "Lpart": splits, "dQ_out": p["d_qk"]}  # fmt: skip
    latent = p.get("latent", False)
    per_unit = {}
    for b in range(p["B"]):
        for u in range(units):
            sees = mask
            if callable(mask):  # packed row x of unit u: head u g + x // N_q (packed) or u, query row x mod N_q

                def sees(x, c, b=b, u=u):
                    h = u * g + x // p["N_q"] if gqa == "packed" else u
                    return bool(mask(b, h, x % p["N_q"] + p["N_k"] - p["N_q"], c))

            per_unit[b, u] = _model_unit(alg, backward, p, R, Br, Bc, sees, policy, mla, splits, M, convert)
    kernels = per_unit[0, 0]
    launches_ = []  # per kernel: CTAs as (requests, unit copy, KV copy), for b, for unit, for piece
    for k in range(len(kernels)):
        launches_.append([(c, b * units + u, b * p["H_kv"] + (u if gqa == "packed" else u // g))
                          for b in range(p["B"]) for u in range(units) for c in per_unit[b, u][k][1] if c])  # fmt: skip
    cap = C // L
    lines: OrderedDict = OrderedDict()
    fill, wb = {}, {}

    def touch(key, write, array, owner):
        if key in lines:
            lines.move_to_end(key)
            if write:
                lines[key] = (True, owner)
            return
        if not write:
            fill[array] = fill.get(array, 0) + L
        lines[key] = (bool(write), owner)
        if len(lines) > cap:
            _, (dirty, o) = lines.popitem(last=False)
            if dirty:
                wb[o] = wb.get(o, 0) + L

    def issue(req, ucopy, kvcopy):
        w, a, r0, nr, c0, nc = req
        owner = "K" if (a == "V" and latent) else a  # MLA: V is the latent's first d_v columns, K's addresses
        owner = "dQ" if a == "dq_accum" else owner  # dQ's conversion reads the accumulator: dQ's own words
        stride = width.get(owner, 1)
        copy = kvcopy if a in ("K", "V") else ucopy
        for r in range(r0, r0 + nr):
            w0 = r * stride + c0
            for line in range(w0 // L, (w0 + nc - 1) // L + 1):
                touch((owner, copy, line), w, a, owner)
        return nr * nc

    import heapq

    t_start, bid = 0, 0
    for ctas_ in launches_:
        heap, nxt, t_end = [], 0, t_start
        while nxt < min(P, len(ctas_)):
            heapq.heappush(heap, (t_start, bid + nxt, nxt, 0))
            nxt += 1
        while heap:
            t, i, c, k = heapq.heappop(heap)
            reqs, ucopy, kvcopy = ctas_[c]
            t += issue(reqs[k], ucopy, kvcopy)
            if k + 1 < len(reqs):
                heapq.heappush(heap, (t, i, c, k + 1))
                continue
            t_end = max(t_end, t)
            if nxt < len(ctas_):
                heapq.heappush(heap, (t, bid + nxt, nxt, 0))
                nxt += 1
        bid += len(ctas_)
        t_start = t_end
    for dirty, owner in lines.values():
        if dirty:
            wb[owner] = wb.get(owner, 0) + L
    return fill, wb, [name for name, ctas_ in kernels if any(ctas_)]


def _p(B, H_q, H_kv, N_q, N_k, d_qk, d_v, latent=False):  # noqa: N803
    return dict(B=B, H_q=H_q, H_kv=H_kv, N_q=N_q, N_k=N_k, d_qk=d_qk, d_v=d_v, **({"latent": True} if latent else {}))


# fmt: off
MODEL_CASES = [  # (algorithm, backward, problem, Br, Bc, mask, policy, mla, gqa, P, C, L)
    ("flash2", False, _p(2, 4, 2, 24, 24, 8, 16), 5, 7, None, "skip", "shared", "per-head", 3, 96, 4),
    ("flash2", False, _p(1, 2, 1, 9, 30, 8, 8), 4, 6, "causal", "skip", "shared", "packed", 2, 200, 8),
    ("flash2", False, _p(1, 2, 2, 20, 20, 8, 8), 4, 3, "window:4", "paper", "shared", "per-head", 3, 64, 4),
    ("flash1", False, _p(2, 2, 2, 24, 24, 8, 8), 5, 7, None, "skip", "shared", "per-head", 3, 96, 4),
    ("flash1", False, _p(1, 4, 2, 20, 20, 8, 8), 4, 6, "causal", "paper", "shared", "per-head", 2, 160, 8),
    ("flash1", False, _p(1, 2, 2, 20, 20, 8, 8), 4, 3, "window:4", "skip", "shared", "per-head", 4, 64, 4),
    # issue 32's example: 2,344 DRAM words
    ("flash2", True, _p(1, 2, 2, 6, 20, 8, 16), 3, 4, "window:5", "skip", "shared", "per-head", 1, 1072, 8),
    ("flash2", True, _p(2, 2, 2, 20, 20, 8, 8), 4, 6, None, "skip", "shared", "per-head", 3, 96, 4),
    ("flash2", True, _p(1, 2, 1, 16, 16, 8, 8), 4, 5, "causal", "paper", "shared", "packed", 2, 128, 4),
    ("flash2", False, _p(2, 4, 1, 1, 60, 24, 16, latent=True), 4, 8, None, "skip", "naive", "packed", 3, 256, 8),
    ("flash2", False, _p(2, 4, 1, 1, 60, 24, 16, latent=True), 4, 8, None, "skip", "shared", "packed", 3, 256, 8),
    ("flash1", False, _p(1, 2, 1, 3, 40, 12, 8, latent=True), 2, 8, "causal", "skip", "naive", "per-head", 2, 96, 4),
]
# fmt: on


@pytest.mark.parametrize("case", MODEL_CASES, ids=lambda c: f"{c[0]}-{'bwd' if c[1] else 'fwd'}-{c[5]}-{c[7]}")
def test_an_independent_model_of_the_launches_agrees_word_for_word(case):
    """Issue 32's definition of done: an independent model (one launch per kernel, V aliased to K's lines, one
    flash1 CTA per head; tests/test_hierarchy.py's own line LRU and clock, nothing of iosim's counting) equals
    the hierarchy's DRAM per array, word for word, on masked and unmasked launches."""
    alg, backward, pd, Br, Bc, mask, policy, mla, gqa, P, C, L = case
    problem = iosim.Problem(**pd, causal=mask == "causal")
    h = hierarchy(
        iosim.Schedule(alg, Br=Br, Bc=Bc, kv_policy=policy, gqa=gqa, mla=mla),
        problem=problem,
        M=100_000,
        backward=backward,
        mask=None if mask in (None, "causal") else mask,
        device=Machine(P=P, C=C, L=L, blocks_per_sm=1),
    )
    fill, wb, names = _model_dram(alg, backward, pd, Br, Bc, mask, policy, mla, gqa, P, C, L)
    assert [k["kernel"] for k in h.launches] == names
    got_fill = {n: c.l2_fill for n, c in h.per_array.items() if c.l2_fill}
    got_wb = {n: c.l2_writeback for n, c in h.per_array.items() if c.l2_writeback}
    assert (got_fill, got_wb) == (fill, wb)
    if case == MODEL_CASES[6]:
        assert h.dram == 2344  # the issue's figure for one launch per kernel (the inferred launches gave 2,440)


DOCS = np.array([[0] * 20 + [1] * 9, [0] * 7 + [1] * 15 + [2] * 7])  # N_k = 29 tokens, documents per batch item


def _doc_window(b, h, row, key):  # documents per batch item, a causal window that grows with the head
    return (DOCS[b][row] == DOCS[b][key]) & (row >= key) & (key > row - 3 - 4 * h)


# fmt: off
HEAD_MASK_CASES = [  # (algorithm, backward, gqa, policy, splits, P, C, L)
    ("flash2", False, "per-head", "skip", 1, 3, 96, 4),
    ("flash2", False, "packed", "skip", 1, 2, 200, 8),
    ("flash2", False, "packed", "paper", 2, 3, 128, 4),
    ("flash1", False, "per-head", "paper", 1, 2, 160, 8),
    ("flash2", True, "packed", "skip", 1, 2, 128, 4),
]
# fmt: on


@pytest.mark.parametrize("case", HEAD_MASK_CASES, ids=lambda c: f"{c[0]}-{'bwd' if c[1] else 'fwd'}-{c[2]}-{c[4]}")
def test_a_mask_that_differs_per_head_launches_each_units_own(case):
    """A mask_mod that differs per (b, h) (documents per batch item, a window per head; the g = 2 heads of a group
    differ): each head unit's CTAs are cut from its own mask's trace (packed: the group's rows under their own
    mask). The independent model (each unit's CTAs from the function itself) equals the hierarchy's DRAM per array,
    word for word; with no L2 every array's two-level words are iosim.run's over the whole problem."""
    from iosim.masking import masks

    alg, backward, gqa, policy, splits, P, C, L = case
    pd = _p(2, 4, 2, 17, 29, 8, 16)
    problem = iosim.Problem(**pd)
    mod = masks.from_mask_mod(_doc_window)
    sched = dict(Br=4, Bc=5, kv_policy=policy, gqa=gqa, splits=splits)
    kw = dict(problem=problem, M=100_000, backward=backward, mask=mod)
    h = hierarchy(iosim.Schedule(alg, **sched), **kw, device=Machine(P=P, C=C, L=L, blocks_per_sm=1))
    fill, wb, names = _model_dram(alg, backward, pd, 4, 5, _doc_window, policy, "shared", gqa, P, C, L, splits)
    assert [k["kernel"] for k in h.launches] == names
    assert ({n: c.l2_fill for n, c in h.per_array.items() if c.l2_fill},
            {n: c.l2_writeback for n, c in h.per_array.items() if c.l2_writeback}) == (fill, wb)  # fmt: skip
    r = run_keywords(alg, count_only=True, **kw, **sched)
    flat = (
        h if C == 0 else hierarchy(iosim.Schedule(alg, **sched), **kw, device=Machine(P=P, C=0, L=L, blocks_per_sm=1))
    )
    ps = r.passes["backward" if backward else "forward"]
    assert {n: (c.two_level_reads, c.two_level_writes) for n, c in flat.per_array.items() if c.two_level} == {
        n: (a.reads, a.writes) for n, a in ps.stats.per_array.items() if a.reads or a.writes}  # fmt: skip
    assert flat.dram == flat.two_level == ps.stats.total


def test_a_group_of_per_head_units_that_differ_is_refused():
    """The backward under per-head GQA runs a group's g query heads as one unit (their dK, dV partials meet in the
    group sum): one line when the mask differs within a group; a mask the same within each group runs."""
    from iosim.masking import masks

    problem = iosim.Problem(**_p(2, 4, 2, 17, 29, 8, 16))
    kw = dict(problem=problem, M=100_000, backward=True, device=Machine(C=0))
    flash2 = iosim.Schedule("flash2", Br=4, Bc=5)
    with pytest.raises(InputError, match="^gqa must be packed for this launch: the mask differs between the g = 2"):
        hierarchy(flash2, mask=masks.from_mask_mod(_doc_window), **kw)
    h = hierarchy(flash2, mask=masks.from_mask_mod(lambda b, h, q, kv: _doc_window(b, h // 2, q, kv)), **kw)
    r = iosim.run(
        iosim.Schedule("flash2", Br=4, Bc=5),
        problem=problem,
        M=100_000,
        backward=True,
        count_only=True,
        mask=masks.from_mask_mod(lambda b, h, q, kv: _doc_window(b, h // 2, q, kv)),
    )
    assert h.two_level == r.passes["backward"].stats.total


def test_a_launch_whose_ctas_race_is_refused():
    """flash1's forward read-modify-writes O_i, l_i, m_i at every column block: one CTA per column block would race
    (not an atomic sum), so it is declared one CTA per head, and a declaration of one CTA per column block is
    refused; flash2's backward adds dQ_i atomically (declared), its dK_j, dV_j are the column block's own."""
    r = traced("flash1", False)
    c = ctas.cut(r.trace)
    legal = launches.assign(c, r.trace, launches.kernels("flash1", False))
    launches.check_races(c, r.trace, legal)  # one CTA per head: nothing to race with
    racing = [launches.Kernel("memset", "m", ("init",)), launches.Kernel("flash1 per column block", "x", ("rest",))]
    with pytest.raises(InputError) as e:
        launches.check_races(c, r.trace, launches.assign(c, r.trace, racing))
    assert e.value.parameter == "schedule" and "race" in str(e.value) and "\n" not in str(e.value)
    r = traced("flash2", True)
    c = ctas.cut(r.trace)
    launches.check_races(c, r.trace, launches.assign(c, r.trace, launches.kernels("flash2", True)))
    not_atomic = [k if k.name != "flash2 backward" else launches.Kernel(k.name, k.models, k.select)
                  for k in launches.kernels("flash2", True)]  # fmt: skip
    with pytest.raises(InputError, match="dQ"):
        launches.check_races(c, r.trace, launches.assign(c, r.trace, not_atomic))


def test_flash1_forward_is_one_cta_per_head():
    """Issue 32's example: one CTA per head moves 4,407,296 DRAM words (the CTA per column block gave 1,597,440)."""
    h = hierarchy(
        iosim.Schedule("flash1", Br=64, Bc=64),
        N=512,
        d=64,
        H_q=8,
        M=100_000,
        causal=True,
        device=Machine(C=65536, L=64, P=4),
    )
    assert [(k["kernel"], k["ctas"]) for k in h.launches] == [("memset O, l, m", 24), ("flash1 forward", 8)]
    assert h.dram == 4_407_296


def test_mla_naive_reads_the_latent_twice_from_the_same_lines():
    """V is the latent's first d_v columns: with an L2 that holds everything naive's second read hits the lines
    its K tile brought, so naive DRAM = shared DRAM (issue 32: 1,214,592 words at B = 2, H_q = 16, N_k = 1024,
    d 576/512, packed, P = 8, L = 64); with no L2 naive moves V's words again (the two-level count)."""
    p = iosim.Problem(B=2, H_q=16, N_q=1, N_k=1024, d_qk=576, d_v=512, latent=True)
    kw = dict(problem=p, M=50_000)
    big = Machine(P=8, C=1 << 30, L=64)
    naive, shared = (
        hierarchy(iosim.Schedule("flash2", mla=m, gqa="packed"), **kw, device=big) for m in ("naive", "shared")
    )
    assert naive.dram == shared.dram == 1_214_592 and naive.per_array["V"].dram == 0
    assert naive.two_level > shared.two_level
    naive0 = hierarchy(iosim.Schedule("flash2", mla="naive", gqa="packed"), **kw, device=Machine(P=8, C=0, L=64))
    assert naive0.per_array["V"].dram == naive0.per_array["V"].two_level == 2 * 1024 * 512


def test_the_page_table_is_one_per_batch_item():
    """A batch item's KV heads share its pages (vLLM): an L2 holding everything reads each batch item's page table
    once, B x pages words, not once per KV head."""
    p = iosim.Problem(B=3, H_q=4, H_kv=2, N_q=2, N_k=50, d=8, page_size=7)
    h = hierarchy("flash2", problem=p, M=3000, device=Machine(P=2, C=1 << 24, L=1))
    assert h.per_array["page_table"].dram == p.B * p.pages
    assert h.per_array["K"].dram == p.B * p.H_kv * p.N_k * p.d_qk


def test_hierarchy_json_lists_the_launches(capsys):
    import json

    from iosim.cli import main

    argv = ["hierarchy", "flash2", "--heads", "2", "--Nq", "6", "--Nk", "20", "--d", "8", "--dv", "16", "--M",
            "100000", "--Br", "3", "--Bc", "4", "--backward", "--mask", "window:5", "--C", "1072", "--L", "8", "--P",
            "1", "--blocks-per-sm", "1", "--json"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(k["kernel"], k["grid"], k["ctas"]) for k in out["launches"]] == [
        ("memset dQ", "piece", 2), ("preprocess D", "piece", 4), ("flash2 backward", "piece", 10),
        ("convert dQ", "piece", 4)]  # fmt: skip
    assert out["launches"][2]["atomic"] == ["dQ"] and "flash_bwd" in out["launches"][2]["models"]
    # the issue's 2,344 words are the schedule's launches; bf16's dQ conversion (96 words read, 96 written) adds 144
    assert (out["schedule_dram"], out["convert_dq_dram"], out["dram"]) == (2344, 144, 2488)


# fmt: off
SPLIT_CASES = [  # (problem, Br, Bc, mask, policy, gqa, splits, M, P, C, L): Tc = ceil(N_k / Bc) column blocks
    (_p(2, 4, 2, 1, 60, 8, 8), 1, 8, None, "skip", "per-head", 3, 100_000, 3, 96, 4),  # Tc 8: splits of 3, 3, 2
    (_p(1, 2, 1, 7, 40, 8, 16), 3, 4, "causal", "skip", "packed", 4, 100_000, 2, 200, 8),  # splits past the diagonal
    (_p(1, 2, 2, 9, 30, 8, 8), 4, 6, "window:5", "paper", "per-head", 4, 100_000, 3, 64, 4),  # Tc 5: 2, 2, 1, empty
    (_p(2, 2, 1, 5, 24, 8, 8), 2, 5, None, "paper", "per-head", 7, 100_000, 2, 128, 8),  # Tc 5, 7 splits: 2 empty
    (_p(1, 3, 1, 4, 33, 8, 8), 2, 4, "causal", "paper", "packed", 3, 200, 4, 160, 4),  # combine: 9 rows a CTA
]
# fmt: on


@pytest.mark.parametrize("case", SPLIT_CASES, ids=lambda c: f"{c[3]}-{c[4]}-{c[5]}-s{c[6]}")
def test_the_independent_model_agrees_on_split_kv_word_for_word(case):
    """Split-KV in the hierarchy: the split kernel (one CTA per (row block, split), the row block fastest, each
    writing its Opart, Lpart; ragged and empty splits write their partials too) and the combine kernel, against the
    independent model's own schedule, line LRU and clock, per array, word for word; with no L2 (C = 0) the DRAM is
    iosim run's two-level count of the same split schedule, per array; the split CTAs write disjoint partials (the
    race check passes)."""
    pd, Br, Bc, mask, policy, gqa, splits, M, P, C, L = case
    problem = iosim.Problem(**pd, causal=mask == "causal")
    flash2 = iosim.Schedule("flash2", Br=Br, Bc=Bc, kv_policy=policy, gqa=gqa, splits=splits)
    kw = dict(problem=problem, M=M, mask=None if mask in (None, "causal") else mask)
    h = hierarchy(flash2, **kw, device=Machine(P=P, C=C, L=L, blocks_per_sm=1))
    fill, wb, names = _model_dram("flash2", False, pd, Br, Bc, mask, policy, "shared", gqa, P, C, L, splits, M)
    assert [k["kernel"] for k in h.launches] == names == ["flash2 split-KV forward", "split-KV combine"]
    assert h.launches[0]["splits"] == splits and h.splits == splits
    got_fill = {n: c.l2_fill for n, c in h.per_array.items() if c.l2_fill}
    got_wb = {n: c.l2_writeback for n, c in h.per_array.items() if c.l2_writeback}
    assert (got_fill, got_wb) == (fill, wb)
    h0 = hierarchy(flash2, **kw, device=Machine(P=P, C=0, L=L, blocks_per_sm=1))
    run = iosim.run(iosim.Problem(**pd, causal=mask == "causal"), iosim.Schedule("flash2", Br=Br, Bc=Bc, gqa=gqa,
                    splits=splits, kv_policy=policy), M, mask=kw["mask"], count_only=True)  # fmt: skip
    want = {n: (c.reads, c.writes) for n, c in run.stats.per_array.items() if c.reads or c.writes}
    assert {n: (c.dram_read, c.dram_update) for n, c in h0.per_array.items() if c.dram} == want
    assert {n: (c.two_level_reads, c.two_level_writes) for n, c in h0.per_array.items() if c.two_level} == want
    fill0, wb0, _ = _model_dram("flash2", False, pd, Br, Bc, mask, policy, "shared", gqa, P, 0, 1, splits, M)
    assert {n: (fill0.get(n, 0), wb0.get(n, 0)) for n in want} == want


def test_split_kv_from_the_objects_and_the_command_line(capsys):
    """hierarchy(problem, Schedule(..., splits=S), device) and iosim hierarchy --splits S launch the split kernel
    and the combine; --json lists both launches; splits without a problem are refused in one line."""
    import json

    from iosim.cli import main

    p = iosim.Problem(B=2, H_q=4, H_kv=1, N_q=1, N_k=300, d=16, dtype_q="bf16")
    h = hierarchy(p, iosim.Schedule("flash2", splits=4, Bc=32), 20_000, device=Machine(P=4, C=4096, L=8))
    assert [(k["kernel"], k["ctas"]) for k in h.launches] == [("flash2 split-KV forward", 32), ("split-KV combine", 8)]
    argv = ["hierarchy", "flash2", "--batch", "2", "--heads", "4", "--kv-heads", "1", "--Nq", "1", "--Nk", "300",
            "--d", "16", "--M", "20000", "--Bc", "32", "--splits", "4", "--P", "4", "--C", "4096", "--L", "8",
            "--json"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(k["kernel"], k["ctas"], k["splits"]) for k in out["launches"]] == [
        ("flash2 split-KV forward", 32, 4), ("split-KV combine", 8, 1)]  # fmt: skip
    assert out["dram"] == h.dram and out["splits"] == 4
    with pytest.raises(InputError) as e:
        hierarchy(iosim.Schedule("flash2", splits=2), N=64, d=16, M=4000, device=Machine(C=0))
    assert e.value.parameter == "splits"
    with pytest.raises(InputError) as e:
        hierarchy(iosim.Schedule("flash1", splits=2), problem=p, M=20_000, device=Machine(C=0))
    assert e.value.parameter == "splits"


@pytest.mark.parametrize("case", [MODEL_CASES[6], MODEL_CASES[7], MODEL_CASES[8]], ids=["window", "dense", "packed"])
def test_the_independent_model_agrees_with_the_dq_conversion(case):
    """flash2's backward in bf16: the schedule's launches, then dQ's conversion (one CTA per row block reading
    dq_accum at dQ's own lines and writing dQ_out), against the independent model, per array, word for word."""
    alg, backward, pd, Br, Bc, mask, policy, mla, gqa, P, C, L = case
    problem = iosim.Problem(**pd, causal=mask == "causal", dtype_q="bf16")
    h = hierarchy(
        iosim.Schedule(alg, Br=Br, Bc=Bc, kv_policy=policy, gqa=gqa),
        problem=problem,
        M=100_000,
        backward=True,
        mask=None if mask in (None, "causal") else mask,
        device=Machine(P=P, C=C, L=L, blocks_per_sm=1),
    )
    fill, wb, names = _model_dram(alg, True, pd, Br, Bc, mask, policy, mla, gqa, P, C, L, convert=True)
    assert [k["kernel"] for k in h.launches] == names and names[-1] == "convert dQ"
    got_fill = {n: c.l2_fill for n, c in h.per_array.items() if c.l2_fill}
    got_wb = {n: c.l2_writeback for n, c in h.per_array.items() if c.l2_writeback}
    assert (got_fill, got_wb) == (fill, wb)


@pytest.mark.parametrize(("gqa", "H_kv"), [("per-head", 4), ("packed", 2)])  # per-head g = 1: no group sum
def test_dq_conversion_is_its_own_launch_at_its_dtypes(gqa, H_kv):  # noqa: N803
    """FlashAttention-2's backward accumulates dQ in fp32 and converts it in a launch of its own: it reads and writes
    exactly B H_q N_q d_qk words each way, priced at fp32 read and dtype_o written; the schedule's launches stay
    iosim run's count (C = 0, per array), and the total is the schedule's launches + the conversion. With an L2
    that holds everything, the conversion reads dq_accum from the lines the backward left (dQ's own)."""
    p = iosim.Problem(B=2, H_q=4, H_kv=H_kv, N_q=7, N_k=12, d_qk=8, d_v=16, dtype_q="bf16", dtype_o="fp8")
    words = p.B * p.H_q * p.N_q * p.d_qk
    kw = dict(problem=p, M=100_000, backward=True)
    flash2 = iosim.Schedule("flash2", Br=3, Bc=5, gqa=gqa)
    h0 = hierarchy(flash2, **kw, device=Machine(P=3, C=0, L=4))
    conv = h0.launches[-1]
    assert conv["kernel"] == "convert dQ" and "flash_bwd_convert_dq_kernel" in conv["models"]
    assert conv["reads"] == {"dq_accum": words} and conv["writes"] == {"dQ_out": words}
    assert (conv["read_bytes"], conv["write_bytes"]) == (4 * words, 1 * words)
    assert (conv["read_dtype"], conv["write_dtype"]) == ("fp32", "fp8")
    run = iosim.run(iosim.Schedule("flash2", Br=3, Bc=5, gqa=gqa), problem=p, M=100_000, backward=True, count_only=True)
    want = {n: (c.reads, c.writes) for n, c in run.passes["backward"].stats.per_array.items() if c.reads or c.writes}
    sched = {n: (c.dram_read, c.dram_update) for n, c in h0.per_array.items() if c.launch == "schedule" and c.dram}
    assert sched == want and h0.schedule_dram == h0.two_level == run.passes["backward"].stats.total
    assert h0.per_array["dq_accum"].dram == h0.per_array["dQ_out"].dram == words
    assert h0.convert_dq_dram == 2 * words and h0.dram == h0.schedule_dram + h0.convert_dq_dram
    big = hierarchy(flash2, **kw, device=Machine(P=3, C=1 << 24, L=4))
    assert big.per_array["dq_accum"].dram == 0 and big.per_array["dQ_out"].dram == words
    assert big.as_dict()["convert_dq_dram"] == words


def test_no_dq_conversion_where_dq_is_already_its_accumulators_dtype():
    """The conversion runs where dQ's output dtype differs from its fp32 accumulator's: not at fp32 (or fp64, where
    the accumulator is fp64), not for flash1's backward or a forward, not for N and d (no dtypes)."""
    kw = dict(M=100_000, device=Machine(P=2, C=0))
    for p in (iosim.Problem(H_q=2, N_q=7, N_k=12, d=8, dtype_q="fp32"), iosim.Problem(H_q=2, N_q=7, N_k=12, d=8)):
        h = hierarchy(iosim.Schedule("flash2", Br=3, Bc=5), problem=p, backward=True, **kw)
        assert "convert dQ" not in [k["kernel"] for k in h.launches] and h.convert_dq_dram == 0
    bf16 = iosim.Problem(H_q=2, N_q=7, N_k=12, d=8, dtype_q="bf16")
    for alg, bwd in (("flash1", True), ("flash2", False)):
        launch = hierarchy(iosim.Schedule(alg, Br=3, Bc=5), problem=bf16, backward=bwd, **kw)
        assert "convert dQ" not in [k["kernel"] for k in launch.launches]
    assert hierarchy(iosim.Schedule("flash2", Br=3, Bc=5), N=12, d=8, backward=True, **kw).convert_dq_dram == 0


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ("flash2 --N 64 --d 8 --splits 0", "--splits must be an integer from 1"),
        ("flash2 --Nq 1 --Nk 20 --d 8 --splits 21", "splits must be an integer from 1 to 20"),
        ("flash1 --N 64 --d 8 --splits 2", "splits applies to flash2"),
        ("flash2 --N 64 --d 8 --splits 2 --backward", "splits is an inference option with no backward"),
    ],
)
def test_bad_splits_on_the_command_line_are_one_line_exit_2(args, says, capsys):
    from iosim.cli import main

    try:
        rc = main(["hierarchy", *args.split(), "--M", "4000", "--C", "0"])
    except SystemExit as e:  # argparse's own refusal
        rc = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and says in err[-1] and "Traceback" not in "\n".join(err)

"""Whole problems (iosim.Problem): batch and heads, GQA per-head / packed, N_q != N_k (bottom-right causal),
split-KV, paged KV, MLA shared / naive. Simulated == closed form per array and in peak on ragged grids; numerics
against the float64 reference head by head; one-line errors for bad input."""

import itertools
import json

import numpy as np
import pytest
from iosim.algorithms import flash
from iosim.memory_model import TwoLevelMemory

import iosim
from iosim import InputError, Problem
from iosim.runner.api import run_keywords
from iosim.theory import io_model

HEADS = [(1, 1, 1), (2, 4, 2), (1, 6, 1), (1, 3, 3)]  # (B, H_q, H_kv)
LENGTHS = [(1, 37), (3, 50), (17, 17), (13, 40), (40, 13)]  # (N_q, N_k): decoding, chunked prefill, N_q > N_k
TILES = [(3, 4), (7, 9), (16, 5)]


def _M(p, Br, Bc, splits=1):
    return io_model.problem_working_set(p.d_qk, p.d_v, Br, Bc) + splits + 2 * p.d_v + 1 + 64


def _count(algo, p, Br, Bc, gqa, splits, mla, fast):
    """Count-only run on the fast (counters-only) or the checked (tile-table) memory; its prediction."""
    M = _M(p, Br, Bc, splits)
    mem = TwoLevelMemory(M, fast=fast)
    G = p.g if gqa == "per-head" else 1
    rows = p.N_q * (p.g // G)
    br, bc = min(Br, rows), Bc
    bm = iosim.runner.problem_runs.combine_rows(p, splits, M)
    if algo == "flash2":
        flash.flash2_problem(mem, p, None, None, None, None, Br=br, Bc=bc, gqa=gqa, splits=splits, mla=mla,
                                combine_rows=bm, scale=1.0)  # fmt: skip
        pred = io_model.flash2_problem(p, br, bc, gqa, splits, mla, bm)
    else:
        flash.flash1_problem(mem, p, None, None, None, None, Br=br, Bc=bc, gqa=gqa, mla=mla, scale=1.0)
        pred = io_model.flash1_problem(p, br, bc, gqa, mla)
    return mem.stats(), pred, M


def _cases():
    for (B, Hq, Hkv), (Nq, Nk), (Br, Bc), causal in itertools.product(HEADS, LENGTHS, TILES, (False, True)):
        yield Problem(B=B, H_q=Hq, H_kv=Hkv, N_q=Nq, N_k=Nk, d_qk=6, d_v=5, causal=causal), Br, Bc


CASES = list(_cases())


@pytest.mark.parametrize("algo", ["flash1", "flash2"])
@pytest.mark.parametrize("gqa", ["per-head", "packed"])
def test_counts_equal_closed_form_grid(algo, gqa):
    """4 head shapes x 5 length pairs x 3 tilings x causal or not (120 problems) per algorithm and policy."""
    for p, Br, Bc in CASES:
        stats, pred, M = _count(algo, p, Br, Bc, gqa, 1, "shared", fast=True)
        assert stats.per_array == pred.per_array, (p, Br, Bc)
        assert stats.peak == pred.peak <= M, (p, Br, Bc)


@pytest.mark.parametrize("splits", [2, 3, 7, 50])
@pytest.mark.parametrize("gqa", ["per-head", "packed"])
def test_split_kv_counts_grid(splits, gqa):
    for p, Br, Bc in CASES[::3]:
        if splits > p.N_k:
            continue
        stats, pred, M = _count("flash2", p, Br, Bc, gqa, splits, "shared", fast=True)
        assert stats.per_array == pred.per_array, (p, Br, Bc, splits)
        assert stats.peak == pred.peak <= M, (p, Br, Bc, splits)


@pytest.mark.parametrize("algo", ["flash1", "flash2"])
@pytest.mark.parametrize("page", [1, 2, 5, 9, 16])
def test_paged_counts_grid(algo, page):
    for p, Br, Bc in CASES[::4]:
        if page > p.N_k:
            continue
        q = Problem(**{**_fields(p), "page_size": page})
        for splits in (1, 3) if algo == "flash2" else (1,):
            stats, pred, M = _count(algo, q, Br, Bc, "packed", splits, "shared", fast=True)
            assert stats.per_array == pred.per_array, (q, Br, Bc)
            assert stats.peak == pred.peak <= M, (q, Br, Bc)


@pytest.mark.parametrize("algo", ["flash1", "flash2"])
@pytest.mark.parametrize("mla", ["shared", "naive"])
def test_mla_counts_grid(algo, mla):
    for (Nq, Nk), (Br, Bc), causal in itertools.product(LENGTHS, TILES, (False, True)):
        p = Problem(B=2, H_q=4, H_kv=1, N_q=Nq, N_k=Nk, d_qk=9, d_v=7, latent=True, causal=causal)
        stats, pred, M = _count(algo, p, Br, Bc, "packed", 1, mla, fast=True)
        assert stats.per_array == pred.per_array
        assert stats.peak == pred.peak <= M
        assert ("V" in stats.per_array) == (mla == "naive")


@pytest.mark.parametrize("algo", ["flash1", "flash2"])
def test_checked_memory_agrees(algo):
    """The tile-table memory (every region and handle checked) counts what the counters-only memory counts."""
    for p, Br, Bc in CASES[::7]:
        q = Problem(**{**_fields(p), "page_size": 4 if p.N_k >= 4 else None})
        a = _count(algo, q, Br, Bc, "packed", 2 if algo == "flash2" else 1, "shared", fast=True)[0]
        b = _count(algo, q, Br, Bc, "packed", 2 if algo == "flash2" else 1, "shared", fast=False)[0]
        assert a.per_array == b.per_array and a.peak == b.peak


def _fields(p):
    return {k: getattr(p, k) for k in ("B", "H_q", "H_kv", "N_q", "N_k", "d_qk", "d_v", "causal", "latent")}


@pytest.mark.parametrize("algo", ["flash1", "flash2"])
@pytest.mark.parametrize(
    "p, gqa, splits",
    [
        (Problem(B=2, H_q=4, H_kv=2, N_q=1, N_k=37, d_qk=16, d_v=16), "packed", 1),
        (Problem(B=1, H_q=6, H_kv=2, N_q=5, N_k=29, d_qk=8, causal=True), "packed", 3),
        (Problem(B=1, H_q=6, H_kv=2, N_q=5, N_k=29, d_qk=8, causal=True), "per-head", 1),
        (Problem(B=1, H_q=2, N_q=23, N_k=11, d_qk=7, d_v=5, causal=True), "per-head", 2),
        (Problem(B=2, H_q=4, H_kv=1, N_q=2, N_k=41, d_qk=12, d_v=8, latent=True, causal=True), "packed", 4),
        (Problem(B=2, H_q=4, H_kv=2, N_q=3, N_k=41, d_qk=8, page_size=6, causal=True), "packed", 2),
        (Problem(B=1, H_q=2, H_kv=1, N_q=4, N_k=19, d_qk=8, page_size=1), "per-head", 1),
    ],
)
def test_numerics_match_reference(algo, p, gqa, splits):
    if algo == "flash1" and splits > 1:
        splits = 1
    for mla in ("shared", "naive") if p.latent else ("shared",):
        r = iosim.run(iosim.Schedule(algo, gqa=gqa, splits=splits, mla=mla, Br=3, Bc=4), problem=p, M=2000, seed=7)
        assert r.main.exact, (r.stats.per_array, r.predicted.per_array, r.stats.peak, r.predicted.peak)
        assert np.all(np.isfinite(r.outputs["O"])), "an output element was never written"
        assert r.errors["O"] <= 1e-12 and r.errors["L"] <= 1e-12, r.errors
        c = iosim.run(
            iosim.Schedule(algo, gqa=gqa, splits=splits, mla=mla, Br=3, Bc=4), problem=p, M=2000, count_only=True
        )
        assert c.stats.per_array == r.stats.per_array and c.stats.peak == r.stats.peak


def test_rows_without_keys_get_zero_and_minus_inf():
    """N_q > N_k, causal bottom-right: the first N_q - N_k rows see no key (O = 0, L = -inf)."""
    p = Problem(N_q=9, N_k=4, d_qk=4, causal=True)
    r = iosim.run(iosim.Schedule("flash2", gqa="packed", Br=2, Bc=2), problem=p, M=500)
    assert np.all(r.outputs["O"][:5] == 0) and np.all(np.isneginf(r.outputs["L"][:5]))
    assert r.errors["O"] <= 1e-12 and r.main.exact


@pytest.mark.parametrize("algo", ["flash1", "flash2"])
@pytest.mark.parametrize("N", [1, 17, 113, 203])
@pytest.mark.parametrize("causal", [False, True])
def test_one_head_problem_counts_as_today(algo, N, causal):
    """The problem schedule on one head with N_q = N_k counts what the seed algorithms count, word for word."""
    legacy = iosim.run(algo, N=N, d=16, M=1500, causal=causal, count_only=True)
    t = legacy.tiling
    r = iosim.run(
        iosim.Schedule(algo, gqa="packed"), problem=Problem(N=N, d=16, causal=causal), M=1500, count_only=True
    )
    assert r.tiling.Br == t.Br and r.tiling.Bc == t.Bc
    assert r.stats.per_array == legacy.stats.per_array and r.stats.peak == legacy.stats.peak
    assert r.main.exact


def test_gqa_decoding_factor_g():
    """At N_q = 1 per-head loads K/V g times per KV head, packed once: the factor g of the Metal-kernel finding."""
    p = Problem(B=2, H_q=8, H_kv=2, N_q=1, N_k=4096, d=64)
    per = iosim.run(iosim.Schedule("flash2", gqa="per-head"), problem=p, M=20000, count_only=True)
    packed = iosim.run(iosim.Schedule("flash2", gqa="packed"), problem=p, M=20000, count_only=True)
    assert per.stats.per_array["K"].reads == p.g * packed.stats.per_array["K"].reads
    assert packed.stats.per_array["K"].reads == p.compulsory()["K"]
    assert per.main.exact and packed.main.exact


def test_split_kv_costs_partials_and_adds_blocks():
    p = Problem(B=1, H_q=4, H_kv=1, N_q=1, N_k=8192, d=128)
    one = iosim.run(iosim.Schedule("flash2", gqa="packed"), problem=p, M=40000, count_only=True)
    four = iosim.run(iosim.Schedule("flash2", gqa="packed", splits=4), problem=p, M=40000, count_only=True)
    rows = p.B * p.H_q * p.N_q
    extra = four.stats.total - one.stats.total
    # each split writes its partial O and lse (s rows of d_v + 1 per query row), the combine reads them back,
    # and every split loads Q_i again
    assert extra == 2 * 4 * rows * (p.d_v + 1) + 3 * rows * p.d_qk
    assert four.schedule["thread_blocks"] == 4 + 1 and one.schedule["thread_blocks"] == 1


def test_bytes_follow_dtypes():
    p = Problem(B=1, H_q=8, H_kv=1, N_q=1, N_k=1000, d=64, dtype_q="bf16", dtype_kv="fp8")
    r = iosim.run(iosim.Schedule("flash2", gqa="packed"), problem=p, M=20000, count_only=True)
    b = r.bytes_per_array
    assert b["K"] == r.stats.per_array["K"].reads and b["Q"] == 2 * r.stats.per_array["Q"].reads
    assert b["L"] == 4 * r.stats.per_array["L"].writes
    assert r.as_dict()["total_bytes"] == sum(b.values())


def test_one_head_keywords_unchanged():
    r = iosim.run("flash2", N=64, d=16, M=1000)
    assert r.problem == Problem(N=64, d=16) and r.main.exact


@pytest.mark.parametrize(
    "kwargs, parameter",
    [
        (dict(H_q=6, H_kv=4, N=8, d=4), "H_kv"),
        (dict(N_q=0, N_k=8, d=4), "N_q"),
        (dict(N_q=4, N_k=1 << 27, d=4), "N_k"),
        (dict(N=8, d=4, page_size=0), "page_size"),
        (dict(N=8, d=4, page_size=9), "page_size"),
        (dict(N=8, d_qk=4, d_v=8, latent=True), "d_v"),
        (dict(N=8, d=4, dtype_kv="fp7"), "dtype_kv"),
    ],
)
def test_bad_problem_is_one_line(kwargs, parameter):
    with pytest.raises(InputError) as e:
        Problem(**kwargs)
    assert e.value.parameter.startswith(parameter) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "algo, kwargs, parameter",
    [
        ("flash2", dict(splits=0), "splits"),
        ("flash2", dict(splits=9), "splits"),
        ("flash1", dict(splits=2), "splits"),
        ("flash2", dict(gqa="grouped"), "gqa"),
        ("flash2", dict(mla="naive"), "mla"),
        ("standard", dict(gqa="packed"), "gqa"),
        ("square-tiling", dict(splits=2), "splits"),
        ("flash2", dict(Br=2, Bc=8), "Br, Bc"),
        ("flash2", dict(B=4), "B"),
    ],
)
def test_bad_schedule_is_one_line(algo, kwargs, parameter):
    p = Problem(B=1, H_q=4, H_kv=2, N_q=2, N_k=8, d=16)
    with pytest.raises(InputError) as e:
        run_keywords(algo, problem=p, M=200, count_only=True, **kwargs)
    assert e.value.parameter == parameter and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "algo, tiles",
    [("flash2", dict(Br=5, Bc=3)), ("flash1", dict(Bc=7)), ("square-tiling", dict(B=6)), ("standard", dict(B=9))],
)
def test_explicit_tiles_one_head(algo, tiles):
    r = run_keywords(algo, N=50, d=8, M=4000, **tiles)
    assert r.main.exact and all(getattr(r.tiling, k) == v for k, v in tiles.items())
    with pytest.raises(InputError):
        run_keywords(algo, N=50, d=8, M=30, **tiles)


def _cli(*argv):
    from iosim.cli import main

    return main(list(argv))


def test_cli_problem_run_and_bad_input(capsys):
    args = ["--heads", "8", "--kv-heads", "2", "--Nq", "1", "--Nk", "300", "--d", "16", "--M", "3000"]
    assert _cli("run", "flash2", *args, "--gqa", "packed", "--splits", "3", "--bytes", "--count-only") == 0
    out = capsys.readouterr().out
    assert "exact (per array and peak)" in out and "yes" in out and "bytes total" in out
    assert _cli("compare", *args, "--dtype-kv", "fp8", "--count-only") == 0
    assert "compulsory traffic" in capsys.readouterr().out
    assert _cli(
        "bounds", "--heads", "8", "--kv-heads", "2", "--Nq", "1", "--Nk", "300", "--d", "16", "--M", "3000"
    ) in (0, None)
    assert "compulsory" in capsys.readouterr().out
    for bad in (["--kv-heads", "3"], ["--splits", "400"], ["--page-size", "0"], ["--dtype-kv", "fp7"]):
        with pytest.raises(SystemExit) as e:
            code = _cli("run", "flash2", *args, *bad, "--count-only")
            raise SystemExit(code)
        assert e.value.code == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]  # argparse prints its usage first
        assert bad[0].lstrip("-").replace("-", "_")[:5].lower() in last.replace("-", "_").lower() or "H_kv" in last


def test_sweep_problem_points():
    recs = iosim.sweep(
        {"algorithm": "flash2", "N": 64, "d": 16, "M": 4000, "N_q": 1, "heads": 4, "kv_heads": 2,
         "gqa": ["per-head", "packed"], "splits": [1, 2]},
        executor="serial", cache=None, as_frame=False,
    )  # fmt: skip
    assert [r["status"] for r in recs] == ["ok"] * 4 and all(r["exact"] for r in recs)


@pytest.mark.parametrize("algo, splits", [("flash2", 3), ("flash1", 1)])
def test_trace_of_a_problem_replays(algo, splits, tmp_path, capsys):
    p = Problem(B=2, H_q=4, H_kv=2, N_q=2, N_k=23, d=8, page_size=5, causal=True)
    r = iosim.run(
        iosim.Schedule(algo, gqa="packed", splits=splits, Br=3, Bc=4), problem=p, M=600, trace=True, count_only=True
    )
    assert r.trace is not None and r.trace.replay(r.M) == r.stats and r.main.exact
    out = tmp_path / "t.npy"
    argv = ["trace", algo, "--batch", "2", "--heads", "4", "--kv-heads", "2", "--Nq", "2", "--Nk", "23", "--d", "8"]
    argv += ["--M", "600", "--splits", str(splits), "--page-size", "5", "--count-only", "-o", str(out)]
    assert _cli(*argv) == 0 and "equal counts and peak" in capsys.readouterr().out


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(
    algo=st.sampled_from(["flash1", "flash2"]),
    B=st.integers(1, 2),
    Hkv=st.integers(1, 3),
    g=st.integers(1, 4),
    Nq=st.integers(1, 30),
    Nk=st.integers(1, 60),
    dqk=st.integers(1, 9),
    dv=st.integers(1, 9),
    causal=st.booleans(),
    latent=st.booleans(),
    page=st.one_of(st.none(), st.integers(1, 20)),
    gqa=st.sampled_from(["per-head", "packed"]),
    splits=st.integers(1, 9),
    naive=st.booleans(),
    Br=st.integers(1, 12),
    Bc=st.integers(1, 12),
)
def test_counts_equal_closed_form_property(algo, B, Hkv, g, Nq, Nk, dqk, dv, causal, latent, page, gqa, splits,
                                           naive, Br, Bc):  # fmt: skip
    """Any problem, schedule and tiles: the simulation (counters-only memory) equals the closed form."""
    if latent:
        Hkv, dv = 1, min(dv, dqk)
    page = None if page is None or page > Nk else page
    splits = 1 if algo == "flash1" else min(splits, Nk)
    p = Problem(B=B, H_q=Hkv * g, H_kv=Hkv, N_q=Nq, N_k=Nk, d_qk=dqk, d_v=dv, causal=causal, latent=latent,
                page_size=page)  # fmt: skip
    stats, pred, M = _count(algo, p, Br, Bc, gqa, splits, "naive" if latent and naive else "shared", fast=True)
    assert stats.per_array == pred.per_array
    assert stats.peak == pred.peak <= M


@pytest.mark.parametrize("algo", ["standard", "square-tiling"])
@pytest.mark.parametrize("causal", [False, True])
def test_one_head_rectangular_grid(algo, causal):
    """Standard attention and square tiling on one head with N_q != N_k and d_qk != d_v: counts == closed form per
    array and in peak (standard: including the two-pass softmax, a row of S wider than M - 2), explicit tiles."""
    for (Nq, Nk), (dqk, dv), M in itertools.product(LENGTHS + [(5, 90)], [(6, 5), (3, 9)], [30, 64, 400]):
        p = Problem(N_q=Nq, N_k=Nk, d_qk=dqk, d_v=dv, causal=causal)
        if p.is_single:
            continue
        r = iosim.run(algo, problem=p, M=M, count_only=True)
        assert r.main.exact and r.stats.peak <= M, (p, M)
        e = iosim.run(iosim.Schedule(algo, B=2), problem=p, M=M, count_only=True)
        assert e.main.exact and e.tiling.B == 2
    for Nq, Nk in ((23, 11), (4, 30)):
        r = iosim.run(algo, problem=Problem(N_q=Nq, N_k=Nk, d_qk=7, d_v=5, causal=causal), M=60, seed=2)
        assert r.main.exact and r.errors["O"] <= 1e-12 and r.errors.get("L", 0.0) <= 1e-12


@pytest.mark.parametrize("algo", ["standard", "square-tiling"])
@pytest.mark.parametrize("causal", [False, True])
def test_heads_one_after_another(algo, causal):
    """Standard attention and square tiling over batch and heads (GQA per-head: each query head reads its key/value
    head's K and V itself): every head simulated, counts == B H_q times one head's closed form per array, the peak
    one head's; numerics against the float64 problem reference with query head h on key/value head h // g."""
    for B, Hq, Hkv, Nq, Nk in ((2, 4, 2, 7, 13), (1, 3, 1, 9, 4), (3, 2, 2, 5, 5)):
        p = Problem(B=B, H_q=Hq, H_kv=Hkv, N_q=Nq, N_k=Nk, d_qk=6, d_v=4, causal=causal)
        one = iosim.run(algo, problem=Problem(N_q=Nq, N_k=Nk, d_qk=6, d_v=4, causal=causal), M=90, count_only=True)
        r = iosim.run(algo, problem=p, M=90, count_only=True)
        assert r.main.exact and r.stats.peak == one.stats.peak <= 90
        for name, c in one.stats.per_array.items():
            assert r.stats.per_array[name].reads == B * Hq * c.reads
            assert r.stats.per_array[name].writes == B * Hq * c.writes
        n = iosim.run(algo, problem=p, M=90, seed=4)
        assert n.main.exact and n.stats.per_array == r.stats.per_array
        assert n.errors["O"] <= 1e-12 and n.errors.get("L", 0.0) <= 1e-12 and n.outputs["O"].shape == (B * Hq * Nq, 4)


@pytest.mark.parametrize("algo", ["standard", "square-tiling"])
@pytest.mark.parametrize(
    "kwargs, problem, parameter",
    [(dict(gqa="packed"), {}, "gqa"), (dict(splits=2), {}, "splits"), ({}, dict(page_size=4), "page_size"),
     (dict(mla="naive"), dict(latent=True, d_v=4), "latent")],
)  # fmt: skip
def test_heads_schedule_options_that_do_not_apply(algo, kwargs, problem, parameter):
    p = Problem(B=2, H_q=4, H_kv=2, N_q=3, N_k=8, d=8, **problem)
    with pytest.raises(InputError) as e:
        run_keywords(algo, problem=p, M=400, count_only=True, **kwargs)
    assert e.value.parameter == parameter and "flash1 and flash2" in str(e.value) and "\n" not in str(e.value)


def test_show_text_of_a_problem(capsys):
    argv = ["show", "flash2", "--heads", "4", "--kv-heads", "2", "--Nq", "2", "--Nk", "20", "--d", "4", "--M", "300"]
    assert _cli(*argv, "--gqa", "packed", "--splits", "2", "--text", "--limit", "5") == 0
    out = capsys.readouterr().out
    assert "load Q[0:4, 0:4]" in out  # the 2 x 2 packed rows of a group: one row block
    assert "B=1, H_q=4, H_kv=2, N_q=2, N_k=20, d_qk=4, d_v=4, GQA packed, 2 KV splits, M=300 words" in out
    assert "N=2," not in out  # a problem is named as one, not by its query length


@pytest.mark.parametrize(
    "extra", [[], ["--mask", "window:3"], ["--backward"], ["--json"], ["--csv"], ["--M", "40"], ["--dv", "5"]]
)
def test_compare_over_one_head_with_nq_below_nk(extra, capsys):
    """One head, N_q != N_k (chunked prefill): every variant of compare prints its table (standard attention and
    square tiling ran head by head with a schedule of their own; a KeyError once ended this with a traceback)."""
    assert _cli("compare", "--Nq", "2", "--Nk", "50", "--d", "8", "--M", "900", "--count-only", *extra) == 0
    out = capsys.readouterr().out
    assert "flash2" in out and ("standard" in out or "--backward" in extra)


@pytest.mark.parametrize("algo", ["flash1", "flash2", "standard", "square-tiling"])
def test_problem_kv_policy_and_flags_are_checked_with_or_without_a_mask(algo):
    p = Problem(H_q=2, N_q=3, N_k=20, d=4)
    with pytest.raises(InputError) as e:
        iosim.run(iosim.Schedule(algo, kv_policy="lazy"), problem=p, M=900, count_only=True)
    assert e.value.parameter == "kv_policy" and "\n" not in str(e.value)
    for name in ("causal", "latent"):
        with pytest.raises(InputError) as e:
            Problem(N_q=3, N_k=20, d=4, **{name: "yes"})
        assert e.value.parameter == name


def test_mla_latent_defaults_to_one_shared_cache(capsys):
    """The absorbed form shares one latent cache among all query heads: H_kv defaults to 1 with the latent (it was
    H_q: a per-head latent, H_q times the cache, counted silently for --mla without --kv-heads)."""
    assert Problem(H_q=8, N=4, d=4, latent=True).H_kv == 1 and Problem(H_q=8, N=4, d=4).H_kv == 8
    assert Problem(H_q=8, H_kv=2, N=4, d=4, latent=True).H_kv == 2  # given: kept
    argv = ["run", "flash2", "--heads", "8", "--Nq", "1", "--Nk", "100", "--d", "72", "--dv", "64", "--M", "20000"]
    assert _cli(*argv, "--mla", "shared", "--count-only") == 0
    assert "H_kv=1" in capsys.readouterr().out


@pytest.mark.parametrize("algo", ["flash1", "flash2"])
def test_causal_field_honours_the_kv_policy(algo, capsys):
    """Issue 32, point 5: ``--causal`` over a problem counts the policy it reports (it counted skip's schedule while
    the JSON said paper). flash2 at N_q = 40 > N_k = 13: paper loads every Q_i before testing, 1,920 words; skip
    only the row blocks that see a key, 768; the closed form is exact under both, forward and backward."""
    p = Problem(H_q=3, H_kv=1, N_q=40, N_k=13, d=16, causal=True)
    q = {}
    for policy in ("paper", "skip"):
        r = iosim.run(
            iosim.Schedule(algo, Br=6, Bc=5, kv_policy=policy), problem=p, M=2468, count_only=True, backward=True
        )
        assert r.kv_policy == policy and r.passes["forward"].exact and r.passes["backward"].exact
        q[policy] = r.passes["forward"].stats.per_array["Q"].reads
    if algo == "flash2":
        assert q == {"paper": 1920, "skip": 768}
    else:  # K/V outer: the last query row sees every key, so no column block is empty and the policies agree
        assert q["paper"] == q["skip"]
    argv = ["run", algo, "--heads", "3", "--kv-heads", "1", "--Nq", "40", "--Nk", "13", "--d", "16", "--M", "2468",
            "--Br", "6", "--Bc", "5", "--kv-policy", "paper", "--causal", "--count-only", "--json"]  # fmt: skip
    assert _cli(*argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_policy"] == "paper" and out["per_array"]["Q"]["reads"] == q["paper"]


GATHER_CASES = [  # (problem, Br, Bc)
    (Problem(B=2, H_q=4, H_kv=2, N_q=3, N_k=50, d=8, page_size=7), 2, 16),
    (Problem(B=1, H_q=2, N_q=5, N_k=37, d_qk=12, d_v=8, page_size=1, latent=True, causal=True), 4, 5),
    (Problem(B=1, H_q=3, N_q=1, N_k=64, d=16, page_size=16), 2, 16),
    (Problem(B=1, H_q=2, N_q=9, N_k=30, d_qk=8, d_v=6, page_size=4, causal=True), 4, 6),
]


@pytest.mark.parametrize(("p", "Br", "Bc"), GATHER_CASES)
@pytest.mark.parametrize("gqa", ["per-head", "packed"])
def test_paged_flash1_that_gathers_a_tile_pays_only_the_table_words(p, Br, Bc, gqa):  # noqa: N803
    """Issue 32, point 7: beside flash1's piece-per-step paging (each page piece an outer step with its own round
    trip of Q_i, O_i, l_i, m_i) a K/V-outer kernel gathers a tile's keys from their pages: the contiguous cache's
    counts plus one table word per page piece. Simulated = closed form per array and in peak, under masks and both
    policies; numerics against the float64 reference."""
    from iosim.runner.problem_runs import _problem_inputs
    from iosim.runner.problem_runs import problem_mask as _problem_mask
    from iosim.runner.references import problem_reference

    contiguous = Problem(B=p.B, H_q=p.H_q, H_kv=p.H_kv, N_q=p.N_q, N_k=p.N_k, d_qk=p.d_qk, d_v=p.d_v,
                         latent=p.latent, causal=p.causal)  # fmt: skip
    masks = [None] if p.causal else [None, "window:6"]
    for mask, policy, mla in itertools.product(masks, ("skip", "paper"), ("shared", "naive") if p.latent else ("",)):
        mla = mla or "shared"
        tm = _problem_mask(p, mask, policy) if mask else None
        counts = {}
        for q, gather in ((p, True), (p, False), (contiguous, False)):
            mem = TwoLevelMemory(10**6)
            flash.flash1_problem(mem, q, None, None, None, None, Br=Br, Bc=Bc, gqa=gqa, mla=mla, scale=1.0,
                                    mask=tm, gather=gather)  # fmt: skip
            st, pred = mem.stats(), io_model.flash1_problem(q, Br, Bc, gqa, mla, tm, gather=gather)
            assert st.per_array == pred.per_array and st.peak == pred.peak
            counts[(q.page_size, gather)] = {n: (c.reads, c.writes) for n, c in st.per_array.items()}
        gathered, pieces, flat = counts[(p.page_size, True)], counts[(p.page_size, False)], counts[(None, False)]
        table = gathered.pop("page_table")
        assert gathered == flat  # the contiguous cache's counts and the table words alone
        assert table == pieces["page_table"] if mask is None else table >= pieces["page_table"]  # whole tiles
        if p.page_size < Bc:
            assert pieces["Q"][0] >= flat["Q"][0]  # piece by piece: Q_i, O_i, l_i, m_i again per piece
    rng = np.random.default_rng(3)
    Q, K, V, Ks, Vs, table = _problem_inputs(p, rng)
    O, l_, m = flash.flash1_problem(TwoLevelMemory(10**6), p, Q, Ks, Vs, table, Br=Br, Bc=Bc, gqa=gqa,
                                       mla="shared", scale=0.5, gather=True)  # fmt: skip
    O_ref, L_ref = problem_reference(p, Q, K, V, 0.5)
    assert np.max(np.abs(O - O_ref)) < 1e-12
    seen = np.isfinite(L_ref)
    assert np.max(np.abs((m + np.log(l_))[seen] - L_ref[seen])) < 1e-12

"""The teaching pages' data, caps and command lines (iosim.views.html), without a browser (test_html_browser.py
plays the pages in Chromium)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import iosim
from iosim.base.errors import InputError
from iosim.cli import main
from iosim.pebble.game import Game
from iosim.pebble.graph import named
from iosim.runner import registry
from iosim.views import html


def _page_data(text: str) -> dict:
    m = re.search(r"const PAGE = (\{.*?\});\n", text)
    return json.loads(m.group(1))


@pytest.fixture(scope="module")
def flash2_run():
    return html.traced("flash2", N=32, d=8, M=256)


def test_page_is_self_contained_and_carries_the_trace(flash2_run):
    r = flash2_run
    text = html.schedule_page(r)
    # no request can leave the page: no external script, style, image, link or fetch
    assert not re.search(r"<(link|img|iframe)\b|\bsrc\s*=|fetch\(|XMLHttpRequest|@import|url\(", text)
    assert re.findall(r"https?://[^\s\"')]+", text) == ["http://www.w3.org/2000/svg"]  # the SVG namespace, a name
    data = _page_data(text)
    s = data["schedules"][0]
    ev = np.array(s["events"]).reshape(-1, 9)
    names = s["names"]
    assert ev.shape == r.trace.events.shape
    assert [names[a] for a in ev[:, 1]] == [r.trace.names[a] for a in r.trace.events[:, 1]]
    assert (ev[:, [0, 2, 3, 4, 5, 6, 7, 8]] == r.trace.events[:, [0, 2, 3, 4, 5, 6, 7, 8]]).all()
    per = {k: [v.reads, v.writes] for k, v in r.stats.per_array.items()}
    assert s["final"] == per == s["simulated"] == s["closed_form"]
    assert s["exact"] is True and s["peak"] == r.stats.peak
    assert s["bounds"][0] == [r.main.lower_bound_name, r.main.lower_bound]
    # outer iterations: flash2's row blocks (Tr = ceil(32 / Br))
    assert len(s["outer"]) == -(-32 // r.tiling.Br)


def test_paper_steps_follow_the_driver(flash2_run):
    s = html.schedule_data(flash2_run)
    ev = np.array(s["events"]).reshape(-1, 9)
    names = s["names"]
    for k, (op, a) in enumerate(ev[:, :2].tolist()):
        name = names[a]
        want = {(1, "Q"): 4, (1, "K"): 7, (1, "V"): 7, (3, "S"): 8, (2, "O"): 14, (2, "L"): 15}.get((op, name))
        if want is not None:
            assert s["steps"][k] == want
    frees = [k for k in range(len(ev)) if ev[k, 0] == 4 and names[ev[k, 1]] == "K"]
    assert frees and all(s["steps"][k] == 0 for k in frees)  # a free is no paper step (issue 46, defect 7)
    assert all(s["steps"][k] == 0 for k in range(len(ev)) if ev[k, 0] == 4)
    r1 = html.traced("flash1", N=20, d=4, M=128)
    s1 = html.schedule_data(r1)
    ev1 = np.array(s1["events"]).reshape(-1, 9)
    assert {s1["steps"][k] for k in range(len(ev1)) if ev1[k, 0] == 5} == {2}  # init O, l, m: step 2
    assert s1["step_text"]["6"].startswith("load K_j, V_j")


@pytest.mark.parametrize(
    "algorithm, problem, gqa, splits",
    [
        (a, dict(B=2, H_q=4, H_kv=2, N=24, d=4), "per-head", 1) for a in ("flash1", "flash2")
    ] + [
        (a, dict(B=1, H_q=4, H_kv=1, N=24, d=4), "packed", 1) for a in ("flash1", "flash2")
    ] + [
        ("flash2", dict(B=2, H_q=2, N_q=1, N_k=40, d_qk=4), "per-head", 2),  # decoding, split-KV
        ("flash1", dict(B=2, H_q=2, N_q=1, N_k=40, d_qk=4), "per-head", 1),
    ],
)  # fmt: skip
def test_one_thread_block_over_a_problem(algorithm, problem, gqa, splits):
    """Without a mask every thread block of the main kernel moves the same words: the block the page plays,
    times the number of blocks, is the problem's total (split-KV: the main kernel's blocks; flash1's inits apart)."""
    p = iosim.Problem(**problem)
    r = html.traced(algorithm, problem=p, M=256, gqa=gqa, splits=splits)
    start, end, blocks = html.thread_block(r)
    assert start == 0 and blocks == r.schedule["thread_blocks"] and 0 < end <= len(r.trace)
    ev = r.trace.events[:end]
    assert ev[-1, 7] == 0  # a block leaves fast memory empty
    s = html.schedule_data(r)
    assert s["problem"] == str(p) and s["thread_blocks"] == blocks
    Br = r.tiling.Br
    R = p.N_q * (p.g if gqa == "packed" else 1)
    for name in ("K", "V"):
        per_block = s["final"][name][0]
        if algorithm == "flash2" and splits > 1:  # the first (row block, split) streams its split's K_j, V_j
            Bc, Tc = r.tiling.Bc, -(-p.N_k // r.tiling.Bc)
            assert per_block == min(-(-Tc // splits) * Bc, p.N_k) * p.d_qk
        elif algorithm == "flash2":  # each row block streams every K_j, V_j
            assert per_block * blocks == r.stats.per_array[name].reads
        else:  # one block per query head (per-head) or KV head (packed): K, V once per block
            assert per_block * blocks == r.stats.per_array[name].reads
    q = s["final"]["Q"][0]
    assert q == (min(Br, R) * p.d_qk if algorithm == "flash2" else R * p.d_qk * -(-p.N_k // r.tiling.Bc))


@pytest.mark.parametrize("gqa", ["per-head", "packed"])
@pytest.mark.parametrize("algorithm", ["flash1", "flash2"])
def test_one_thread_block_of_a_backward_over_a_problem(algorithm, gqa):
    """The backward's main kernel: one block per column block (K_j, V_j loaded once) and per group; the block the
    page plays loads K_j and V_j once and streams the group's rows past them."""
    p = iosim.Problem(B=2, H_q=4, H_kv=2, N=24, d=4)
    r = html.traced(algorithm, problem=p, M=512, gqa=gqa, backward=True)
    start, end, blocks = html.thread_block(r)
    assert blocks == r.schedule["backward_thread_blocks"]
    ev = r.trace.events[start:end]
    assert ev[-1, 7] == 0 and (start == 0 or r.trace.events[start - 1, 7] == 0)
    s = html.schedule_data(r)
    assert s["final"] == html._counts(ev, r.trace.names)
    Bc = r.tiling.Bc
    rows = p.N_q * (p.g if gqa == "packed" else 1)
    assert s["final"]["K"] == [min(Bc, p.N_k) * p.d_qk, 0] == [s["final"]["V"][0], 0]
    assert s["final"]["Q"][0] == rows * p.d_qk


def test_chart_is_the_closed_forms(flash2_run):
    c = html.closed_form_chart(32, 8, 256)
    assert c["d2"] == 64 and c["M"] == 256
    assert set(c["series"]) == set(registry.algorithms())
    pts = dict(c["series"]["flash2"])
    assert pts[256] == flash2_run.predicted.total == flash2_run.stats.total
    for name, series in c["series"].items():
        a = registry.get(name)
        for m, total in series[::9]:
            t = a.choose_tiling(32, 8, m, "fit")
            assert total == a.predict_forward(32, 8, m, t, False).total
    assert all(v == iosim.theory.bounds.lower_bound(32, 8, m)[0] for m, v in c["lower"])
    # the upper line is FlashAttention's Theorem 2 with its proof's constants (docs/theory.md; initialisations
    # counted), never below the lower bound (issue 46, defect 6: a Theta form with constant 1 fell below it)
    lower = dict(c["lower"])
    for backward, chart in ((False, c), (True, html.closed_form_chart(32, 8, 256, backward=True))):
        assert len(chart["upper"]) == len(chart["lower"])
        for m, v in chart["upper"]:
            N, d, Tc = 32, 8, -(-32 // -(-m // (4 * 8)))
            f1 = 2 * N * d + Tc * (3 * N * d + 4 * N) + N * d + 2 * N
            b1 = 4 * N * d + Tc * (5 * N * d + 2 * N) + 3 * N * d
            assert v == (b1 if backward else f1)
            assert v >= dict(chart["lower"])[m] and (backward or v >= lower[m])


def test_two_schedules_one_page():
    runs = [html.traced(a, N=24, d=4, M=128) for a in ("standard", "flash2")]
    data = _page_data(html.schedule_page(runs))
    assert [s["algorithm"] for s in data["schedules"]] == ["standard", "flash2"]
    assert data["chart"]["N"] == 24
    for s, r in zip(data["schedules"], runs, strict=True):
        assert s["final"] == {k: [v.reads, v.writes] for k, v in r.stats.per_array.items()}


def test_too_large_a_page_is_refused_naming_the_largest_N(monkeypatch):
    monkeypatch.setattr(html, "MAX_EVENTS", 600)
    kw = dict(N=200, d=8, M=256)
    with pytest.raises(InputError) as e:
        html.check_fits(["flash2"], kw)
    assert e.value.parameter == "N"
    n = int(re.search(r"the largest N that fits at d=8 and M=256 is (\d+)", str(e.value)).group(1))
    assert html.page_events(["flash2"], {**kw, "N": n}) <= 600 < html.page_events(["flash2"], {**kw, "N": n + 1})
    html.check_fits(["flash2"], {**kw, "N": n})  # fits: no error
    p = iosim.Problem(B=1, H_q=2, N=200, d=8)  # over a problem the page holds one thread block: flash1's is a head
    with pytest.raises(InputError, match=r"largest N that fits at d=8 and M=256 is \d+"):
        html.check_fits(["flash1"], dict(problem=p, M=256))


def test_the_cli_refuses_in_one_line_before_any_work(tmp_path, capsys):
    cmd = ["show", "flash2", "--N", "8192", "--d", "8", "--M", "256", "--html"]
    capsys.readouterr()
    assert main([*cmd, "-o", str(tmp_path / "p.html")]) == 2 and not (tmp_path / "p.html").exists()
    lines = [x for x in capsys.readouterr().err.strip().splitlines() if not x.startswith("iosim: compiling")]
    assert len(lines) == 1
    assert f"the cap is {html.MAX_EVENTS:,} events and {html.MAX_HTML_BYTES:,} bytes of HTML" in lines[0]
    assert "the largest N that fits at d=8 and M=256 is" in lines[0]
    for bad, why in (("p.png", "must end in .html"), ("no/such/p.html", "existing folder")):
        assert main([*cmd, "-o", str(tmp_path / bad)]) == 2
        err = capsys.readouterr().err
        assert why in err and "Traceback" not in err


def test_output_checked_before_the_work(monkeypatch, tmp_path):
    def boom(*a, **k):
        raise AssertionError("traced before the output was checked")

    monkeypatch.setattr(html, "traced", boom)
    with pytest.raises(InputError, match="must end in .html"):
        html.page("flash2", tmp_path / "x.htm", N=16, d=4, M=128)
    with pytest.raises(InputError):
        html.page("flash2", tmp_path / "missing" / "x.html", N=16, d=4, M=128)


def test_cli_pages(tmp_path, capsys):
    runs = [
        ["show", "flash2", "standard", "--N", "24", "--d", "4", "--M", "128", "--html", "-o", str(tmp_path / "a.html")],
        ["compare", "--N", "16", "--d", "4", "--M", "128", "--count-only", "--html", str(tmp_path / "b.html")],
        ["pebble", "matmul:1x2x1", "--M", "3", "docs/pebble/matmul-1x2x1-M3.txt", "--html", str(tmp_path / "c.html")],
    ]
    for args in runs:
        assert main(args) == 0, capsys.readouterr().err
    a = _page_data((tmp_path / "a.html").read_text())
    assert [s["algorithm"] for s in a["schedules"]] == ["flash2", "standard"]
    b = _page_data((tmp_path / "b.html").read_text())
    assert sorted(s["algorithm"] for s in b["schedules"]) == sorted(registry.algorithms())
    c = _page_data((tmp_path / "c.html").read_text())
    assert c["games"][0]["best"]["io"] == 7 and c["games"][0]["best"]["how"].startswith("optimum")
    capsys.readouterr()
    assert main(["show", "flash2", "standard", "--N", "8", "--d", "4", "--M", "64", "--text"]) == 2
    assert "ALGORITHM2 applies with --html" in capsys.readouterr().err


def test_pebble_page_data_plays_under_the_checker():
    games = html.exercises("docs/pebble")
    assert {(g, m) for g, m, _ in games} == {
        ("matmul:1x2x1", 3), ("matmul:2x2x2", 4), ("matmul:2x2x2", 3), ("attention:4x2", 8)
    }  # fmt: skip
    for spec, M, sol in games[:2]:
        d = html.pebble_data(spec, M, sol, optimum_states=2000)
        g = named(spec)
        assert d["names"] == g.names and d["parents"] == [list(p) for p in g.parents]
        assert Game(g, M).play(d["best"]["moves"]).io == d["best"]["io"]
        assert Game(g, M).play(d["solution"]["moves"]).complete


def test_the_lessons_answers():
    """docs/teaching.md: the predictions of part 1, the M where the ranking flips (part 2), the backward (part 3)."""
    r = html.traced("flash2", N=64, d=16, M=1024)
    assert (r.tiling.Br, r.tiling.Bc) == (12, 12)
    per = r.stats.per_array
    assert (per["K"].reads, per["Q"].reads, r.stats.writes, r.stats.total, r.stats.peak) == (
        6144,
        1024,
        1088,
        14400,
        936,
    )
    assert r.predicted.total == 14400

    def ranking(M):  # noqa: N803
        runs = [html.traced(a, N=64, d=16, M=M) for a in registry.algorithms()]
        return [x.algorithm for x in sorted(runs, key=lambda x: x.stats.total)]

    assert ranking(279)[:3] == ["square-tiling", "standard", "flash2"]
    assert ranking(280)[0] == "flash2"
    assert all(ranking(m)[0] != "flash2" for m in (256, 270, 278))
    f279, f280 = html.traced("flash2", N=64, d=16, M=279), html.traced("flash2", N=64, d=16, M=280)
    assert (f279.stats.total, f280.stats.total) == (47168, 34880)
    assert (f279.stats.per_array["K"].reads, f280.stats.per_array["K"].reads) == (22 * 1024, 16 * 1024)
    b = html.traced("flash2", N=64, d=16, M=1024, backward=True)
    assert (b.tiling.Br, b.stats.total, b.passes["forward"].stats.total) == (7, 49472, 14400)
    assert (b.stats.per_array["dQ"].writes, b.stats.per_array["dQ"].init_writes) == (11264, 1024)
    d = html.pebble_data("matmul:1x2x1", 3, "docs/pebble/matmul-1x2x1-M3.txt")
    assert d["best"]["io"] == 7 and d["best"]["how"] == "optimum (A* search, 65 states)"


def test_the_byte_cap_names_the_largest_N_too(monkeypatch, tmp_path):
    monkeypatch.setattr(html, "MAX_HTML_BYTES", 60_000)
    kw = dict(N=200, d=8, M=256)
    with pytest.raises(InputError) as e:
        html.page("flash2", tmp_path / "p.html", **kw)
    n = int(re.search(r"is (\d+), got 200", str(e.value)).group(1))
    events, size, _ = html.page_size(["flash2"], {**kw, "N": n})
    assert size <= 60_000 < html.page_size(["flash2"], {**kw, "N": n + 1})[1] and events <= html.MAX_EVENTS


def test_iosim_show_html(tmp_path):
    path = iosim.show("standard", "flash2", N=16, d=4, M=128, html=tmp_path / "p.html")
    data = _page_data(path.read_text())
    assert [s["algorithm"] for s in data["schedules"]] == ["standard", "flash2"]
    with pytest.raises(InputError, match="must end in .html"):
        iosim.show("flash2", N=16, d=4, M=128, html=tmp_path / "p.txt")


# ---------------------------------------------------------------------------------------------------------------
# Issue 46: the defects a class would hit
# ---------------------------------------------------------------------------------------------------------------
def _per_array_by_hand(r) -> dict:
    """Reads and writes per array summed from the trace's events (loads; stores and initialisations)."""
    out: dict = {}
    for op, a, words in r.trace.events[:, [0, 1, 6]].tolist():
        x = out.setdefault(r.trace.names[a], [0, 0])
        if op == 1:
            x[0] += words
        elif op in (2, 5):
            x[1] += words
    return {k: v for k, v in out.items() if v != [0, 0]}


def test_masks_fixed_to_their_N_make_pages(tmp_path, capsys):
    """Defect 1: a mask that holds at one N only (blockdiag:, prefix:, an N x N file:) makes a page at that N,
    with the counts of `iosim run`; over the cap it is refused in one line saying no smaller N fits it."""
    np.save(tmp_path / "m.npy", np.tril(np.ones((96, 96), bool)))
    for mask in ("blockdiag:32,32,32", "prefix:40", f"file:{tmp_path / 'm.npy'}"):
        out = tmp_path / "p.html"
        assert (
            main(["show", "flash2", "--N", "96", "--d", "8", "--M", "256", "--mask", mask, "--html", "-o", str(out)])
            == 0
        )
        s = _page_data(out.read_text())["schedules"][0]
        r = iosim.run("flash2", N=96, d=8, M=256, mask=mask, count_only=True, trace=True)
        assert s["final"] == _per_array_by_hand(r) == {k: [v.reads, v.writes] for k, v in r.stats.per_array.items()}
    capsys.readouterr()
    cmd = ["show", "flash2", "--N", "2048", "--d", "8", "--M", "64", "--mask", "blockdiag:1024,1024", "--html"]
    assert main([*cmd, "-o", str(tmp_path / "big.html")]) == 2 and not (tmp_path / "big.html").exists()
    err = [x for x in capsys.readouterr().err.strip().splitlines() if not x.startswith("iosim: compiling")]
    assert len(err) == 1 and "holds at this N only" in err[0] and "Traceback" not in err[0]


def test_pebble_page_cap_names_the_largest_graph(tmp_path, capsys):
    """Defect 2: a graph past the pebble page's cap is refused before any search, naming the largest of its kind."""
    with pytest.raises(InputError) as e:
        html.pebble_page([("attention:64x8", 64, None)])
    assert e.value.parameter == "graph" and "the largest that fits is attention:5x8" in str(e.value)
    assert len(named("attention:5x8")) <= html.MAX_PEBBLE_VERTICES < len(named("attention:6x8"))
    assert main(["pebble", "attention:64x8", "--M", "64", "--html", str(tmp_path / "p.html")]) == 2
    assert "attention:5x8" in capsys.readouterr().err and not (tmp_path / "p.html").exists()
    with pytest.raises(InputError, match=r"largest that fits is matmul:\d+x8x8"):
        html.pebble_graph("matmul:20x8x8")


def test_outer_iterations_and_rows():
    """flash1's initialisations are not outer iterations (Tc of them: one per column block); the counters' rows
    cover the problem's arrays so a column sums to the total (defect 8: split-KV's O and L); no bound of 0 words."""
    r1 = html.traced("flash1", N=20, d=4, M=128)
    s1 = html.schedule_data(r1)
    assert len(s1["outer"]) == -(-20 // r1.tiling.Bc)
    p = iosim.Problem(B=2, H_q=2, N_q=1, N_k=40, d_qk=4)
    r = html.traced("flash2", problem=p, M=256, splits=2)
    s = html.schedule_data(r)
    assert {"O", "L", "Opart", "Lpart"} <= set(s["rows"])
    assert sum(s["simulated"][n][0] + s["simulated"][n][1] for n in s["rows"]) == r.stats.total
    big = html.traced("flash2", N=16, d=4, M=4096)
    assert all(v > 0 for _, v in html.schedule_data(big)["bounds"])


def test_page_without_javascript_shows_the_counts(flash2_run):
    """Defect 11: the page's <noscript> says JavaScript is off and holds the final counts as plain HTML."""
    text = html.schedule_page(flash2_run)
    nos = re.search(r"<noscript>(.*)</noscript>", text, re.S).group(1)
    assert "JavaScript" in nos
    for name, v in flash2_run.stats.per_array.items():
        assert f"<td>{name}</td><td>{v.reads:,}</td><td>{v.writes:,}</td>" in nos
    peb = re.search(r"<noscript>(.*)</noscript>", html.pebble_page([("matmul:1x2x1", 3, None)]), re.S).group(1)
    assert "matmul:1x2x1, M = 3" in peb and "7 I/O" in peb


@pytest.mark.slow
def test_python_pebble_page_gives_the_lessons_optima():
    """Defect 13: docs/teaching.md's `pebble_page(exercises("docs/pebble"))` searches as far as `iosim pebble
    --html` (its default budget) and finds the optima the lesson promises, 17 and 25 (about 2 minutes)."""
    data = _page_data(html.pebble_page(html.exercises("docs/pebble")))
    best = {(g["graph"], g["M"]): g["best"] for g in data["games"]}
    assert best[("matmul:2x2x2", 4)]["io"] == 17 and best[("matmul:2x2x2", 3)]["io"] == 25
    assert best[("matmul:2x2x2", 3)]["how"].startswith("optimum")
    for (spec, M), b in best.items():  # noqa: N806
        assert Game(named(spec), M).play(b["moves"]).io == b["io"]


def test_grid_page_carries_every_settings_real_trace(tmp_path, capsys, monkeypatch):
    """Issue 46: one page holds the traces of a grid of N, d, M and masks; each setting's counts are its own run's
    (summed here from the events); a setting iosim refuses keeps its one-line reason; over the byte cap the page is
    refused naming the N that fit."""
    text = html.grid_page(["flash2"], Ns=[16, 24], ds=[4], Ms=[16, 128], masks=["none", "causal"])
    g = _page_data(text)["grid"]
    assert g["axes"] == {"N": [16, 24], "d": [4], "M": [16, 128], "mask": ["none", "causal"]}
    assert len(g["settings"]) == 8
    for s in g["settings"]:
        if s["M"] == 16:  # below flash2's smallest working set at d = 4
            assert "M must be at least" in s["refused"] and "schedules" not in s
            continue
        r = html.traced("flash2", N=s["N"], d=4, M=s["M"], mask=None if s["mask"] == "none" else s["mask"])
        assert s["schedules"][0]["final"] == _per_array_by_hand(r)
        assert s["schedules"][0]["events"] == r.trace.events[:, :9].ravel().tolist()
        assert s["chart"]["N"] == s["N"]
    out = tmp_path / "g.html"
    cmd = ["show", "flash2", "--grid-N", "16,24", "--N", "16", "--d", "4", "--M", "128", "--grid-M", "64,128", "--html",
           "-o", str(out)]  # fmt: skip
    assert main(cmd) == 0 and len(_page_data(out.read_text())["grid"]["settings"]) == 4
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:  # argparse's one-line error, exit 2
        main([*cmd[:3], "16,x", *cmd[4:]])
    assert e.value.code == 2
    assert "--grid-N: must be a comma-separated list of positive integers" in capsys.readouterr().err
    assert main(["show", "flash2", "--N", "16", "--d", "4", "--M", "128", "--grid-M", "64,128", "--text"]) == 2
    assert "--grid-M applies with --html" in capsys.readouterr().err
    one = len(html.grid_page(["flash2"], Ns=[16], ds=[4], Ms=[128]).encode())
    monkeypatch.setattr(html, "MAX_HTML_BYTES", one + 1000)
    with pytest.raises(InputError, match=r"N in \[16\] fits with these d, M and masks"):
        html.grid_page(["flash2"], Ns=[16, 64], ds=[4], Ms=[128])


@pytest.mark.parametrize("algorithm", ["flash1", "flash2"])
def test_score_blocks_drawn_are_the_ones_computed(algorithm):
    """The page's picture of S = Q K^T: every block the schedule computes, and none a causal mask skips (model:
    a block of rows i0..i0+nq-1 and keys k0.. is computed iff some key is at or below some row, k0 <= i0 + nq - 1)."""
    N, d, M = 20, 4, 128  # noqa: N806
    for causal in (False, True):
        r = html.traced(algorithm, N=N, d=d, M=M, causal=causal)
        Br, Bc = r.tiling.Br, r.tiling.Bc  # noqa: N806
        got = {(q0, nq, k0, nk) for _, q0, nq, k0, nk in html.schedule_data(r)["blocks"]}
        want = {(i0, min(Br, N - i0), j0, min(Bc, N - j0)) for i0 in range(0, N, Br) for j0 in range(0, N, Bc)
                if not causal or j0 <= i0 + min(Br, N - i0) - 1}  # fmt: skip
        assert got == want
    assert html.schedule_data(html.traced("standard", N=N, d=d, M=M))["blocks"] is None

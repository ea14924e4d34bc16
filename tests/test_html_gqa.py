"""GQA's shared K/V on the teaching page (iosim.views.shared_kv, page/gqa.js): the page's per-tile loads of key/value
head 0 under per-head and packed GQA, and the problem's K and V reads, against the runs' counts and against an
independent count written here from the loop orders (ragged N: the last tile and row block are short); then the
page in headless Chromium (the browser fixture of tests/test_html_browser.py: skipped without chromium, a failure
under IOSIM_CI=1)."""

from __future__ import annotations

import json
import math

import pytest
from test_html_browser import TEXT_COLOURS, _clean, _contrast, _fits, _open, _shot, browser  # noqa: F401 (fixture)

import iosim
from iosim.views import html

# (algorithm, B, H_q, H_kv, N_q, N_k, d, M, Br, Bc): ragged N (37 = 4 x 8 + 5 keys; 37 rows in blocks of 16), a
# decoding step (N_q = 1, four query heads on one cache) and K/V-outer FlashAttention
CASES = [
    ("flash2", 2, 6, 2, 37, 37, 8, 800, 16, 8),
    ("flash2", 1, 4, 1, 1, 45, 8, 400, 4, 16),
    ("flash1", 2, 4, 2, 37, 37, 8, 800, 8, 8),
]


def _page_data(path) -> dict:
    text = path.read_text(encoding="utf-8")
    start = text.index("const PAGE = ") + len("const PAGE = ")
    return json.loads(text[start : text.index(";\n", start)].replace("<\\/", "</"))


def _expected_loads(alg, g, n_q, br, policy) -> int:
    """Loads of one K_j of a key/value head, from the loop order: FlashAttention-2 (Q outer) loads K_j once per
    row block, a head's N_q rows alone (per-head: g heads of ceil(N_q/Br) blocks) or the group's g N_q rows stacked
    (packed: ceil(g N_q / Br)); FlashAttention (K/V outer) once per query head (per-head) or once (packed)."""
    if alg == "flash2":
        return g * math.ceil(n_q / br) if policy == "per-head" else math.ceil(g * n_q / br)
    return g if policy == "per-head" else 1


def _expected_readers(alg, g, n_q, br, policy) -> dict:
    """{query heads that read a load: how many loads} for one K_j: per-head each load is one head's; packed
    FlashAttention-2's row block i holds rows [i Br, (i+1) Br) of the stacked g N_q, read by the heads it overlaps."""
    if policy == "per-head":
        return {(h,): _expected_loads(alg, 1, n_q, br, policy) for h in range(g)}
    if alg == "flash1":
        return {tuple(range(g)): 1}
    out: dict = {}
    for i in range(math.ceil(g * n_q / br)):
        lo, hi = i * br, min((i + 1) * br, g * n_q)
        heads = tuple(range(lo // n_q, (hi - 1) // n_q + 1))
        out[heads] = out.get(heads, 0) + 1
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-g{c[2] // c[3]}-Nq{c[4]}")
def test_page_counts_per_group_equal_the_runs(case, tmp_path):
    """(a) The page's per-tile K/V loads of key/value head 0 and its problem totals under both policies equal an
    independent count from the loop order and the runs' own counts (iosim.run per policy, the same tiles); the
    page's size check counts the panel; the page carries the saving and says it with these numbers."""
    alg, B, hq, hkv, n_q, n_k, d, M, br, bc = case
    g = hq // hkv
    p = iosim.Problem(B=B, H_q=hq, H_kv=hkv, N_q=n_q, N_k=n_k, d_qk=d)
    kw = dict(problem=p, M=M, gqa="packed", Br=br, Bc=bc)
    path = html.page(alg, tmp_path / "gqa.html", **kw)
    assert html.page_size([alg], kw)[1] == path.stat().st_size <= html.MAX_HTML_BYTES
    gqa = _page_data(path)["schedules"][0]["gqa"]
    assert (gqa["g"], gqa["own"], gqa["heads"]) == (g, "packed", list(range(g)))
    starts = list(range(0, n_k, bc))
    total = {}
    for policy in ("per-head", "packed"):
        got = gqa["policies"][policy]
        loads = _expected_loads(alg, g, n_q, br, policy)
        readers = _expected_readers(alg, g, n_q, br, policy)
        for name in ("K", "V"):
            tiles = got["tiles"][name]
            assert [(t[0], t[1]) for t in tiles] == [(k0, min(bc, n_k - k0)) for k0 in starts]  # ragged last tile
            assert all(t[2] == loads and t[3] == loads * t[1] * d for t in tiles)
            assert all({tuple(h): n for h, n in t[4]} == readers for t in tiles)
            assert got["group"][name] == loads * n_k * d
            run = iosim.run(
                iosim.Schedule(alg, gqa=policy, Br=br, Bc=bc), problem=p, M=M, count_only=True, reference=False
            )
            assert got["problem"][name] == run.stats.per_array[name].reads == B * hkv * loads * n_k * d
        assert all(t[5] == 2 * t[3] for t in got["tiles"]["K"])  # K_j and V_j words together (d_v = d_qk)
        assert got["group_total"] == 2 * loads * n_k * d
        total[policy] = got["total"]
        assert total[policy] == 2 * B * hkv * loads * n_k * d
    saved = total["per-head"] - total["packed"]
    assert gqa["saving"]["words"] == saved > 0
    assert f"Packing saves {saved:,} words" in " ".join(gqa["text"])
    assert f"{total['per-head']:,} against {total['packed']:,}" in " ".join(gqa["text"])


def test_partner_rebuilt_from_the_run_and_no_panel_without_gqa(tmp_path):
    """schedule_page(run) rebuilds the other policy from the run (a causal problem); a problem without shared heads
    (g = 1) and a one-head run carry no panel; the page without JavaScript still shows the sentences and the tiles."""
    p = iosim.Problem(H_q=2, H_kv=1, N=20, d=4, causal=True)
    r = html.traced("flash1", problem=p, M=300, gqa="per-head")
    page = html.schedule_page(r, tmp_path / "causal.html")
    gqa = _page_data(tmp_path / "causal.html")["schedules"][0]["gqa"]
    other = html.traced("flash1", problem=p, M=300, gqa="packed", Br=r.tiling.Br, Bc=r.tiling.Bc)
    assert gqa["policies"]["packed"]["total"] == other.stats.per_array["K"].reads + other.stats.per_array["V"].reads
    assert gqa["policies"]["per-head"]["total"] == r.stats.per_array["K"].reads + r.stats.per_array["V"].reads
    noscript = page[page.index("<noscript>") : page.index("</noscript>")]
    assert "Shared K/V" in noscript and f"{gqa['saving']['words']:,} words" in noscript
    assert "K_1 (keys 0 to" in noscript
    for run in (html.traced("flash2", problem=iosim.Problem(H_q=2, N=16, d=4), M=200),
                html.traced("flash2", N=16, d=4, M=200)):  # fmt: skip
        html.schedule_page(run, tmp_path / "plain.html")
        assert "gqa" not in _page_data(tmp_path / "plain.html")["schedules"][0]


def test_gqa_page_in_the_browser(browser, tmp_path):  # noqa: F811
    """(b) The page draws the group (its g query heads joined to key/value head 0), one chip per load of every
    K_j under each policy coloured by the heads that read it, the words and the saving as the data counts them,
    and lights the tile the current event loads."""
    p = iosim.Problem(H_q=4, H_kv=1, N_q=1, N_k=45, d_qk=8)
    path = html.page("flash2", tmp_path / "decode.html", problem=p, M=400, gqa="packed", Br=4, Bc=16)
    gqa = _page_data(path)["schedules"][0]["gqa"]
    drv = _open(browser, path)
    _clean(drv)
    _fits(drv)
    css = "css selector"
    heads = drv.find_elements(css, "#gqa0 #gqa-picture rect[data-head]")
    assert len(heads) == 4
    labels = [t.text for t in drv.find_elements(css, "#gqa0 #gqa-picture text")]
    assert [f"query head {h}" for h in range(4)] == [x for x in labels if x.startswith("query head ")]
    rows = drv.find_elements(css, "#gqa0 tr[data-tile]")
    assert len(rows) == 3  # 45 keys in tiles of 16: 16, 16, 13
    for row, j in zip(rows, range(3), strict=True):
        for policy, loads, each in (("per-head", 4, ["h0", "h1", "h2", "h3"]), ("packed", 1, ["all 4"])):
            cell = row.find_element(css, f"td.loads[data-policy='{policy}']")
            chips = [c.text for c in cell.find_elements(css, ".chip")]
            assert chips == each and cell.text.startswith(f"{loads} \u00d7")
            nk = gqa["policies"][policy]["tiles"]["K"][j][1]
            words = row.find_element(css, f"td[data-policy='{policy}']:not(.loads)").text
            assert words == f"{2 * loads * nk * 8:,}"
    for key, value in (("group_total", 2 * 4 * 45 * 8), ("total", 2 * 4 * 45 * 8)):
        per = drv.find_element(css, f"#gqa0 tr[data-sum='{key}'] td[data-policy='per-head']").text
        assert per == f"{value:,}"
    saving = drv.find_element(css, "#gqa0 .saving")
    assert saving.get_attribute("data-words") == str(3 * 2 * 45 * 8)
    assert f"{3 * 2 * 45 * 8:,} words (75%)" in saving.text
    text = drv.find_element(css, "#gqa0 .gqa-text").text
    assert "K_1 is loaded 4 times, once for each of the 4 query heads" in text
    assert "K_1 is loaded once, each load read by all 4 query heads at once" in text
    # the player lights the tile the current event loads: the first K load of the page's (packed) schedule
    events = drv.execute_script(
        "const p = window.iosimPage; const out = [];"
        "for (let t = 0; t <= p.ticks(); t++) { p.go(t); out.push(p.state()[0].gqaTile); } return out;"
    )
    assert [j for j in dict.fromkeys(events) if j is not None] == [0, 1, 2]
    drv.execute_script("window.iosimPage.go(arguments[0])", events.index(1))  # the first load of K_2
    assert [r.get_attribute("data-tile") for r in drv.find_elements(css, "#gqa0 tr.current")] == ["1"]
    _shot(drv, tmp_path, "gqa")
    drv.execute_script("window.iosimPage.go(window.iosimPage.ticks())")  # the last event, a store: nothing lit
    assert drv.find_elements(css, "#gqa0 tr.current") == []
    chips = 0
    for tag, text, fg, bg in drv.execute_script(TEXT_COLOURS):  # every text, the chips' among them, 4.5:1 or more
        assert _contrast(fg, bg) >= 4.5, (tag, text, fg, bg)
        chips += tag == "SPAN.chip"
    assert chips == 3 * (4 + 1)

"""The teaching pages played in a real browser: Debian's chromium and chromium-driver, driven by Selenium (the
``browser`` extra; .ci/run installs them). One headless browser for the module; small traces.

Screenshots of each page kind go to the test's temporary folder, and to $IOSIM_FIGURES when it is set (docs/figures
keeps one of each: ``IOSIM_FIGURES=docs/figures pytest tests/test_html_browser.py``)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from iosim.pebble.game import Game, IllegalMoveError, parse
from iosim.pebble.graph import named
from iosim.views import html

By = Keys = None  # selenium's, set by the browser fixture (a skip there is a test's skip: IOSIM_CI=1 fails it)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
SIZES = {"laptop": (1280, 720), "projector": (1920, 1080)}
PEBBLE = Path(__file__).resolve().parent.parent / "docs" / "pebble"


@pytest.fixture(scope="module")
def browser():
    global By, Keys
    webdriver = pytest.importorskip("selenium.webdriver", reason="could not import 'selenium' (the browser extra)")
    if not CHROMIUM or not DRIVER:
        pytest.skip("chromium is not installed (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    profile = tempfile.mkdtemp(prefix="iosim-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
        f"--user-data-dir={profile}", "--window-size=1280,720",
    ):  # fmt: skip
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    drv = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield drv
    drv.quit()
    shutil.rmtree(profile, ignore_errors=True)


def _open(drv, path: Path, fragment: str = "", size=SIZES["laptop"]):
    drv.set_window_size(*size)
    drv.get_log("browser")
    drv.get_log("performance")
    drv.get("about:blank")
    drv.get(path.resolve().as_uri() + fragment)
    return drv


def _clean(drv) -> None:
    """No console message above INFO, and no request but the page's own file."""
    logs = [e for e in drv.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
    assert logs == []
    urls = []
    for entry in drv.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg["method"] == "Network.requestWillBeSent":
            urls.append(msg["params"]["request"]["url"])
    assert urls and all(u.startswith(("file://", "about:", "data:")) for u in urls), urls


def _fits(drv) -> None:
    """Nothing wider than the window (no horizontal scroll bar)."""
    assert drv.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")


def _shot(drv, tmp_path: Path, name: str) -> None:
    path = tmp_path / f"{name}.png"
    drv.save_screenshot(str(path))
    assert path.stat().st_size > 20_000  # a drawn page, not a blank one
    figures = os.environ.get("IOSIM_FIGURES")
    if figures:
        shutil.copy(path, Path(figures) / f"teaching-{name}.png")


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    r = html.traced("flash2", N=40, d=8, M=320)
    path = tmp_path_factory.mktemp("pages") / "flash2.html"
    html.schedule_page(r, path)
    return r, path


def test_schedule_page_counts_equal_the_trace(browser, one, tmp_path):
    r, path = one
    drv = _open(browser, path)
    _clean(drv)
    _fits(drv)
    n = len(r.trace)
    # every event, one at a time (the page's own incremental step), then the counters
    final = drv.execute_script(
        "const p = window.iosimPage; for (let t = 1; t <= p.ticks(); t++) p.go(t); return p.state()[0];"
    )
    assert final["k"] == n - 1
    per = {k: v for k, v in r.stats.per_array.items()}
    assert {k: final["reads"][k] for k in per} == {k: v.reads for k, v in per.items()}
    assert {k: final["writes"][k] for k in per} == {k: v.writes for k, v in per.items()}
    assert final["peak"] == r.stats.peak and final["resident"] == 0
    rows = drv.find_elements(By.CSS_SELECTOR, "#schedule0 table.counts tr[data-array]")
    shown = {row.get_attribute("data-array"): row.find_elements(By.TAG_NAME, "td")[1].text for row in rows}
    assert shown == {k: f"{v.reads:,}" for k, v in per.items()}
    # fast-memory occupancy at sampled events, reached forwards and backwards
    ev = r.trace.events
    for k in [*np.linspace(0, n - 1, 25).astype(int).tolist(), 7, 3, n // 2, 1]:
        st = drv.execute_script("return window.iosimPage.seekEvent(0, arguments[0]);", k)
        assert st["resident"] == int(ev[k, 7]) == sum(w for _, w in st["live"])
        assert st["peak"] == int(ev[: k + 1, 7].max())


def test_keyboard_and_fragment(browser, one, tmp_path):
    r, path = one
    drv = _open(browser, path, "#k=100")
    assert drv.execute_script("return window.iosimPage.tick()") == 100
    assert "event 100 of" in drv.find_element(By.CSS_SELECTOR, "#schedule0 .event").text
    body = drv.find_element(By.TAG_NAME, "body")
    body.send_keys(Keys.HOME)
    for _ in range(3):
        body.send_keys(Keys.ARROW_RIGHT)
    assert drv.execute_script("return window.iosimPage.tick()") == 3
    assert drv.current_url.endswith("#k=3")
    body.send_keys(Keys.ARROW_LEFT)
    assert drv.execute_script("return window.iosimPage.tick()") == 2
    # one outer iteration: to the end of the first row block, where fast memory is empty
    body.send_keys(Keys.SHIFT, Keys.ARROW_RIGHT)
    t = drv.execute_script("return window.iosimPage.tick()")
    ev = r.trace.events
    first_end = int(np.flatnonzero(ev[:, 7] == 0)[0])
    assert t == first_end + 1 and drv.current_url.endswith(f"#k={t}")
    body.send_keys(Keys.PAGE_DOWN)
    assert drv.execute_script("return window.iosimPage.tick()") == int(np.flatnonzero(ev[:, 7] == 0)[1]) + 1
    body.send_keys(Keys.PAGE_UP)
    assert drv.execute_script("return window.iosimPage.tick()") == t
    body.send_keys(Keys.END)
    assert drv.execute_script("return window.iosimPage.tick()") == len(ev)
    # play and pause
    body.send_keys(Keys.HOME)
    body.send_keys(Keys.SPACE)
    assert "pause" in drv.find_element(By.ID, "play").text
    drv.execute_script("return new Promise(r => setTimeout(r, 400))")
    body.send_keys(Keys.SPACE)
    assert "play" in drv.find_element(By.ID, "play").text
    assert drv.execute_script("return window.iosimPage.tick()") > 0
    # speed
    before = drv.find_element(By.ID, "speed").get_attribute("value")
    body.send_keys("+")
    assert int(drv.find_element(By.ID, "speed").get_attribute("value")) == int(before) + 1
    # a link to a moment, opened afresh at projector size
    drv = _open(browser, path, "#k=37", SIZES["projector"])
    assert drv.execute_script("return window.iosimPage.state()[0].k") == 36
    _fits(drv)
    _shot(drv, tmp_path, "schedule")


def test_side_by_side_and_chart(browser, tmp_path):
    runs = [html.traced(a, N=32, d=8, M=256) for a in ("standard", "flash2")]
    path = tmp_path / "side.html"
    html.schedule_page(runs, path)
    drv = _open(browser, path, "#t=100")
    _clean(drv)
    _fits(drv)
    T = drv.execute_script("return window.iosimPage.ticks()")
    assert T == max(len(r.trace) for r in runs)
    ks = [s["k"] for s in drv.execute_script("return window.iosimPage.state()")]
    assert ks == [round(100 * len(r.trace) / T) - 1 for r in runs]  # the same fraction of each schedule
    drv.find_element(By.ID, "end").click()
    for st, r in zip(drv.execute_script("return window.iosimPage.state()"), runs, strict=True):
        moved = {k: (v, st["writes"][k]) for k, v in st["reads"].items() if v or st["writes"][k]}
        assert moved == {k: (v.reads, v.writes) for k, v in r.stats.per_array.items()}
    assert drv.execute_script("return window.iosimPage.state()[0].writes.S") == runs[0].stats.per_array["S"].writes
    assert drv.execute_script("return window.iosimPage.state()[1].writes.S") == 0  # flash2: S stays on chip
    series = {e.get_attribute("data-series") for e in drv.find_elements(By.CSS_SELECTOR, "#chart polyline")}
    assert series == {"standard", "flash1", "flash2", "square-tiling", "lower", "upper"}
    marks = [e.get_attribute("data-mark") for e in drv.find_elements(By.CSS_SELECTOR, "#chart line[data-mark]")]
    assert marks == ["M = d\u00b2 = 64", "this page: M = 256"]
    lanes = drv.find_elements(By.CSS_SELECTOR, "#race .lane")
    assert [lane.find_element(By.CSS_SELECTOR, ".words").text for lane in lanes] == [
        f"{r.stats.total:,} of {r.stats.total:,} words" for r in runs
    ]
    drv.execute_script("window.iosimPage.go(arguments[0])", T // 2)
    _shot(drv, tmp_path, "side-by-side")


def _python_verdict(spec: str, M: int, moves) -> dict:  # noqa: N803
    g = named(spec)
    game = Game(g, M)
    try:
        o = game.play([tuple(m) for m in moves])
    except IllegalMoveError as e:
        return {"legal": False, "step": e.step, "rule": e.rule, "vertex": e.vertex, "reason": e.reason}
    return {"legal": True, "io": o.io, "reads": o.reads, "writes": o.writes, "computes": o.computes,
            "peak": o.peak, "complete": o.complete, "missing": o.missing}  # fmt: skip


def _broken(moves: list, spec: str) -> list[list]:
    """Move lists that break the rules in every way the checker knows, made from a solution."""
    g = named(spec)
    out = []
    for k in sorted({1, 2, len(moves) // 3, len(moves) // 2, len(moves) - 2}):  # a move dropped
        out.append(moves[:k] + moves[k + 1 :])
    for k in (0, len(moves) // 2):  # two moves swapped
        out.append(moves[:k] + [moves[k + 1], moves[k]] + moves[k + 2 :])
    first_in, out_v = g.names[g.inputs[0]], g.names[g.outputs[0]]
    out += [
        [["R3", first_in]],  # an input computed
        [["R4", first_in]],  # nothing to remove
        [["R2", first_in]],  # nothing red to write
        [["R1", out_v]],  # no blue pebble to read
        [["R3", out_v]],  # parents not red
        moves[: len(moves) // 2],  # legal but unfinished
        [["R1", g.names[v]] for v in g.inputs],  # more reds than M (when the inputs outnumber M)
        moves + moves[:3],  # a reload of a red vertex: legal, and it counts
    ]
    return out


def test_pebble_page_rules_equal_the_checker(browser, tmp_path):
    games = html.exercises(PEBBLE)
    path = tmp_path / "pebble.html"
    html.pebble_page(games, path, optimum_states=2000)
    drv = _open(browser, path)
    _clean(drv)
    _fits(drv)
    cases = 0
    for i, (spec, _M, sol) in enumerate(games):
        g = named(spec)
        solution = [[m.rule, g.names[m.vertex]] for m in parse(Path(sol).read_text(), g)]
        # the solution on its own graph, and on every other game with the same graph (another M)
        lists = [(i, solution)] + [(j, solution) for j, (s2, _, _) in enumerate(games) if s2 == spec and j != i]
        lists += [(i, b) for b in _broken(solution, spec)]
        for j, moves in lists:
            page = drv.execute_script("return window.iosimPebble.replay(arguments[0], arguments[1]);", j, moves)
            page.pop("message", None)
            page.pop("moves", None)
            assert page == _python_verdict(games[j][0], games[j][1], moves), (games[j][:2], moves[:5])
            cases += 1
    assert cases >= 50
    verdicts = {drv.execute_script("return window.iosimPebble.replay(arguments[0], arguments[1]).legal", i, b)
                for i, (spec, _, sol) in enumerate(games[:1])
                for b in _broken([[m.rule, named(spec).names[m.vertex]] for m in parse(Path(sol).read_text(),
                                                                                      named(spec))], spec)}  # fmt: skip
    assert verdicts == {True, False}  # the broken lists include both kinds


def test_pebble_page_plays_by_clicking(browser, tmp_path):
    games = html.exercises(PEBBLE)[:1]  # matmul:1x2x1, M = 3
    path = tmp_path / "pebble1.html"
    html.pebble_page(games, path)
    drv = _open(browser, path)
    body = drv.find_element(By.TAG_NAME, "body")

    def vertex(name):
        return drv.find_element(By.CSS_SELECTOR, f'#board g[data-name="{name}"]')

    vertex("A[0,0]").click()
    body.send_keys("1")
    assert drv.find_element(By.ID, "log").text == "1. R1 A[0,0]"
    vertex("prod(C[0,0],k=0)").click()
    body.send_keys("3")  # B[0,0] is not red: refused with the checker's message
    g = named("matmul:1x2x1")
    try:
        Game(g, 3).play([("R1", "A[0,0]"), ("R3", "prod(C[0,0],k=0)")])
    except IllegalMoveError as e:
        want = str(e)
    assert drv.find_element(By.ID, "verdict").text.startswith(want)
    assert drv.find_element(By.ID, "log").text == "1. R1 A[0,0]"
    drv.find_element(By.ID, "best").click()
    assert "optimum" in drv.find_element(By.ID, "verdict").text and "7 I/O" in drv.find_element(By.ID, "verdict").text
    assert "every output is blue" not in drv.find_element(By.ID, "verdict").text
    n = len(drv.execute_script("return PAGE.games[0].best.moves"))
    assert f"moves {n}; I/O 7" in drv.find_element(By.ID, "status").text
    drv.find_element(By.ID, "undo").click()
    assert f"moves {n - 1};" in drv.find_element(By.ID, "status").text
    drv.find_element(By.ID, "solution").click()
    _fits(drv)
    _shot(drv, tmp_path, "pebble")

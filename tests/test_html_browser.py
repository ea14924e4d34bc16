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
    # chrome:// and chrome-untrusted:// are the browser's own new-tab page still loading at start (no page can
    # request them); anything else, http(s) above all, would be the page leaving the machine
    own = ("chrome://", "chrome-untrusted://")
    urls = [u for u in urls if not u.startswith(own)]
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
    assert final["blocksDone"] == -(-40 // r.tiling.Br) * -(-40 // r.tiling.Bc)  # every block of S = Q K^T drawn
    rows = drv.find_elements(By.CSS_SELECTOR, "#schedule0 table.counts tr[data-array]")
    shown = {row.get_attribute("data-array"): row.find_elements(By.TAG_NAME, "td")[1].text for row in rows}
    assert shown == {k: f"{v.reads:,}" for k, v in per.items()}
    # fast-memory occupancy at sampled events, reached forwards and backwards
    ev = r.trace.events
    for k in [*np.linspace(0, n - 1, 25).astype(int).tolist(), 7, 3, n // 2, 1]:
        st = drv.execute_script("return window.iosimPage.seekEvent(0, arguments[0]);", k)
        assert st["resident"] == int(ev[k, 7]) == sum(w for _, w in st["live"])
        assert st["peak"] == int(ev[: k + 1, 7].max())
    # the event's tile is lit in fast memory too (a load or alloc: the tile it brought in)
    k = int(np.flatnonzero(ev[:, 0] == 1)[3])
    drv.execute_script("window.iosimPage.go(arguments[0])", k + 1)
    lit = drv.find_elements(By.CSS_SELECTOR, "#schedule0 .fast .tile.current")
    assert [e.text for e in lit] == [r.trace.names[ev[k, 1]]]
    assert lit[0].get_attribute("title").endswith(f"{int(ev[k, 6])} words")


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
    assert _wait(drv, "return window.location.hash === '#k=3'")  # the fragment follows within FRAGMENT_MS
    body.send_keys(Keys.ARROW_LEFT)
    assert drv.execute_script("return window.iosimPage.tick()") == 2
    # one outer iteration: to the end of the first row block, where fast memory is empty
    body.send_keys(Keys.SHIFT, Keys.ARROW_RIGHT)
    t = drv.execute_script("return window.iosimPage.tick()")
    ev = r.trace.events
    first_end = int(np.flatnonzero(ev[:, 7] == 0)[0])
    assert t == first_end + 1 and _wait(drv, f"return window.location.hash === '#k={t}'")
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
    # outer-iteration keys stop where any schedule ends one (issue 46: they followed the first schedule only)
    # at tick t a schedule of n events shows event round(t n / T) - 1: event k is done from t = ceil((k + 1/2) T / n)
    ends = sorted({-(-(2 * int(k) + 1) * T // (2 * len(r.trace)))
                   for r in runs for k in np.flatnonzero(r.trace.events[:, 7] == 0)})  # fmt: skip
    drv.execute_script("window.iosimPage.go(0)")
    body = drv.find_element(By.TAG_NAME, "body")
    for want in ends[:4]:
        body.send_keys(Keys.PAGE_DOWN)
        assert drv.execute_script("return window.iosimPage.tick()") == want
    body.send_keys(Keys.PAGE_UP)
    assert drv.execute_script("return window.iosimPage.tick()") == ends[2]
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


# ---------------------------------------------------------------------------------------------------------------
# Issue 46: the defects a class would hit
# ---------------------------------------------------------------------------------------------------------------
PHONE = (390, 844)


def _phone(drv, on: bool) -> None:
    """A 390 x 844 phone screen (device metrics as Chromium's device mode sets them), or back to the window."""
    if on:
        metrics = {"width": PHONE[0], "height": PHONE[1], "deviceScaleFactor": 2, "mobile": True}
        drv.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    else:
        drv.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def _wait(drv, script: str, timeout: float = 3.0):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(drv, timeout, poll_frequency=0.05).until(lambda d: d.execute_script(script))


def test_fragment_follows_fast_play(browser, tmp_path):
    """Defect 3: after fast play and pause the URL fragment names the event the page shows (Chromium ignores
    history.replaceState past about 200 calls in 10 s: the page has to play past 200 events)."""
    r = html.traced("flash2", N=96, d=8, M=256)
    path = tmp_path / "fast.html"
    html.schedule_page(r, path)
    drv = _open(browser, path)
    drv.execute_script("const s = document.getElementById('speed'); s.value = 8; s.dispatchEvent(new Event('change'));")
    drv.find_element(By.ID, "play").click()
    # pause from inside the page the moment it passes event 100 (a round trip through the driver can miss it)
    _wait(drv, "if (window.iosimPage.tick() <= 400) return false; document.getElementById('play').click(); return true",
          timeout=20)  # fmt: skip
    t = drv.execute_script("return window.iosimPage.tick()")
    assert 400 < t < len(r.trace)  # it played fast (speed 500 events a second) and stopped before the end
    assert _wait(drv, f"return window.location.hash === '#k={t}'")
    # 300 steps at key-repeat speed and faster: one history update each would pass the browser's limit
    drv.execute_script(
        "for (let i = 0; i < 300; i++) document.dispatchEvent(new KeyboardEvent('keydown', {key: 'ArrowRight'}));"
    )
    assert drv.execute_script("return window.iosimPage.tick()") == t + 300
    assert _wait(drv, f"return window.location.hash === '#k={t + 300}'")


def _reads_per_word(r) -> dict:
    """The most times any word of each array is read and written, from the trace's events (a small model here)."""
    out = {}
    ev = r.trace.events
    for a, name in enumerate(r.trace.names):
        shape = r.trace.shapes[name]
        rd, wr = np.zeros(shape, int), np.zeros(shape, int)
        for op, _, r0, nr, c0, nc in ev[ev[:, 1] == a][:, :6].tolist():
            if op == 1:
                rd[r0 : r0 + nr, c0 : c0 + nc] += 1
            elif op == 2:
                wr[r0 : r0 + nr, c0 : c0 + nc] += 1
            elif op == 5:
                wr += 1
        out[name] = (int(rd.max(initial=0)), int(wr.max(initial=0)))
    return out


def test_one_shading_scale_and_writes_drawn(browser, tmp_path):
    """Defects 4 and 5: one scale of words moved per word for every array of both schedules, so Q (read once) is
    lighter than K (read Tr times); standard attention's S is drawn as it is written."""
    runs = [html.traced(a, N=32, d=8, M=256) for a in ("standard", "flash2")]
    path = tmp_path / "scale.html"
    html.schedule_page(runs, path)
    drv = _open(browser, path)
    per = [_reads_per_word(r) for r in runs]
    want = max(max(v) for p in per for v in p.values())
    drv.find_element(By.ID, "end").click()
    states = drv.execute_script("return window.iosimPage.state()")
    assert {s["scale"] for s in states} == {want}
    f2 = states[1]["heat"]
    assert max(f2["Q"][0]) == per[1]["Q"][0] == 1 and max(f2["K"][0]) == per[1]["K"][0] == -(-32 // runs[1].tiling.Br)

    def alpha(i, name, y):  # the shade's opacity at the middle column, y as a fraction of the canvas height
        return drv.execute_script(
            "const c = document.querySelector('#schedule' + arguments[0] + ' canvas[data-array=\"' + arguments[1]"
            " + '\"]'); const x = Math.floor(c.width / 2), y = Math.floor(c.height * arguments[2]);"
            "const p = c.getContext('2d').getImageData(x, y, 1, 1).data;"
            "return 255 - Math.min(p[0], p[1], p[2]);", i, name, y)  # fmt: skip

    assert alpha(1, "Q", 0.5) < alpha(1, "K", 0.5)  # read once against Tr times, on one scale
    s_cell = 1 / 32  # S is 32 x 32: the lower half of its first row's cells holds the writes
    assert states[0]["writes"]["S"] == runs[0].stats.per_array["S"].writes > 0
    assert max(states[0]["heat"]["S"][1]) == per[0]["S"][1] == 1 and alpha(0, "S", 0.5 + 0.75 * s_cell) > 0
    drv.execute_script("window.iosimPage.go(0)")
    assert alpha(0, "S", 0.5 + 0.75 * s_cell) == 0


def test_split_kv_table_holds_every_array(browser, tmp_path):
    """Defect 8: the split-KV page's table lists the combine kernel's O and L, and its problem column sums to the
    problem's total."""
    import iosim

    r = html.traced("flash2", problem=iosim.Problem(B=2, H_q=2, N_q=1, N_k=40, d_qk=4), M=256, splits=2)
    path = tmp_path / "split.html"
    html.schedule_page(r, path)
    drv = _open(browser, path)
    rows = drv.find_elements(By.CSS_SELECTOR, "#schedule0 table.counts tr[data-array]")
    names = [row.get_attribute("data-array") for row in rows]
    assert {"O", "L"} <= set(names) and set(r.stats.per_array) <= set(names)
    total = drv.find_element(By.CSS_SELECTOR, "#schedule0 table.counts tr[data-total]").find_elements(By.TAG_NAME, "td")
    assert total[4].text == f"{r.stats.reads:,} / {r.stats.writes:,}"


def test_phone_layout(browser, one, tmp_path):
    """Defect 9: at 390 x 844 neither page is wider than the screen and every counter is on screen."""
    _r, path = one
    games = html.exercises(PEBBLE)[:1]
    pebble = tmp_path / "pebble-phone.html"
    html.pebble_page(games, pebble)
    try:
        for page in (path, pebble):
            drv = _open(browser, page)
            _phone(drv, True)
            drv.get(page.resolve().as_uri() + "#k=50")
            assert drv.execute_script("return window.innerWidth") == PHONE[0]
            _fits(drv)
            right = drv.execute_script(
                "const all = document.querySelectorAll('table.counts td, #status, #board, .controls button');"
                "return Math.max(...[...all].map(e => e.getBoundingClientRect().right))"
            )
            assert right <= PHONE[0]
        _shot(drv, tmp_path, "pebble-phone")
    finally:
        _phone(browser, False)


def test_pebble_keyboard_play(browser, tmp_path):
    """Defect 10: Tab reaches the vertices; Enter selects one and a key plays a rule on it."""
    path = tmp_path / "pebble-keys.html"
    html.pebble_page(html.exercises(PEBBLE)[:1], path)
    drv = _open(browser, path)
    body = drv.find_element(By.TAG_NAME, "body")
    body.click()
    first = None
    for _ in range(40):
        drv.switch_to.active_element.send_keys(Keys.TAB)
        first = drv.switch_to.active_element.get_attribute("data-name")
        if first:
            break
    assert first == named("matmul:1x2x1").names[0]  # A[0,0]: the first vertex in Tab order
    drv.switch_to.active_element.send_keys(Keys.ENTER)
    drv.switch_to.active_element.send_keys("1")
    assert drv.find_element(By.ID, "log").text == f"1. R1 {first}"
    assert drv.switch_to.active_element.get_attribute("data-name") == first  # the focus stays after the redraw
    drv.switch_to.active_element.send_keys(Keys.TAB)
    second = drv.switch_to.active_element.get_attribute("data-name")
    drv.switch_to.active_element.send_keys(" ")
    drv.switch_to.active_element.send_keys("1")
    assert drv.find_element(By.ID, "log").text == f"1. R1 {first}\n2. R1 {second}"


def test_no_javascript(browser, one):
    """Defect 11: with JavaScript off the page says so and shows the final counts."""
    r, path = one
    browser.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": True})
    try:
        drv = _open(browser, path)
        text = drv.find_element(By.TAG_NAME, "main").text
    finally:
        browser.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": False})
    assert "JavaScript" in text
    for name, v in r.stats.per_array.items():
        assert f"{name} {v.reads:,} {v.writes:,}" in text
    assert f"total {r.stats.total:,} words" in text


def _contrast(fg, bg) -> float:
    """WCAG 2.x contrast ratio of two rgb triples (0-255)."""

    def lum(c):
        v = [x / 255 for x in c]
        v = [x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4 for x in v]
        return 0.2126 * v[0] + 0.7152 * v[1] + 0.0722 * v[2]

    a, b = sorted((lum(fg), lum(bg)))
    return (b + 0.05) / (a + 0.05)


TEXT_COLOURS = """
const rgb = s => (s.match(/[\\d.]+/g) || []).map(Number);
const bgOf = e => {
  for (; e; e = e.parentElement) {
    const c = rgb(getComputedStyle(e).backgroundColor);
    if (c.length && (c.length < 4 || c[3] > 0)) return c.slice(0, 3);
  }
  return [255, 255, 255];
};
const out = [];
for (const e of document.querySelectorAll('body *')) {
  if (!e.childNodes.length || ![...e.childNodes].some(n => n.nodeType === 3 && n.textContent.trim())) continue;
  if (!e.getClientRects().length) continue;
  const st = getComputedStyle(e), svgText = e instanceof SVGElement;
  out.push([e.tagName + '.' + (e.getAttribute('class') || ''), e.textContent.trim().slice(0, 30),
    rgb(svgText ? st.fill : st.color).slice(0, 3), svgText ? [255, 255, 255] : bgOf(e)]);
}
return out;
"""


def test_small_labels_contrast(browser, tmp_path):
    """Defect 12: every text on the pages, the fast-memory tiles' labels and the chart's among them, has at least
    4.5:1 contrast with what is behind it (WCAG 2 AA for small text), computed here from the page's colours."""
    runs = [html.traced(a, N=32, d=8, M=256) for a in ("standard", "flash2")]
    path = tmp_path / "contrast.html"
    html.schedule_page(runs, path)
    drv = _open(browser, path)
    seen = set()
    for t in range(0, drv.execute_script("return window.iosimPage.ticks()"), 7):  # tiles of every array go by
        drv.execute_script("window.iosimPage.go(arguments[0])", t)
        for tag, text, fg, bg in drv.execute_script(TEXT_COLOURS):
            if (tag, tuple(fg), tuple(bg)) not in seen:
                seen.add((tag, tuple(fg), tuple(bg)))
                assert _contrast(fg, bg) >= 4.5, (tag, text, fg, bg)
    assert any(tag.startswith("DIV.tile") for tag, _, _ in seen) and any(tag.startswith("text") for tag, _, _ in seen)


def test_grid_page_controls_narration_and_questions(browser, tmp_path):
    """Issue 46: N, d and M changed on the page (each a real trace): the counters follow the setting picked, a
    setting iosim refuses shows its reason, the fragment keeps the setting; the narrated argument's numbers and the
    questions' answers are this setting's trace's (counted here from the events)."""
    from selenium.webdriver.support.ui import Select

    path = tmp_path / "grid.html"
    html.grid_page(["standard", "flash2"], path, Ns=[32, 48], ds=[8], Ms=[32, 256, 512])
    drv = _open(browser, path, "#N=48&d=8&M=512")
    assert drv.execute_script("return window.iosimPage.setting({})") == {"N": 48, "d": 8, "M": 512, "mask": "none"}
    for n, m in ((32, 256), (48, 256), (48, 512)):
        Select(drv.find_element(By.ID, "set-N")).select_by_value(str(n))
        Select(drv.find_element(By.ID, "set-M")).select_by_value(str(m))
        drv.find_element(By.ID, "end").click()
        runs = [html.traced(a, N=n, d=8, M=m) for a in ("standard", "flash2")]
        for st, r in zip(drv.execute_script("return window.iosimPage.state()"), runs, strict=True):
            assert {k: [v, st["writes"][k]] for k, v in st["reads"].items() if v or st["writes"][k]} == {
                k: [v.reads, v.writes] for k, v in r.stats.per_array.items()
            }
        assert _wait(drv, f"return window.location.hash.startsWith('#N={n}&d=8&M={m}&')")
        # the narration, from flash2's trace: blocks, row blocks, loads of K_1, K's words
        ev, names = runs[1].trace.events, runs[1].trace.names
        kq, kk = names.index("Q"), names.index("K")
        q_loads = ev[(ev[:, 0] == 1) & (ev[:, 1] == kq)]
        k_loads = ev[(ev[:, 0] == 1) & (ev[:, 1] == kk)]
        Tr, k1, kwords = len(set(q_loads[:, 2].tolist())), int((k_loads[:, 2] == 0).sum()), int(k_loads[:, 6].sum())  # noqa: N806
        steps = dict(drv.execute_script("return window.iosimStory.steps()"))
        assert f"Br = {q_loads[0, 3]}, Bc = {k_loads[0, 3]}" in steps["Why Br \u2248 M/(4d)"]
        assert f"= {Tr} row blocks" in steps["How often each K_j is read"]
        assert (
            f"K is read {kwords:,} words in all; Tr\u00b7N\u00b7d = {Tr} \u00b7 {n} \u00b7 8 = {Tr * n * 8:,}"
            in steps["The total against Tr\u00b7N\u00b7d"]
        )
        assert (
            f"of M = {m:,} words" in steps["What fits in M"]
            and f": {int(ev[:, 7].max()):,} of M" in steps["What fits in M"]
        )
        for qid, right in (("tr", Tr), ("k1", k1), ("kwords", kwords)):
            box = drv.find_element(By.ID, f"answer-{qid}")
            box.clear()
            box.send_keys(str(right + 1))
            drv.find_element(By.ID, f"check-{qid}").click()
            assert drv.find_element(By.ID, f"verdict-{qid}").text.startswith("not yet")
            box.clear()
            box.send_keys(f"{right:,}")
            drv.find_element(By.ID, f"check-{qid}").click()
            assert drv.find_element(By.ID, f"verdict-{qid}").text == f"right: the trace says {right:,}"
    drv.find_element(By.ID, "story-next").click()
    assert "1 of 5" not in drv.find_element(By.ID, "story").text and "2 of 5" in drv.find_element(By.ID, "story").text
    drv.execute_script("document.getElementById('narration').scrollIntoView()")
    _shot(drv, tmp_path, "explore")
    Select(drv.find_element(By.ID, "set-M")).select_by_value("32")  # below flash2's smallest working set at d = 8
    assert "M must be at least" in drv.find_element(By.ID, "refused").text
    _fits(drv)


def test_pebble_optimum_stepped_move_by_move(browser, tmp_path):
    """Issue 46: iosim's best schedule stepped one move at a time, each move the checker's, ending at its I/O."""
    path = tmp_path / "pebble-step.html"
    html.pebble_page(html.exercises(PEBBLE)[:1], path)
    drv = _open(browser, path)
    best = drv.execute_script("return PAGE.games[0].best")
    g = named("matmul:1x2x1")
    for i in range(len(best["moves"])):
        drv.find_element(By.ID, "best-step").click() if i % 2 else drv.find_element(By.TAG_NAME, "body").send_keys("n")
        assert (
            drv.find_element(By.ID, "log").text.splitlines()[-1]
            == f"{i + 1}. {best['moves'][i][0]} {best['moves'][i][1]}"
        )
    o = Game(g, 3).play([tuple(m) for m in best["moves"]])
    assert (
        f"I/O {o.io} " in drv.find_element(By.ID, "status").text
        and f"done, {o.io} I/O" in drv.find_element(By.ID, "verdict").text
    )
    assert o.complete and "every output is blue" not in drv.find_element(By.ID, "verdict").text


def test_exercise_page(browser, tmp_path):
    """Issue 46: a student's numba.cuda kernel's page: its counts beside iosim's schedule and the bound, and the
    verdict (the starter of exercise 1 re-reads X: not yet)."""
    pytest.importorskip("numba.cuda")
    from iosim.views import exercises

    path = tmp_path / "exercise.html"
    d = exercises.check("softmax", "docs/exercises/softmax_starter.py", path, R=4, C=16)
    drv = _open(browser, path)
    _clean(drv)
    assert drv.find_element(By.ID, "verdict").text.startswith("not yet: correct, but it moves 256 words")
    row = drv.find_element(By.CSS_SELECTOR, '#traffic tr[data-array="X"]').find_elements(By.TAG_NAME, "td")
    assert [c.text for c in row] == ["X", f"{3 * 4 * 16:,} / 0", f"{4 * 16} / 0", f"{4 * 16} / 0"]
    assert d["total"] == 256
    _fits(drv)

"""Teaching pages: one self-contained HTML file per page, built from real traces (``iosim show ... --html``).

Three kinds of page, each one file with its scripts, styles and data inline (no server, no network, no CDN; the
scripts are iosim's own, in ``iosim/views/page/``, plain JavaScript with no third-party code):

* **schedule** (:func:`schedule_page` with one run): the slow-memory arrays as grids shaded by the reads so far,
  the current event's tile outlined, the live tiles dashed; fast memory as a bar of M words holding the live
  tiles coloured by array, with the occupancy and the peak; per-array read and write counters that climb as the
  trace plays, beside the trace's final counts, the closed form's counts and the lower bounds; the paper's step of
  the event where the algorithm has numbered steps (:data:`PAPER_STEPS`); play/pause, speed, one event and one
  outer iteration back and forth, a scrubber and keyboard shortcuts; the URL fragment (``#k=EVENT``) keeps the
  position. Over a problem (batch, heads, GQA, decoding, split-KV) the page plays the first thread block's
  schedule (:func:`thread_block`) with the problem's simulated and closed-form totals beside it. With GQA (query
  heads sharing a key/value head) it draws key/value head 0 with the query heads that read each of its tiles and
  each tile's loads under per-head and packed GQA, from this run's trace and a second traced run under the other
  policy with the same tiles (:mod:`iosim.views.shared_kv`, ``page/gqa.js``).
* **side by side** (:func:`schedule_page` with several runs): the schedules advance together by fraction of their
  events, with a chart of total words against M for every registered algorithm from the closed forms (computed
  when the page is built), the page's M marked, the d^2 crossover and the lower and upper bounds drawn (inline SVG).
* **pebble** (:func:`pebble_page`): the red-blue pebble game on small graphs, played by clicking; the page
  enforces the rules of :class:`iosim.pebble.game.Game` (a test replays solutions and broken move lists through
  both), counts I/O and shows iosim's optimum (or, past the search's reach, its greedy schedule) on request.

An outer iteration (the unit of the page's big steps) is the stretch of events between two moments at which fast
memory is empty: one row block of FlashAttention-2, one column block of FlashAttention, one output tile of a
product in standard attention.

Caps (:func:`check_fits`): a page holds at most :data:`MAX_EVENTS` events and :data:`MAX_HTML_BYTES` bytes of
HTML; a larger request is refused in one line naming the largest N that fits at that d and M.
"""

from __future__ import annotations

import dataclasses
import json
import re
from importlib import resources
from pathlib import Path

import numpy as np

from iosim.base import outputs
from iosim.base.errors import InputError
from iosim.memory_model.core import INIT, LOAD

MAX_EVENTS = 20_000  # events a page holds (all its schedules together)
MAX_HTML_BYTES = 3_000_000  # bytes of one page's HTML
MAX_PEBBLE_VERTICES = 1_200  # vertices of one pebble game's graph (a board a class can read and click)
MAX_GRID = 40  # cells per side of a drawn array (larger arrays are drawn in cells of several words)
SUFFIXES = (".html",)

# The paper's step numbers of a forward pass's events, by (op, array): FlashAttention Algorithm 1 (Dao et al.,
# 2022), FlashAttention-2 Algorithm 1 (Dao, 2023), standard attention Algorithm 0. A free has no step of its own (the
# papers never free a tile: it is overwritten by the next load). Arrays and passes not listed have no step number.
PAPER_STEPS = {
    ("flash1", "forward"): {
        ("init", "O"): (2, "initialise O = 0, l = 0, m = -inf in HBM"),
        ("init", "l"): (2, "initialise O = 0, l = 0, m = -inf in HBM"),
        ("init", "m"): (2, "initialise O = 0, l = 0, m = -inf in HBM"),
        ("load", "K"): (6, "load K_j, V_j from HBM to on-chip SRAM"),
        ("load", "V"): (6, "load K_j, V_j from HBM to on-chip SRAM"),
        ("load", "Q"): (8, "load Q_i, O_i, l_i, m_i from HBM to on-chip SRAM"),
        ("load", "O"): (8, "load Q_i, O_i, l_i, m_i from HBM to on-chip SRAM"),
        ("load", "l"): (8, "load Q_i, O_i, l_i, m_i from HBM to on-chip SRAM"),
        ("load", "m"): (8, "load Q_i, O_i, l_i, m_i from HBM to on-chip SRAM"),
        ("alloc", "S"): (9, "on chip, compute S_ij = Q_i K_j^T"),
        ("store", "O"): (12, "write O_i to HBM"),
        ("store", "l"): (13, "write l_i, m_i to HBM"),
        ("store", "m"): (13, "write l_i, m_i to HBM"),
    },
    ("flash2", "forward"): {
        ("load", "Q"): (4, "load Q_i from HBM to on-chip SRAM"),
        ("alloc", "O"): (5, "on chip, initialise O_i = 0, l_i = 0, m_i = -inf"),
        ("alloc", "L"): (5, "on chip, initialise O_i = 0, l_i = 0, m_i = -inf"),
        ("alloc", "m"): (5, "on chip, initialise O_i = 0, l_i = 0, m_i = -inf"),
        ("load", "K"): (7, "load K_j, V_j from HBM to on-chip SRAM"),
        ("load", "V"): (7, "load K_j, V_j from HBM to on-chip SRAM"),
        ("alloc", "S"): (8, "on chip, compute S_ij = Q_i K_j^T (then m_i, P_ij, l_i and O_i: steps 9-10)"),
        ("store", "O"): (14, "write O_i to HBM"),
        ("store", "L"): (15, "write L_i = m_i + log(l_i) to HBM"),
    },
    ("standard", "forward"): {
        ("load", "Q"): (1, "S = Q K^T (a tiled product, S written to HBM)"),
        ("load", "K"): (1, "S = Q K^T (a tiled product, S written to HBM)"),
        ("alloc", "S"): (1, "S = Q K^T (a tiled product, S written to HBM)"),
        ("store", "S"): (1, "S = Q K^T (a tiled product, S written to HBM)"),
        ("load", "S"): (2, "P = softmax(S), read from and written to HBM"),
        ("store", "P"): (2, "P = softmax(S), read from and written to HBM"),
        ("alloc", "m"): (2, "P = softmax(S), read from and written to HBM"),
        ("load", "P"): (3, "O = P V (a tiled product, O written to HBM)"),
        ("load", "V"): (3, "O = P V (a tiled product, O written to HBM)"),
        ("alloc", "O"): (3, "O = P V (a tiled product, O written to HBM)"),
        ("store", "O"): (3, "O = P V (a tiled product, O written to HBM)"),
    },
}
OPS = ("", "load", "store", "alloc", "free", "init")


def _asset(name: str) -> str:
    return resources.files("iosim.views").joinpath("page", name).read_text(encoding="utf-8")


def _script_json(data) -> str:
    """JSON safe inside a <script> element (no '</' can close it)."""
    return json.dumps(data, separators=(",", ":")).replace("</", "<\\/")


def render(kind: str, title: str, data: dict) -> str:
    """The page: the template with its styles, scripts and data inline."""
    html = _asset("page.html")
    scripts = {"schedule": ["common.js", "gqa.js", "schedule.js"], "pebble": ["common.js", "pebble.js"],
               "exercise": ["common.js", "exercise.js"]}[kind]  # fmt: skip
    js = "\n".join(_asset(s) for s in scripts)
    from iosim.base.version import __version__

    for key, value in (
        ("/*STYLE*/", _asset("style.css")),
        ("/*SCRIPT*/", js),
        ("/*DATA*/", f"const PAGE = {_script_json({**data, 'kind': kind, 'version': __version__})};"),
        ("<!--TITLE-->", _escape(title)),
        ("<!--NOSCRIPT-->", _noscript(kind, data)),
    ):
        html = html.replace(key, value)
    return html


def _escape(text) -> str:
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _table(head: list, rows: list) -> str:
    cells = "".join(f"<th>{_escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{_escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="counts"><tr>{cells}</tr>{body}</table>'


def _noscript(kind: str, data: dict) -> str:
    """What the page shows with JavaScript off: a line saying the player needs it, and the page's final numbers
    as plain HTML (per-array counts beside the closed form and the bounds; the pebble games' best schedules)."""
    parts = ['<p class="verdict bad">This page plays its trace with JavaScript, which is off: the final numbers '
             "are below; turn JavaScript on to step through the events.</p>"]  # fmt: skip
    if kind == "exercise":
        rows = [[a, *(f"{v[0]:,} / {v[1]:,}" for v in (data["kernel"][a], data["schedule"][a], data["bound"][a]))]
                for a in data["kernel"]]  # fmt: skip
        parts.append(_table(["array", "your kernel", "iosim's schedule", "lower bound"], rows))
        parts.append(f"<p>{'passed' if data['passed'] else 'not yet'}</p>")
        return "".join(parts)
    if kind == "pebble":
        for g in data["games"]:
            b = g["best"]
            parts.append(f"<h2>{_escape(g['graph'])}, M = {g['M']}: iosim's {_escape(b['how'])}, {b['io']} I/O</h2>")
            parts.append(f'<div class="moves">{_escape(" ".join(f"{r} {v}" for r, v in b["moves"]))}</div>')
        return "".join(parts)
    schedules = data.get("schedules")
    if schedules is None:  # a grid page: the first setting that runs
        first = next((x for x in data["grid"]["settings"] if "schedules" in x), {"schedules": []})
        parts.append(f"<p>The setting N = {first.get('N')}, d = {first.get('d')}, M = {first.get('M')}:</p>")
        schedules = first["schedules"]
    for s in schedules:
        cf = s["closed_form"] or {}
        rows = [[n, f"{s['simulated'].get(n, [0, 0])[0]:,}", f"{s['simulated'].get(n, [0, 0])[1]:,}",
                 " / ".join(f"{x:,}" for x in cf[n]) if n in cf else "-"] for n in s["rows"]]  # fmt: skip
        t = s["totals"]
        parts.append(f"<h2>{_escape(s['title'])}</h2>")
        parts.append(_table(["array", "reads", "writes", "closed form"], rows))
        parts.append(f"<p>total {t['reads'] + t['writes']:,} words, peak {t['peak']:,} of M = {s['M']:,}</p>")
        parts.append("<ul>" + "".join(f"<li>lower bound {v:,.0f} words: {_escape(n)}</li>" for n, v in s["bounds"]))
        parts.append("</ul>")
        if s.get("gqa"):
            parts.append(_noscript_gqa(s["gqa"]))
    return "".join(parts)


def _noscript_gqa(g: dict) -> str:
    """GQA's shared K/V as plain HTML: the sentences and, per policy, each K tile's loads and words."""
    parts = [f"<h2>Shared K/V: key/value head 0 and its {g['g']} query heads</h2>"]
    parts += [f"<p>{_escape(t)}</p>" for t in g["text"]]
    names = [n for n in ("per-head", "packed") if n in g["policies"]]
    by = {n: {(t[0], t[1]): t for t in g["policies"][n]["tiles"].get("K", [])} for n in names}
    rows = []
    for j, (k0, nk) in enumerate(sorted(set().union(*by.values()))):
        row = [f"K_{j + 1} (keys {k0} to {k0 + nk - 1})"]
        row += [f"{by[n][k0, nk][2]:,} loads, {by[n][k0, nk][3]:,} words" if (k0, nk) in by[n] else "-" for n in names]
        rows.append(row)
    parts.append(_table(["tile", *names], rows))
    return "".join(parts)


# ---------------------------------------------------------------------------------------------------------------
# Schedules
# ---------------------------------------------------------------------------------------------------------------
def thread_block(r) -> tuple[int, int, int]:
    """(start, end, blocks): the events [start, end) of the thread block the page plays, and the number of thread
    blocks of the pass ((0, all events, 1) for one head).

    Over a problem the schedules run their thread blocks one after another. FlashAttention-2's forward (one block
    per row block and KV split) holds Q_i, O_i until its block ends, so its first block ends where fast memory is
    first empty. FlashAttention's forward (one block per query head, or per KV head packed) ends before the first
    load of Q rows that belong to the next head. The backward passes (one block per column block, K_j, V_j held)
    start with preprocessing kernels (D = rowsum(dO o O), dQ zeroed): the page plays the first stretch between two
    empty fast memories that loads K, the main kernel's first block."""
    ev = r.trace.events
    n = len(ev)
    p = r.problem
    if p is None or p.is_single or n == 0:
        return 0, n, 1
    backward = "backward" in r.passes
    blocks = int(r.schedule.get("backward_thread_blocks" if backward else "thread_blocks") or 1)
    empty = np.flatnonzero((ev[:, 7] == 0) & (ev[:, 0] != INIT))
    ends = [*(int(k) + 1 for k in empty), n] if not len(empty) or empty[-1] != n - 1 else [int(k) + 1 for k in empty]
    if backward:
        k_id = r.trace.names.index("K")
        start = 0
        for end in ends:
            seg = ev[start:end]
            if ((seg[:, 0] == LOAD) & (seg[:, 1] == k_id)).any():
                return start, end, blocks
            start = end
        return 0, ends[0], blocks
    if r.algorithm == "flash1":
        R = p.N_q * (1 if r.schedule.get("gqa") == "per-head" else p.g)
        q = r.trace.names.index("Q")
        later = np.flatnonzero((ev[:, 0] == LOAD) & (ev[:, 1] == q) & (ev[:, 2] >= R))
        if len(later) == 0:
            return 0, n, blocks
        before = empty[empty < later[0]]
        return 0, int(before[-1]) + 1, blocks
    return 0, ends[0], blocks


def outer_starts(ev) -> list[int]:
    """The first event of every outer iteration: event 0 and each event after one that leaves fast memory empty,
    an initialisation of slow memory (flash1's O, l, m) not counting as an iteration of its own."""
    empty = (ev[:, 7] == 0) & (ev[:, 0] != INIT)
    return sorted({0, *(int(k) + 1 for k in np.flatnonzero(empty) if k + 1 < len(ev))})


def _grid(shape) -> list[int]:
    rows, cols = shape
    fr, fc = -(-rows // MAX_GRID), -(-cols // MAX_GRID)
    return [-(-rows // fr), -(-cols // fc), fr, fc]


def _counts(ev, names) -> dict:
    """Reads and writes (initialisations included) per array of the events ``ev``."""
    out = {}
    for i, name in enumerate(names):
        sel = ev[ev[:, 1] == i]
        reads = int(sel[sel[:, 0] == LOAD, 6].sum())
        writes = int(sel[np.isin(sel[:, 0], (2, INIT)), 6].sum())
        if reads or writes:
            out[name] = [reads, writes]
    return out


def _steps(r, ev) -> tuple[list[int], dict]:
    """The paper's step of each event (0: none, a free among them) and the steps' descriptions."""
    table = PAPER_STEPS.get((r.algorithm, r.main.name), {})
    steps = [0] * len(ev)
    text = {}
    for k, (op, aid) in enumerate(ev[:, :2].tolist()):
        s = table.get((OPS[op], r.trace.names[aid]))
        if s:
            steps[k] = s[0]
            text[s[0]] = s[1]
    return steps, text


def _title(r) -> str:
    from iosim.views import show

    return show._title(r)


def schedule_data(r) -> dict:
    """One schedule's page data from a traced run (``iosim.run(..., trace=True)``)."""
    if r.trace is None:
        raise InputError("result", "needs a traced run: iosim.run(..., trace=True)", r.algorithm)
    t = r.trace
    start, end, blocks = thread_block(r)
    ev = t.events[start:end]
    used = sorted(set(ev[:, 1].tolist()))
    names = [t.names[i] for i in used]
    remap = {a: i for i, a in enumerate(used)}
    compact = ev.copy()
    compact[:, 1] = [remap[a] for a in ev[:, 1].tolist()]
    slow = sorted({remap[a] for a, op in zip(ev[:, 1].tolist(), ev[:, 0].tolist(), strict=True) if op in (1, 2, 5)})
    outer = outer_starts(ev)
    steps, step_text = _steps(r, ev)
    pred = r.predicted
    stats = r.stats
    single = r.problem is None or r.problem.is_single
    data = {
        "title": _title(r),
        "algorithm": r.algorithm,
        "pass": r.main.name,
        "M": r.M,
        "names": names,
        "shapes": [list(t.shapes[n]) for n in names],
        "grids": [_grid(t.shapes[n]) for n in names],
        "slow": slow,
        "events": compact[:, :9].ravel().tolist(),
        "steps": steps,
        "step_text": {str(k): v for k, v in step_text.items()},
        "outer": outer,
        "final": _counts(compact, names),
        "rows": _rows(names, stats, pred),
        "blocks": score_blocks(ev, t.names),
        "peak": int(ev[:, 7].max()) if len(ev) else 0,
        "thread_blocks": blocks,
        "problem": None if single else str(r.problem),
        "simulated": {k: [v.reads, v.writes] for k, v in stats.per_array.items()},
        "closed_form": None if pred is None else {k: [v.reads, v.writes] for k, v in pred.per_array.items()},
        "exact": r.main.exact,
        "bounds": _bounds(r),
        "totals": {
            "reads": stats.reads,
            "writes": stats.writes,
            "peak": stats.peak,
            "closed_form": None if pred is None else pred.total,
        },
    }
    return data


def score_blocks(ev, names) -> list[list[int]] | None:
    """The blocks of S = Q K^T the schedule computes, from the trace: at each allocation of a score tile S_ij, the
    rows of the Q tile and of the K tile then resident, as [event, q0, nq, k0, nk] (event order, the event's index
    in ``ev``). A block a mask skips is
    never allocated, so it is absent. None for a schedule without score tiles beside resident Q and K tiles (standard
    attention writes S whole)."""
    if not {"S", "Q", "K"} <= set(names):
        return None
    s_id, q_id, k_id = names.index("S"), names.index("Q"), names.index("K")
    live: dict[int, tuple] = {}
    out = []
    for e, (op, a, r0, nr, _c0, _nc, _w, _res, h) in enumerate(ev[:, :9].tolist()):
        if op in (1, 3):
            live[h] = (a, r0, nr)
        elif op == 4:
            live.pop(h, None)
        if op == 3 and a == s_id:
            q = [t for t in live.values() if t[0] == q_id]
            k = [t for t in live.values() if t[0] == k_id]
            if len(q) == 1 and len(k) == 1:
                out.append([e, q[0][1], q[0][2], k[0][1], k[0][2]])
    return out or None


def _rows(names, stats, pred) -> list[str]:
    """The counters' rows: every array the page's events move, then any other array of the run's (or the
    problem's) counts, so a column sums to its total (split-KV: the combine kernel's O and L)."""
    out = [n for n in names if n in stats.per_array or (pred is not None and n in pred.per_array)]
    more = list(stats.per_array) + ([] if pred is None else list(pred.per_array))
    for n in more:
        if n not in out:
            out.append(n)
    return out


def _bounds(r) -> list[list]:
    """[name, words] of the lower bounds that apply to the run's pass (the run's own bound first)."""
    from iosim.theory import bounds

    out = [[r.main.lower_bound_name, float(r.main.lower_bound)]]
    if r.problem is None or r.problem.is_single:
        found = (
            bounds.backward_bounds(r.N, r.d, r.M) if r.main.name == "backward" else bounds.forward_bounds(r.N, r.d, r.M)
        )
        out += [[f"{b.name}: {b.formula}", float(b.value)] for b in found if b.is_lower and b.applies]
    seen, uniq = set(), []
    for name, value in out:
        if value > 0 and name not in seen:  # a bound of 0 words (Hong-Kung's at a large M) says nothing
            seen.add(name)
            uniq.append([name, value])
    return uniq


def closed_form_chart(N: int, d: int, M: int, backward: bool = False, causal: bool = False) -> dict:
    """Total words against M for every registered algorithm from its closed form (fit tiling), the lower bound,
    the page's M and the d^2 crossover: the data of the page's chart."""
    from iosim.runner import registry
    from iosim.theory import bounds

    lo, hi = max(4 * d + 4, 16), max(64 * d * d, 4 * M, 64)
    Ms = sorted({int(round(x)) for x in np.geomspace(lo, hi, 40)} | {M, d * d})
    series = {}
    for name in registry.algorithms():
        a = registry.get(name)
        if backward and not a.has_backward:
            continue
        pts = []
        for m in Ms:
            try:
                t = a.backward_tiling(N, d, m, "fit") if backward else a.choose_tiling(N, d, m, "fit")
                pred = (a.predict_backward if backward else a.predict_forward)(N, d, m, t, causal)
            except InputError:
                continue
            pts.append([m, int(pred.total)])
        if pts:
            series[name] = pts
    lower = [[m, float(bounds.lower_bound(N, d, m, backward=backward, causal=causal)[0])] for m in Ms]
    upper = theorem2_line(N, d, Ms, backward, causal)
    return {"N": N, "d": d, "M": M, "d2": d * d, "series": series, "lower": lower, "upper": upper,
            "backward": backward}  # fmt: skip


def theorem2_line(N: int, d: int, Ms, backward: bool = False, causal: bool = False) -> list[list]:  # noqa: N803
    """FlashAttention's Theorem 2 (Dao et al., 2022) with the constants of its proof kept, at each M: the exact count
    of Algorithm 1 (or 4, backward) at the paper's blocks Bc = ceil(M/4d), Br = min(Bc, d), from iosim's closed form
    (forward 2Nd + Tc(3Nd + 4N) + Nd + 2N, backward 4Nd + Tc(5Nd + 2N) + 3Nd with the initialisations; Tc = ceil(N/Bc)).
    It is the Theta(N^2 d^2 / M) upper bound as a number, not a Theta form with constant 1 (which falls below the
    trivial lower bound 4Nd at small N^2 d / M). The paper's blocks overfill M by about half (docs/theory-model.md),
    which the chart's legend says."""
    from iosim.runner import registry

    a = registry.get("flash1")
    out = []
    for m in Ms:
        try:
            t = a.backward_tiling(N, d, m, "paper") if backward else a.choose_tiling(N, d, m, "paper")
            pred = (a.predict_backward if backward else a.predict_forward)(N, d, m, t, causal)
        except InputError:
            continue
        out.append([m, int(pred.total)])
    return out


def _page_of(results, chart: bool = True, partners=None) -> dict:
    """The data of one page of traced ``results``: their schedules and, for one-head runs of equal N, d and pass,
    the chart of the closed forms against M. A GQA run's schedule carries its shared K/V (``gqa``:
    :func:`iosim.views.shared_kv.gqa_data`) with the other policy's counts from ``partners`` (one per result:
    :func:`iosim.views.shared_kv.partner`; None: rebuilt from each run where its mask allows)."""
    from iosim.views import shared_kv

    schedules = [schedule_data(r) for r in results]
    if partners is None:
        partners = [shared_kv.partner(r) for r in results]
    for s, r, other in zip(schedules, results, partners, strict=True):
        gqa = shared_kv.gqa_data(r, other)
        if gqa is not None:
            s["gqa"] = gqa
    first = results[0]
    one_head = all(r.problem is None or r.problem.is_single for r in results)
    same = len({(r.N, r.d, r.main.name, r.causal) for r in results}) == 1
    data = {"schedules": schedules}
    if chart and one_head and same and first.mask in ("none", "causal"):
        data["chart"] = closed_form_chart(
            first.N, first.d, first.M, first.main.name == "backward", first.mask == "causal"
        )
    return data


def _build(results, chart: bool = True, partners=None) -> tuple[str, int]:
    """The page of traced ``results`` (GQA: with ``partners``, as :func:`_page_of`) and the events it holds."""
    data = _page_of(results, chart, partners)
    schedules = data["schedules"]
    title = " vs ".join(r.algorithm for r in results) + f": {schedules[0]['title']}"
    return render("schedule", title, data), sum(len(s["steps"]) for s in schedules)


# ---------------------------------------------------------------------------------------------------------------
# A grid of settings on one page
# ---------------------------------------------------------------------------------------------------------------
GRID_AXES = ("N", "d", "M", "mask")


def _setting(algorithms, key: dict, kw: dict) -> dict:
    """One setting of a grid page: its real traces' page data, or the one-line refusal a class sees."""
    mask = None if key["mask"] == "none" else key["mask"]
    try:
        runs = [traced(a, N=key["N"], d=key["d"], M=key["M"], mask=mask, **kw) for a in algorithms]
        data = _page_of(runs)
    except InputError as e:
        return {**key, "refused": str(e)}
    events = sum(len(s["steps"]) for s in data["schedules"])
    if events > MAX_EVENTS:
        return {**key, "refused": f"{events:,} events, over a setting's cap of {MAX_EVENTS:,}"}
    return {**key, **data}


def grid_page(algorithms, path=None, *, Ns, ds, Ms, masks=("none",), **kw) -> str:  # noqa: N803
    """One page holding the real traces of every setting of the grid ``Ns`` x ``ds`` x ``Ms`` x ``masks`` of the
    schedules ``algorithms`` (other keywords as :func:`iosim.run`: tiling, backward, ...); the page's controls pick
    a setting and every number follows it.

    Why traces, not a JavaScript port of the loop nests: every number on the page is then iosim's own count,
    exact by construction, and there is no second implementation of the schedules to drift from the first. The
    price is size: the grid must fit :data:`MAX_HTML_BYTES`; a setting iosim refuses (M too small for d) is kept
    with its one-line refusal, which the page shows in place of a blank panel."""
    if isinstance(algorithms, str):
        algorithms = [algorithms]
    if path is not None:
        path = outputs.file("path", path, SUFFIXES)
    axes = {"N": sorted(set(Ns)), "d": sorted(set(ds)), "M": sorted(set(Ms)), "mask": list(dict.fromkeys(masks))}
    for name in ("N", "d", "M"):
        if not axes[name] or min(axes[name]) < 1:
            raise InputError(name, "values of a grid must be positive integers", axes[name])
    keys = [dict(N=n, d=d, M=m, mask=k) for n in axes["N"] for d in axes["d"] for m in axes["M"] for k in axes["mask"]]
    settings = [_setting(algorithms, key, kw) for key in keys]
    title = " vs ".join(algorithms) + ": N, d and M chosen on the page"
    html = render("schedule", title, {"grid": {"axes": axes, "settings": settings, "algorithms": list(algorithms)}})
    size = len(html.encode())
    if size > MAX_HTML_BYTES:
        per_n = {n: sum(len(_script_json(s)) for s in settings if s["N"] == n) for n in axes["N"]}
        fit, total = [], len(html.encode()) - sum(per_n.values())
        for n in axes["N"]:
            total += per_n[n]
            if total > MAX_HTML_BYTES:
                break
            fit.append(n)
        best = f"N in {fit} fits with these d, M and masks" if fit else "no N fits with these d, M and masks"
        raise InputError(
            "grid", f"makes a page of {size:,} bytes, over the cap of {MAX_HTML_BYTES:,} bytes of HTML; {best}"
        )
    if path is not None:
        path.write_text(html, encoding="utf-8")
    return html


def _fits(events: int, size: int) -> bool:
    return events <= MAX_EVENTS and size <= MAX_HTML_BYTES


def schedule_page(results, path=None, chart: bool = True, partners=None) -> str:
    """The page of one traced run, or of several side by side; written to ``path`` (``.html``) if given.
    Returns the HTML. A chart of the closed forms against M is added for one-head runs of equal N, d, pass.
    A GQA run's panel of its shared K/V compares it with the other policy: ``partners`` (one traced run, refusal
    or None per result, :func:`iosim.views.shared_kv.partner`), rebuilt from the runs when not given.
    A page over the caps is an InputError (:func:`page` names the largest N that fits instead)."""
    if not isinstance(results, (list, tuple)):
        results = [results]
    if path is not None:
        path = outputs.file("path", path, SUFFIXES)
    html, events = _build(results, chart, partners)
    size = len(html.encode())
    if not _fits(events, size):
        raise InputError(
            "trace",
            f"is too large for a page ({events:,} events, {size:,} bytes of HTML; the caps are "
            f"{MAX_EVENTS:,} events and {MAX_HTML_BYTES:,} bytes)",
        )
    if path is not None:
        path.write_text(html, encoding="utf-8")
    return html


def traced(algorithm: str, **kw):
    """A count-only traced run for a page (the events of the schedule, no arithmetic)."""
    from iosim.runner import api

    kw = {k: v for k, v in kw.items() if k != "dtype"}
    kw.update(count_only=True, reference=False, trace=True)
    return api.run_keywords(algorithm, **kw)


def _with_n(kw: dict, n: int) -> dict:
    p = kw.get("problem")
    if p is None:
        return {**kw, "N": n}
    if p.N_q == p.N_k:
        return {**kw, "problem": dataclasses.replace(p, N_q=n, N_k=n)}
    return {**kw, "problem": dataclasses.replace(p, N_k=n, N_q=min(p.N_q, n))}


def _n_of(kw: dict) -> int:
    p = kw.get("problem")
    return int(kw["N"]) if p is None else int(p.N_k)


def page_size(algorithms, kw: dict) -> tuple[int, int, list]:
    """(events, bytes of HTML, the traced runs) of a page of ``algorithms`` run with ``kw`` (bytes 0 when the
    events are already over the cap: the page is not rendered); a GQA run's shared K/V panel counted
    (:func:`sized`)."""
    return sized(algorithms, kw)[:3]


def sized(algorithms, kw: dict) -> tuple[int, int, list, list | None]:
    """:func:`page_size` and the runs' GQA partners: the same keywords under the other policy
    (:func:`iosim.views.shared_kv.partner`; None when the events are already over the cap), so the size counts the
    shared K/V panel the page will carry."""
    from iosim.views import shared_kv

    runs = [traced(a, **kw) for a in algorithms]
    events = sum(thread_block(r)[1] - thread_block(r)[0] for r in runs)
    if events > MAX_EVENTS:
        return events, 0, runs, None
    partners = [shared_kv.partner(r, kw) for r in runs]
    return events, len(_build(runs, True, partners)[0].encode()), runs, partners


def page_events(algorithms, kw: dict) -> int:
    """The events a page of ``algorithms`` (run with ``kw``) would hold."""
    return page_size(algorithms, kw)[0]


def check_fits(algorithms, kw: dict) -> list:
    """The traced runs of a page of ``algorithms`` at ``kw`` (:func:`fitting`, without the GQA partners)."""
    return fitting(algorithms, kw)[0]


def fitting(algorithms, kw: dict) -> tuple[list, list]:
    """(the traced runs, their GQA partners) of a page of ``algorithms`` at ``kw``, or, for a page over
    :data:`MAX_EVENTS` events or :data:`MAX_HTML_BYTES` bytes, an InputError on N naming the largest N that fits at
    that d and M. Smaller sizes are probed first (N = 16, 32, ... up to the requested N), so an oversized request
    costs only traces of about the cap's size (events grow at least linearly with N)."""
    N = _n_of(kw)
    probes: dict[int, tuple] = {}

    def ok(n: int) -> bool:
        if n not in probes:
            probes[n] = sized(algorithms, _with_n(kw, n))
        return _fits(*probes[n][:2])

    try:
        n = min(16, N)
        while n < N and ok(n):
            n *= 2
    except InputError:  # the mask holds at this N only (blockdiag:, prefix:, file:): no smaller N to probe
        return _at_its_own_n(algorithms, kw, ok, probes)
    if n >= N and ok(N):
        return probes[N][2], probes[N][3]
    lo, hi = n // 2, min(n, N)  # ok(lo) unless lo was never probed; not ok(hi)
    lo = lo if lo >= 1 and ok(lo) else 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    d = kw.get("d") if kw.get("problem") is None else kw["problem"].d_qk
    where = f"at d={d} and M={kw['M']}"
    best = f"the largest N that fits {where} is {lo}" if lo else f"no N fits {where}"
    raise InputError(
        "N",
        f"gives a trace too large for a page (the cap is {MAX_EVENTS:,} events and {MAX_HTML_BYTES:,} bytes of "
        f"HTML); {best}",
        N,
    )


def _at_its_own_n(algorithms, kw: dict, ok, probes) -> tuple[list, list]:
    """The traced runs at the requested N for a mask that holds at that N only (document lengths, a prefix, an
    N x N file), or an InputError saying so (no smaller N exists to name)."""
    N = _n_of(kw)
    if ok(N):
        return probes[N][2], probes[N][3]
    events, size = probes[N][:2]
    raise InputError(
        "N",
        f"gives a trace too large for a page ({events:,} events; the cap is {MAX_EVENTS:,} events and "
        f"{MAX_HTML_BYTES:,} bytes of HTML), and the mask {kw.get('mask')} holds at this N only: no smaller N "
        "fits it (a larger M or a smaller mask makes a page)",
        N,
    )


def page(algorithms, path, **kw) -> Path:
    """Build the schedule page of ``algorithms`` (one name, or several side by side) run with ``kw`` (the keywords
    of :func:`iosim.run`), written to ``path``; the output path and the size are checked before the full traces."""
    if isinstance(algorithms, str):
        algorithms = [algorithms]
    path = outputs.file("path", path, SUFFIXES)
    runs, partners = fitting(algorithms, kw)
    schedule_page(runs, path, partners=partners)
    return path


# ---------------------------------------------------------------------------------------------------------------
# The pebble game
# ---------------------------------------------------------------------------------------------------------------
def _layout(graph) -> list[list[float]]:
    """(x, y) in [0, 1] for every vertex: inputs at the bottom, each vertex one layer above its deepest parent."""
    layer = [0] * len(graph)
    for v, ps in enumerate(graph.parents):  # vertices are numbered after their parents
        layer[v] = 1 + max((layer[p] for p in ps), default=-1)
    top = max(layer, default=0)
    rows: dict[int, list[int]] = {}
    for v, lv in enumerate(layer):
        rows.setdefault(lv, []).append(v)
    pos = [[0.0, 0.0] for _ in range(len(graph))]
    for lv, vs in rows.items():
        for i, v in enumerate(vs):
            pos[v] = [(i + 0.5) / len(vs), 1.0 - lv / max(top, 1)]
    return pos


def _resized(spec: str, first: int) -> str:
    kind, sizes = spec.strip().split(":", 1)
    return f"{kind}:{'x'.join([str(first), *sizes.split('x')[1:]])}"


def pebble_graph(spec: str):
    """The graph of ``spec`` for a pebble page, or an InputError naming the largest graph of its kind (its first
    size varied, the others kept) within :data:`MAX_PEBBLE_VERTICES` vertices."""
    from iosim.pebble.graph import named

    g = named(spec)
    if len(g) <= MAX_PEBBLE_VERTICES:
        return g
    lo, hi = 0, int(spec.split(":", 1)[1].split("x")[0])  # named(hi) is over the cap
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if len(named(_resized(spec, mid))) <= MAX_PEBBLE_VERTICES:
            lo = mid
        else:
            hi = mid
    best = f"the largest that fits is {_resized(spec, lo)}" if lo else "no graph of its kind with these sizes fits"
    raise InputError(
        "graph",
        f"has {len(g):,} vertices, too many for a pebble page (the cap is {MAX_PEBBLE_VERTICES:,}); {best}",
        spec,
    )


def pebble_data(
    spec: str,
    M: int,  # noqa: N803
    solution: str | None = None,
    optimum_states: int | None = None,
    allow_long: bool = False,
) -> dict:
    """A graph of the pebble page: vertices, parents, inputs, outputs, layout, the exercise's solution (a
    schedule file's moves) and iosim's best schedule: the optimum where the search finishes within
    ``optimum_states`` states (default: the search's own limit, as ``iosim pebble --html``), else the greedy schedule
    (labelled so)."""
    from iosim.pebble import search

    optimum_states = search.MAX_STATES if optimum_states is None else optimum_states
    from iosim.pebble.game import Game, parse

    g = pebble_graph(spec)
    best, how = None, None
    if len(g) <= search.MAX_VERTICES:
        try:
            o = search.optimum(g, M, max_states=optimum_states, allow_long=allow_long)
            best, how = o.moves, f"optimum (A* search, {o.states:,} states)"
        except InputError as e:
            if e.parameter == "M":
                raise
            best = None  # past the search's reach: the greedy schedule, labelled so
    if best is None:
        best, how = search.greedy(g, M), "greedy (demand order, Belady removal): an upper bound, not the optimum"
    out = Game(g, M).play(best)
    sol = None
    if solution is not None:
        try:
            text = Path(solution).read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise InputError("schedule", "must be a readable text file", f"{solution}: {e}") from None
        moves = parse(text, g, Path(solution).name)
        sol = {"file": Path(solution).name, "moves": [[m.rule, g.names[m.vertex]] for m in moves]}
    return {
        "graph": g.name,
        "M": M,
        "names": g.names,
        "ops": g.ops,
        "parents": [list(p) for p in g.parents],
        "inputs": g.inputs,
        "outputs": g.outputs,
        "pos": _layout(g),
        "best": {"how": how, "io": out.io, "moves": [[m.rule, g.names[m.vertex]] for m in best]},
        "solution": sol,
    }


def pebble_page(games, path=None, optimum_states: int | None = None, allow_long: bool = False) -> str:
    """The pebble page: ``games`` is a list of (graph spec, M, solution file or None); iosim's optimum is searched
    up to ``optimum_states`` states per graph (default: the search's own limit, 400,000 states, as ``iosim pebble
    --html``; :func:`pebble_data`). Every graph is checked against :data:`MAX_PEBBLE_VERTICES` before any search."""
    if path is not None:
        path = outputs.file("path", path, SUFFIXES)
    for g in games:
        pebble_graph(g[0])
    data = {"games": [pebble_data(*g, optimum_states=optimum_states, allow_long=allow_long) for g in games]}
    html = render("pebble", "The red-blue pebble game", data)
    if len(html.encode()) > MAX_HTML_BYTES:
        raise InputError("games", f"make a page over the cap of {MAX_HTML_BYTES:,} bytes of HTML; play fewer at once")
    if path is not None:
        path.write_text(html, encoding="utf-8")
    return html


EXERCISE = re.compile(r"(?P<kind>.+)-(?P<sizes>[^-]+)-M(?P<M>[0-9]+)")  # GRAPH-SIZES-MM, e.g. matmul-2x2x2-M4


def exercises(folder) -> list[tuple[str, int, str]]:
    """The pebble exercises of ``folder`` (docs/pebble): files named GRAPH-SIZES-MM.txt, e.g. matmul-2x2x2-M4.txt
    is graph matmul:2x2x2 with M = 4; a file misnamed or not text is one line naming it."""
    out = []
    for f in sorted(Path(folder).glob("*-M*.txt")):
        m = EXERCISE.fullmatch(f.stem)
        if m is None:
            raise InputError("folder", "must hold exercises named GRAPH-SIZES-MM.txt (matmul-2x2x2-M4.txt: graph "
                             "matmul:2x2x2, M = 4)", str(f))  # fmt: skip
        try:
            lines = len(f.read_text(encoding="utf-8").splitlines())
        except (OSError, UnicodeDecodeError) as e:
            raise InputError("folder", "must hold exercises readable as text", f"{f}: {e}") from None
        out.append((lines, f"{m['kind']}:{m['sizes']}", int(m["M"]), str(f)))
    return [g[1:] for g in sorted(out, key=lambda g: (g[0], g[3]))]  # the shortest solution first


def show(*algorithms: str, html, **kw) -> Path:
    """``iosim.show("flash2", N=64, d=16, M=1024, html="flash2.html")``: the teaching page of a schedule (two or
    more names: side by side) run with ``kw`` (the keywords of :func:`iosim.run`), as ``iosim show ... --html``
    writes it; returns the path. The path and the page's size are checked before the full traces are built."""
    if not algorithms or not all(isinstance(a, str) for a in algorithms):
        raise InputError("algorithms", "must be one or more algorithm names (iosim.algorithm_names())", algorithms)
    return page(list(algorithms), html, **kw)

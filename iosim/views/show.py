"""Pictures of a schedule (``iosim show``): tile heat maps, the residency timeline, a step view, an animation, and a
plain-text step-through for a terminal.

Everything is drawn from one traced run (:class:`iosim.memory_model.Trace`, count-only: the schedule without the
arithmetic), so every picture shows exactly the loads, stores, allocs and frees that the counts come from.

* ``tiles``: each slow array (Q, K, V, O, S, P, dQ, ...) as an image with the algorithm's tile boundaries; top row
  how many times each word was read (loaded), bottom row how many times it was written (stored or initialised).
* ``timeline``: resident words per array (stacked) after every event, with the capacity M as a line.
* ``step``: the state after event k: the tiles resident then (filled), the tile that event moved (outlined), and
  the running read and write totals.
* ``animate``: the step view over the run as a GIF (matplotlib's Pillow writer), at most :data:`MAX_FRAMES` frames
  (events sampled evenly at large sizes).
* ``--text``: one line per event (what moved, resident words per array, running totals) and, with ``--step``, the
  tile map at that step in characters.

Large arrays are aggregated: an array of more than :data:`MAX_CELLS` cells per side is drawn on a coarser grid
(cells of several words, the count shown is per word averaged over the cell) instead of failing.
"""

from __future__ import annotations

import numpy as np

from iosim.base import outputs
from iosim.base.errors import InputError, install_hint
from iosim.memory_model.core import ALLOC, FREE, INIT, LOAD, OPS, STORE

VIEWS = ("tiles", "timeline", "step", "animate", "all")
PICTURES = (".png", ".pdf", ".svg")  # what draw_tiles, draw_timeline and draw_step write (matplotlib by suffix)
MAX_CELLS = 512  # cells per side of a drawn array
MAX_FRAMES = 60
GIF_DPI = 110  # a step-view GIF about 1,400 px wide for four arrays: readable on a projector
MAX_TIMELINE_POINTS = 20_000
EXACT_WORDS = 1 << 24  # arrays up to this many words are counted per word, larger ones per drawn cell


def pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("show", f"needs matplotlib: {install_hint('plot')} (or use --text)") from None
    return plt


def slow_arrays(trace) -> list[str]:
    """The arrays the schedule loads from or stores to (or initialises), in registration order."""
    ev = trace.events
    used = set(ev[np.isin(ev[:, 0], (LOAD, STORE, INIT)), 1].tolist())
    return [n for i, n in enumerate(trace.names) if i in used]


def _grid(shape) -> tuple[int, int, int, int]:
    """(cells down, cells across, words per cell down, across) for drawing an array of ``shape``."""
    rows, cols = shape
    fr, fc = -(-rows // MAX_CELLS), -(-cols // MAX_CELLS)
    return -(-rows // fr), -(-cols // fc), fr, fc


def heat(trace, name: str, op: int) -> np.ndarray:
    """Times each word of ``name`` was read (op LOAD) or written (op STORE; initialisations count as writes), on
    the drawing grid of :func:`_grid` (per word, averaged over a cell when the array is aggregated)."""
    aid = trace.names.index(name)
    rows, cols = trace.shapes[name]
    gr, gc, fr, fc = _grid((rows, cols))
    ev = trace.events
    ops = (op, INIT) if op == STORE else (op,)
    sel = ev[(ev[:, 1] == aid) & np.isin(ev[:, 0], ops)]
    diff = np.zeros((rows + 1, cols + 1)) if rows * cols <= EXACT_WORDS else None
    if diff is not None:  # exact, per word: a 2-D difference array
        r0, r1, c0, c1 = sel[:, 2], sel[:, 2] + sel[:, 3], sel[:, 4], sel[:, 4] + sel[:, 5]
        np.add.at(diff, (r0, c0), 1)
        np.add.at(diff, (r0, c1), -1)
        np.add.at(diff, (r1, c0), -1)
        np.add.at(diff, (r1, c1), 1)
        words = diff.cumsum(0).cumsum(1)[:rows, :cols]
        pad = np.zeros((gr * fr, gc * fc))
        pad[:rows, :cols] = words
        return pad.reshape(gr, fr, gc, fc).mean(axis=(1, 3))
    out = np.zeros((gr, gc))  # aggregated: each tile spread over the cells it covers
    for _, _, r0, nr, c0, nc, *_ in sel:
        a, b = r0 // fr, -(-(r0 + nr) // fr)
        c, e = c0 // fc, -(-(c0 + nc) // fc)
        out[a:b, c:e] += nr * nc / ((b - a) * fr * (e - c) * fc)
    return out


def tile_edges(trace, name: str) -> tuple[list[int], list[int]]:
    """The row and column boundaries of the tiles the schedule moves of ``name`` (at most 64 of each)."""
    aid = trace.names.index(name)
    ev = trace.events
    sel = ev[(ev[:, 1] == aid) & np.isin(ev[:, 0], (LOAD, STORE, ALLOC))]
    rows, cols = trace.shapes[name]
    re = sorted(set(sel[:, 2].tolist()) | set((sel[:, 2] + sel[:, 3]).tolist()) - {0, rows})
    ce = sorted(set(sel[:, 4].tolist()) | set((sel[:, 4] + sel[:, 5]).tolist()) - {0, cols})
    return (re if len(re) <= 64 else []), (ce if len(ce) <= 64 else [])


def _title(r) -> str:
    p = r.main.name
    masked = f", mask {r.mask}" if r.mask not in ("none", "causal") else ""
    shape = f"N={r.N}, d={r.d}" if r.problem is None or r.problem.is_single else str(r.problem)
    sched = r.schedule
    for key, what in (("gqa", "GQA {}"), ("splits", "{} KV splits"), ("mla", "MLA {}")):
        if sched.get(key) not in (None, 1):
            shape += ", " + what.format(sched[key])
    return f"{r.algorithm} {p}{', causal' if r.causal else ''}{masked}: {shape}, M={r.M} words, {r.tiling}"


def array_colours(names) -> dict[str, tuple]:
    """One distinct colour per array, the same in every picture of a run: matplotlib's 20-colour qualitative map
    (tab20, its strong shades first), so the backward's 14 arrays never share a colour."""
    from matplotlib import colormaps

    tab = colormaps["tab20"].colors
    order = [*tab[0::2], *tab[1::2]]  # the ten strong shades, then their light partners
    return {name: order[i % len(order)] for i, name in enumerate(names)}


def draw_tiles(r, path) -> None:
    """The heat maps: reads (top) and writes (bottom) per word of every slow array, on one colour scale per row
    (the most any word of any array is read, or written), so an array read five times a word looks darker than one
    read once, as it is."""
    path = outputs.file("path", path, PICTURES)
    plt = pyplot()
    t = r.trace
    names = slow_arrays(t)
    heats = {(name, op): heat(t, name, op) for name in names for op in (LOAD, STORE)}
    fig, axes = plt.subplots(2, len(names), figsize=(2.6 * len(names) + 1.6, 6.0), squeeze=False, layout="constrained")
    for i, (op, what, cmap) in enumerate(((LOAD, "reads", "Blues"), (STORE, "writes", "Oranges"))):
        top = max(max(float(heats[(n, op)].max()) for n in names), 1.0)
        for j, name in enumerate(names):
            rows, cols = t.shapes[name]
            gr, gc, fr, fc = _grid((rows, cols))
            re, ce = tile_edges(t, name)
            ax = axes[i, j]
            h = heats[(name, op)]
            im = ax.imshow(
                h, cmap=cmap, aspect="auto", interpolation="nearest", extent=(0, cols, rows, 0), vmin=0, vmax=top
            )
            for e in re:
                ax.axhline(e, color="0.5", lw=0.3)
            for e in ce:
                ax.axvline(e, color="0.5", lw=0.3)
            agg = f", cells {fr}x{fc}" if fr * fc > 1 else ""
            ax.set_title(f"{name} {what}\n(max {h.max():.0f}/word{agg})", fontsize=10)
            ax.tick_params(labelsize=8)
        bar = fig.colorbar(im, ax=list(axes[i, :]), fraction=0.03, pad=0.01)
        bar.ax.tick_params(labelsize=8)
        bar.set_label(f"{what} per word", fontsize=9)
    fig.suptitle(_title(r) + ": times each word was read / written (one scale per row)", fontsize=11)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def residency(trace) -> tuple[list[str], np.ndarray]:
    """Resident words per array after each event: (names, array of shape (events, arrays))."""
    ev = trace.events
    sign = np.where(np.isin(ev[:, 0], (LOAD, ALLOC)), 1, np.where(ev[:, 0] == FREE, -1, 0))
    delta = np.zeros((len(ev), len(trace.names)), np.int64)
    delta[np.arange(len(ev)), ev[:, 1]] = sign * ev[:, 6]
    res = delta.cumsum(0)
    keep = [i for i in range(len(trace.names)) if res[:, i].any()]
    return [trace.names[i] for i in keep], res[:, keep]


def draw_timeline(r, path) -> None:
    """Resident words per array (stacked) over the events, with the line at M."""
    path = outputs.file("path", path, PICTURES)
    plt = pyplot()
    names, res = residency(r.trace)
    step = max(1, len(res) // MAX_TIMELINE_POINTS)
    x = np.arange(len(res))[::step]
    fig, ax = plt.subplots(figsize=(11, 4.4))
    colours = array_colours(r.trace.names)
    ax.stackplot(x, res[::step].T, labels=names, step="post", alpha=0.9, colors=[colours[n] for n in names])
    ax.axhline(r.M, color="k", ls="--", lw=1, label=f"M = {r.M:,}")
    ax.set_xlabel("event (load, store, alloc, free)" + (f", every {step}th shown" if step > 1 else ""))
    ax.set_ylabel("resident words")
    ax.set_ylim(0, r.M * 1.08)
    ax.set_xlim(0, max(len(res) - 1, 1))
    ax.legend(fontsize=9, ncol=min(len(names) + 1, 8), loc="upper center", bbox_to_anchor=(0.5, -0.2))
    ax.set_title(_title(r) + f"; peak {r.stats.peak:,} words", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


class Stepper:
    """Walks the events and knows, after event k, the resident tiles and the running read/write totals."""

    def __init__(self, trace) -> None:
        self.t = trace
        self.k = -1
        self.live: dict[int, tuple] = {}
        self.reads = self.writes = 0

    def advance(self, k: int) -> None:
        ev = self.t.events
        while self.k < k:
            self.k += 1
            op, aid, r0, nr, c0, nc, words, _res, h = (int(v) for v in ev[self.k])
            if op in (LOAD, ALLOC):
                self.live[h] = (aid, r0, nr, c0, nc)
            elif op == FREE:
                self.live.pop(h, None)
            if op == LOAD:
                self.reads += words
            elif op in (STORE, INIT):
                self.writes += words

    def event(self) -> tuple:
        return tuple(int(v) for v in self.t.events[self.k])

    def describe(self) -> str:
        op, aid, r0, nr, c0, nc, words, res, _h = self.event()
        name = self.t.names[aid]
        where = f"{name}[{r0}:{r0 + nr}, {c0}:{c0 + nc}]" if op != INIT else f"{name} (all)"
        return (
            f"step {self.k}: {OPS[op]} {where} ({words:,} words); resident {res:,} / {self.t.M:,}; "
            f"reads {self.reads:,}, writes {self.writes:,}"
        )


def _draw_step(fig, r, st: Stepper, names) -> None:
    from matplotlib.patches import Rectangle

    t = r.trace
    fig.clear()
    axes = fig.subplots(1, len(names), squeeze=False)[0]
    op, aid, r0, nr, c0, nc, *_ = st.event()
    colour = {LOAD: "tab:blue", STORE: "tab:orange", ALLOC: "tab:green", FREE: "tab:gray", INIT: "tab:red"}
    for ax, name in zip(axes, names, strict=True):
        rows, cols = t.shapes[name]
        ax.set_xlim(0, cols)
        ax.set_ylim(rows, 0)
        ax.set_title(name, fontsize=10)
        ax.tick_params(labelsize=7)
        ax.add_patch(Rectangle((0, 0), cols, rows, fill=False, lw=0.6, color="0.4"))
        for a, tr0, tnr, tc0, tnc in st.live.values():
            if t.names[a] == name:
                ax.add_patch(Rectangle((tc0, tr0), tnc, tnr, color="tab:green", alpha=0.45, lw=0))
        if t.names[aid] == name:
            if op == INIT:
                r0, nr, c0, nc = 0, rows, 0, cols
            ax.add_patch(Rectangle((c0, r0), nc, nr, fill=False, lw=2, color=colour[op]))
    fig.suptitle(f"{_title(r)}\n{st.describe()}\n(green: resident tiles; outline: this event's tile)", fontsize=10)
    fig.subplots_adjust(top=0.72, bottom=0.08, left=0.04, right=0.98, wspace=0.5)


def draw_step(r, path, k: int) -> None:
    path = outputs.file("path", path, PICTURES)
    plt = pyplot()
    st = Stepper(r.trace)
    st.advance(k)
    names = slow_arrays(r.trace) + [n for n in r.trace.names if n not in slow_arrays(r.trace)]
    names = [n for n in names if (r.trace.events[:, 1] == r.trace.names.index(n)).any()]
    fig = plt.figure(figsize=(1.6 * len(names) + 2, 3.8))
    _draw_step(fig, r, st, names)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def draw_animation(r, path) -> int:
    """The step view over the run as a GIF; returns the number of frames."""
    path = outputs.file("path", path, (".gif",))
    plt = pyplot()
    from matplotlib.animation import FuncAnimation, PillowWriter

    n = len(r.trace)
    frames = np.unique(np.linspace(0, n - 1, min(n, MAX_FRAMES)).astype(int))
    st = Stepper(r.trace)
    names = [n_ for n_ in r.trace.names if (r.trace.events[:, 1] == r.trace.names.index(n_)).any()]
    fig = plt.figure(figsize=(1.6 * len(names) + 2, 3.8))

    def frame(k):
        st.advance(int(k))
        _draw_step(fig, r, st, names)

    FuncAnimation(fig, frame, frames=frames).save(path, writer=PillowWriter(fps=6), dpi=GIF_DPI)
    plt.close(fig)
    return len(frames)


def text_map(r, st: Stepper, width: int = 48) -> str:
    """The resident tiles after the stepper's event, per array, in characters ('#' resident, '.' not)."""
    t = r.trace
    lines = []
    for name in [n for n in t.names if (t.events[:, 1] == t.names.index(n)).any()]:
        rows, cols = t.shapes[name]
        h, w = min(rows, 16), min(cols, width)
        grid = [["."] * w for _ in range(h)]
        for a, r0, nr, c0, nc in st.live.values():
            if t.names[a] != name:
                continue
            for i in range(r0 * h // rows, max(r0 * h // rows + 1, -(-(r0 + nr) * h // rows))):
                for j in range(c0 * w // cols, max(c0 * w // cols + 1, -(-(c0 + nc) * w // cols))):
                    grid[min(i, h - 1)][min(j, w - 1)] = "#"
        lines.append(f"{name} ({rows} x {cols}):")
        lines += ["  " + "".join(row) for row in grid]
    return "\n".join(lines)


def text(r, step: int | None = None, limit: int = 200) -> str:
    """The plain-text step-through: one line per event (at most ``limit``), or the map at ``step``."""
    st = Stepper(r.trace)
    out = [_title(r) + f"; {len(r.trace):,} events"]
    if step is not None:
        st.advance(step)
        out += [st.describe(), text_map(r, st)]
        return "\n".join(out)
    n = len(r.trace)
    for k in range(min(n, limit)):
        st.advance(k)
        out.append(st.describe())
    if n > limit:
        st.advance(n - 1)
        out.append(f"... {n - limit:,} more events (--step K shows any one); at the end: {st.describe()}")
    return "\n".join(out)

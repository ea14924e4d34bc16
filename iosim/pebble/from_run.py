"""iosim schedules as red-blue pebblings: a run of a built-in algorithm turned into element-level moves, checked.

How a run becomes a pebbling
----------------------------
The algorithm's own driver runs once more, as plain Python (its @njit functions' ``py_func``), on arrays of
:class:`Value` objects instead of floats: every arithmetic operation the driver performs on fast-memory words
creates (or finds) a vertex of the run's computation DAG whose parents are the vertices it read, and every
memory-model op the driver calls is recorded at the same moment. So the DAG is the algorithm's *own* graph, built
from the code that iosim counts, not a hand-written twin of it:

* **load** of an nr x nc region = R1 on each of its nr nc words (the vertex the slow word holds at that moment);
* **store** = R2 on each word of the tile (the vertex the fast word holds); a word that holds a plain constant
  (never computed on) is first computed as a constant vertex (R3, no parents);
* **arithmetic** between events = R3 on each vertex the driver computes, in the driver's order; a computation
  whose parents are not all red is an illegal move, so a driver that computed on a word it had not loaded would
  fail here;
* **free** = R4: a word's red pebble is removed right after its last use (an R3 that reads it, an R2 that writes
  it, or the free of the tile that holds it), so a loaded word stays red until its tile is freed, as in the
  model, and a value overwritten in place (O_i rescaled) loses its pebble when its successor has been computed
  (a scratch tile that is never stored, such as S_ij, names no buffer to the model: its words lose their pebbles
  at their last use, which can be before the tile's free);
* **initialising a slow array** (FlashAttention 1 zeroes O, l, m in HBM; FlashAttention's backward zeroes dQ, dK,
  dV) = for each word a constant vertex ``init:O[r,c]`` (no parents) computed (R3), written (R2) and removed (R4):
  the writes the model counts as ``init_writes`` are these R2 moves.

The driver's per-row scalars (m~, l~, m_new, the running sums of a softmax sweep), the products of a dot product
and the partial sums of a summation are vertices too: they carry red pebbles while they are live. The memory
model does not count them (its documented convention: scalars and BLAS temporaries are outside M), so the
pebbling's red peak can exceed M by those words: :class:`PebbleRun` reports the true peak beside M and the
model's own peak, never hiding the difference. A word loaded twice while still red (nothing iosim's drivers do)
would be an R1 on a red vertex: legal, counted.

Vertices are hash-consed: an operation with the same op, the same parent vertices and the same constants is the
same vertex (additions and multiplications with their operands in either order), so a recomputation (S_ij and
P_ij in a backward pass, Q K^T again for each row block) is R3 on the same vertex again, which the game allows.
Exact identities with constants are folded (0 + x, x - 0, x * 1, x / 1 and max(-inf, x) are x), so a summation
that starts from 0.0 has the papers' shape: the first product is the chain's first leaf.

What is common with the papers' graph (docs/theory-replay.md): the level-1 vertices. Every driver computes S = Q K^T
(scaled) with the standard algorithm, so the run's DAG contains each product Q[i,k] K[j,k] as a vertex with
exactly those two parents and a summation chain over k per entry; :func:`level1_products` counts them (the tests
check all N^2 d are there). Beyond level 1 each algorithm has its own graph: FlashAttention's online softmax
computes running maxima, rescaling factors and partial outputs the standard graph does not have.

Masks: causal masking sets scores to the constant -inf (a constant, not a vertex) and skips tiles (no moves);
every other mask (``mask=``, as in :func:`iosim.run`) maps the same way: masked entries are constants, skipped tiles
issue no moves.
"""

from __future__ import annotations

import math
import types
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np
from numba.core.dispatcher import Dispatcher

from iosim.base.errors import InputError
from iosim.memory_model import TwoLevelMemory, core
from iosim.pebble.game import Game, IllegalMoveError, Move, Outcome
from iosim.pebble.graph import Graph
from iosim.runner import registry

MAX_N, MAX_D = 16, 8  # the element-level DAG grows as N^2 d per pass: keep runs tiny
PASSES = ("forward", "backward")


# ---------------------------------------------------------------------------------------------------------------
# Values: floats that build the DAG
# ---------------------------------------------------------------------------------------------------------------
class _Recorder:
    """The run's DAG (hash-consed vertices) and the log of moves, in the order the driver does them."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.ops: list[str] = []
        self.parents: list[tuple[int, ...]] = []
        self.table: dict[tuple, int] = {}
        self.log: list[tuple] = []  # ("R3", v, parents) | ("R1", vids) | ("R2", vids) | ("use", vids)
        self.active = False

    def vertex(self, key: tuple, name: str, op: str, parents: tuple[int, ...]) -> int:
        v = self.table.get(key)
        if v is None:
            v = self.table[key] = len(self.names)
            self.names.append(name if name else f"{op}#{v}")
            self.ops.append(op)
            self.parents.append(parents)
        return v

    def compute(self, key: tuple, op: str, parents: tuple[int, ...], name: str = "") -> int:
        v = self.vertex(key, name, op, parents)
        self.log.append(("R3", v, parents))
        return v


_REC: list[_Recorder] = []


def _rec() -> _Recorder | None:
    return _REC[-1] if _REC and _REC[-1].active else None


def _x(a) -> float:
    return a.x if isinstance(a, Value) else float(a)


_FUNCS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b if b else (math.nan if a == 0 else math.copysign(math.inf, a)),
    "max": lambda a, b: a if a >= b else b,
}
_COMMUTATIVE = {"add", "mul", "max"}


def _is(a, c: float) -> bool:
    return not isinstance(a, Value) and a == c


def _fold(op: str, a, b):
    """An exact identity with a constant operand: the Value it reduces to, or None."""
    unit = {"add": 0.0, "sub": 0.0, "mul": 1.0, "div": 1.0, "max": -math.inf}[op]
    if _is(b, unit):
        return a
    if op in _COMMUTATIVE and _is(a, unit):
        return b
    return None


def _binary(op: str, a, b):
    x = _FUNCS[op](_x(a), _x(b))
    rec = _rec()
    if rec is None or not (isinstance(a, Value) or isinstance(b, Value)):
        return x
    same = _fold(op, a, b)
    if same is not None:
        return same
    ka = ("v", a.v) if isinstance(a, Value) else ("c", float(a))
    kb = ("v", b.v) if isinstance(b, Value) else ("c", float(b))
    if op in _COMMUTATIVE and kb < ka:
        ka, kb = kb, ka
    parents = tuple(dict.fromkeys(k[1] for k in (ka, kb) if k[0] == "v"))
    return Value(x, rec.compute((op, ka, kb), op, parents))


def _unary(op: str, fn, a):
    x = fn(_x(a))
    rec = _rec()
    if rec is None or not isinstance(a, Value):
        return x
    return Value(x, rec.compute((op, ("v", a.v)), op, (a.v,)))


def _exp(x: float) -> float:
    return math.exp(x) if x < 709.0 else math.inf


class Value:
    """A float that knows its vertex ``v`` in the run's DAG; arithmetic with it records R3 moves."""

    __slots__ = ("x", "v")

    def __init__(self, x: float, v: int) -> None:
        self.x, self.v = float(x), v

    def __float__(self) -> float:
        return self.x

    def __repr__(self) -> str:
        return f"Value({self.x!r}, v={self.v})"

    __hash__ = object.__hash__

    def __eq__(self, o):
        return self.x == _x(o)

    def __ne__(self, o):
        return self.x != _x(o)

    def __lt__(self, o):
        return self.x < _x(o)

    def __le__(self, o):
        return self.x <= _x(o)

    def __gt__(self, o):
        return self.x > _x(o)

    def __ge__(self, o):
        return self.x >= _x(o)

    def __add__(self, o):
        return _binary("add", self, o)

    def __radd__(self, o):
        return _binary("add", o, self)

    def __sub__(self, o):
        return _binary("sub", self, o)

    def __rsub__(self, o):
        return _binary("sub", o, self)

    def __mul__(self, o):
        return _binary("mul", self, o)

    def __rmul__(self, o):
        return _binary("mul", o, self)

    def __truediv__(self, o):
        return _binary("div", self, o)

    def __rtruediv__(self, o):
        return _binary("div", o, self)

    def __neg__(self):
        return _unary("neg", lambda t: -t, self)

    def exp(self):  # np.exp on an object array calls this
        return _unary("exp", _exp, self)

    def log(self):
        return _unary("log", lambda t: math.log(t) if t > 0 else -math.inf, self)


def _max(*args, **kwargs):
    if len(args) == 2 and not kwargs and (isinstance(args[0], Value) or isinstance(args[1], Value)):
        return _binary("max", args[0], args[1])
    return max(*args, **kwargs)


class _FastArray(np.ndarray):
    """An object-dtype fast buffer whose ``max()`` is a chain of max vertices (NumPy's object max would return one
    of the elements, hiding that the result depends on all of them)."""

    def max(self, *args, **kwargs):
        if args or kwargs or self.size == 0:
            return np.ndarray.max(self.view(np.ndarray), *args, **kwargs)
        acc = -math.inf
        for y in self.view(np.ndarray).ravel():
            acc = _max(acc, y)
        return acc


def _buffer(n, like):
    return None if like is None else np.empty(n, dtype=object).view(_FastArray)


_MATH = types.SimpleNamespace(**{k: getattr(math, k) for k in dir(math) if not k.startswith("_")})
_MATH.exp = lambda a: _unary("exp", _exp, a) if isinstance(a, Value) else _exp(a)
_MATH.log = lambda a: a.log() if isinstance(a, Value) else math.log(a)


# ---------------------------------------------------------------------------------------------------------------
# The memory-model ops, recorded
# ---------------------------------------------------------------------------------------------------------------
def _last_event(W) -> tuple[int, ...]:
    k = int(W[core._NEV]) - 1
    e = core.E0 + k * core.EVENT_WIDTH
    return tuple(int(t) for t in W[e : e + core.EVENT_WIDTH])


def _word(a, r: int, c: int):
    return a[r] if a.ndim == 1 else a[r, c]


def _set_word(a, r: int, c: int, value) -> None:
    if a.ndim == 1:
        a[r] = value
    else:
        a[r, c] = value


class _Session:
    """Wraps the driver modules' memory ops so that each also logs its pebble moves."""

    def __init__(self, rec: _Recorder, names: list[str]) -> None:
        self.rec, self.names = rec, names
        self.buffers: dict[int, tuple] = {}  # live handle -> (fast array, nr, nc): the words a free releases
        self.init: dict[tuple[int, int, int], int] = {}  # (array, r, c) -> the init vertex that word holds

    def _vertex_in_slow(self, aid: int, src, r: int, c: int) -> int:
        x = _word(src, r, c)
        if isinstance(x, Value):
            return x.v
        v = self.init.get((aid, r, c))
        if v is None:
            raise RuntimeError(f"load of {self.names[aid]}[{r},{c}], a word no one wrote")
        return v

    def _fast_words(self, a, nr: int, nc: int) -> list:
        a = np.asarray(a).view(np.ndarray)
        return list(a[:nr].ravel()) if a.ndim == 1 else list(a[:nr, :nc].ravel())

    def wrap(self, name: str, op):
        rec = self.rec

        if name in ("load", "load_vec"):

            def wrapped(W, aid, src, r0, *rest):
                h = op(W, aid, src, r0, *rest)
                if not rec.active:
                    return h
                _, _, r0_, nr, c0, nc, *_ = _last_event(W)
                dst = rest[-1]
                if src is not None:
                    rec.log.append(
                        ("R1", [self._vertex_in_slow(aid, src, r0_ + i, c0 + j) for i in range(nr) for j in range(nc)])
                    )
                    self.buffers[h] = (dst, nr, nc)
                return h

        elif name in ("store", "store_vec", "store_to"):

            def wrapped(W, h, src, *rest):
                if not rec.active:
                    return op(W, h, src, *rest)
                if src is not None:
                    row = core.T0 + (h & (core.MAX_TILES - 1)) * core._STRIDE  # the tile's row in the table
                    nr, nc = int(W[row + core._TNR]), int(W[row + core._TNC])
                    words = self._fast_words(src, nr, nc)
                    for k, x in enumerate(words):
                        if not isinstance(x, Value):  # a plain constant in fast memory: a constant vertex
                            words[k] = Value(float(x), rec.compute(("const", float(x)), "const", (), f"const({x})"))
                out = op(W, h, src, *rest)
                _, aid, r0, nr, c0, nc, *_ = _last_event(W)
                if src is not None:
                    dst = rest[0] if name != "store_to" else rest[1]
                    for k, x in enumerate(words):
                        _set_word(dst, r0 + k // nc, c0 + k % nc, x)
                    rec.log.append(("R2", [x.v for x in words]))
                    self.buffers.setdefault(h, (src, nr, nc))
                return out

        elif name == "free":

            def wrapped(W, h):
                if not rec.active:
                    return op(W, h)
                held = self.buffers.pop(h, None)
                if held is not None:
                    rec.log.append(("use", [x.v for x in self._fast_words(*held) if isinstance(x, Value)]))
                return op(W, h)

        elif name == "init_slow":

            def wrapped(W, aid, words):
                out = op(W, aid, words)
                if not rec.active:
                    return out
                _, _, _, nr, _, nc, *_ = _last_event(W)
                for r in range(nr):
                    for c in range(nc):
                        where = f"{self.names[aid]}[{r},{c}]" if nc > 1 else f"{self.names[aid]}[{r}]"
                        v = rec.compute(("init", aid, r, c), "const", (), f"init:{where}")
                        self.init[(aid, r, c)] = v
                        rec.log.append(("R2", [v]))
                return out

        else:
            return op
        return wrapped


_OPS = ("load", "load_vec", "store", "store_vec", "store_to", "free", "init_slow")


@contextmanager
def _symbolic(session: _Session):
    """Patch the driver modules for the run: plain-Python functions, Value-aware math/max, object buffers and
    recorded memory ops; restored afterwards."""
    from iosim.algorithms import _tiles, flash, paged, square_tiling, standard
    from iosim.algorithms import tile_masks as masks

    saved = []
    for mod in (_tiles, masks, flash, square_tiling, standard, paged):
        for name, obj in list(vars(mod).items()):
            new = None
            if isinstance(obj, Dispatcher):  # an @njit function: its plain Python
                new = obj.py_func
            elif name in _OPS:
                new = session.wrap(name, obj)
            elif name == "buffer":
                new = _buffer
            elif name == "math":
                new = _MATH
            if new is not None:
                saved.append((mod, name, obj))
                setattr(mod, name, new)
        saved.append((mod, "max", None))
        mod.max = _max
    try:
        yield
    finally:
        for mod, name, obj in reversed(saved):
            if obj is None:
                delattr(mod, name)
            else:
                setattr(mod, name, obj)


class _RecordingMemory(TwoLevelMemory):
    """A traced memory whose ``call`` records the driver's arithmetic (and runs it once: no trace rerun)."""

    def __init__(self, M: int, rec: _Recorder | None) -> None:  # noqa: N803
        super().__init__(M, strict=True, trace=True, trace_capacity=1 << 18)
        self.rec = rec

    def call(self, driver, *args):
        if self.rec is not None:
            self.rec.active = True
        try:
            out = driver(self.W, *args)
        finally:
            if self.rec is not None:
                self.rec.active = False
        self.check()
        return out


# ---------------------------------------------------------------------------------------------------------------
# From the log to checked moves
# ---------------------------------------------------------------------------------------------------------------
def _moves(log: list[tuple]) -> list[Move]:
    """The log as moves, with an R4 right after each red pebble's last use (before its vertex is next read or
    computed again)."""
    open_last: dict[int, int] = {}  # vertex -> time of the last use in its current red interval
    remove_at: dict[int, list[int]] = {}

    def close(v: int, t: int | None = None) -> None:
        """End v's red interval at its last use, unless that use is entry t itself (v read twice in one tile)."""
        if t is not None and open_last[v] == t:
            return
        remove_at.setdefault(open_last.pop(v), []).append(v)

    for t, entry in enumerate(log):
        kind = entry[0]
        if kind == "R3":
            for p in entry[2]:
                if p in open_last:
                    open_last[p] = t
            v = entry[1]
            if v in open_last:
                close(v, t)
            open_last[v] = t
        elif kind == "R1":
            for v in entry[1]:
                if v in open_last:
                    close(v, t)
                open_last[v] = t
        else:  # R2 and a free's release: uses
            for v in entry[1]:
                if v in open_last:
                    open_last[v] = t
    for v in list(open_last):
        close(v)
    moves: list[Move] = []
    for t, entry in enumerate(log):
        kind = entry[0]
        if kind == "R3":
            moves.append(Move("R3", entry[1]))
        elif kind in ("R1", "R2"):
            moves.extend(Move(kind, v) for v in entry[1])
        for v in dict.fromkeys(remove_at.get(t, ())):
            moves.append(Move("R4", v))
    return moves


@dataclass
class PebbleRun:
    """An iosim run as a pebbling: the run's DAG, the moves, the game's verdict and the simulator's counts."""

    algorithm: str
    pass_: str
    N: int
    d: int
    M: int
    causal: bool
    graph: Graph
    moves: list[Move]
    outcome: Outcome | None
    illegal: IllegalMoveError | None
    sim_reads: int
    sim_writes: int
    sim_init_writes: int
    sim_peak: int
    level1: int  # level-1 product vertices Q[i,k] K[j,k] of the papers' graph found in the run's DAG
    max_error: float  # outputs of the symbolic run vs the float64 reference
    mask: str = "none"  # the mask's label (iosim.masking.masks), "causal" for the causal flag
    problem: object = None  # the iosim.Problem run (None: one head, N and d)
    gqa: str = "per-head"

    @property
    def level1_total(self) -> int:
        """The level-1 products Q[i,k] K[j,k] a dense run forms: N^2 d, or B H_q N_q N_k d_qk over a problem."""
        p = self.problem
        return self.N * self.N * self.d if p is None else p.B * p.H_q * p.N_q * p.N_k * p.d_qk

    @property
    def legal(self) -> bool:
        return self.illegal is None

    @property
    def M_prime(self) -> int | None:  # noqa: N802
        """The red pebbles the pebbling needs: its red peak (M plus the per-row scalars and temporaries the memory
        model does not count); None when a move is illegal."""
        return None if self.outcome is None else self.outcome.peak

    @property
    def legal_at_M(self) -> bool:  # noqa: N802
        """Legal in the red-blue game with M red pebbles: no illegal move and a red peak of at most M."""
        return self.legal and self.outcome is not None and self.outcome.peak <= self.M

    def legality(self) -> str:
        """One phrase that says what is true: legal with M, or legal only with M' = the red peak (and by how much it
        exceeds M), or the illegal move."""
        if not self.legal:
            return f"illegal: {self.illegal}"
        if self.legal_at_M:
            return f"legal with M = {self.M} red pebbles (red peak {self.M_prime})"
        over = self.M_prime - self.M
        return (
            f"legal with M' = {self.M_prime} red pebbles, not with M = {self.M}: the red peak exceeds M by {over} "
            "(per-row scalars and temporaries the memory model does not count)"
        )

    @property
    def io_matches(self) -> bool:
        return self.outcome is not None and self.outcome.io == self.sim_reads + self.sim_writes

    def as_dict(self) -> dict:
        o = self.outcome
        return {
            "algorithm": self.algorithm,
            "pass": self.pass_,
            "N": self.N,
            "d": self.d,
            "M": self.M,
            "causal": self.causal,
            "mask": self.mask,
            **({"problem": self.problem.as_dict(), "gqa": self.gqa} if self.problem is not None else {}),
            "vertices": len(self.graph),
            "moves": len(self.moves),
            "legal": self.legal,
            "legal_at_M": self.legal_at_M,
            "M_prime": self.M_prime,
            "illegal": None if self.illegal is None else str(self.illegal),
            "pebble_reads": None if o is None else o.reads,
            "pebble_writes": None if o is None else o.writes,
            "pebble_io": None if o is None else o.io,
            "sim_reads": self.sim_reads,
            "sim_writes": self.sim_writes,
            "sim_init_writes": self.sim_init_writes,
            "sim_io": self.sim_reads + self.sim_writes,
            "io_matches": self.io_matches,
            "complete": None if o is None else o.complete,
            "red_peak": None if o is None else o.peak,
            "model_peak": self.sim_peak,
            "over_M": None if o is None else max(0, o.peak - self.M),
            "level1_products": self.level1,
            "max_error": self.max_error,
        }


def level1_products(graph: Graph, pairs=None) -> int:
    """How many product vertices with parents exactly {Q[i,k], K[j,k]} the graph has (N^2 d when all are there).
    ``pairs(i, j)``: whether query row i meets key row j (a problem: only rows of one batch item, query head h with
    key/value head h // g); by default every pair."""
    found = set()
    for v, ps in enumerate(graph.parents):
        if graph.ops[v] == "mul" and len(ps) == 2:
            a, b = sorted(graph.names[p] for p in ps)
            if a.startswith("K[") and b.startswith("Q[") and a.split(",")[1] == b.split(",")[1]:
                if pairs is None or pairs(int(b[2:].split(",")[0]), int(a[2:].split(",")[0])):
                    found.add((a, b))
    return len(found)


def _check_sizes(algorithm: str, pass_: str, N: int, d: int, M: int) -> None:  # noqa: N803
    for name, value, hi in (("N", N, MAX_N), ("d", d, MAX_D)):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= hi:
            raise InputError(name, f"of a run as a pebbling must be an integer in [1, {hi}] (moves per element)", value)
    if not isinstance(M, int) or isinstance(M, bool) or M < 1:
        raise InputError("M", "must be a positive integer", M)
    if pass_ not in PASSES:
        raise InputError("pass", f"must be one of {', '.join(PASSES)}", pass_)
    algo = registry.get(algorithm)
    if not algo.builtin:
        raise InputError("algorithm", "must be a built-in algorithm (its driver runs symbolically)", algorithm)


def _leaves(rec: _Recorder, name: str, data: np.ndarray) -> np.ndarray:
    out = np.empty(data.shape, dtype=object)
    for idx in np.ndindex(data.shape):
        label = f"{name}[{','.join(str(i) for i in idx)}]"
        out[idx] = Value(float(data[idx]), rec.vertex(("input", label), label, "input", ()))
    return out


def _played(rec: _Recorder, name: str, outputs, M: int):  # noqa: N803
    """The recorded run's graph (its outputs: the vertices of the ``outputs`` arrays), its moves and the game's
    verdict with M red pebbles: (graph, moves, outcome or None, the illegal move or None)."""
    graph = Graph(name)
    graph.names, graph.ops, graph.parents = rec.names, rec.ops, rec.parents
    graph.index = {n: v for v, n in enumerate(rec.names)}
    graph.outputs = list(
        dict.fromkeys(x.v for a in outputs if a is not None for x in np.ravel(a) if isinstance(x, Value))
    )
    moves = _moves(rec.log)
    try:
        return graph, moves, Game(graph, M, strict=False).play(moves), None
    except IllegalMoveError as e:
        return graph, moves, None, e


MAX_PROBLEM_SCORES = MAX_N * MAX_N  # a problem's scores B H_q N_q N_k, at most one largest one-head run's


@dataclass(frozen=True)
class _ProblemAsk:
    """A problem as a pebbling, as asked: :func:`pebble_run`'s arguments over an :class:`iosim.Problem` (``M`` red
    pebbles, ``gqa`` per-head or packed, ``scale`` None for 1/sqrt(d_qk), ``mask`` and ``kv_policy`` as
    :func:`iosim.run` takes them, ``Br``, ``Bc``, ``B`` explicit tiles)."""

    algorithm: str
    problem: object
    M: int  # noqa: N815
    pass_: str
    gqa: str
    seed: int
    scale: float | None
    mask: object = None
    kv_policy: str | None = None
    Br: int | None = None  # noqa: N815
    Bc: int | None = None  # noqa: N815
    B: int | None = None  # noqa: N815


def _problem_run(ask: _ProblemAsk) -> PebbleRun:
    """:func:`pebble_run` over an :class:`iosim.Problem`: flash1 or flash2 over batch and heads (GQA per-head or
    packed), N_q against N_k keys, d_qk and d_v, causal bottom-right or a mask over the N_k positions (the queries
    its last N_q rows), run symbolically through the problem drivers of :mod:`iosim.algorithms.flash` (a
    contiguous cache, one split, no latent). Steps: check the request (:func:`_check_problem`), cut the problem
    into the parts one mask covers (:func:`_problem_parts`), tile it, draw Q, K, V, run each part symbolically
    (:func:`_record_problem`), play the recorded moves, and hold the outputs against the float64 reference."""
    from iosim.theory.tiling import problem_tiling

    _check_problem(ask)
    p, M = ask.problem, ask.M  # noqa: N806
    _, _, rows = p.groups(ask.gqa)
    parts, heads = _problem_parts(ask)
    t = problem_tiling(ask.algorithm, p, M, "fit", rows, False, ask.Br, ask.Bc)
    scale = 1.0 / math.sqrt(p.d_qk) if ask.scale is None else float(ask.scale)
    rng = np.random.default_rng(ask.seed)
    Q = rng.standard_normal((p.B * p.H_q * p.N_q, p.d_qk))  # noqa: N806
    K = rng.standard_normal((p.B * p.H_kv * p.N_k, p.d_qk))  # noqa: N806
    V = rng.standard_normal((p.B * p.H_kv * p.N_k, p.d_v))  # noqa: N806
    rec, mem, O, O_ref = _record_problem(ask, parts, t, scale, (Q, K, V))  # noqa: N806
    graph, moves, outcome, illegal = _played(rec, f"{ask.algorithm}-forward-{ask.gqa}:{p},M={M}", [O], M)
    stats = mem.stats()
    if len(parts) > 1:  # each query head against its key/value head under its own mask, one head at a time
        _per_head_reference(p, heads, (Q, K, V), scale, O_ref)
    err = float(np.max(np.abs(np.vectorize(_x, otypes=[float])(O) - O_ref)))
    tmask = parts[0][3]
    label = (f"{heads[0][0].label} per (b, h)" if len(parts) > 1
             else tmask.label if tmask else "causal" if p.causal else "none")  # fmt: skip

    def pairs(i: int, j: int) -> bool:  # query row i (b, h, r) meets key row j (b, h_kv, c): same b, h_kv = h // g
        b, h = divmod(i // p.N_q, p.H_q)
        return j // p.N_k == b * p.H_kv + h // p.g

    return PebbleRun(
        ask.algorithm, "forward", p.N_q, p.d_qk, M, p.causal, graph, moves, outcome, illegal, stats.reads,
        stats.writes, stats.init_writes, stats.peak, level1_products(graph, pairs), err,
        label, p, ask.gqa,
    )  # fmt: skip


def _check_problem(ask: _ProblemAsk) -> None:
    """What a problem's pebbling takes, checked in this order: an iosim.Problem; flash1 or flash2 with tiles it
    takes; the forward pass; a contiguous cache without a latent; a known GQA policy; at most
    :data:`MAX_PROBLEM_SCORES` scores and widths of at most :data:`MAX_D`; a positive M."""
    from iosim.spec.problem import GQA_POLICIES, Problem
    from iosim.spec.schedule import explicit_tiles

    p = ask.problem
    if not isinstance(p, Problem):
        raise InputError("problem", "must be an iosim.Problem", type(p).__name__)
    if ask.algorithm not in ("flash1", "flash2"):
        raise InputError("algorithm", "of a problem as a pebbling must be flash1 or flash2", ask.algorithm)
    explicit_tiles(registry.get(ask.algorithm), ask.Br, ask.Bc, ask.B)
    if ask.pass_ != "forward":
        raise InputError("pass", "of a problem as a pebbling must be forward", ask.pass_)
    if p.page_size is not None or p.latent:
        raise InputError("problem", "as a pebbling takes a contiguous KV cache without an MLA latent", str(p))
    if ask.gqa not in GQA_POLICIES:
        raise InputError("gqa", f"must be one of {', '.join(GQA_POLICIES)}", ask.gqa)
    scores = p.B * p.H_q * p.N_q * p.N_k
    if scores > MAX_PROBLEM_SCORES or max(p.d_qk, p.d_v) > MAX_D:
        raise InputError(
            "problem",
            f"as a pebbling must have at most {MAX_PROBLEM_SCORES} scores (B H_q N_q N_k) and widths at most {MAX_D} "
            "(moves per element)",
            str(p),
        )
    M = ask.M  # noqa: N806
    if not isinstance(M, int) or isinstance(M, bool) or M < 1:
        raise InputError("M", "must be a positive integer", M)


def _problem_parts(ask: _ProblemAsk):
    """The parts of the problem that each run under one mask, as (b, first query head, heads, mask), and each query
    head's own mask (``heads[b][h]``) when they differ (None otherwise): the whole problem under one mask, or the
    runs of heads that share one (:mod:`iosim.masking.head_masks`)."""
    from iosim.runner.problem_runs import problem_mask

    p, mask = ask.problem, ask.mask
    if mask is None or (isinstance(mask, str) and mask in ("none", "dense")):
        return [(0, 0, p.H_q, None)], None
    from iosim.masking import head_masks

    one, heads = head_masks.resolve(p, mask)  # heads: each query head's own mask, when they differ
    if heads is not None:
        return head_masks.part_masks(p, heads, head_masks.cut(p, heads), ask.gqa), heads
    return [(0, 0, p.H_q, problem_mask(p, one, ask.kv_policy))], None


def _record_problem(ask: _ProblemAsk, parts, t, scale: float, arrays):
    """Run each part symbolically, one after another, each its own problem (:mod:`iosim.masking.head_masks`), through
    flash1's or flash2's problem driver on one recording memory: (recorder, memory, O as Values, O's float64
    reference; the reference is filled here when the problem runs as one part)."""
    from iosim.algorithms import flash
    from iosim.runner.problem_runs import problem_mask
    from iosim.runner.references import problem_reference

    p, kv_policy = ask.problem, ask.kv_policy
    Q, K, V = arrays  # noqa: N806
    rec = _Recorder()
    _REC.append(rec)
    try:
        ins = [_leaves(rec, n, a) for n, a in (("Q", Q), ("K", K), ("V", V))]
        mem = _RecordingMemory(ask.M, rec)
        O = np.empty((p.B * p.H_q * p.N_q, p.d_v), dtype=object)  # noqa: N806
        O_ref = np.empty(O.shape)  # noqa: N806
        with _symbolic(_Session(rec, mem.names)):
            for b, h0, nh, part_mask in parts:
                sub = p if len(parts) == 1 else replace(p, B=1, H_q=nh, H_kv=max(1, nh // p.g))
                tm = part_mask if len(parts) == 1 or part_mask is None else problem_mask(sub, part_mask, kv_policy)
                q0, k0 = (b * p.H_q + h0) * p.N_q, (b * p.H_kv + h0 // p.g) * p.N_k
                qs, ks = slice(q0, q0 + sub.B * sub.H_q * p.N_q), slice(k0, k0 + sub.B * sub.H_kv * p.N_k)
                kw = dict(Br=t.Br, Bc=t.Bc, gqa=ask.gqa, mla="shared", scale=scale, dtype=np.dtype(object), mask=tm)
                args = (ins[0][qs], ins[1][ks], ins[2][ks], None)
                if ask.algorithm == "flash2":
                    O[qs] = flash.flash2_problem(mem, sub, *args, splits=1, combine_rows=1, **kw)[0]
                else:
                    O[qs] = flash.flash1_problem(mem, sub, *args, **kw)[0]
                if len(parts) == 1:
                    O_ref[qs] = problem_reference(sub, Q[qs], K[ks], V[ks], scale, tm)[0]
    finally:
        _REC.pop()
    return rec, mem, O, O_ref


def _per_head_reference(p, heads, arrays, scale: float, O_ref) -> None:  # noqa: N803
    """Fill ``O_ref`` head by head: each query head (b, h) against its key/value head h // g under its own mask
    ``heads[b][h]``."""
    from iosim.runner.references import problem_reference

    Q, K, V = arrays  # noqa: N806
    head = replace(p, B=1, H_q=1, H_kv=1)
    for b in range(p.B):
        for h in range(p.H_q):
            q0, k0 = (b * p.H_q + h) * p.N_q, (b * p.H_kv + h // p.g) * p.N_k
            qs, ks = slice(q0, q0 + p.N_q), slice(k0, k0 + p.N_k)
            O_ref[qs] = problem_reference(head, Q[qs], K[ks], V[ks], scale, heads[b][h])[0]


def pebble_run(
    algorithm: str,
    N: int | None = None,  # noqa: N803
    d: int | None = None,
    M: int | None = None,  # noqa: N803
    pass_: str = "forward",
    causal: bool = False,
    seed: int = 0,
    scale: float | None = None,
    mask=None,
    kv_policy: str | None = None,
    problem=None,
    gqa: str = "per-head",
    Br: int | None = None,  # noqa: N803
    Bc: int | None = None,  # noqa: N803
    B: int | None = None,  # noqa: N803
) -> PebbleRun:
    """Run ``algorithm``'s ``pass_`` at (N, d, M) as a pebbling (tiling rule ``fit``) and check it. ``mask`` (an
    :mod:`iosim.masking.masks` pattern or ``--mask`` string) and ``kv_policy`` are those of :func:`iosim.run`.
    ``problem``
    (an :class:`iosim.Problem`, in place of N and d) with ``gqa``: flash1 or flash2's forward over the problem.
    ``Br``, ``Bc`` (flash1, flash2) and ``B`` (the square tile) are :func:`iosim.run`'s explicit tiles, checked
    against M as it checks them. ``pebble_run(problem, schedule, M)`` takes the three objects (an
    :class:`iosim.Problem`, an :class:`iosim.Schedule` or an algorithm's name, and M).

    Steps: the objects form is unpacked into keywords; a problem goes to :func:`_problem_run`; one head is checked,
    tiled (:func:`_one_head_tiling`), run symbolically (:func:`_record_one_head`), played and held against the
    float64 reference (:func:`_max_error`)."""
    from iosim.masking.masks import compile_mask
    from iosim.spec.problem import Problem
    from iosim.spec.schedule import explicit_tiles

    if isinstance(algorithm, Problem):  # pebble_run(problem, schedule, M): N and d hold the schedule and M here
        return _from_objects(algorithm, N, d if d is not None else M, causal, seed, scale, mask, kv_policy,
                             problem, gqa, (Br, Bc, B))  # fmt: skip
    if problem is not None:
        if N is not None or d is not None or causal:
            raise InputError("N, d, causal", "are fields of the problem when problem= is given", (N, d))
        return _problem_run(_ProblemAsk(algorithm, problem, M, pass_, gqa, seed, scale, mask, kv_policy, Br, Bc, B))
    _check_sizes(algorithm, pass_, N, d, M)
    algo = registry.get(algorithm)
    given = explicit_tiles(algo, Br, Bc, B)
    tmask = compile_mask(mask, N, causal, kv_policy)  # what the built-in drivers take as their ``causal`` argument
    causal = tmask.is_causal
    allowed = tmask if not causal and tmask.label != "none" else None
    t, tb = _one_head_tiling(algo, given, N, d, M, pass_, tmask)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    rng = np.random.default_rng(seed)
    Q, K, V = (rng.standard_normal((N, d)) for _ in range(3))  # noqa: N806
    dO = rng.standard_normal((N, d))  # noqa: N806
    rec, mem, outputs = _record_one_head(algo, pass_, (Q, K, V, dO), N, d, M, (t, tb), scale, tmask)
    masked = f"-{tmask.label}" if causal or allowed is not None else ""
    graph, moves, outcome, illegal = _played(rec, f"{algorithm}-{pass_}{masked}:{N}x{d},M={M}", outputs.values(), M)
    stats = mem.stats()
    err = _max_error(algorithm, pass_, outputs, Q, K, V, dO, scale, causal, allowed)
    return PebbleRun(
        algorithm, pass_, N, d, M, causal, graph, moves, outcome, illegal, stats.reads, stats.writes,
        stats.init_writes, stats.peak, level1_products(graph), err, tmask.label,
    )  # fmt: skip


def _from_objects(problem, schedule, memory, causal, seed, scale, mask, kv_policy, given_problem, gqa, tiles):
    """``pebble_run(problem, schedule, M)``: the schedule's fields as keywords (a keyword an object holds is refused
    by :func:`iosim.spec.schedule.from_objects`), then :func:`pebble_run` over the problem."""
    from iosim.spec.schedule import from_objects

    Br, Bc, B = tiles  # noqa: N806
    given = dict(kv_policy=kv_policy, causal=causal, problem=given_problem, gqa=None if gqa == "per-head" else gqa,
                 Br=Br, Bc=Bc, B=B)  # fmt: skip
    spec, options = from_objects(problem, schedule, given)
    return pebble_run(
        spec.algorithm, M=memory, pass_="backward" if spec.backward else "forward", seed=seed, scale=scale,
        mask=mask, kv_policy=spec.kv_policy, problem=problem, gqa=spec.gqa, Br=spec.Br, Bc=spec.Bc, B=spec.B,
    )  # fmt: skip


def _one_head_tiling(algo, given: dict, N: int, d: int, M: int, pass_: str, tmask):  # noqa: N803
    """The forward tiling and (for the backward pass) the backward tiling under rule ``fit``, or the explicit tiles
    ``given`` (:func:`iosim.spec.schedule.explicit_tiles`) checked against M as :func:`iosim.run` checks them."""
    from iosim.runner.problem_runs import explicit_tiling

    t = algo.choose_tiling(N, d, M, "fit")
    tb = algo.backward_tiling(N, d, M, "fit") if pass_ == "backward" else None
    if given:
        t, tb = explicit_tiling(algo, given, t, tb, N, d, M, tmask, True)
    return t, tb


def _record_one_head(algo, pass_: str, arrays, N: int, d: int, M: int, tilings, scale: float, tmask):  # noqa: N803
    """Run one head's pass symbolically on a recording memory: (recorder, memory, the outputs as Values). The
    backward reads the forward's outputs (run as usual, in float64): inputs of its graph, named by their arrays
    (O[r,c], l[r], P[i,j])."""
    Q, K, V, dO = arrays  # noqa: N806
    t, tb = tilings
    rec = _Recorder()
    _REC.append(rec)
    try:
        ins = {"Q": _leaves(rec, "Q", Q), "K": _leaves(rec, "K", K), "V": _leaves(rec, "V", V)}
        if pass_ == "forward":
            mem = _RecordingMemory(M, rec)
            with _symbolic(_Session(rec, mem.names)):
                outputs = algo.forward(mem, ins["Q"], ins["K"], ins["V"], N, d, t, scale, tmask, np.dtype(object))
        else:
            fwd = algo.forward(TwoLevelMemory(M), Q, K, V, N, d, t, scale, tmask, np.dtype(np.float64))
            fwd_in = {k: _leaves(rec, k, a) for k, a in fwd.items() if a is not None}
            mem = _RecordingMemory(M, rec)
            dO_in = _leaves(rec, "dO", dO)  # noqa: N806
            with _symbolic(_Session(rec, mem.names)):
                outputs = algo.backward(
                    mem, ins["Q"], ins["K"], ins["V"], dO_in, fwd_in, N, d, tb, scale, tmask, np.dtype(object)
                )
    finally:
        _REC.pop()
    return rec, mem, outputs


def _max_error(algorithm, pass_, outputs, Q, K, V, dO, scale, causal, mask=None) -> float:  # noqa: N803
    from iosim.algorithms.reference import attention_backward, attention_forward

    def num(a):
        return np.vectorize(_x, otypes=[float])(a)

    if pass_ == "forward":
        O_ref, _ = attention_forward(Q, K, V, scale=scale, causal=causal, mask=mask)
        return float(np.max(np.abs(num(outputs["O"]) - O_ref)))
    refs = attention_backward(Q, K, V, dO, scale=scale, causal=causal, mask=mask)
    return float(max(np.max(np.abs(num(outputs[n]) - r)) for n, r in zip(("dQ", "dK", "dV"), refs, strict=True)))

"""The exact minimum I/O of a tiny graph: Q(G, M) = min (R1 + R2) over complete calculations, by A* search.

A state is (red set, blue set) as two bit masks. Removing pebbles is free, and removing one earlier than needed
never helps (a red pebble only ever blocks capacity), so the search removes lazily: a read or a compute that finds
all M red pebbles in use comes paired with the removal of one red pebble (any but the new vertex's parents). Blue
pebbles are never removed (slow memory is unbounded). Reads cost 1, writes cost 1, computes and removals 0; the
heuristic (how many outputs still lack a blue pebble, each needs one write) never overestimates, so the first
finished state popped is optimal. Recomputation is allowed, as in the papers.

Where it gives up: a graph of more than :data:`MAX_VERTICES` vertices is refused before searching, and a search
that has expanded :data:`MAX_STATES` states without finishing stops with an :class:`~iosim.base.errors.InputError`
saying so (the optimum is then unknown, not guessed). Both limits are arguments. A graph whose vertex has k parents
needs M >= k + 1 (k parents and the vertex itself red at once): smaller M is refused as unwinnable.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

from iosim.base.errors import InputError
from iosim.pebble.game import Game, Move
from iosim.pebble.graph import Graph

MAX_VERTICES = 40
MAX_STATES = 400_000


@dataclass
class Optimum:
    """The minimum I/O of ``graph`` with M red pebbles, one optimal schedule (checked by the game) and the effort."""

    graph: str
    M: int
    io: int
    moves: list[Move]
    states: int

    def as_dict(self) -> dict:
        return {
            "graph": self.graph,
            "M": self.M,
            "optimum_io": self.io,
            "moves": len(self.moves),
            "states": self.states,
        }


def min_M(graph: Graph) -> int:
    """The fewest red pebbles with which the game on ``graph`` can be won: max in-degree + 1 (at least 1)."""
    return max([len(ps) + 1 for ps in graph.parents] + [1])


def optimum(
    graph: Graph,
    M: int,  # noqa: N803
    max_vertices: int = MAX_VERTICES,
    max_states: int = MAX_STATES,
    allow_long: bool = False,
) -> Optimum:
    """The exact minimum I/O of ``graph`` with ``M`` red pebbles (InputError past the search's limits). A search
    allowed over a minute (``max_states`` times the cost of a state, :mod:`iosim.runner.estimate`) needs
    ``allow_long=True``; over an hour is refused. Steps: check the arguments and the search's cost
    (:func:`_check_search`), write the graph as bit masks (:class:`_Bits`), run A* (:func:`_astar`)."""
    _check_search(graph, M, max_vertices, max_states, allow_long)
    return _astar(graph, _Bits.of(graph, M), max_states)


def _check_search(graph, M, max_vertices, max_states, allow_long) -> None:  # noqa: N803
    """The graph, the limits, the search's time (:mod:`iosim.runner.estimate`), the graph's size and M, in that order:
    the first that fails is an InputError naming it."""
    from iosim.runner import estimate

    if not isinstance(graph, Graph):
        raise InputError("graph", "must be an iosim.pebble Graph (iosim.pebble.named('matmul:2x2x2'), ...)", graph)
    for name, v in (("max_vertices", max_vertices), ("max_states", max_states)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(name, "must be a positive integer", v)
    estimate.check(
        estimate.pebble_seconds(max_states),
        f"a search of up to {max_states:,} states",
        allow_long=allow_long,
        parameter="max_states",
        value=max_states,
        remedy="use a smaller --max-states",
    )
    n = len(graph)
    if n > max_vertices:
        raise InputError(
            "--optimum",
            f"searches graphs of at most {max_vertices} vertices exhaustively; {graph.name} has {n}",
        )
    if not isinstance(M, int) or isinstance(M, bool) or M < min_M(graph):
        raise InputError("M", f"must be at least {min_M(graph)} for {graph.name} (a vertex and its parents red)", M)


@dataclass(frozen=True)
class _Bits:
    """The graph as the search sees it: vertex v is bit v; ``parents[v]`` the mask of v's parents; ``inputs`` and
    ``outputs`` masks; ``computable`` the non-input vertices in order; ``M`` the red pebbles."""

    n: int
    parents: list[int]
    inputs: int
    outputs: int
    computable: list[int]
    M: int  # noqa: N815

    @classmethod
    def of(cls, graph: Graph, M: int) -> _Bits:  # noqa: N803
        return cls(
            len(graph),
            [sum(1 << p for p in ps) for ps in graph.parents],
            sum(1 << v for v in graph.inputs),
            sum(1 << v for v in graph.outputs),
            [v for v in range(len(graph)) if not graph.is_input(v)],
            M,
        )


def _heuristic(g: _Bits, red: int, blue: int) -> int:
    """Outputs without blue (one write each) plus the inputs, not red, that some such output still needs through
    vertices with neither pebble (each needs a read: an input is never computed). Never overestimates."""
    parents, inputs = g.parents, g.inputs
    region, stack, need = 0, [], 0
    missing = g.outputs & ~blue
    m = missing & ~red
    while m:
        u = m & -m
        m ^= u
        stack.append(u.bit_length() - 1)
        region |= u
    while stack:
        v = stack.pop()
        ps = parents[v] & ~red & ~region
        region |= ps
        while ps:
            u = ps & -ps
            ps ^= u
            if not blue & u:
                stack.append(u.bit_length() - 1)
            elif inputs & u:
                need += 1
    return missing.bit_count() + need


def _live(g: _Bits, blue: int) -> int:
    """The vertices with a path to an output that lacks a blue pebble (the only ones worth reading or computing:
    anything else can be dropped from a schedule with all its consequences)."""
    parents = g.parents
    alive = g.outputs & ~blue
    frontier = alive
    while frontier:
        u = frontier & -frontier
        frontier ^= u
        ps = parents[u.bit_length() - 1] & ~alive
        alive |= ps
        frontier |= ps
    return alive


def _place(red: int, blue: int, full: bool, v: int, rule: str, cost: int, keep: int):
    """Put a red pebble on v by ``rule`` (R1 or R3): at once while a pebble is free, else paired with the removal
    (R4) of each red pebble but those in ``keep`` in turn."""
    bit = 1 << v
    if not full:
        yield red | bit, blue, cost, (Move(rule, v),)
        return
    rest = red & ~keep
    while rest:
        u = rest & -rest
        rest ^= u
        yield (red ^ u) | bit, blue, cost, (Move("R4", u.bit_length() - 1), Move(rule, v))


def _successors(g: _Bits, red: int, blue: int):
    """(red, blue, cost, moves) after each move worth trying from (red, blue): a red output not yet blue is written
    at once (a forced move); else each R2 of a live red vertex, each R1 of a live blue one, each R3 of a live vertex
    whose parents are red."""
    ready = red & g.outputs & ~blue
    if ready:  # a red output is written at once: writing it later is never cheaper (a forced move)
        u = ready & -ready
        yield red, blue | u, 1, (Move("R2", u.bit_length() - 1),)
        return
    full = red.bit_count() >= g.M
    alive = _live(g, blue)
    r = red & ~blue & alive  # R2: write a red vertex that is not yet blue
    while r:
        u = r & -r
        r ^= u
        yield red, blue | u, 1, (Move("R2", u.bit_length() - 1),)
    b = blue & ~red & alive  # R1: read a blue vertex
    while b:
        u = b & -b
        b ^= u
        yield from _place(red, blue, full, u.bit_length() - 1, "R1", 1, 0)
    parents = g.parents
    for v in g.computable:  # R3: compute a vertex whose parents are all red
        if not red >> v & 1 and alive >> v & 1 and parents[v] & red == parents[v]:
            yield from _place(red, blue, full, v, "R3", 0, parents[v])


def _pruned(g: _Bits, red: int, blue: int, moves: tuple[Move, ...]):
    """A successor state with its dead pebbles gone: a red pebble no missing output can use is removed now (free,
    and never worse: R4 moves appended), and blue on a dead vertex (never read again) is dropped from the state's
    key so that one state stands for all such."""
    alive = _live(g, blue)
    dead = red & ~alive
    if dead:
        red &= alive
        moves += tuple(Move("R4", v) for v in range(g.n) if dead >> v & 1)
    blue &= alive | g.inputs | g.outputs
    return red, blue, moves


def _astar(graph: Graph, g: _Bits, max_states: int) -> Optimum:
    """A* from (no red, the inputs blue) until every output is blue: pop the cheapest f = cost + heuristic, expand
    it (:func:`_successors`, :func:`_pruned`), keep the best cost and the way back to each state. The first
    finished state popped is optimal (the heuristic never overestimates)."""
    M = g.M  # noqa: N806
    start = (0, g.inputs)
    best = {start: 0}
    back: dict[tuple[int, int], tuple[tuple[int, int], tuple[Move, ...]]] = {}
    heap = [(_heuristic(g, 0, g.inputs), 0, 0, 0, g.inputs)]
    tick = expanded = 0
    while heap:
        f, cost, _, red, blue = heapq.heappop(heap)
        if best.get((red, blue), -1) != cost:
            continue
        if g.outputs & ~blue == 0:
            return Optimum(graph.name, M, cost, _path(back, (red, blue), graph, M), expanded)
        expanded += 1
        if expanded > max_states:
            raise InputError(
                "--optimum",
                f"gave up on {graph.name} with M={M} after {max_states} search states (the optimum is at least {f}; "
                f"a larger graph or M needs a smarter search)",
            )
        for r2, b2, step, moves in _successors(g, red, blue):
            ng = cost + step
            r2, b2, moves = _pruned(g, r2, b2, moves)
            if ng < best.get((r2, b2), 1 << 60):
                best[(r2, b2)] = ng
                back[(r2, b2)] = ((red, blue), moves)
                tick += 1
                heapq.heappush(heap, (ng + _heuristic(g, r2, b2), ng, tick, r2, b2))
    raise InputError("graph", f"{graph.name} cannot be pebbled with M={M}")


def _path(back, state, graph: Graph, M: int) -> list[Move]:  # noqa: N803
    out: list[Move] = []
    while state in back:
        state, moves = back[state]
        out.extend(reversed(moves))
    out.reverse()
    game = Game(graph, M)  # the search's schedule, checked by the game itself
    outcome = game.play(out)
    assert outcome.complete and outcome.peak <= M, "the search produced an illegal schedule"
    return out


def bound_rows(graph: Graph, M: int) -> list[tuple[str, float, str]]:  # noqa: N803
    """The papers' lower bounds on Q(graph, M) that apply at its sizes: (name, value, formula). For attention graphs
    those of :mod:`iosim.theory.bounds` (Saha & Ye's graph reads Q, K, V and writes O: the trivial 4Nd is its own);
    for matrix products the trivial bound and the Hong-Kung bound with the tight constant."""
    kind, _, sizes = graph.name.partition(":")
    dims = [int(x) for x in sizes.split("x")]
    if kind == "matmul":
        m, k, n = dims
        return [
            ("trivial", m * k + k * n + m * n, "read A and B, write C"),
            ("Hong-Kung", 2 * m * n * k / M**0.5 - 2 * M, "2mnk/sqrt(M) - 2M (tight constant; docs/theory.md L2)"),
        ]
    from iosim.theory import bounds

    N, d = dims
    found = bounds.backward_bounds(N, d, M) if kind == "attention-backward" else bounds.forward_bounds(N, d, M)
    return [(b.name, b.value, b.formula) for b in found if b.is_lower and b.applies]


def demand_order(graph: Graph) -> list[int]:
    """The non-input vertices in the order a demand-driven evaluation computes them: depth-first from each output
    in turn, parents before children (row by row for attention: O[0,*] needs only row 0 of S, A and D)."""
    seen, order = set(graph.inputs), []
    for out in graph.outputs:
        stack = [(out, False)]
        while stack:
            v, done = stack.pop()
            if done:
                order.append(v)
            elif v not in seen:
                seen.add(v)
                stack.append((v, True))
                stack.extend((p, False) for p in reversed(graph.parents[v]) if p not in seen)
    return order


def greedy(graph: Graph, M: int, order: list[int] | None = None) -> list[Move]:  # noqa: N803
    """A complete schedule that computes the vertices in ``order`` (default :func:`demand_order`), reading parents
    when needed, writing outputs at once, removing a pebble after its last use and, when all M are in use, removing
    the one needed furthest in the future (Belady), writing it first if it is needed again and not yet blue. An upper
    bound on the optimum for graphs too large for :func:`optimum`."""
    if not isinstance(M, int) or isinstance(M, bool) or M < min_M(graph):
        raise InputError("M", f"must be at least {min_M(graph)} for {graph.name} (a vertex and its parents red)", M)
    order = demand_order(graph) if order is None else order
    uses: dict[int, deque[int]] = {}
    for t, v in enumerate(order):
        for p in graph.parents[v]:
            uses.setdefault(p, deque()).append(t)
    red: set[int] = set()
    blue = set(graph.inputs)
    outputs = set(graph.outputs)
    moves: list[Move] = []
    inf = len(order) + 1

    def next_use(u: int, t: int) -> int:
        q = uses.get(u)
        while q and q[0] <= t:
            q.popleft()
        return q[0] if q else inf

    def make_room(t: int, keep: set[int]) -> None:
        while len(red) >= M:
            victim = max(red - keep, key=lambda u: (next_use(u, t - 1), u))
            if next_use(victim, t - 1) < inf and victim not in blue:
                moves.append(Move("R2", victim))
                blue.add(victim)
            moves.append(Move("R4", victim))
            red.discard(victim)

    for t, v in enumerate(order):
        ps = set(graph.parents[v])
        for p in graph.parents[v]:
            if p not in red:
                make_room(t, ps & red)
                moves.append(Move("R1", p))
                red.add(p)
        if v not in red:
            make_room(t, ps)
            moves.append(Move("R3", v))
            red.add(v)
        if v in outputs and v not in blue:
            moves.append(Move("R2", v))
            blue.add(v)
        for u in [*dict.fromkeys(graph.parents[v]), v]:
            if u in red and next_use(u, t) == inf:
                moves.append(Move("R4", u))
                red.discard(u)
    return moves

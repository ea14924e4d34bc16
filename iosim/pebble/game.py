"""The red-blue pebble game (Hong & Kung 1981, as Saha & Ye Def. 2.1 restate it; docs/theory-replay.md).

A red pebble on a vertex means its value is in fast memory, a blue pebble that it is in slow memory. At the start
every input carries a blue pebble; the goal is a blue pebble on every output; at most M red pebbles exist at any
time. The moves:

* **R1** (read) ``v``: place a red pebble on a vertex that carries a blue one. One I/O.
* **R2** (write) ``v``: place a blue pebble on a vertex that carries a red one. One I/O.
* **R3** (compute) ``v``: place a red pebble on a vertex whose parents all carry red pebbles. Inputs have no
  parents but enter fast memory only by R1 (they are data, not computations); a non-input vertex without parents
  (a constant, such as the zeros FlashAttention 1 writes into O, l, m) may be computed at any time. Recomputation
  is allowed.
* **R4** (remove) ``v``: remove the red pebble from a vertex (blue pebbles never need removing: slow memory is
  unbounded).

I/O = number of R1 + R2 moves. R1 on a vertex that is already red, and R2 on one that is already blue, are legal
and count (a schedule that reloads a word it still holds pays for it, as the memory model counts it); they change
nothing else. An illegal move raises :class:`IllegalMoveError` naming the rule, the vertex and why. With
``strict=False`` the capacity is not enforced: the game records the red peak instead (how far above M a schedule
goes).

Schedule files (:func:`parse`): one move a line, ``R1 Q[0,0]`` (the rule, white space, the vertex name); blank
lines and text after ``#`` are ignored; the words read, write, compute, remove may stand for R1 to R4. JSON: a list
of ``["R1", "Q[0,0]"]`` pairs or ``{"rule": "R1", "vertex": "Q[0,0]"}`` objects.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from iosim.base.errors import InputError
from iosim.pebble.graph import Graph

RULES = ("R1", "R2", "R3", "R4")
WORDS = {"read": "R1", "write": "R2", "compute": "R3", "remove": "R4"}
TITLES = {"R1": "R1 (read)", "R2": "R2 (write)", "R3": "R3 (compute)", "R4": "R4 (remove)"}


class IllegalMoveError(ValueError):
    """A move the rules forbid: ``rule``, ``vertex`` (its name), ``step`` (1-based move number) and ``reason``."""

    def __init__(self, rule: str, vertex: str, reason: str, step: int, line: int | None = None) -> None:
        self.rule, self.vertex, self.reason, self.step, self.line = rule, vertex, reason, step, line
        where = f"{step}" + (f" (line {line})" if line is not None else "")
        super().__init__(f"illegal move {where}: {TITLES[rule]} on {vertex}: {reason}")


@dataclass(frozen=True)
class Move:
    rule: str
    vertex: int
    line: int | None = None  # the schedule file's line, for messages


@dataclass
class Outcome:
    """A finished (or abandoned) game: I/O = reads + writes, the red peak, and whether every output is blue."""

    graph: str
    M: int | None
    moves: int
    reads: int
    writes: int
    computes: int
    peak: int
    complete: bool
    missing: list[str]  # outputs without a blue pebble

    @property
    def io(self) -> int:
        return self.reads + self.writes

    def as_dict(self) -> dict:
        return {
            "graph": self.graph,
            "M": self.M,
            "moves": self.moves,
            "reads": self.reads,
            "writes": self.writes,
            "io": self.io,
            "computes": self.computes,
            "red_peak": self.peak,
            "complete": self.complete,
            "missing_outputs": self.missing,
        }


class Game:
    """The game on ``graph`` with at most ``M`` red pebbles (``M=None``: no limit; ``strict=False``: record the
    peak instead of refusing a move past M)."""

    def __init__(self, graph: Graph, M: int | None, strict: bool = True) -> None:  # noqa: N803
        if not isinstance(graph, Graph):
            raise InputError("graph", "must be an iosim.pebble Graph (iosim.pebble.named('matmul:2x2x2'), ...)", graph)
        if M is not None and (not isinstance(M, int) or isinstance(M, bool) or M < 1):
            raise InputError("M", "must be a positive integer (the number of red pebbles)", M)
        if not isinstance(strict, bool):
            raise InputError("strict", "must be True or False", strict)
        self.graph, self.M, self.strict = graph, M, strict
        self.red: set[int] = set()
        self.blue: set[int] = set(graph.inputs)
        self.reads = self.writes = self.computes = self.steps = self.peak = 0

    # the four rules ------------------------------------------------------------------------------------------------
    def _illegal(self, rule: str, v: int, reason: str, line: int | None) -> IllegalMoveError:
        return IllegalMoveError(rule, self.graph.names[v], reason, self.steps + 1, line)

    def _place_red(self, rule: str, v: int, line: int | None) -> None:
        if v in self.red:
            return
        if self.strict and self.M is not None and len(self.red) >= self.M:
            raise self._illegal(rule, v, f"all M={self.M} red pebbles are in use (remove one first, R4)", line)
        self.red.add(v)
        self.peak = max(self.peak, len(self.red))

    def move(self, rule: str, v: int, line: int | None = None) -> None:
        """Play one move (rule R1..R4 on vertex number v); IllegalMoveError if the rules forbid it."""
        g = self.graph
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < len(g):
            raise InputError("vertex", f"must be a vertex number from 0 to {len(g) - 1} of graph {g.name}", v)
        if rule == "R1":
            if v not in self.blue:
                raise self._illegal(rule, v, "it has no blue pebble (not in slow memory)", line)
            self._place_red(rule, v, line)
            self.reads += 1
        elif rule == "R2":
            if v not in self.red:
                raise self._illegal(rule, v, "it has no red pebble (not in fast memory)", line)
            self.blue.add(v)
            self.writes += 1
        elif rule == "R3":
            if g.is_input(v):
                raise self._illegal(rule, v, "it is an input: inputs enter fast memory only by R1", line)
            missing = [g.names[p] for p in g.parents[v] if p not in self.red]
            if missing:
                shown = ", ".join(missing[:4]) + (", ..." if len(missing) > 4 else "")
                raise self._illegal(rule, v, f"parent{'s' if len(missing) > 1 else ''} {shown} not red", line)
            self._place_red(rule, v, line)
            self.computes += 1
        elif rule == "R4":
            if v not in self.red:
                raise self._illegal(rule, v, "it has no red pebble to remove", line)
            self.red.discard(v)
        else:
            raise InputError("rule", f"must be one of {', '.join(RULES)}", rule)
        self.steps += 1

    def play(self, moves, stop: int | None = None) -> Outcome:
        """Play ``moves`` (Move objects or (rule, vertex name) pairs), the first ``stop`` of them if given."""
        if isinstance(moves, (str, bytes)) or not hasattr(moves, "__iter__"):
            raise InputError(
                "moves", "must be a list of Move objects or (rule, vertex name) pairs (a schedule text: parse it "
                "with iosim.pebble.game.parse)", type(moves).__name__,
            )  # fmt: skip
        if stop is not None and (isinstance(stop, bool) or not isinstance(stop, int) or stop < 0):
            raise InputError("stop", "must be None or a non-negative integer (moves to play)", stop)
        for k, mv in enumerate(moves):
            if stop is not None and k >= stop:
                break
            if not isinstance(mv, Move):
                if not isinstance(mv, (tuple, list)) or len(mv) != 2 or not all(isinstance(x, str) for x in mv):
                    raise InputError("moves", f"item {k} must be a Move or a (rule, vertex name) pair of strings", mv)
                mv = Move(mv[0], self.graph.vertex(mv[1]))
            self.move(mv.rule, mv.vertex, mv.line)
        return self.outcome()

    def outcome(self) -> Outcome:
        g = self.graph
        missing = [g.names[v] for v in g.outputs if v not in self.blue]
        return Outcome(
            g.name, self.M, self.steps, self.reads, self.writes, self.computes, self.peak, not missing, missing
        )


# schedule files -------------------------------------------------------------------------------------------------
def _rule(word: str, where: str) -> str:
    rule = WORDS.get(word.lower(), word.upper())
    if rule not in RULES:
        raise InputError(
            "schedule", f"{where}: the move must start with R1, R2, R3 or R4 (or read, write, compute, remove)", word
        )
    return rule


def parse(text: str, graph: Graph, source: str = "schedule") -> list[Move]:
    """The moves of a schedule (text, one move a line, or JSON) on ``graph``; InputError with the line number and
    the reason for a line that does not parse or names no vertex of the graph."""
    if not isinstance(text, str):
        raise InputError("text", "must be a schedule as a string (one move a line, or JSON)", type(text).__name__)
    if not isinstance(graph, Graph):
        raise InputError("graph", "must be an iosim.pebble Graph (iosim.pebble.named('matmul:2x2x2'), ...)", graph)
    stripped = text.lstrip()
    if stripped.startswith(("[", "{")):
        return _parse_json(text, graph, source)
    moves = []
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split(None, 1)
        where = f"{source} line {n}"
        if len(parts) != 2:
            raise InputError("schedule", f"{where}: a move is a rule and a vertex, e.g. 'R1 Q[0,0]'", raw.strip())
        rule = _rule(parts[0], where)
        name = parts[1].strip()
        v = graph.index.get(name)
        if v is None:
            raise InputError("schedule", f"{where}: no vertex {name} in graph {graph.name}", name)
        moves.append(Move(rule, v, n))
    return moves


def _parse_json(text: str, graph: Graph, source: str) -> list[Move]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError("schedule", f"{source} line {e.lineno}: not valid JSON ({e.msg})") from None
    if isinstance(data, dict):
        data = data.get("moves")
    if not isinstance(data, list):
        raise InputError("schedule", f"{source}: JSON must be a list of moves (or an object with a 'moves' list)")
    moves = []
    for k, item in enumerate(data, start=1):
        where = f"{source} move {k}"
        if isinstance(item, dict):
            item = (item.get("rule"), item.get("vertex"))
        if not isinstance(item, (list, tuple)) or len(item) != 2 or not all(isinstance(x, str) for x in item):
            raise InputError("schedule", f'{where}: a move is ["R1", "Q[0,0]"] or {{"rule", "vertex"}}', item)
        v = graph.index.get(item[1].strip())
        if v is None:
            raise InputError("schedule", f"{where}: no vertex {item[1]} in graph {graph.name}", item[1])
        moves.append(Move(_rule(item[0], where), v, None))
    return moves


def format_moves(moves, graph: Graph) -> str:
    """The moves as a schedule file (the text format :func:`parse` reads)."""
    return "".join(f"{m.rule} {graph.names[m.vertex]}\n" for m in moves)

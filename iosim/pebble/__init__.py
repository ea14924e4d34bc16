"""The red-blue pebble game: computation graphs, the game and its rules, iosim runs as pebblings, the exact
minimum I/O of tiny graphs, and the ``iosim pebble`` command. See docs/pebble.md."""

from iosim.pebble.game import Game, IllegalMoveError, Move, Outcome, format_moves, parse
from iosim.pebble.graph import Graph, attention, attention_backward, matmul, named

__all__ = [
    "Game",
    "Graph",
    "IllegalMoveError",
    "Move",
    "Outcome",
    "attention",
    "attention_backward",
    "format_moves",
    "matmul",
    "named",
    "parse",
]

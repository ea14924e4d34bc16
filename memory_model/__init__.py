"""Two-level memory model: fast memory of M words in front of an unbounded slow memory.

See :mod:`iosim.memory_model.core` for the conventions every count in iosim follows, and
:mod:`iosim.memory_model.schedule` for writing a schedule in plain Python.
"""

from iosim.memory_model.core import (
    MAX_TILES,
    ArrayCounts,
    CapacityError,
    ScheduleError,
    Stats,
    Tally,
    Tile,
    Trace,
    TraceTooLargeError,
    TwoLevelMemory,
    alloc,
    alloc_vec,
    free,
    init_slow,
    load,
    load_vec,
    store,
    store_to,
    store_vec,
)
from iosim.memory_model.schedule import FastTile, Memory, SlowArray

__all__ = [
    "MAX_TILES",
    "ArrayCounts",
    "CapacityError",
    "FastTile",
    "Memory",
    "ScheduleError",
    "SlowArray",
    "Stats",
    "Tally",
    "Tile",
    "Trace",
    "TraceTooLargeError",
    "TwoLevelMemory",
    "alloc",
    "alloc_vec",
    "free",
    "init_slow",
    "load",
    "load_vec",
    "store",
    "store_to",
    "store_vec",
]

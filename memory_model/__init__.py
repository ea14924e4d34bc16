"""Two-level memory model: fast memory of M words in front of an unbounded slow memory.

See :mod:`iosim.memory_model.core` for the conventions every count in iosim follows.
"""

from iosim.memory_model.core import (
    ArrayCounts,
    CapacityError,
    Stats,
    Tally,
    TwoLevelMemory,
    alloc,
    free,
    init_slow,
    load,
    load_vec,
    store,
    store_vec,
)

__all__ = [
    "ArrayCounts",
    "Stats",
    "Tally",
    "CapacityError",
    "TwoLevelMemory",
    "alloc",
    "free",
    "init_slow",
    "load",
    "load_vec",
    "store",
    "store_vec",
]

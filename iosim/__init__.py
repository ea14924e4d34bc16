"""iosim: an exact I/O simulator for attention algorithms in the two-level (red-blue pebble) memory model.

>>> import iosim
>>> r = iosim.run("flash2", N=256, d=32, M=4096)
>>> r.stats.total == r.predicted.total
True
"""

from iosim import _numba_cache, masks
from iosim.api import PassResult, Result, algorithm_names, run
from iosim.errors import InputError
from iosim.hierarchy import HierarchyResult, hierarchy
from iosim.kernels.check import CheckReport, check
from iosim.memory_model import CapacityError, Memory, ScheduleError, Trace
from iosim.problem import Problem
from iosim.registry import register, unregister
from iosim.schedule import Schedule
from iosim.sweep import sweep
from iosim.version import __version__ as __version__
from iosim.views.html import show
from iosim.views.replay import ReplayResult, replay

__all__ = [
    "CapacityError",
    "CheckReport",
    "HierarchyResult",
    "InputError",
    "Memory",
    "ScheduleError",
    "Trace",
    "__version__",
    "PassResult",
    "Problem",
    "Result",
    "Schedule",
    "algorithm_names",
    "check",
    "hierarchy",
    "masks",
    "register",
    "replay",
    "ReplayResult",
    "run",
    "show",
    "sweep",
    "unregister",
]

_numba_cache.drop_stale()  # before anything loads from Numba's cache: see iosim/_numba_cache.py

"""iosim: an exact I/O simulator for attention algorithms in the two-level (red-blue pebble) memory model.

>>> import iosim
>>> r = iosim.run("flash2", N=256, d=32, M=4096)
>>> r.stats.total == r.predicted.total
True
"""

from iosim.base import numba_cache as _numba_cache
from iosim.base.errors import InputError
from iosim.base.version import __version__ as __version__
from iosim.hierarchy import HierarchyResult, hierarchy
from iosim.kernels.check import CheckReport, check
from iosim.masking import masks
from iosim.memory_model import CapacityError, Memory, ScheduleError, Trace
from iosim.runner.api import PassResult, Result, algorithm_names, run
from iosim.runner.registry import register, unregister
from iosim.runner.sweep import sweep
from iosim.spec.problem import Problem
from iosim.spec.schedule import Schedule
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

_numba_cache.drop_stale()  # before anything loads from Numba's cache: see iosim/base/numba_cache.py

"""iosim: an exact I/O simulator for attention algorithms in the two-level (red-blue pebble) memory model.

>>> import iosim
>>> r = iosim.run("flash2", N=256, d=32, M=4096)
>>> r.stats.total == r.predicted.total
True
"""

from iosim.api import PassResult, Result, algorithms, run
from iosim.check import CheckReport, check
from iosim.errors import InputError
from memory_model import CapacityError

__all__ = ["CapacityError", "CheckReport", "InputError", "PassResult", "Result", "algorithms", "check", "run"]
__version__ = "0.1.0"

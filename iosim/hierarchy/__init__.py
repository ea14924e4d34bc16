"""Beyond two levels: thread blocks on P SMs, a shared L2, DRAM (:func:`hierarchy`; see :mod:`.simulate`)."""

from iosim.hierarchy.devices import Device, device, presets
from iosim.hierarchy.machine import Machine
from iosim.hierarchy.scheduler import Scheduler
from iosim.hierarchy.simulate import (
    ELEMENT_BYTES,
    ORDERS,
    POLICIES,
    HierarchyResult,
    LevelCounts,
    block_order,
    hierarchy,
    kernel_dtype,
)

__all__ = [
    "ELEMENT_BYTES",
    "ORDERS",
    "POLICIES",
    "Device",
    "HierarchyResult",
    "LevelCounts",
    "Machine",
    "Scheduler",
    "block_order",
    "device",
    "hierarchy",
    "kernel_dtype",
    "presets",
]

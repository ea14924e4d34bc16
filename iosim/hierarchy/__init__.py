"""Beyond two levels: thread blocks on P SMs, a shared L2, DRAM (:func:`hierarchy`; see :mod:`.simulate`)."""

from iosim.hierarchy.devices import Device, device, presets
from iosim.hierarchy.simulate import ORDERS, POLICIES, HierarchyResult, LevelCounts, block_order, hierarchy

__all__ = [
    "ORDERS",
    "POLICIES",
    "Device",
    "HierarchyResult",
    "LevelCounts",
    "block_order",
    "device",
    "hierarchy",
    "presets",
]

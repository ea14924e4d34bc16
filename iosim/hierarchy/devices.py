"""Device presets for the hierarchy: SMs, shared memory per SM and per block, L2 size and line, from the devices table.

The one source of the figures is ``experiments/data/devices.csv`` (installed as package data of
``iosim.experiments``): every figure has its source column there (NVIDIA's architecture whitepapers for SM counts
and L2 sizes, the CUDA C++ Programming Guide for shared memory, Nsight Compute's profiling guide for the 128-byte
L2 line). A device whose row has no ``sms`` is not a hierarchy preset. The file is read, not imported: iosim does
not import the experiments.
"""

from __future__ import annotations

import csv
import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from iosim.errors import InputError

# The CUDA driver reserves 1 KB of shared memory per thread block on compute capability 8.0 and later (CUDA C++
# Programming Guide, "Shared Memory" of compute capabilities 8.x and 9.0): the per-SM budget of k blocks is
# k (smem per block + 1 KB).
RESERVED_SMEM_PER_BLOCK = 1024
MAX_BLOCKS_PER_SM = 32  # resident blocks per SM, cc 8.0 - 9.0 (the same table)


@dataclass(frozen=True)
class Device:
    """One GPU's figures, in bytes."""

    name: str
    sms: int
    smem_per_sm_bytes: int
    smem_per_block_bytes: int
    l2_bytes: int
    l2_line_bytes: int

    def as_dict(self) -> dict:
        return dict(vars(self))


def _table_path() -> Path:
    spec = importlib.util.find_spec("iosim.experiments")  # finds the folder without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("iosim.experiments is not installed: the devices table is its data/devices.csv")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "devices.csv"


@lru_cache(maxsize=1)
def presets() -> dict[str, Device]:
    """The devices of the table that have hierarchy figures, by name."""
    out = {}
    with open(_table_path(), newline="") as f:
        for row in csv.DictReader(f):
            if not row.get("sms"):
                continue
            out[row["device"]] = Device(
                row["device"],
                int(row["sms"]),
                int(row["smem_per_sm_bytes"]),
                int(row["smem_per_block_bytes"]),
                int(row["l2_bytes"]),
                int(row["l2_line_bytes"]),
            )
    return out


def device(name: str) -> Device:
    """A preset by name (case and spaces ignored: ``h100``, ``RTX4090``); InputError naming the presets."""
    table = presets()
    key = "".join(str(name).lower().split())
    for n, dev in table.items():
        if "".join(n.lower().split()) == key:
            return dev
    raise InputError("device", f"must be one of {', '.join(table)}", name)

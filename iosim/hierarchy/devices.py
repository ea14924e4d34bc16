"""Device presets for the hierarchy: SMs, shared memory, the L2 (size, line, sector, partitions) and the per-SM limits
that decide how many thread blocks are resident, from the devices table.

The one source of the figures is ``experiments/data/devices.csv`` (installed as package data of
``iosim.experiments``): every figure has its source column there (NVIDIA's architecture whitepapers for SM counts,
L2 sizes and L2 partitions, the CUDA C++ Programming Guide for shared memory and the per-SM limits, Nsight Compute's
profiling guide for the 128-byte line and the 32-byte sector). :data:`SOURCES` names the source column of each
parameter. A device whose row has no ``sms`` is not a hierarchy preset. The file is read, not imported: iosim does
not import the experiments.

Per-SM limits (registers, resident threads, resident thread blocks) come from :data:`iosim.gpu.resources.ARCHS`
where the table's compute capability is there (the table leaves those cells empty and names ARCHS as the source);
the other compute capabilities carry them in the table. :meth:`Device.arch` gives the occupancy formula
(:func:`iosim.gpu.resources.occupancy`) its ``Arch``.
"""

from __future__ import annotations

import csv
import importlib.util
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path

from iosim.base.errors import InputError

# The CUDA driver reserves 1 KB of shared memory per thread block on compute capability 8.0 and later (CUDA C++
# Programming Guide, "Shared Memory" of compute capabilities 8.x and 9.0): the per-SM budget of k blocks is
# k (smem per block + 1 KB).
RESERVED_SMEM_PER_BLOCK = 1024
MAX_BLOCKS_PER_SM = 32  # resident blocks per SM, cc 8.0 - 9.0 (the same table)

# The devices table's source column of every Device parameter.
SOURCES = {
    "compute_capability": "compute_capability_source",
    "sms": "sms_source",
    "smem_per_sm_bytes": "smem_bytes_source",
    "smem_per_block_bytes": "smem_bytes_source",
    "l2_bytes": "l2_source",
    "l2_line_bytes": "l2_line_source",
    "l2_partitions": "l2_partitions_source",
    "sector_bytes": "sector_bytes_source",
    "regs_per_sm": "sm_limits_source",
    "max_threads_per_sm": "sm_limits_source",
    "max_blocks_per_sm": "sm_limits_source",
}
_ARCH_LIMITS = ("regs_per_sm", "max_threads_per_sm", "max_blocks_per_sm")


def _pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


@dataclass(frozen=True)
class Device:
    """One GPU's figures, in bytes. Every field is checked on construction (InputError naming the field).

    ``l2_partitions``: the L2 is that many equal partitions, each caching the addresses it owns for every SM (the
    A100 and H100 whitepapers' "L2 cache" sections); ``sector_bytes``: the unit the L1 and the L2 count traffic in,
    ``l2_line_bytes // sector_bytes`` sectors per line (Nsight Compute, Memory Tables). ``compute_capability``:
    "major.minor", or "" for a device made by hand, whose limits are then taken as given and which is taken to be
    cc 8.0 or later (1 KiB of shared memory reserved per block)."""

    name: str
    sms: int
    smem_per_sm_bytes: int
    smem_per_block_bytes: int
    l2_bytes: int
    l2_line_bytes: int
    l2_partitions: int = 1
    sector_bytes: int = 32
    regs_per_sm: int = 65536
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = MAX_BLOCKS_PER_SM
    compute_capability: str = ""

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name not in ("name", "compute_capability") and (not isinstance(v, int) or isinstance(v, bool)):
                raise InputError(f"Device.{f.name}", "must be an integer", v)
        checks = (
            ("sms", self.sms >= 1, "must be at least 1"),
            ("smem_per_sm_bytes", self.smem_per_sm_bytes >= 1, "must be at least 1"),
            ("smem_per_block_bytes", 1 <= self.smem_per_block_bytes <= self.smem_per_sm_bytes,
             f"must be in 1..smem_per_sm_bytes ({self.smem_per_sm_bytes})"),
            ("sector_bytes", _pow2(self.sector_bytes) and self.sector_bytes >= 4, "must be a power of two >= 4"),
            ("l2_line_bytes", _pow2(self.l2_line_bytes) and self.l2_line_bytes >= self.sector_bytes,
             f"must be a power of two >= sector_bytes ({self.sector_bytes})"),
            ("l2_bytes", self.l2_bytes >= self.l2_line_bytes and self.l2_bytes % self.l2_line_bytes == 0,
             f"must be a positive multiple of l2_line_bytes ({self.l2_line_bytes})"),
            ("l2_partitions", 1 <= self.l2_partitions and self.l2_bytes % (self.l2_partitions * self.l2_line_bytes)
             == 0, "must be at least 1 and divide the L2 into whole lines"),
            ("regs_per_sm", self.regs_per_sm >= 256, "must be at least 256"),
            ("max_threads_per_sm", self.max_threads_per_sm >= 32 and self.max_threads_per_sm % 32 == 0,
             "must be a positive multiple of 32 (whole warps)"),
            ("max_blocks_per_sm", self.max_blocks_per_sm >= 1, "must be at least 1"),
        )  # fmt: skip
        for field, ok, accepted in checks:
            if not ok:
                raise InputError(f"Device.{field}", accepted, getattr(self, field))
        if self.compute_capability and _cc(self.compute_capability) is None:
            raise InputError("Device.compute_capability", 'must be "major.minor" or ""', self.compute_capability)

    @property
    def sectors_per_line(self) -> int:
        return self.l2_line_bytes // self.sector_bytes

    def arch(self):
        """The per-SM limits as :class:`iosim.gpu.resources.Arch`: ARCHS' entry for this compute capability where
        there is one, else one made from this device's fields (register allocation as cuda_occupancy.h has it for
        cc 7.0-9.0: 256 registers per warp unit, 4 sub-partitions)."""
        from iosim.gpu.resources import ARCHS, Arch

        cc = _cc(self.compute_capability)
        limits = dict(
            smem_per_sm=self.smem_per_sm_bytes,
            smem_optin_per_block=self.smem_per_block_bytes,
            regs_per_sm=self.regs_per_sm,
            regs_per_block=min(self.regs_per_sm, 65536),
            max_threads_per_sm=self.max_threads_per_sm,
            max_blocks_per_sm=self.max_blocks_per_sm,
            reserved_smem_per_block=RESERVED_SMEM_PER_BLOCK if cc is None or cc >= (8, 0) else 0,
        )
        base = ARCHS.get(cc)
        if base is not None and all(getattr(base, k) == v for k, v in limits.items()):
            return base
        return Arch(self.name, **limits)

    def as_dict(self) -> dict:
        return dict(vars(self))


def _cc(text: str) -> tuple[int, int] | None:
    parts = str(text).split(".")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def _table_path() -> Path:
    spec = importlib.util.find_spec("iosim.experiments")  # finds the folder without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("iosim.experiments is not installed: the devices table is its data/devices.csv")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "devices.csv"


def _from_row(row: dict) -> Device:
    """A Device from one table row; per-SM limits left empty there come from iosim.gpu.resources.ARCHS."""
    from iosim.gpu.resources import ARCHS

    ints = {f: int(row[f]) for f in SOURCES if f != "compute_capability" and row.get(f)}
    cc = _cc(row["compute_capability"])
    missing = [f for f in _ARCH_LIMITS if f not in ints]
    if missing:
        if cc not in ARCHS:
            raise ValueError(f"devices table, {row['device']}: {missing} empty and cc {cc} not in ARCHS")
        ints.update({f: getattr(ARCHS[cc], f) for f in missing})
    return Device(row["device"], compute_capability=row["compute_capability"], **ints)


def table_rows() -> list[dict]:
    """The rows of the devices table that are hierarchy presets (``sms`` given), as read."""
    with open(_table_path(), newline="") as f:
        return [row for row in csv.DictReader(f) if row.get("sms")]


@lru_cache(maxsize=1)
def presets() -> dict[str, Device]:
    """The devices of the table that have hierarchy figures, by name."""
    return {row["device"]: _from_row(row) for row in table_rows()}


def device(name: str) -> Device:
    """A preset by name (case and spaces ignored: ``h100``, ``RTX4090``); InputError naming the presets."""
    table = presets()
    key = "".join(str(name).lower().split())
    for n, dev in table.items():
        if "".join(n.lower().split()) == key:
            return dev
    raise InputError("device", f"must be one of {', '.join(table)}", name)
